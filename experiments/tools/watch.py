r"""Watch a trained run: a video of its policy and the world model's open-loop predictions.

  python experiments/tools/watch.py --logdir runs/quickstart      # -> runs/quickstart/watch/
  python experiments/tools/watch.py --logdir runs/gym_cartpole --out cartpole.gif --episodes 2

Writes, by default into ``<logdir>/watch/`` (where ``experiments/tools/report.py``
finds and links them):

* ``--out`` (``episodes.mp4``; ``.mp4`` or ``.gif``): ``--episodes`` episodes
  of the run's policy (``load_policy``, ``--policy`` sample as the paper
  evaluates, spec 7.3, or mode), each frame stamped with the episode, step
  and return so far.
* ``--openloop`` (``openloop.png``; ``none`` skips it): the world model's
  open-loop prediction on the first recorded episode, as the official code's
  report does: the posterior filters ``--context`` (5) real steps, then the
  prior imagines ``--horizon`` (45) steps under the recorded actions, with no
  observation. Every vector observation dimension, the reward and the
  continuation probability are plotted, prediction against reality; each
  image key gets ``openloop_<key>.gif`` beside it: truth, prediction and
  error side by side per step (green border: context, red: imagined), as
  the official report draws it. Imagined latents take
  the prior's most likely class (a deterministic rollout).

Rendering: dm_control through MuJoCo's EGL backend (``MUJOCO_GL=egl``, Mesa's
software EGL works on CPU-only machines: ``libegl1 libgl1-mesa-dri``), gym
through ``render_mode='rgb_array'`` (pygame), Atari as the ALE's
210x160 screen (``--max_steps`` counts agent steps: 4 frames each), Crafter
through its own renderer (the same view at 256x256). Videos are written by imageio
(GIF via pillow, MP4 via imageio-ffmpeg's bundled ffmpeg). All of these are
installed by the README's commands; where rendering is impossible the command
fails with a message naming what is missing, before writing anything.
"""

from __future__ import annotations

import os
import sys
from typing import Dict, List, Optional

# Before dm_control is imported. 'disable' is experiments/envs/dmc.py's training
# default (never render); another backend the user chose (osmesa) is kept.
if os.environ.get('MUJOCO_GL', 'disable') in ('', 'disable'):
  os.environ['MUJOCO_GL'] = 'egl'
os.environ.setdefault('SDL_VIDEODRIVER', 'dummy')  # pygame (gym) off-screen
os.environ.setdefault('SDL_AUDIODRIVER', 'dummy')
# imageio-ffmpeg starts ffmpeg with preexec_fn=os.setpgrp (so Ctrl-C does not
# reach it); a preexec_fn runs Python's fork hooks, and jax's warns that
# os.fork() "will likely lead to a deadlock". Its documented switch starts
# ffmpeg without one (a Ctrl-C then stops ffmpeg too, as it stops this).
os.environ.setdefault('IMAGEIO_FFMPEG_NO_PREVENT_SIGINT', '1')

import numpy as np
from absl import app, flags

if __package__ in (None, ''):  # run as a script: make the repo root importable
  sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(
      os.path.abspath(__file__)))))

import agent  # noqa: F401,E402  (jax compat before acme)
from experiments.envs import suites  # noqa: E402
from experiments.run import rundir  # noqa: E402
from experiments.run.config import log  # noqa: E402
from experiments.tools.load_policy import load_policy  # noqa: E402

WATCH_DIR = 'watch'
VIDEO_FILE = 'episodes.mp4'
OPENLOOP_FILE = 'openloop.png'
VIDEO_EXTS = ('.mp4', '.gif')


class RenderError(RuntimeError):
  """Frames cannot be rendered or written here; the message says what is missing."""


# --- recording -------------------------------------------------------------------


def make_render_env(suite: str, task: str, action_repeat: int, seed: int,
                    time_limit: Optional[float] = None, image: bool = False,
                    proprio: bool = True):
  """One ``ProtocolEnv`` of the run's task that can render frames (with the
  run's own observations: dm_control's ``image`` / ``proprio``)."""
  if suite == 'custom':
    raise RenderError('this run trained on a custom env factory; record it from '
                      'Python with watch.record(policy, env, ...)')
  return suites.make_env(suite, task, action_repeat, seed, time_limit=time_limit,
                         render=True, image=image, proprio=proprio)


