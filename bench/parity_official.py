"""The official DreamerV3's side of the learning-parity harness.

Runs in the OFFICIAL implementation's own venv (bench/official.py has the
set-up; add dm-control==1.0.50 mujoco==3.17.0 there), never in ours, and
imports nothing of this project. `bench/parity.py run --side=official` starts
it; by hand:

  /tmp/official/venv/bin/python bench/parity_official.py \
      --src=/tmp/official/src --updates=3000 --every=50 \
      --out=/tmp/parity/official_s0/updates.jsonl -- \
      --configs dmc_proprio --task dmc_cartpole_swingup ... (official flags)

It calls the official `dreamerv3/main.py:main` unmodified, with three
wrappers that change nothing the agent computes:

- `Agent.train` is wrapped to collect every update's metrics (the official
  returns them one update late; they are keyed by their own `opt/updates`)
  and to write, per `--every` updates, one JSON row of their means, keyed by
  the update count, with the env step at that point. The return normaliser's
  state (`retnorm/lo/value`, `retnorm/hi/value`, not a metric there) is read from the
  parameters after each update, so the scale S = max(1, hi - lo) (spec 3.8,
  retnorm.debias False as in its config) and the raw mean imagined return
  (its `ret` metric is (R - lo) / S) can be compared.
- dm_control's `Physics.render` returns zeros: the official DMC env renders a
  64x64 `log/image` every step even for proprio tasks (only logged, never
  trained on), and rendering would dominate the run on a CPU. Not with
  `--pixels` (its dmc_vision semantics, env.dmc.image True: the frames are
  the observation): then it renders with MuJoCo EGL (MUJOCO_GL=egl).
- the logger is kept so that its `scores.jsonl` is flushed before the process
  ends at exactly `--updates` updates.
- `Agent.loss` is wrapped to add position-resolved means of the world-model
  losses: `pos/<loss>/<group>`, the mean of that loss (dyn, rew,
  con, each vector and image key) over the trained window positions of the
  group (POS_GROUPS: t0 is the first trained step after the replay context,
  t16-31 the last half of a T = 32 window).
  Also `data/<key>`: means over the trained steps of each observation key,
  the reward, is_first and |a_{t-1}| (what the batch holds).
  Extra metrics only; nothing the loss or the update computes changes.
  bench/parity_probe.py adds the same metrics to ours.
"""

import argparse
import json
import os
import pathlib
import sys

import numpy as np


def parse():
  p = argparse.ArgumentParser()
  p.add_argument('--src', required=True, help='checkout of danijar/dreamerv3')
  p.add_argument('--updates', type=int, required=True,
                 help='stop after this many updates')
  p.add_argument('--every', type=int, default=50,
                 help='updates per written row (means over the window)')
  p.add_argument('--out', required=True, help='JSONL of windowed means')
  p.add_argument('--repeat', type=int, default=2,
                 help='action repeat: the env step is agent steps x repeat')
  p.add_argument('--pixels', action='store_true',
                 help='image observations: keep dm_control rendering (EGL)')
  return p.parse_known_args()


def _scalars(mets):
  out = {}
  for k, v in mets.items():
    v = np.asarray(v)
    if v.ndim == 0 and np.issubdtype(v.dtype, np.number):
      out[k] = float(v)
  return out


# The position groups and their means: one home, bench/parity_probe.py (it
# imports only the standard library, so this script's venv can load it).
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from parity_probe import POS_GROUPS, position_metrics  # noqa: E402,F401


def install_probe():
  """Wraps the official `Agent.loss` to add the pos/ metrics (module doc)."""
  from dreamerv3 import agent as official_agent
  loss = official_agent.Agent.loss

  def probed_loss(self, carry, obs, prevact, training):
    total, (carry, entries, outs, metrics) = loss(self, carry, obs, prevact, training)
    losses = outs['losses']
    T = obs['is_first'].shape[1]
    obskeys = list(self.dec.veckeys) + list(self.dec.imgkeys)
    keys = [k for k, v in losses.items()
            if (k in ('dyn', 'rew', 'con') or k in obskeys)
            and v.shape[1:] == (T,)]
    data = {f'data/{k}': obs[k].mean() for k in obskeys}
    data['data/reward'] = obs['reward'].mean()
    data['data/is_first'] = obs['is_first'].astype('float32').mean()
    data['data/action_abs'] = abs(prevact['action']).mean()
    metrics = {**metrics, **position_metrics(losses, keys), **data}
    return total, (carry, entries, outs, metrics)
  official_agent.Agent.loss = probed_loss


