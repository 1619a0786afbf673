"""gymnasium 1.x tasks as ``dm_env`` environments (spec 7.2, 3.14, 2.9).

Why not acme's ``GymWrapper`` (which ``experiments/envs/gym.py`` adapts for
gym 0.26): it converts ``gym.spaces`` classes only, and gymnasium's spaces are
other classes; acme 0.4.0 has no gymnasium wrapper. So this small
``dm_env.Environment`` does the same job for gymnasium's API:

* ``reset()`` calls ``env.reset(seed=seed)`` once with the env's seed, later
  resets without one (gymnasium's seeding), and returns ``dm_env.restart``;
* ``step`` maps ``terminated`` to ``dm_env.termination`` (discount 0:
  is_terminal, spec 7.2) and ``truncated`` alone to ``dm_env.truncation``
  (is_last only);
* spaces: ``Box`` observations become one array (the protocol's key
  ``'vector'``), a ``Dict`` of ``Box`` keeps its keys; ``Box`` actions are
  continuous (the protocol maps [-1, 1] onto their bounds, spec 7.4),
  ``Discrete`` actions an index (spec 3.14). Any other space raises
  ValueError naming it (and the key, in a ``Dict``).
"""

from __future__ import annotations

from typing import Optional, Tuple

import dm_env
import numpy as np
from dm_env import specs

from experiments.envs.protocol import did_you_mean, gym_step_timestep


def _import():
  import gymnasium  # lazy: only runs of --suite=gymnasium need it
  return gymnasium


def task_names() -> Tuple[str, ...]:
  """Every registered gymnasium task id."""
  return tuple(sorted(_import().envs.registry.keys()))


def unknown_task_message(task: str, names) -> str:
  return (f'Unknown gymnasium task {task!r}.{did_you_mean(task, names)} '
          f'Registered gymnasium tasks: '
          f'{", ".join(names)}')


def _box_spec(space, name: str) -> specs.BoundedArray:
  return specs.BoundedArray(space.shape, space.dtype, space.low, space.high,
                            name=name)


def observation_spec(space, task: str):
  """dm_env spec of a gymnasium observation space (module doc)."""
  spaces = _import().spaces
  if isinstance(space, spaces.Box):
    return _box_spec(space, 'observation')
  if isinstance(space, spaces.Dict):
    out = {}
    for key, sub in space.spaces.items():
      if not isinstance(sub, spaces.Box):
        raise ValueError(f'{task}: observation key {key!r} is a '
                         f'{type(sub).__name__} space; only Box observations (vectors, '
                         'or uint8 (H, W, C) images) are supported')
      out[key] = _box_spec(sub, key)
    return out
  raise ValueError(f'{task}: observation space {space} is not supported; use '
                   'a Box or a Dict of Box (vectors, or uint8 (H, W, C) images)')


def action_spec(space, task: str):
  """dm_env spec of a gymnasium action space (module doc)."""
  spaces = _import().spaces
  if isinstance(space, spaces.Discrete):
    if int(space.start) != 0:
      return specs.BoundedArray((), np.int64, int(space.start),
                                int(space.start) + int(space.n) - 1,
                                name='action')
    return specs.DiscreteArray(int(space.n), name='action')
  if isinstance(space, spaces.Box):
    return _box_spec(space, 'action')
  raise ValueError(f'{task}: action space {space} is not supported; use Box '
                   '(continuous) or Discrete')


class GymnasiumEnv(dm_env.Environment):
  """One gymnasium 1.x env under ``dm_env`` (module doc)."""

  def __init__(self, env, task: str, seed: Optional[int] = None):
    self._env = env
    self._seed = seed
    try:
      self._obs_spec = observation_spec(env.observation_space, task)
      self._act_spec = action_spec(env.action_space, task)
    except ValueError:
      env.close()
      raise
    self._reset_next_step = True

  def reset(self) -> dm_env.TimeStep:
    seed, self._seed = self._seed, None     # seed the first reset only
    obs, _ = self._env.reset(seed=seed)
    self._reset_next_step = False
    return dm_env.restart(obs)

  def step(self, action) -> dm_env.TimeStep:
    if self._reset_next_step:
      return self.reset()
    action = np.asarray(action)
    if isinstance(self._act_spec, specs.DiscreteArray) or (
        np.issubdtype(self._act_spec.dtype, np.integer)):
      action = int(action)
    obs, reward, terminated, truncated, _ = self._env.step(action)
    self._reset_next_step = bool(terminated or truncated)
    return gym_step_timestep(np.float32(reward), obs, terminated, truncated)

  def observation_spec(self):
    return self._obs_spec

  def action_spec(self):
    return self._act_spec

  def render(self):
    return self._env.render()

  def close(self) -> None:
    self._env.close()


def make_gymnasium(task: str, seed: Optional[int],
                   render: bool = False) -> GymnasiumEnv:
  """A registered gymnasium task as a dm_env; ``render`` asks for
  ``render_mode='rgb_array'`` frames."""
  gymnasium = _import()
  names = task_names()
  if task not in names:
    raise ValueError(unknown_task_message(task, names))
  env = gymnasium.make(task, **({'render_mode': 'rgb_array'} if render else {}))
  return GymnasiumEnv(env, task, seed)