def render_frame(env, height: int = 240, width: int = 320) -> np.ndarray:
  """An RGB uint8 frame [H, W, 3] of a ``ProtocolEnv``: dm_control renders
  at height x width; gym, gymnasium and Atari (the ALE screen) give their
  own size."""
  inner = env.dm_env
  try:
    if hasattr(inner, 'physics'):                       # dm_control
      return np.asarray(inner.physics.render(height, width, camera_id=0))
    frame = inner.render()                      # gym rgb_array, ALE screen
  except Exception as e:  # noqa: BLE001  (the backends raise many kinds)
    gl = os.environ.get('MUJOCO_GL')
    raise RenderError(
        f'cannot render {env.task}: {type(e).__name__}: {e}. dm_control needs '
        f'MuJoCo\'s EGL backend (MUJOCO_GL=egl, now {gl!r}) and the Mesa EGL '
        'libraries (Debian: apt-get install libegl1 libgl1-mesa-dri); gym needs '
        'pygame (pip install pygame, in pyproject.toml)') from e
  if frame is None:
    raise RenderError(f'{env.task} rendered no frame (not rgb_array render mode)')
  return np.asarray(frame, np.uint8)


def _stamp(frame: np.ndarray, text: str) -> np.ndarray:
  from PIL import Image, ImageDraw
  img = Image.fromarray(frame)
  draw = ImageDraw.Draw(img)
  draw.rectangle([0, 0, img.width, 14], fill=(0, 0, 0))
  draw.text((3, 1), text, fill=(255, 255, 255))
  return np.asarray(img)


def record(policy, env, episodes: int = 1, max_steps: int = 1000,
           height: int = 240, width: int = 320, frames: bool = True):
  """Runs ``episodes`` episodes of ``policy`` (a ``LoadedPolicy``) in ``env``
  (a ``ProtocolEnv``). Returns (frames, episodes): the stamped frames and, per
  episode, {'obs': {key: [L, ...]}, 'action': [L, A] as stored in the replay
  (one-hot when discrete, zero at is_last), 'reward', 'is_terminal': [L],
  'score'}."""
  out_frames: List[np.ndarray] = []
  records = []
  for ep in range(episodes):
    policy.reset(num_envs=1)
    obs = env.reset()
    steps: List[Dict[str, np.ndarray]] = []
    score = 0.0
    for t in range(max_steps):
      score += float(obs['reward'])
      if frames:
        out_frames.append(_stamp(render_frame(env, height, width),
                                 f'episode {ep + 1}  step {t}  return {score:.1f}'))
      batch = {k: np.asarray(v)[None] for k, v in obs.items()}
      action = policy.act(batch)[0]
      stored = (np.eye(policy.act_dim, dtype=np.float32)[int(action)]
                if policy.spaces.discrete else np.asarray(action, np.float32))
      if obs['is_last']:
        stored = np.zeros_like(stored)
      steps.append({**{k: np.asarray(v) for k, v in obs.items()}, 'action': stored})
      if obs['is_last']:
        break
      obs = env.step(action)
    records.append({
        'obs': {k: np.stack([s[k] for s in steps]) for k in policy.spaces.obs},
        'action': np.stack([s['action'] for s in steps]),
        'reward': np.array([s['reward'] for s in steps], np.float32),
        'is_terminal': np.array([s['is_terminal'] for s in steps], bool),
        'score': score})
  return out_frames, records


