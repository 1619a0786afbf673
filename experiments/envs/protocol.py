"""Any vector- or image-observation ``dm_env.Environment`` under the DreamerV3 env protocol.

``ProtocolEnv(env, action_repeat, name)`` is what ``experiments.envs.vector.VectorEnv``
steps, whatever the suite (dm_control, gym through ``experiments.envs.suites``, or
a user's own ``dm_env`` factory). It holds the env's action rule
(``experiments.envs.actions.ActionSpace``: spec 7.4 continuous, 3.14
discrete actions) and its observation reader
(``experiments.envs.observations``: spec 2.9 vectors, 2.10 images). Spec
items implemented here:

  7.2  Episode protocol: a reset gives reward 0, is_first True, is_terminal
       False; is_terminal = (dm_env discount == 0) on a LAST step, so a
       time-limit end (``dm_env.truncation``, discount 1) gives is_last
       without is_terminal and a true termination gives both; the step after
       is_last is a reset (auto-reset), whatever action comes with it.
  7.5  Action repeat: rewards summed, stopping early at a LAST step; reset
       steps are not repeated.

Each obs dict also holds 'reward' (float32 scalar), 'is_first', 'is_last' and
'is_terminal' (bool scalars); reward is the reward received on entering the
obs (spec 2.15).
"""

from __future__ import annotations

import difflib
from typing import Any, Dict, Optional

import dm_env as dm_env_lib
import numpy as np

from agent.types import EnvSpaces
from experiments.envs.actions import ActionSpace
from experiments.envs.observations import (
    ObservationError, ObservationReader, observation_keys)


def gym_step_timestep(reward, observation, terminated: bool,
                      truncated: bool) -> dm_env_lib.TimeStep:
  """The ``dm_env.TimeStep`` of a gym-API step (gym 0.26, gymnasium 1.x),
  spec 7.2: ``terminated`` is a termination (discount 0: is_terminal),
  ``truncated`` alone a truncation (discount 1: is_last only)."""
  if terminated:
    return dm_env_lib.termination(reward, observation)
  if truncated:
    return dm_env_lib.truncation(reward, observation)
  return dm_env_lib.transition(reward, observation)


def did_you_mean(name, choices) -> str:
  """" Did you mean 'x'?" for the names of ``choices`` closest to ``name``
  (difflib, case-insensitive; up to three), or '' when none is close."""
  by_lower = {}
  for choice in choices:
    by_lower.setdefault(str(choice).lower(), str(choice))
  close = difflib.get_close_matches(str(name).lower(), list(by_lower), n=3,
                                    cutoff=0.75)
  if not close:
    return ''
  return f' Did you mean {" or ".join(repr(by_lower[c]) for c in close)}?'


def check_repeat(action_repeat) -> int:
  if (isinstance(action_repeat, bool) or not isinstance(action_repeat, (int, np.integer))
      or action_repeat < 1):
    raise ValueError(f'action_repeat must be an integer >= 1, got {action_repeat!r}')
  return int(action_repeat)


