"""The observations of one env under the DreamerV3 env protocol.

``observation_keys(spec, task)`` reads an observation spec once (refusing
what the agent cannot take); ``ObservationReader(keys, task)`` turns each
observation the env emits into the agent's {key: array}, checking it.
``experiments.envs.protocol.ProtocolEnv`` adds the reward and the episode
flags (``RESERVED_KEYS``). Spec items implemented here:

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
"""

from __future__ import annotations

from typing import Any, Dict, List, Tuple

import numpy as np
from dm_env import specs

from agent import cnn
from agent.types import is_image_shape

RESERVED_KEYS = ('reward', 'is_first', 'is_last', 'is_terminal')
SINGLE_OBS_KEY = 'vector'
SINGLE_IMAGE_KEY = 'image'       # a single uint8 (H, W, C) array


class ObservationError(ValueError):
  """An observation the agent cannot take (wrong shape, non-finite, image)."""


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



class ObservationReader:
  """The agent's {key: array} of each observation an env emits, checked
  against the keys ``observation_keys`` read from its spec (module doc)."""

  def __init__(self, keys, task: str):
    self.keys, self.task = keys, task

  def read(self, observation) -> Dict[str, np.ndarray]:
    """{key: array} of ``observation``; ``ObservationError`` names a bad key."""
    self._check_keys(observation)
    obs = {}
    for path, key, shape in self.keys:
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
    return obs

  def _check_keys(self, observation):
    """A top-level key the spec lacks (e.g. an image that appears mid-episode)
    is an error, not silently dropped."""
    if not hasattr(observation, 'keys') or not self.keys or not self.keys[0][0]:
      return
    known = {path[0] for path, _, _ in self.keys}
    extra = sorted(str(k) for k in observation.keys() if k not in known)
    if extra:
      raise ObservationError(
          f'{self.task}: observation key(s) {extra} are not in the observation '
          f'spec (keys {sorted(str(k) for k in known)}); the keys of a run are '
          'fixed by the spec at the start')
