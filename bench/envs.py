"""Environment throughput: VectorEnv.step with uniform random actions.

  python bench/envs.py --tasks walker_walk cartpole_swingup --num_envs=16
  python bench/envs.py --suite=atari --tasks pong --num_envs=1 --repeat=4

Prints vector steps/s, agent steps/s and env steps/s per task (no agent, no
replay): the ceiling the envs alone set on a run's acting speed.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import numpy as np

if __package__ in (None, ''):
  sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import agent  # noqa: F401,E402  (jax compat before acme)
from experiments.envs.dmc import DEFAULT_ACTION_REPEAT  # noqa: E402
from experiments.envs.vector import DEFAULT_NUM_ENVS, VectorEnv  # noqa: E402


def measure_steps_per_second(task: str, num_envs: int = DEFAULT_NUM_ENVS,
                             action_repeat: int = DEFAULT_ACTION_REPEAT,
                             agent_steps: int = 200, seed: int = 0,
                             image: bool = False, proprio: bool = True,
                             suite: str = 'dmc') -> dict:
  """Times ``agent_steps`` vector steps with uniform random actions
  (``image``: DMC vision frames rendered with MuJoCo EGL, spec 2.10; env
  steps are agent steps x ``action_repeat``: frames for Atari)."""
  envs = VectorEnv(task, num_envs, action_repeat, seed, image=image,
                   proprio=proprio, suite=suite)
  rng = np.random.default_rng(seed)
  envs.reset()
  start_agent, start_env = envs.agent_steps, envs.env_steps
  t0 = time.perf_counter()
  for _ in range(agent_steps):
    envs.step(rng.integers(0, envs.act_dim, num_envs) if envs.spaces.discrete
              else rng.uniform(-1, 1, (num_envs, envs.act_dim)))
  dt = time.perf_counter() - t0
  envs.close()
  return {
      'task': envs.task, 'num_envs': num_envs, 'seconds': dt,
      'vector_steps_per_s': agent_steps / dt,
      'agent_steps_per_s': (envs.agent_steps - start_agent) / dt,
      'env_steps_per_s': (envs.env_steps - start_env) / dt,
  }


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument('--suite', default='dmc',
                      help='experiments.envs.suites name (dmc, gym, atari...)')
  parser.add_argument('--tasks', nargs='+', default=['walker_walk', 'cartpole_swingup'])
  parser.add_argument('--num_envs', type=int, default=DEFAULT_NUM_ENVS)
  parser.add_argument('--repeat', type=int, default=DEFAULT_ACTION_REPEAT)
  parser.add_argument('--steps', type=int, default=500)
  parser.add_argument('--image', action='store_true',
                      help='render 64x64 frames (DMC vision, no proprio keys)')
  args = parser.parse_args()
  for name in args.tasks:
    r = measure_steps_per_second(name, args.num_envs, args.repeat, args.steps,
                                 image=args.image, proprio=not args.image,
                                 suite=args.suite)
    print(f"{r['task']}{' (image)' if args.image else ''}: {r['num_envs']} "
          f"envs, {r['vector_steps_per_s']:.1f} "
          f"vector steps/s, {r['agent_steps_per_s']:.0f} agent steps/s, "
          f"{r['env_steps_per_s']:.0f} env steps/s")


if __name__ == '__main__':
  main()
