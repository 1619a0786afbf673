"""Data layout shared by the actor, the replay and the learner.

One stored replay step (spec 5.1, 5.7) is a nested dict:

  observation  {key: float32[...]}  vector obs, keys with '/' replaced by '_'
               {key: uint8[H, W, C]} image obs (spec 2.10), stored as they come
  action       float32[A]           unclipped policy sample a_t (zeroed at is_last);
                                    discrete action spaces store a one-hot
  reward       float32[]            reward that entered obs_t (0 at is_first)
  is_first, is_last, is_terminal     bool[]
  latent       {deter: uint16[D] (bf16 bits) or float32[D], stoch: uint8[S]}
                                    posterior h_t, z_t after filtering obs_t
                                    (z_t as class indices: lossless, spec 5.7)
  step_id      int64[2]             (worker, index in that worker's stream)

A training batch has the same tree with leading [B, T + 1] axes (spec 5.8):
index 0 is the replay context, indices 1..T are trained.
"""

from __future__ import annotations

import dataclasses
from typing import Mapping, Optional, Tuple

import numpy as np
from dm_env import specs

from agent import cnn
from agent.config import DreamerConfig, latent_store_np_dtype
from reverb_tables.step_checks import DEFAULT_VALUE_LIMIT, StepBounds

OBS_KEY = 'observation'
LATENT_KEY = 'latent'
STEP_KEYS = ('observation', 'action', 'reward', 'is_first', 'is_last',
             'is_terminal', 'latent', 'step_id')


@dataclasses.dataclass(frozen=True)
class EnvSpaces:
  """What the agent needs to know of an environment.

  obs: {key: shape}. Rank <= 2: a float32 vector observation (spec 2.9);
    rank 3: a uint8 (H, W, C) image (spec 2.10, an image key is a uint8
    observation of rank 3, so the rank alone says which it is).
  act_dim: width of the stored action vector.
  discrete: True for a one-hot categorical action of act_dim classes (3.14).
  """
  obs: Mapping[str, Tuple[int, ...]]
  act_dim: int
  discrete: bool = False

  def __post_init__(self):
    if not self.obs:
      raise ValueError('EnvSpaces.obs is empty: need at least one observation key')
    for k, shape in self.obs.items():
      if k in ('reward', 'is_first', 'is_last', 'is_terminal'):
        raise ValueError(f'observation key {k!r} is reserved')
      if len(tuple(shape)) > 3:
        raise ValueError(f'observation {k!r} has rank {len(shape)} > 3: give '
                         'a vector (rank <= 2, spec 2.9) or an (H, W, C) '
                         'image (spec 2.10)')
      if is_image_shape(shape):
        problem = cnn.image_shape_problem(k, shape)
        if problem:
          raise ValueError(problem)
    if self.image_keys:
      cnn.stacked_shape(self.obs, self.image_keys)  # one H, W for all images
    if self.act_dim <= 0:
      raise ValueError(f'act_dim must be positive, got {self.act_dim}')

  @property
  def obs_keys(self):
    """Sorted keys (spec 1.7 DictConcat order)."""
    return tuple(sorted(self.obs))

  @property
  def vector_keys(self):
    """Sorted keys of the vector observations (spec 2.9)."""
    return tuple(k for k in self.obs_keys if not is_image_shape(self.obs[k]))

  @property
  def image_keys(self):
    """Sorted keys of the uint8 (H, W, C) images (spec 2.10)."""
    return tuple(k for k in self.obs_keys if is_image_shape(self.obs[k]))

  def obs_dtype(self, key: str):
    """uint8 for an image key, float32 for a vector key."""
    return np.uint8 if is_image_shape(self.obs[key]) else np.float32


def obs_array(spaces: EnvSpaces, key: str, value, lead: Tuple[int, ...]):
  """``value`` of observation ``key`` as the array the networks take: float32
  for a vector key; for an image key the uint8 array itself (a float image is
  refused, not cast: its scale is unknown, spec 2.10). ValueError names the
  key on a wrong dtype or shape (``lead`` + the key's shape)."""
  want = tuple(lead) + tuple(spaces.obs[key])
  if key in spaces.image_keys:
    v = np.asarray(value)
    if v.dtype != np.uint8:
      raise ValueError(f'image {key!r} has dtype {v.dtype}; images are uint8 '
                       '0-255 (spec 2.10)')
  else:
    v = np.asarray(value, np.float32)
  if v.shape != want:
    raise ValueError(f'observation {key!r} has shape {v.shape}, expected {want}')
  return v


def is_image_shape(shape) -> bool:
  """An (H, W, C) shape: the one rank that holds a uint8 image (spec 2.10)."""
  return len(tuple(shape)) == 3


def step_spec(spaces: EnvSpaces, config: DreamerConfig) -> dict:
  """dm_env specs of one stored step (the Reverb signature, per step)."""
  return {
      OBS_KEY: {k: specs.Array(tuple(s), spaces.obs_dtype(k),
                               name=f'observation/{k}')
                for k, s in sorted(spaces.obs.items())},
      'action': specs.Array((spaces.act_dim,), np.float32, name='action'),
      'reward': specs.Array((), np.float32, name='reward'),
      'is_first': specs.Array((), np.bool_, name='is_first'),
      'is_last': specs.Array((), np.bool_, name='is_last'),
      'is_terminal': specs.Array((), np.bool_, name='is_terminal'),
      LATENT_KEY: {
          'deter': specs.Array((config.deter,), latent_store_np_dtype(config),
                               name='latent/deter'),
          'stoch': specs.Array((config.stoch,), np.uint8, name='latent/stoch'),
      },
      'step_id': specs.Array((2,), np.int64, name='step_id'),
  }


def step_bytes(spaces: EnvSpaces, config: DreamerConfig) -> int:
  """Bytes of one stored step before Reverb's chunk compression: the
  packed row of every leaf of ``step_spec`` (12,288 of them a 64x64x3 image)."""
  import jax
  return sum(int(np.prod(s.shape)) * np.dtype(s.dtype).itemsize
             for s in jax.tree_util.tree_leaves(step_spec(spaces, config)))


def step_bounds(spaces: EnvSpaces, config: DreamerConfig, *,
                reward: Optional[Tuple[float, float]] = None,
                value_limit: float = DEFAULT_VALUE_LIMIT) -> StepBounds:
  """The plausible values of a stored step (``reverb_tables.step_checks``):
  the policy's actions (a one-hot, or the bounded-normal sample's range,
  ``BoundedNormal.sample_range``), the env's declared ``reward`` range
  (None: none declared) and the run's ``value_limit`` for the rest."""
  from agent.distributions import BoundedNormal
  if spaces.discrete:
    return StepBounds(value_limit=value_limit, reward=reward,
                      one_hot_action=True)
  return StepBounds(value_limit=value_limit, reward=reward,
                    action=BoundedNormal.sample_range(config.maxstd))


def zeros_like_spec(spec, leading=()):
  """Zero arrays for a (nested) spec with extra leading axes."""
  import jax
  return jax.tree_util.tree_map(
      lambda s: np.zeros(tuple(leading) + tuple(s.shape), s.dtype), spec)
