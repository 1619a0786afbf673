"""Pixels end to end (spec 2.10): a tiny image task trained through
``train()``, DMC vision frames rendered by MuJoCo EGL, and the bad inputs
(float image, wrong rank, size outside the rule, a channel count that
changes, an image key that appears mid-episode), each named before anything
is stored."""

import json
import os

import numpy as np
import pytest
from dm_env import specs

from experiments.envs import dmc
from experiments.envs.observations import ObservationError
from experiments.envs.protocol import ProtocolEnv
from experiments.run import rundir
from tests.pixel_env import PixelEnv, make_pixel_env

SMOKE = 'experiments/flags/smoke.flags'


def _rows(logdir, key):
  out = []
  with open(os.path.join(logdir, 'metrics.jsonl')) as f:
    for line in f:
      row = json.loads(line)
      if key in row:
        out.append(row[key])
  return out


def _bad_at_40(seed):
  return PixelEnv(seed, bad='channels', bad_at=40)


def test_train_from_pixels_in_one_process(tmp_path, jax_cache_dir):
  """The image reconstruction loss falls as a tiny model trains on frames.
  Resumed with envs whose frame changes its channel count at their 40th
  step, the run stops naming the key, and what was stored before the bad
  frame is checkpointed there (no periodic checkpoint is due); load_policy
  and watch then act from that checkpoint."""
  from experiments.run_dmc import train
  logdir = str(tmp_path / 'pix')
  common = dict(task='pixel_dot', logdir=logdir, flagfile=SMOKE,
                action_repeat=1, batch_size=2, config_overrides=['imag_horizon=4'],
                eval_every=0, log_every=100, checkpoint_every=1e6,
                jax_cache_dir=jax_cache_dir, report=False)
  summary = train(make_pixel_env, env_steps=700, **common)
  assert summary['updates'] > 100
  rec = _rows(logdir, 'train/loss/rec_image')
  assert len(rec) >= 3, rec
  # At init the sigmoid predicts 0.5 everywhere: about 48*48*0.25 = 576.
  assert rec[0] > 300 and rec[-1] < 0.5 * rec[0], rec
  with pytest.raises(ObservationError, match=r"image 'image' is uint8 \(48, 48, 2\)"):
    train(_bad_at_40, env_steps=1000, **common)
  ckpt = rundir.latest_run_checkpoint(logdir)
  with open(os.path.join(ckpt, rundir.RUN_STATE_FILE)) as f:
    state = json.load(f)
  # 2 envs x (39 good steps, the 40th refused, + 2 reset steps of the
  # 20-step episodes) past the first segment's end: the count at the error.
  assert 78 <= state['counts']['env_steps'] - summary['env_steps'] <= 86, state
  assert state['learner']['updates'] > summary['updates'] + 20, state
  with open(os.path.join(ckpt, 'config.json')) as f:
    saved = json.load(f)
  assert saved['spaces']['obs'] == {'image': [48, 48, 1]}
  _watch_acts_from_images(logdir, tmp_path)


def _watch_acts_from_images(logdir, tmp_path):
  """load_policy acts from frames; watch's open loop writes truth |
  prediction | error frames for the image key (context green, imagined red)."""
  from experiments.tools import watch
  from experiments.tools.load_policy import load_policy
  policy = load_policy(logdir)
  env = ProtocolEnv(PixelEnv(seed=5), name='pixel_dot')
  _, records = watch.record(policy, env, episodes=1, frames=False)
  episode = records[0]
  assert episode['obs']['image'].shape == (21, 48, 48, 1)
  pred = watch.open_loop(watch.load_params(logdir, policy.checkpoint),
                         policy.spaces, policy.config, episode, context=5,
                         horizon=10)
  assert pred['obs']['image'].shape == (15, 48, 48, 1)
  assert 0 <= pred['obs']['image'].min() and pred['obs']['image'].max() <= 1
  frames = watch.open_loop_frames(episode, pred, 5, 'image', scale=1)
  assert len(frames) == 15 and frames[0].shape == (52, 3 * 48 + 4, 3)
  truth = frames[7][2:-2, 2:50, 0]
  np.testing.assert_array_equal(truth, episode['obs']['image'][7, :, :, 0])
  assert tuple(frames[0][0, 0]) == (0, 200, 0) and tuple(frames[9][0, 0]) == (220, 0, 0)
  out = tmp_path / 'openloop_image.gif'
  watch.write_video(str(out), frames, fps=5)
  assert out.stat().st_size > 1000


@pytest.mark.parametrize('proprio', [False, True])
def test_dmc_vision_frames_are_rendered_with_egl(proprio):
  """64x64 RGB from physics.render after the repeat, camera 0 for cartpole
  (the official choice; quadruped 2), proprio keys as the switch says."""
  env = dmc.DMCEnv('cartpole_swingup', action_repeat=2, seed=0, image=True,
                   proprio=proprio)
  try:
    keys = {'image'} | ({'position', 'velocity'} if proprio else set())
    assert set(env.spaces.obs) == keys
    assert env.spaces.image_keys == ('image',)
    first = env.reset()
    assert first['image'].dtype == np.uint8 and first['image'].shape == (64, 64, 3)
    assert first['image'].std() > 5                    # a scene, not a blank
    frames = [env.step(np.ones(1))['image'] for _ in range(10)]
    assert np.abs(frames[-1].astype(int) - first['image']).sum() > 0
    assert env.control_steps == 20
  finally:
    env.close()
  assert dmc.DEFAULT_CAMERAS['quadruped'] == 2


