"""gym 0.26 tasks as ``dm_env`` environments (acme's ``GymWrapper``, adapted).

gym's own ``TimeLimit`` ends give ``dm_env.truncation`` (is_last without
is_terminal), a ``terminated`` step ``dm_env.termination`` (is_terminal,
spec 7.2). Box observations become the key ``'vector'`` (a Dict space keeps
its keys); a Discrete action space is a discrete action (spec 3.14), a Box
one continuous, normalised to [-1, 1] by the protocol (spec 7.4). Other
spaces get a clear error. (This module's name shadows nothing: absolute
imports make ``import gym`` below the gym package.)
"""

from __future__ import annotations

from typing import Optional, Tuple

import dm_env
import numpy as np

import agent  # noqa: F401  (jax compat before acme)
from acme.wrappers import gym_wrapper
from experiments.envs.protocol import did_you_mean, gym_step_timestep


class GymWrapper(gym_wrapper.GymWrapper):
  """acme's ``GymWrapper`` on gym >= 0.26's API (acme 0.4.0 targets the old
  one): ``reset(seed=...)`` returns ``(obs, info)`` and ``step`` returns
  ``(obs, reward, terminated, truncated, info)``. The seed goes to the first
  reset only, as gym 0.26 expects; a terminated step is a termination
  (discount 0), a truncated one a truncation (discount 1, spec 7.2)."""

  def __init__(self, environment, seed: Optional[int] = None):
    super().__init__(environment)
    self._seed = seed

  def reset(self) -> dm_env.TimeStep:
    self._reset_next_step = False
    seed, self._seed = self._seed, None
    observation, self._last_info = self._environment.reset(seed=seed)
    return dm_env.restart(observation)

  def step(self, action) -> dm_env.TimeStep:
    if self._reset_next_step:
      return self.reset()
    observation, reward, terminated, truncated, info = self._environment.step(
        action)
    self._reset_next_step = terminated or truncated
    self._last_info = info
    reward = np.asarray(reward, self.reward_spec().dtype)
    return gym_step_timestep(reward, observation, terminated, truncated)

  def render(self):
    return self._environment.render()


def gym_task_names() -> Tuple[str, ...]:
  import gym
  return tuple(sorted(gym.envs.registry.keys()))


def unknown_task_message(task: str, names) -> str:
  return (f'Unknown gym task {task!r}.{did_you_mean(task, names)} '
          f'Registered gym 0.26 tasks: '
          f'{", ".join(names)}')


def make_gym(task: str, seed: Optional[int], render: bool = False):
  """A gym 0.26 task as a dm_env (``GymWrapper``); ``render`` asks for
  ``render_mode='rgb_array'`` frames."""
  import gym
  names = gym_task_names()
  if task not in names:
    raise ValueError(unknown_task_message(task, names))
  env = gym.make(task, disable_env_checker=True,
                 **({'render_mode': 'rgb_array'} if render else {}))
  try:
    return GymWrapper(env, seed)
  except (ValueError, TypeError) as e:   # a space acme cannot convert
    env.close()
    raise ValueError(f'{task}: gym spaces not supported (observation '
                     f'{env.observation_space}, action {env.action_space}): '
                     f'{e}') from e