def write_video(path: str, frames: List[np.ndarray], fps: int = 30) -> None:
  """Writes ``frames`` as .mp4 (imageio-ffmpeg) or .gif (pillow)."""
  ext = os.path.splitext(path)[1].lower()
  if ext not in VIDEO_EXTS:
    raise ValueError(f'--out {path!r}: the video must end in .mp4 or .gif')
  if not frames:
    raise ValueError('no frames to write')
  try:
    import imageio.v2 as imageio
  except ImportError as e:
    raise RenderError('writing videos needs imageio (pip install imageio '
                      'imageio-ffmpeg, in pyproject.toml)') from e
  os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
  tmp = path + '.tmp' + ext
  try:
    if ext == '.gif':
      imageio.mimsave(tmp, frames, duration=1000.0 / fps, loop=0)
    else:
      try:
        writer = imageio.get_writer(tmp, fps=fps, codec='libx264',
                                    macro_block_size=1, format='FFMPEG')
      except (ImportError, ValueError, RuntimeError) as e:
        raise RenderError(f'writing .mp4 needs ffmpeg through imageio-ffmpeg '
                          f'(pip install imageio-ffmpeg): {e}') from e
      with writer:
        for frame in frames:
          writer.append_data(frame)
    os.replace(tmp, path)
  finally:
    if os.path.exists(tmp):
      os.remove(tmp)


# --- open-loop prediction ------------------------------------------------------------


def load_params(logdir: str, checkpoint: Optional[str] = None):
  """All params (world model included) of a run's newest checkpoint."""
  ckpt = checkpoint or rundir.latest_run_checkpoint(logdir)
  if ckpt is None:
    raise FileNotFoundError(f'no checkpoint in {rundir.checkpoint_root(logdir)}')
  return rundir.read_learner_state(ckpt).params


def open_loop(params, spaces, config, episode, context: int = 5,
              horizon: int = 45, seed: int = 0):
  """World-model predictions on ``episode`` (a ``record`` entry).

  The posterior filters steps 0..context-1 (spec 2.7; those predictions are
  reconstructions); then the prior imagines steps context..context+horizon-1
  under the recorded actions (spec 2.8), each latent its prior's most likely
  class. Returns {'obs': {key: [L, ...]}, 'reward': [L], 'cont': [L]} in the
  env's units (vector outputs symexp'd, spec 2.11; images in [0, 1], 2.10)
  for L = the steps used.
  """
  import jax
  import jax.numpy as jnp

  from agent import distributions as dists
  from agent import networks as nets_lib
  from agent import rssm as rssm_lib
  c = config
  L = min(context + horizon, len(episode['reward']))
  if L <= context:
    raise ValueError(f'the episode has {len(episode["reward"])} steps; the '
                     f'open-loop plot needs more than --context={context}')
  nets = nets_lib.make_networks(spaces, c)
  W = nets.weights(params)
  obs = {k: jnp.asarray(v[None, :context], spaces.obs_dtype(k))
         for k, v in episode['obs'].items()}
  act = jnp.asarray(episode['action'][:L], jnp.float32)
  prevact = jnp.concatenate([jnp.zeros_like(act[:1]), act[:-1]])      # a_{t-1}
  is_first = jnp.zeros((1, context), bool).at[0, 0].set(True)
  start = rssm_lib.Latent(jnp.zeros((1, c.deter), c.jnp_compute_dtype),
                          jnp.zeros((1, c.stoch, c.classes), c.jnp_compute_dtype))
  tokens = nets.encode(W, obs)
  deter, stoch, _ = rssm_lib.observe(W['dyn'], start, tokens, prevact[None, :context],
                                     is_first, jax.random.PRNGKey(seed), c)
  deters, stochs = [deter[0]], [stoch[0]]
  Wc = rssm_lib.prepare_core(W['dyn'], c)
  h, z = deter[:, -1], stoch[:, -1].reshape(1, -1)
  for t in range(context, L):
    x2 = rssm_lib.embed_action(Wc, prevact[t][None], jnp.zeros((1,), bool), c)
    h = rssm_lib.core(Wc, h, z, x2, c)
    logit = rssm_lib.prior_logits(Wc, h, c)
    zt = jax.nn.one_hot(jnp.argmax(logit, -1), c.classes, dtype=h.dtype)
    z = zt.reshape(1, -1)
    deters.append(h)
    stochs.append(zt)
  deter = jnp.concatenate(deters)
  stoch = jnp.concatenate(stochs)
  recon = nets.decode(W, deter, stoch)
  feat = nets_lib.feat(deter, stoch)
  # Vector keys are predicted in symlog space (2.11), images in [0, 1] (2.10).
  return {'obs': {k: np.asarray(v if k in spaces.image_keys else dists.symexp(v))
                  for k, v in recon.items()},
          'reward': np.asarray(dists.twohot_pred(nets.reward_logits(W, feat))),
          'cont': np.asarray(dists.binary_prob(nets.cont_logit(W, feat)))}


