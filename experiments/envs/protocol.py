"""Any vector- or image-observation ``dm_env.Environment`` under the DreamerV3 env protocol.

``ProtocolEnv(env, action_repeat, name)`` is what ``experiments.envs.vector.VectorEnv``
steps, whatever the suite (dm_control, gym through ``experiments.envs.suites``, or
a user's own ``dm_env`` factory). Spec items implemented here:

  7.2  Episode protocol: a reset gives reward 0, is_first True, is_terminal
       False; is_terminal = (dm_env discount == 0) on a LAST step, so a
       time-limit end (``dm_env.truncation``, discount 1) gives is_last
       without is_terminal and a true termination gives both; the step after
       is_last is a reset (auto-reset), whatever action comes with it.
  7.4  Continuous actions: ClipAction to [-1, 1] (outermost) then
       NormalizeAction to the spec's [low, high]; dimensions without finite
       bounds pass the clipped value. The replay keeps the unclipped sample
       (the actor's job). A scalar float action spec counts as shape (1,).
  3.14 Discrete actions (``specs.DiscreteArray``, or an integer
       ``BoundedArray`` of shape ()): ``spaces.discrete`` is True and
       ``act_dim`` the number of actions; ``step`` takes the action index
       (0..n-1, offset by the spec's minimum for the env) while the actor
       stores its one-hot.
  7.5  Action repeat: rewards summed, stopping early at a LAST step; reset
       steps are not repeated.
  2.9  Vector observations: a dict of arrays (nested dicts are flattened
       with '_', '/' becomes '_') or a single array (key ``'vector'``, or
       ``'image'`` for a single image);
       scalars become shape (1,), values float32.
  2.10 Images: a uint8 observation of rank 3 (H, W, C) is an image key,
       passed on as uint8. A float or other-rank image, or a side outside the
       CNN's resolution rule, is refused at construction naming the key.
       Every emitted observation is checked for its shape (an image's channel
       count cannot change), its dtype (an image stays uint8), finite values
       (vectors) and keys the spec does not have; a bad one raises
       ``ObservationError`` naming the key before the caller sees (or
       stores) it.

Each obs dict also holds 'reward' (float32 scalar), 'is_first', 'is_last' and
'is_terminal' (bool scalars); reward is the reward received on entering the
obs (spec 2.15).
"""

from __future__ import annotations

import difflib
from typing import Any, Dict, List, Optional, Tuple

import dm_env as dm_env_lib
import numpy as np
from dm_env import specs

from agent import cnn
from agent.types import EnvSpaces, is_image_shape

RESERVED_KEYS = ('reward', 'is_first', 'is_last', 'is_terminal')
SINGLE_OBS_KEY = 'vector'
SINGLE_IMAGE_KEY = 'image'       # a single uint8 (H, W, C) array


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


class ObservationError(ValueError):
  """An observation the agent cannot take (wrong shape, non-finite, image)."""


def check_repeat(action_repeat) -> int:
  if (isinstance(action_repeat, bool) or not isinstance(action_repeat, (int, np.integer))
      or action_repeat < 1):
    raise ValueError(f'action_repeat must be an integer >= 1, got {action_repeat!r}')
  return int(action_repeat)


def _flatten_spec(spec, prefix='') -> List[Tuple[Tuple[str, ...], str, Any]]:
  """[(path, key, array spec)] of a dict (possibly nested) or a single array."""
  if isinstance(spec, specs.Array):
    image = len(spec.shape) == 3 and np.dtype(spec.dtype) == np.uint8
    return [((), prefix or (SINGLE_IMAGE_KEY if image else SINGLE_OBS_KEY), spec)]
  if isinstance(spec, dict) or hasattr(spec, 'items'):
    out = []
    for raw, sub in spec.items():
      key = (f'{prefix}_{raw}' if prefix else str(raw)).replace('/', '_')
      out += [((raw,) + path, k, s) for path, k, s in _flatten_spec(sub, key)]
    return out
  raise ValueError(f'observation spec {type(spec).__name__} is not supported: '
                   'give a dm_env Array or a dict of Arrays (vector observations, '
                   'spec 2.9)')


