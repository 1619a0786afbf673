"""Crafter's costs: env steps per second of one worker, replay bytes per step.

  python bench/crafter_costs.py --steps=3000 --size=size12m

Prints
  * env steps per second of one worker: one Crafter env (64x64, the reward
    task) through the run's own env stack (``suites.make_env``, the
    ProtocolEnv checks included) under uniform random actions, resets
    included, timed over ``--steps`` steps after a warm-up episode start;
  * bytes per stored step before Reverb's chunk compression
    (``agent.types.step_bytes``: the 64x64x3 frame, the one-hot of the 17
    actions, the latent of the ``--size`` preset and the rest) and the width
    of the packed uint8 row the replay stores (``reverb_tables.packing``).
"""

from __future__ import annotations

import os
import sys
import time

from absl import app, flags

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import agent  # noqa: F401,E402  (jax compat first)
import numpy as np  # noqa: E402

from agent import types  # noqa: E402
from agent.config import make_config  # noqa: E402
from experiments.envs import suites  # noqa: E402
from reverb_tables import packing  # noqa: E402

flags.DEFINE_integer('steps', 3000, 'Env steps to time.', lower_bound=1)
flags.DEFINE_string('size', 'size12m', 'Size preset of the latent.')
flags.DEFINE_integer('seed', 0, 'Env and action seed.')
FLAGS = flags.FLAGS


def env_steps_per_second(steps: int, seed: int) -> float:
  env = suites.make_env('crafter', 'reward', 1, seed)
  rng = np.random.default_rng(seed)
  env.reset()
  start = time.perf_counter()
  for _ in range(steps):
    env.step(int(rng.integers(env.act_dim)))
  seconds = time.perf_counter() - start
  env.close()
  return steps / seconds


def main(_):
  rate = env_steps_per_second(FLAGS.steps, FLAGS.seed)
  print(f'crafter reward, 1 worker: {rate:,.0f} env steps/s '
        f'({1e3 / rate:.2f} ms per step, {FLAGS.steps} steps)')
  config = make_config(size=FLAGS.size)
  spaces = suites.make_env('crafter', 'reward', 1, FLAGS.seed).spaces
  spec = types.step_spec(spaces, config)
  width = packing.StepLayout.from_step_spec(spec).width
  print(f'bytes per stored step at {config.size} (signature): '
        f'{types.step_bytes(spaces, config):,} B; packed row {width:,} B')


if __name__ == '__main__':
  app.run(main)