def plot_open_loop(path: str, episode, pred, context: int, title: str = '') -> None:
  """Prediction (dashed) against reality (solid) for every obs dimension,
  the reward and the continuation; the grey band is the context."""
  import matplotlib
  matplotlib.use('Agg')
  import matplotlib.pyplot as plt
  L = len(pred['reward'])
  panels = [(f'{k}', episode['obs'][k][:L].reshape(L, -1), v.reshape(L, -1))
            for k, v in sorted(pred['obs'].items()) if v.ndim != 4]
  panels.append(('reward', episode['reward'][:L, None], pred['reward'][:, None]))
  panels.append(('continuation', 1.0 - episode['is_terminal'][:L, None].astype(float),
                 pred['cont'][:, None]))
  cols = min(3, len(panels))
  rows = -(-len(panels) // cols)
  fig, axes = plt.subplots(rows, cols, figsize=(5 * cols, 2.8 * rows), squeeze=False)
  t = np.arange(L)
  for ax, (name, real, guess) in zip(axes.flat, panels):
    ax.axvspan(-0.5, context - 0.5, color='0.9')
    for d in range(real.shape[1]):
      color = f'C{d % 10}'
      ax.plot(t, real[:, d], color=color, lw=1.2)
      ax.plot(t, guess[:, d], color=color, lw=1.2, ls='--')
    ax.set_title(f'{name} ({real.shape[1]} dims)' if real.shape[1] > 1 else name,
                 fontsize=9)
    ax.tick_params(labelsize=7)
  for ax in list(axes.flat)[len(panels):]:
    ax.axis('off')
  fig.suptitle(f'{title} open loop: {context} context steps (grey), then imagined '
               'under the recorded actions; solid = real, dashed = predicted',
               fontsize=10)
  fig.tight_layout()
  os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
  tmp = path + '.tmp.png'
  fig.savefig(tmp, dpi=80)
  plt.close(fig)
  os.replace(tmp, path)


def open_loop_frames(episode, pred, context: int, key: str,
                     scale: int = 3) -> List[np.ndarray]:
  """Frames of an image key's open loop, as the official report draws it:
  truth | prediction | error side by side, error = (pred - true + 255) / 2,
  a green border on the context steps and a red one on the imagined ones;
  enlarged ``scale`` times (nearest)."""
  L = len(pred['reward'])
  true = np.asarray(episode['obs'][key][:L], np.uint8)
  guess = np.clip(np.asarray(pred['obs'][key]) * 255, 0, 255).astype(np.uint8)
  error = ((guess.astype(np.int32) - true + 255) // 2).astype(np.uint8)
  frames = []
  for t in range(L):
    row = np.concatenate([true[t], guess[t], error[t]], 1)
    if row.shape[-1] == 1:
      row = np.repeat(row, 3, -1)
    row = row[..., :3]
    color = (0, 200, 0) if t < context else (220, 0, 0)
    framed = np.empty((row.shape[0] + 4, row.shape[1] + 4, 3), np.uint8)
    framed[:] = color
    framed[2:-2, 2:-2] = row
    frames.append(framed.repeat(scale, 0).repeat(scale, 1))
  return frames


def open_loop_video_path(openloop: str, key: str, ext: str = '.gif') -> str:
  """Beside openloop.png: openloop_<key>.gif."""
  root, _ = os.path.splitext(openloop)
  return f'{root}_{key}{ext}'


# --- command line -----------------------------------------------------------------------


def watch(logdir: str, out: Optional[str] = None, openloop: Optional[str] = None,
          episodes: int = 1, policy_mode: str = 'sample', max_steps: int = 1000,
          context: int = 5, horizon: int = 45, fps: int = 30, seed: int = 0,
          height: int = 240, width: int = 320) -> Dict[str, str]:
  """The command's work (module doc); returns {'video': path, 'openloop': path}."""
  out = out or os.path.join(logdir, WATCH_DIR, VIDEO_FILE)
  if os.path.splitext(out)[1].lower() not in VIDEO_EXTS:
    raise ValueError(f'--out {out!r}: the video must end in .mp4 or .gif')
  if openloop is None:
    openloop = os.path.join(logdir, WATCH_DIR, OPENLOOP_FILE)
  policy = load_policy(logdir, mode=policy_mode, seed=seed)
  saved_run = rundir.read_saved_config(policy.checkpoint)[2]
  env = make_render_env(policy.suite, policy.task, policy.action_repeat or 1,
                        seed=10_000 + seed, time_limit=saved_run.get('time_limit'),
                        image=saved_run.get('image', False),
                        proprio=saved_run.get('proprio', True))
  try:
    env.reset()
    render_frame(env, height, width)          # fail early, before any file
    frames, records = record(policy, env, episodes, max_steps, height, width)
  finally:
    env.close()
  write_video(out, frames, fps)
  log(f'[watch] {len(records)} episode(s), returns '
             f'{[round(r["score"], 1) for r in records]}: wrote {out}')
  result = {'video': out}
  if openloop != 'none':
    pred = open_loop(load_params(logdir, policy.checkpoint), policy.spaces,
                     policy.config, records[0], context, horizon, seed)
    plot_open_loop(openloop, records[0], pred, context,
                   title=f'{policy.task} @ {policy.env_steps} env steps:')
    log(f'[watch] wrote {openloop}')
    result['openloop'] = openloop
    for key in policy.spaces.image_keys:
      path = open_loop_video_path(openloop, key)
      write_video(path, open_loop_frames(records[0], pred, context, key),
                  fps=max(1, fps // 3))
      log(f'[watch] wrote {path} (truth | prediction | error; green context, '
          'red imagined)')
      result[f'openloop_{key}'] = path
  return result


FLAGS = flags.FLAGS


def define_flags() -> None:
  flags.DEFINE_string('logdir', None, 'Run directory with a checkpoint.')
  flags.DEFINE_string('out', None, f'Video file (.mp4 or .gif); default '
                      f'<logdir>/{WATCH_DIR}/{VIDEO_FILE}.')
  flags.DEFINE_string('openloop', None, f'Open-loop PNG; default '
                      f'<logdir>/{WATCH_DIR}/{OPENLOOP_FILE}; "none" skips it.')
  flags.DEFINE_integer('episodes', 1, 'Episodes to record.', lower_bound=1)
  flags.DEFINE_enum('policy', 'sample', ['sample', 'mode'], 'Policy mode (spec 7.3).')
  flags.DEFINE_integer('max_steps', 1000, 'Agent steps per episode at most.',
                       lower_bound=1)
  flags.DEFINE_integer('context', 5, 'Open loop: context steps.', lower_bound=1)
  flags.DEFINE_integer('horizon', 45, 'Open loop: imagined steps.', lower_bound=1)
  flags.DEFINE_integer('fps', 30, 'Video frames per second.', lower_bound=1)
  flags.DEFINE_integer('seed', 0, 'Seed of the env and the policy.')
  flags.mark_flag_as_required('logdir')


def main(argv) -> int:
  if len(argv) > 1:
    raise app.UsageError(f'unexpected arguments: {argv[1:]}')
  try:
    watch(FLAGS.logdir, FLAGS.out, FLAGS.openloop, FLAGS.episodes, FLAGS.policy,
          FLAGS.max_steps, FLAGS.context, FLAGS.horizon, FLAGS.fps, FLAGS.seed)
  except (ValueError, FileNotFoundError, RenderError) as e:
    print(f'error: {e}', file=sys.stderr)
    return 2
  return 0


if __name__ == '__main__':
  define_flags()
  app.run(main)
