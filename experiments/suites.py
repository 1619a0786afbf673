"""Where a run's envs come from: dm_control, gym, or the caller's factory.

``make_env(suite, task, action_repeat, seed, ...)`` returns one
``experiments.protocol_env.ProtocolEnv`` (the spec 7.2/7.4/7.5 protocol over a
``dm_env.Environment``):

* ``'dmc'``: a dm_control suite task, ``experiments.envs.DMCEnv``.
* ``'gym'``: a registered gym 0.26 task id such as ``CartPole-v1`` or
  ``Pendulum-v1``, through ``GymWrapper`` (acme's wrapper on gym 0.26's API).
  gym's own ``TimeLimit`` ends give ``dm_env.truncation`` (is_last without
  is_terminal), a ``terminated`` step ``dm_env.termination`` (is_terminal,
  spec 7.2). Box observations become the key ``'vector'`` (a Dict space
  keeps its keys); a Discrete action space is a discrete action (spec 3.14),
  a Box one continuous, normalised to [-1, 1] (spec 7.4). Other spaces get a
  clear error.
* ``'custom'``: ``env_factory(seed) -> dm_env.Environment``, the caller's
  own env (``experiments.run_dmc.train``, README "Your own environment").

``check_task(suite, task)`` raises ValueError for a task the suite does not
have (listing what it has), so flags fail before anything is written.
"""

from __future__ import annotations

from typing import Callable, Optional, Tuple

import dm_env
import numpy as np

from acme.wrappers import gym_wrapper

from experiments.protocol_env import ProtocolEnv

SUITES = ('dmc', 'gym', 'custom')
EnvFactory = Callable[[int], dm_env.Environment]


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
    if terminated:
      return dm_env.termination(reward, observation)
    if truncated:
      return dm_env.truncation(reward, observation)
    return dm_env.transition(reward, observation)

  def render(self):
    return self._environment.render()


def gym_task_names() -> Tuple[str, ...]:
  import gym
  return tuple(sorted(gym.envs.registry.keys()))


def check_task(suite: str, task: str) -> None:
  """ValueError naming the problem when ``suite`` has no task ``task``."""
  if suite not in SUITES:
    raise ValueError(f'unknown suite {suite!r}; valid: {", ".join(SUITES)}')
  if not task or not isinstance(task, str):
    raise ValueError(f'task must be a non-empty string, got {task!r}')
  if suite == 'dmc':
    from experiments.envs import parse_task
    parse_task(task)
  elif suite == 'gym':
    names = gym_task_names()
    if task not in names:
      raise ValueError(f'Unknown gym task {task!r}. Registered gym 0.26 tasks: '
                       f'{", ".join(names)}')


def make_gym(task: str, seed: Optional[int], render: bool = False):
  """A gym 0.26 task as a dm_env (``GymWrapper``); ``render`` asks for
  ``render_mode='rgb_array'`` frames."""
  import gym
  check_task('gym', task)
  env = gym.make(task, disable_env_checker=True,
                 **({'render_mode': 'rgb_array'} if render else {}))
  try:
    return GymWrapper(env, seed)
  except (ValueError, TypeError) as e:   # a space acme cannot convert
    env.close()
    raise ValueError(f'{task}: gym spaces not supported (observation '
                     f'{env.observation_space}, action {env.action_space}): '
                     f'{e}') from e


def make_env(suite: str, task: str, action_repeat: int, seed: int, *,
             time_limit: Optional[float] = None,
             environment_kwargs: Optional[dict] = None,
             env_factory: Optional[EnvFactory] = None,
             render: bool = False) -> ProtocolEnv:
  """One env of ``suite`` with the DreamerV3 protocol (module doc).

  ``time_limit`` (simulated seconds) is dm_control's; ``render`` makes gym
  envs render rgb_array frames (dm_control renders through its physics)."""
  if env_factory is not None:
    suite = 'custom'
  if suite == 'dmc':
    from experiments.envs import DMCEnv
    return DMCEnv(task, action_repeat, seed=seed, time_limit=time_limit,
                  environment_kwargs=environment_kwargs)
  if time_limit is not None:
    raise ValueError(f'--time_limit (simulated seconds) is a dm_control '
                     f'setting; suite {suite!r} envs end by their own limits')
  if suite == 'gym':
    return ProtocolEnv(make_gym(task, seed, render), action_repeat, task, seed)
  if suite == 'custom':
    if env_factory is None:
      raise ValueError("suite 'custom' needs an env_factory(seed) -> "
                       'dm_env.Environment')
    env = env_factory(seed)
    if not isinstance(env, dm_env.Environment):
      raise ValueError(f'env_factory({seed}) returned {type(env).__name__}, '
                       'not a dm_env.Environment')
    return ProtocolEnv(env, action_repeat, task, seed)
  raise ValueError(f'unknown suite {suite!r}; valid: {", ".join(SUITES)}')