def test_dmc_needs_image_or_proprio():
  with pytest.raises(ValueError, match='--image or --proprio'):
    dmc.DMCEnv('cartpole_swingup', image=False, proprio=False)


@pytest.mark.parametrize('spec,match', [
    (specs.Array((48, 48, 3), np.float32), r"'frame'.*dtype float32.*must be uint8"),
    (specs.Array((2, 48, 48, 3), np.uint8), r"'frame' has rank 4"),
    (specs.Array((8, 8, 3), np.uint8), r"image 'frame' is 8x8.*from 48 to 256"),
    (specs.Array((48, 40, 3), np.uint8), r"image 'frame' is 48x40"),
    (specs.Array((48, 48), np.uint8), r"'frame'.*without its channel axis"),
])
def test_bad_image_specs_are_refused_naming_the_key(spec, match):
  class Env(PixelEnv):
    def observation_spec(self):
      return {'frame': spec}
  with pytest.raises(ObservationError, match=match):
    ProtocolEnv(Env(), name='bad')


@pytest.mark.parametrize('bad,match', [
    ('channels', r"image 'image' is uint8 \(48, 48, 2\), the spec says uint8 \(48, 48, 1\)"),
    ('float', r"image 'image' is float32"),
    ('rank', r"image 'image' is uint8 \(48, 48\), the spec says uint8 \(48, 48, 1\)"),
    ('new_key', r"\['image2'\] are not in the observation spec"),
])
def test_bad_frames_mid_episode_are_refused_naming_the_key(bad, match):
  env = ProtocolEnv(PixelEnv(bad=bad), name='pix')
  env.reset()
  env.step(np.zeros(1))
  with pytest.raises(ObservationError, match=match):
    env.step(np.zeros(1))


def test_a_bad_image_env_writes_nothing(tmp_path):
  """An env the CNN cannot take fails in train() before the logdir exists."""
  from experiments.run_dmc import train

  class Tiny(PixelEnv):
    def observation_spec(self):
      return {'image': specs.Array((8, 8, 3), np.uint8)}

  logdir = tmp_path / 'never'
  with pytest.raises(ValueError, match=r"image 'image' is 8x8"):
    train(lambda seed: Tiny(seed), task='tiny_image', logdir=str(logdir),
          flagfile=SMOKE, env_steps=100)
  assert not logdir.exists()


def test_replay_capacity_is_fitted_to_memory_before_anything_is_written(tmp_path):
  """spec 5.1 with images: 48*48*1 B of frame per step plus the step's other
  leaves; a chosen capacity whose steps would not fit is refused naming the
  estimate, the default shrinks to what fits."""
  from agent.config import make_config
  from agent.types import EnvSpaces
  from experiments.run.config import RunConfig
  from experiments.run.experiment import fit_replay
  spaces = EnvSpaces(obs={'image': (48, 48, 1)}, act_dim=1)
  config = make_config(size='tiny')
  # image 2304 + action 4 + reward 4 + 3 flags + deter bf16 64*2 + stoch 32
  # + step_id 16 = 2491 bytes, typed out.
  per_step = 2304 + 4 + 4 + 3 + 128 + 32 + 16
  run = RunConfig(task='t', logdir=str(tmp_path / 'r'), env_steps=2_000_000,
                  action_repeat=1, num_envs=1, suite='custom',
                  env_factory=make_pixel_env)
  memory = 1 << 30                                     # 1 GiB: 512 MiB share
  fitted = fit_replay(run, config, spaces, memory)
  assert fitted.replay_capacity == (memory // 2) // per_step
  with pytest.raises(ValueError, match=r'--replay_capacity 1,000,000 would hold '
                     r'1,000,000 steps x 2,491 B = 2\.3 GiB'):
    fit_replay(run, config.replace(replay_capacity=1_000_000), spaces, memory)
  small = fit_replay(run, config.replace(replay_capacity=100_000), spaces, memory)
  assert small.replay_capacity == 100_000
  assert not (tmp_path / 'r').exists()


@pytest.mark.parametrize('library', ['gym', 'gymnasium'])
def test_gym_and_gymnasium_box_uint8_images_are_images(library):
  """A Box(0, 255, (48, 48, 3), uint8) observation space is one image key."""
  import importlib
  lib = importlib.import_module(library)

  class Pix(lib.Env):
    observation_space = lib.spaces.Box(0, 255, (48, 48, 3), np.uint8)
    action_space = lib.spaces.Discrete(3)

    def reset(self, seed=None, options=None):
      return np.full((48, 48, 3), 7, np.uint8), {}

    def step(self, action):
      return np.full((48, 48, 3), int(action), np.uint8), 1.0, False, False, {}

  if library == 'gym':
    from experiments.envs.gym import GymWrapper
    inner = GymWrapper(Pix())
  else:
    from experiments.envs.gymnasium import GymnasiumEnv
    inner = GymnasiumEnv(Pix(), 'pix')
  env = ProtocolEnv(inner, name='pix')
  assert env.spaces.image_keys == ('image',) and env.discrete
  assert env.reset()['image'].dtype == np.uint8
  obs = env.step(2)
  assert obs['image'].dtype == np.uint8 and (obs['image'] == 2).all()