class ProtocolEnv:
  """One env with the DreamerV3 env protocol (module doc).

    env = ProtocolEnv(my_dm_env, action_repeat=1, name='my_env')
    obs = env.reset()                   # reward 0, is_first True
    obs = env.step(action)              # [A] floats in [-1, 1], or an index

  ``step`` validates the action on every call (shape, finiteness, index
  range: ValueError naming the problem); a step after is_last, or before any
  reset, is a reset and ignores the action.
  """

  def __init__(self, env: dm_env.Environment, action_repeat: int = 1,
               name: Optional[str] = None, seed: Optional[int] = None):
    self._repeat = check_repeat(action_repeat)
    self._env = env
    self.task = name or type(env).__name__
    self.seed = seed
    keys, shapes = observation_keys(self.observation_spec(), self.task)
    self._reader = ObservationReader(keys, self.task)
    self._actions = ActionSpace(env.action_spec(), self.task)
    self.discrete = self._actions.discrete
    self._spaces = EnvSpaces(obs=shapes, act_dim=self._actions.dim,
                             discrete=self.discrete)
    self._done = True  # a step() before reset() is a reset (spec 7.2)
    self.control_steps = 0  # inner env.step calls made (not resets)

  # --- description -----------------------------------------------------------
  @property
  def spaces(self) -> EnvSpaces:
    """agent.types.EnvSpaces(obs={key: shape}, act_dim, discrete)."""
    return self._spaces

  @property
  def act_dim(self) -> int:
    return self._actions.dim

  @property
  def action_repeat(self) -> int:
    return self._repeat

  @property
  def action_low(self) -> np.ndarray:
    """The env's own action bounds (what [-1, 1] is mapped to, spec 7.4)."""
    return self._actions.low.copy()

  @property
  def action_high(self) -> np.ndarray:
    return self._actions.high.copy()

  @property
  def dm_env(self):
    """The wrapped dm_env environment."""
    return self._env

  # --- what a suite may add (experiments.envs.dmc renders its images here) ----
  def observation_spec(self):
    """The observation spec the protocol reads (default: the env's)."""
    return self._env.observation_spec()

  def observation(self, time_step):
    """The observation of the agent step that ``time_step`` ends (after the
    repeat; default: the env's own)."""
    return time_step.observation

  def episode_stats(self) -> Dict[str, Any]:
    """Facts about the current episode that the env reports outside its
    observations (so never stored in the replay nor seen by the model), e.g.
    Crafter's unlocked achievements: the wrapped env's ``episode_stats()``
    where it has one, else {}. Read when an episode ends, before the reset."""
    stats = getattr(self._env, 'episode_stats', None)
    return dict(stats()) if stats is not None else {}

  # --- protocol --------------------------------------------------------------
  def reset(self) -> Dict[str, np.ndarray]:
    """Start an episode: obs with reward 0, is_first True, is_terminal False."""
    time_step = self._env.reset()
    self._done = False
    return self._obs(time_step, 0.0)

  def step(self, action) -> Dict[str, np.ndarray]:
    """One agent step (action_repeat env steps); a reset after is_last."""
    action = self.check_action(action)
    if self._done:
      return self.reset()
    env_action = self.env_action(action, checked=True)
    reward = 0.0
    for _ in range(self._repeat):
      time_step = self._env.step(env_action)
      self.control_steps += 1
      reward += float(np.sum(time_step.reward or 0.0))
      if time_step.last():  # is_last or is_terminal: stop early (spec 7.5)
        break
    self._done = time_step.last()
    return self._obs(time_step, reward)

  def check_action(self, action):
    """Validate a policy action: float64 [A], or an int index if discrete
    (``ActionSpace.check``, the one home of the action rule)."""
    return self._actions.check(action)

  def env_action(self, action, checked: bool = False):
    """What the env sees: the index (+ the spec's minimum), or the action
    clipped to [-1, 1] and mapped to [low, high] (spec 7.4)."""
    if not checked:
      action = self.check_action(action)
    return self._actions.to_env(action)

  def close(self):
    close = getattr(self._env, 'close', None)
    if close is not None:
      close()

  def __enter__(self):
    return self

  def __exit__(self, *exc):
    self.close()

  def __repr__(self):
    return (f'{type(self).__name__}({self.task!r}, '
            f'action_repeat={self._repeat}, seed={self.seed!r})')

  # --- internals -------------------------------------------------------------
  def _obs(self, time_step, reward: float) -> Dict[str, np.ndarray]:
    obs = self._reader.read(self.observation(time_step))
    first = bool(time_step.first())
    obs['reward'] = np.float32(0.0 if first else reward)
    if not np.isfinite(obs['reward']):
      raise ObservationError(f'{self.task}: reward is not finite: {reward!r}')
    obs['is_first'] = np.bool_(first)
    obs['is_last'] = np.bool_(time_step.last())
    obs['is_terminal'] = np.bool_(
        time_step.last() and time_step.discount is not None
        and np.all(np.asarray(time_step.discount) == 0))
    return obs