def _image_problem(key: str, shape, dtype):
  """What keeps an image-like observation out (spec 2.10), or None."""
  if len(shape) == 3 and dtype == np.uint8:
    return cnn.image_shape_problem(key, shape)
  if len(shape) == 3:
    return (f'observation {key!r} of shape {shape} is an image of dtype {dtype}: '
            'images must be uint8 (H, W, C) with values 0-255 (spec 2.10); '
            'convert it, e.g. (x * 255).astype(np.uint8)')
  if len(shape) > 3:
    return (f'observation {key!r} has rank {len(shape)} (shape {shape}): give a '
            'vector (rank <= 2) or one (H, W, C) uint8 image per key')
  if dtype == np.uint8 and len(shape) == 2:
    return (f'observation {key!r} of shape {shape} and dtype uint8 looks like '
            'a single-channel image without its channel axis: give it as '
            f'({shape[0]}, {shape[1]}, 1), or as float32 if it is a vector')
  return None


def observation_keys(spec, name: str):
  """[(path, key, shape)] and {key: shape} from an observation spec (module doc)."""
  keys, shapes = [], {}
  for path, key, arr in _flatten_spec(spec):
    shape = tuple(arr.shape) or (1,)
    dtype = np.dtype(arr.dtype)
    if dtype.kind not in 'biuf':
      raise ObservationError(f'{name}: observation {key!r} has dtype {dtype}, '
                             'not a number')
    problem = _image_problem(key, shape, dtype)
    if problem:
      raise ObservationError(f'{name}: {problem}')
    if key in shapes:
      raise ObservationError(f'{name}: observation keys collide after flattening: '
                             f'{key!r}')
    if key in RESERVED_KEYS:
      raise ObservationError(f'{name}: observation key {key!r} is reserved')
    shapes[key] = shape
    keys.append((path, key, shape))
  if not keys:
    raise ObservationError(f'{name}: the observation spec has no arrays')
  return keys, shapes


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
    self._keys, shapes = observation_keys(self.observation_spec(), self.task)
    spec = env.action_spec()
    if not isinstance(spec, specs.Array):
      raise ValueError(f'{self.task}: action spec {type(spec).__name__} is not '
                       'supported: give one bounded float Array (continuous) or '
                       'a DiscreteArray')
    kind = np.dtype(spec.dtype).kind
    self.discrete = isinstance(spec, specs.DiscreteArray) or (
        kind in 'iu' and tuple(spec.shape) == ())
    self._act_dtype = spec.dtype
    if self.discrete:
      low = int(np.asarray(getattr(spec, 'minimum', 0)))
      if isinstance(spec, specs.DiscreteArray):
        low, count = 0, int(spec.num_values)
      elif isinstance(spec, specs.BoundedArray):
        count = int(np.asarray(spec.maximum)) - low + 1
      else:
        raise ValueError(f'{self.task}: an integer action spec needs bounds '
                         '(BoundedArray or DiscreteArray)')
      if count < 2:
        raise ValueError(f'{self.task}: a discrete action spec needs >= 2 '
                         f'actions, has {count}')
      self._act_dim, self._index_offset = count, low
    else:
      if kind != 'f' or len(spec.shape) > 1:
        raise ValueError(
            f'{self.task}: action spec of shape {tuple(spec.shape)} and dtype '
            f'{np.dtype(spec.dtype)} is not supported: continuous actions are a '
            'float vector, discrete ones a DiscreteArray')
      shape = tuple(spec.shape) or (1,)
      self._scalar_action = tuple(spec.shape) == ()
      self._act_dim = int(shape[0])
      low = np.broadcast_to(np.asarray(getattr(spec, 'minimum', -np.inf),
                                       np.float64), shape)
      high = np.broadcast_to(np.asarray(getattr(spec, 'maximum', np.inf),
                                        np.float64), shape)
      self._bounded = np.isfinite(low) & np.isfinite(high)
      self._low = np.where(self._bounded, low, -1.0)
      self._high = np.where(self._bounded, high, 1.0)
    self._spaces = EnvSpaces(obs=shapes, act_dim=self._act_dim,
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
    return self._act_dim

  @property
  def action_repeat(self) -> int:
    return self._repeat

  @property
  def action_low(self) -> np.ndarray:
    """The env's own action bounds (what [-1, 1] is mapped to, spec 7.4)."""
    return self._low.copy()

  @property
  def action_high(self) -> np.ndarray:
    return self._high.copy()

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
    """Validate a policy action: float64 [A], or an int index if discrete."""
    try:
      arr = np.asarray(action)
    except Exception as e:  # ragged nested lists and the like
      raise ValueError(f'{self.task}: action is not an array: {e}') from e
    if arr.dtype.kind not in 'biuf':
      raise ValueError(f'{self.task}: action must be numeric, got dtype {arr.dtype}')
    if self.discrete:
      if arr.shape not in ((), (1,)) or arr.dtype.kind == 'f' and not (
          np.isfinite(arr).all() and float(arr.reshape(())).is_integer()):
        raise ValueError(f'{self.task}: a discrete action is one integer index, '
                         f'got {arr.tolist()!r} of shape {arr.shape}')
      index = int(arr.reshape(()))
      if not 0 <= index < self._act_dim:
        raise ValueError(f'{self.task}: action index {index} is outside '
                         f'[0, {self._act_dim})')
      return index
    if arr.shape != (self._act_dim,):
      raise ValueError(f'{self.task}: action has shape {arr.shape}, expected '
                       f'({self._act_dim},)')
    arr = arr.astype(np.float64)
    bad = ~np.isfinite(arr)
    if bad.any():
      raise ValueError(f'{self.task}: action has non-finite values (NaN/inf) at '
                       f'indices {np.flatnonzero(bad).tolist()}: {arr.tolist()}')
    return arr

  def env_action(self, action, checked: bool = False):
    """What the env sees: the index (+ the spec's minimum), or the action
    clipped to [-1, 1] and mapped to [low, high] (spec 7.4)."""
    if not checked:
      action = self.check_action(action)
    if self.discrete:
      return np.asarray(action + self._index_offset, self._act_dtype)
    clipped = np.clip(action, -1.0, 1.0)
    mapped = self._low + (clipped + 1.0) / 2.0 * (self._high - self._low)
    out = np.where(self._bounded, mapped, clipped).astype(self._act_dtype)
    return out.reshape(()) if self._scalar_action else out

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
  def _check_keys(self, observation):
    """A top-level key the spec lacks (e.g. an image that appears mid-episode)
    is an error, not silently dropped."""
    if not hasattr(observation, 'keys') or not self._keys or not self._keys[0][0]:
      return
    known = {path[0] for path, _, _ in self._keys}
    extra = sorted(str(k) for k in observation.keys() if k not in known)
    if extra:
      raise ObservationError(
          f'{self.task}: observation key(s) {extra} are not in the observation '
          f'spec (keys {sorted(str(k) for k in known)}); the keys of a run are '
          'fixed by the spec at the start')

  def _obs(self, time_step, reward: float) -> Dict[str, np.ndarray]:
    obs = {}
    observation = self.observation(time_step)
    self._check_keys(observation)
    for path, key, shape in self._keys:
      value = observation
      image = is_image_shape(shape)
      try:
        for part in path:
          value = value[part]
        arr = np.asarray(value) if image else np.asarray(value, np.float32)
      except (KeyError, TypeError, ValueError) as e:
        raise ObservationError(f'{self.task}: observation {key!r} is missing or '
                               f'not numeric ({type(e).__name__}: {e})') from e
      if image:
        if arr.shape != shape or arr.dtype != np.uint8:
          raise ObservationError(
              f'{self.task}: image {key!r} is {arr.dtype} {arr.shape}, the spec '
              f'says uint8 {shape} (spec 2.10: its size, channel count and '
              'dtype are fixed for the run)')
        obs[key] = arr
        continue
      if arr.size != int(np.prod(shape)):
        raise ObservationError(f'{self.task}: observation {key!r} has shape '
                               f'{arr.shape}, the spec says {shape}')
      arr = arr.reshape(shape)
      if not np.isfinite(arr).all():
        raise ObservationError(f'{self.task}: observation {key!r} has non-finite '
                               f'values (NaN/inf): {arr.tolist()}')
      obs[key] = arr
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
