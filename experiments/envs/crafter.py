"""Crafter (Hafner 2021, the ``crafter`` package) under the DreamerV3 env protocol.

The official semantics (embodied/envs/crafter.py at e3f0224, the crafter
config of dreamerv3/configs.yaml; spec 7.6):

* tasks 'reward' (crafter's reward: +1 on a step that unlocks an
  achievement for the first time in the episode, plus the change of health
  / 10) and 'noreward' (reward 0, same world);
* one 64x64 RGB uint8 'image' key, 17 discrete actions (spec 3.14), no
  action repeat;
* an episode ends at death (a termination: is_terminal, discount 0) or at
  crafter's length cap of 10000 steps (a truncation: is_last only, spec 7.2).

Achievements never reach the world model: the official env puts them in
``log/`` observation keys that its agent ignores; here they are not
observation keys at all. ``CrafterEnv.episode_stats()`` (read through
``ProtocolEnv.episode_stats`` when an episode ends) gives the episode's
achievement counts, which go to the scores file, never to the replay.
"""

from __future__ import annotations

import importlib
from typing import Dict, Optional, Tuple

import dm_env
import numpy as np
from dm_env import specs

import agent  # noqa: F401  (quiets gym's import notice before crafter imports gym)
from experiments.envs.protocol import did_you_mean

TASKS: Tuple[str, ...] = ('reward', 'noreward')
IMAGE_SIZE = (64, 64)
IMAGE_KEY = 'image'
PACKAGE = 'crafter==1.8.3'
# Crafter's own episode cap (crafter.Env(length=10000)), kept as the official.
EPISODE_LENGTH = 10000
# The official crafter config has no action repeat.
ACTION_REPEAT = 1


def import_crafter():
  """The ``crafter`` package, or ImportError naming what to install."""
  try:
    return importlib.import_module('crafter')
  except ImportError as e:
    raise ImportError(f'--suite=crafter needs the crafter package: pip install '
                      f'{PACKAGE} (import failed: {e})') from e


def check_task(task: str) -> None:
  """ValueError for a task that is not one of ``TASKS``, naming them."""
  if task not in TASKS:
    raise ValueError(f'unknown Crafter task {task!r}.{did_you_mean(task, TASKS)} '
                     f'Valid tasks: {", ".join(TASKS)}')


def check_action_repeat(action_repeat) -> None:
  """ValueError unless ``action_repeat`` is the official 1."""
  if action_repeat != ACTION_REPEAT:
    raise ValueError(f'--action_repeat must be {ACTION_REPEAT} for Crafter '
                     f'(the official crafter config), got {action_repeat!r}')


def achievement_names() -> Tuple[str, ...]:
  """Crafter's 22 achievements, in the package's order."""
  return tuple(import_crafter().constants.achievements)


class CrafterEnv(dm_env.Environment):
  """``crafter.Env`` as a ``dm_env.Environment`` (module doc).

    env = ProtocolEnv(CrafterEnv('reward', seed=0), 1, 'crafter_reward', 0)

  Written here because crafter has only a gym-style API, and acme's
  GymWrapper needs gym spaces that crafter makes only when gym imports."""

  def __init__(self, task: str, seed: Optional[int]):
    check_task(task)
    self._env = import_crafter().Env(size=IMAGE_SIZE, reward=(task == 'reward'),
                                     length=EPISODE_LENGTH, seed=seed)
    self._num_actions = int(self._env.action_space.n)
    self._info: Optional[dict] = None

  def reset(self) -> dm_env.TimeStep:
    self._info = None
    return dm_env.restart({IMAGE_KEY: self._env.reset()})

  def step(self, action) -> dm_env.TimeStep:
    image, reward, done, info = self._env.step(int(action))
    self._info = info
    obs = {IMAGE_KEY: image}
    if not done:
      return dm_env.transition(reward, obs)
    if info['discount'] == 0:             # the player died
      return dm_env.termination(reward, obs)
    return dm_env.truncation(reward, obs)  # the length cap

  def observation_spec(self):
    return {IMAGE_KEY: specs.Array(IMAGE_SIZE + (3,), np.uint8, name=IMAGE_KEY)}

  def action_spec(self):
    return specs.DiscreteArray(self._num_actions, name='action')

  def render(self, size=(256, 256)) -> np.ndarray:
    """A larger RGB frame of the same view, for videos
    (``experiments/tools/watch.py``); crafter draws it at any size."""
    return np.asarray(self._env.render(size), np.uint8)

  def episode_stats(self) -> Dict[str, Dict[str, int]]:
    """{'achievements': {name: times done this episode}} for all 22 (0 if
    never); {} before the first step of an episode."""
    if self._info is None:
      return {}
    return {'achievements': {str(k): int(v) for k, v in
                             sorted(self._info['achievements'].items())}}