class Recorder:
  """Per-update metrics -> rows of means over `every` updates."""

  def __init__(self, path, every, updates, repeat):
    self.path = pathlib.Path(path)
    self.path.parent.mkdir(parents=True, exist_ok=True)
    self.file = open(self.path, 'w')
    self.every, self.updates, self.repeat = every, updates, repeat
    self.sums, self.count = {}, 0
    self.norm = {}        # update -> (lo, hi) read after that update
    self.logger = None
    self.done = False

  def env_step(self):
    return int(self.logger.step) * self.repeat if self.logger else None

  def add(self, mets):
    if not mets:
      return
    mets = _scalars(mets)
    update = int(mets['train/opt/updates'] if 'train/opt/updates' in mets
                 else mets['opt/updates'])
    lo, hi = self.norm.pop(update, (np.nan, np.nan))
    scale = max(1.0, hi - lo)
    mets['retnorm/lo'], mets['retnorm/hi'], mets['retnorm/scale'] = lo, hi, scale
    if 'ret' in mets:
      mets['ret_raw'] = mets['ret'] * scale + lo
    for k, v in mets.items():
      self.sums[k] = self.sums.get(k, 0.0) + v
    self.count += 1
    if update % self.every == 0 or update >= self.updates:
      row = {k: v / self.count for k, v in self.sums.items()}
      row.update(updates=update, updates_in_mean=self.count,
                 env_step=self.env_step())
      self.file.write(json.dumps(row) + '\n')
      self.file.flush()
      self.sums, self.count = {}, 0
    if update >= self.updates:
      self.done = True


def main():
  args, official_argv = parse()
  if official_argv and official_argv[0] == '--':
    official_argv = official_argv[1:]
  src = os.path.abspath(args.src)
  sys.path.insert(0, src)
  os.environ.setdefault('MUJOCO_GL', 'egl')

  if not args.pixels:
    from dm_control import mujoco as dm_mujoco

    def render(self, height=240, width=320, *a, **k):
      del self, a, k
      return np.zeros((height, width, 3), np.uint8)
    dm_mujoco.Physics.render = render
  elif os.environ['MUJOCO_GL'] != 'egl':
    sys.exit(f'--pixels renders with MuJoCo EGL; MUJOCO_GL is '
             f'{os.environ["MUJOCO_GL"]!r}')

  import embodied.jax.agent as jax_agent
  from dreamerv3 import main as official
  install_probe()

  rec = Recorder(args.out, args.every, args.updates, args.repeat)
  train = jax_agent.Agent.train
  norm_keys = []

  def wrapped_train(self, carry, data):
    carry, outs, mets = train(self, carry, data)
    if not norm_keys:
      norm_keys.extend(['retnorm/lo/value', 'retnorm/hi/value'])
    n = int(self.n_updates)
    rec.norm[n] = tuple(float(np.asarray(self.params[k])) for k in norm_keys)
    rec.add(mets)
    if rec.done:
      finish()
    return carry, outs, mets
  jax_agent.Agent.train = wrapped_train

  make_logger = official.make_logger

  def keep_logger(config):
    rec.logger = make_logger(config)
    return rec.logger
  official.make_logger = keep_logger

  def finish():
    rec.file.close()
    if rec.logger is not None:
      rec.logger.write()
      for output in rec.logger.outputs:
        getattr(output, 'close', lambda: None)()
    print(f'[parity_official] reached {args.updates} updates', flush=True)
    os._exit(0)

  official.main(official_argv)
  rec.file.close()
  print('[parity_official] the official run ended before --updates',
        file=sys.stderr, flush=True)
  sys.exit(1)


if __name__ == '__main__':
  main()
