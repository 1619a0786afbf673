"""Data layout shared by the actor, the replay and the learner.

One stored replay step (spec 5.1, 5.7) is a nested dict:

  observation  {key: float32[...]}  vector obs, keys with '/' replaced by '_'
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

from agent.config import DreamerConfig, latent_store_np_dtype
from reverb_tables.step_checks import DEFAULT_VALUE_LIMIT, StepBounds

OBS_KEY = 'observation'
LATENT_KEY = 'latent'
STEP_KEYS = ('observation', 'action', 'reward', 'is_first', 'is_last',
             'is_terminal', 'latent', 'step_id')


@dataclasses.dataclass(frozen=True)
class EnvSpaces:
  """What the agent needs to know of an environment.

  obs: {key: shape} of float32 vector observations (spec 2.9).
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
      if len(tuple(shape)) > 2:
        raise ValueError(f'observation {k!r} has rank {len(shape)} > 2 '
                         '(vector observations only, spec 2.9)')
    if self.act_dim <= 0:
      raise ValueError(f'act_dim must be positive, got {self.act_dim}')

  @property
  def obs_keys(self):
    """Sorted keys (spec 1.7 DictConcat order)."""
    return tuple(sorted(self.obs))


def step_spec(spaces: EnvSpaces, config: DreamerConfig) -> dict:
  """dm_env specs of one stored step (the Reverb signature, per step)."""
  return {
      OBS_KEY: {k: specs.Array(tuple(s), np.float32, name=f'observation/{k}')
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
