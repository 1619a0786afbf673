"""The action rule of one env under the DreamerV3 env protocol.

``ActionSpace(spec, task)`` reads a ``dm_env`` action spec once; ``check``
validates a policy action and ``to_env`` turns it into what the env steps
with. ``experiments.envs.protocol.ProtocolEnv`` holds one per env. Spec
items implemented here:

  7.4  Continuous actions: ClipAction to [-1, 1] (outermost) then
       NormalizeAction to the spec's [low, high]; dimensions without finite
       bounds pass the clipped value. The replay keeps the unclipped sample
       (the actor's job). A scalar float action spec counts as shape (1,).
  3.14 Discrete actions (``specs.DiscreteArray``, or an integer
       ``BoundedArray`` of shape ()): ``discrete`` is True and ``dim`` the
       number of actions; ``check`` takes the action index (0..n-1) and
       ``to_env`` offsets it by the spec's minimum, while the actor stores
       its one-hot.
"""

from __future__ import annotations

import numpy as np
from dm_env import specs


class ActionSpace:
  """One env's actions (module doc): ``discrete``, ``dim`` and, for
  continuous actions, the bounds ``low`` / ``high`` that [-1, 1] maps to
  (``bounded``: the dimensions with finite ones)."""

  def __init__(self, spec, task: str):
    self.task = task
    if not isinstance(spec, specs.Array):
      raise ValueError(f'{task}: action spec {type(spec).__name__} is not '
                       'supported: give one bounded float Array (continuous) or '
                       'a DiscreteArray')
    kind = np.dtype(spec.dtype).kind
    self.discrete = isinstance(spec, specs.DiscreteArray) or (
        kind in 'iu' and tuple(spec.shape) == ())
    self.dtype = spec.dtype
    if self.discrete:
      low = int(np.asarray(getattr(spec, 'minimum', 0)))
      if isinstance(spec, specs.DiscreteArray):
        low, count = 0, int(spec.num_values)
      elif isinstance(spec, specs.BoundedArray):
        count = int(np.asarray(spec.maximum)) - low + 1
      else:
        raise ValueError(f'{task}: an integer action spec needs bounds '
                         '(BoundedArray or DiscreteArray)')
      if count < 2:
        raise ValueError(f'{task}: a discrete action spec needs >= 2 '
                         f'actions, has {count}')
      self.dim, self.index_offset = count, low
    else:
      if kind != 'f' or len(spec.shape) > 1:
        raise ValueError(
            f'{task}: action spec of shape {tuple(spec.shape)} and dtype '
            f'{np.dtype(spec.dtype)} is not supported: continuous actions are a '
            'float vector, discrete ones a DiscreteArray')
      shape = tuple(spec.shape) or (1,)
      self.scalar = tuple(spec.shape) == ()
      self.dim = int(shape[0])
      low = np.broadcast_to(np.asarray(getattr(spec, 'minimum', -np.inf),
                                       np.float64), shape)
      high = np.broadcast_to(np.asarray(getattr(spec, 'maximum', np.inf),
                                        np.float64), shape)
      self.bounded = np.isfinite(low) & np.isfinite(high)
      self.low = np.where(self.bounded, low, -1.0)
      self.high = np.where(self.bounded, high, 1.0)

  def check(self, action):
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
      if not 0 <= index < self.dim:
        raise ValueError(f'{self.task}: action index {index} is outside '
                         f'[0, {self.dim})')
      return index
    if arr.shape != (self.dim,):
      raise ValueError(f'{self.task}: action has shape {arr.shape}, expected '
                       f'({self.dim},)')
    arr = arr.astype(np.float64)
    bad = ~np.isfinite(arr)
    if bad.any():
      raise ValueError(f'{self.task}: action has non-finite values (NaN/inf) at '
                       f'indices {np.flatnonzero(bad).tolist()}: {arr.tolist()}')
    return arr

  def to_env(self, action):
    """What the env sees of a checked action: the index (+ the spec's
    minimum), or the action clipped to [-1, 1] and mapped to [low, high]
    (spec 7.4)."""
    if self.discrete:
      return np.asarray(action + self.index_offset, self.dtype)
    clipped = np.clip(action, -1.0, 1.0)
    mapped = self.low + (clipped + 1.0) / 2.0 * (self.high - self.low)
    out = np.where(self.bounded, mapped, clipped).astype(self.dtype)
    return out.reshape(()) if self.scalar else out
