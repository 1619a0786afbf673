"""What makes a stored step's values valid (spec 5.1, 5.7, 2.9): one rule,
used where steps enter the replay and where they leave it.

``WindowAdder`` refuses a step with any of these problems before anything is
written (a ValueError naming the key); ``ReplaySampler`` drops a sampled
item that has one (an item that reached the server some other way, e.g.
by a client that wrote to the Reverb port directly) instead of training on
it; ``LatentStore`` never stores a latent that is not finite.

  observation, action, reward   finite (no NaN or Inf), and plausible
                                (``StepBounds``, below)
  latent/deter                  finite; bf16 bits (uint16): exponent not all
                                ones (spec 5.7)
  latent/stoch                  class indices < classes (spec 5.7)
  step_id                       worker in [0, num_workers), index >= 0
                                (spec 5.1 'stepid')

Shapes and dtypes are the adder's own check (and the table signature's).

Plausible values (``StepBounds``): finite is not enough. A remote actor with
the run secret, or anyone who reaches the Reverb port, could store rewards
of 1e30 (symlog only squashes them to ~69), and the return normaliser's
scale follows them (one such actor drove ``ret_scale`` from 1 to 3.5e5 in
12 s). So a float observation, reward or action must lie

  reward    in the env's declared range where it has one (dm_control:
            [0, 1] per control step, summed over the action repeat);
  action    in the policy's range: a one-hot (or all zeros, the is_last
            step's) for a discrete policy; for the bounded-normal one the
            unclipped sample's range (``agent.types.step_bounds``);
  else      |value| <= ``value_limit`` (default ``DEFAULT_VALUE_LIMIT``,
            the run's ``--replay_value_limit``).

Integer leaves (a uint8 image, bool flags) are bounded by their dtype.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Dict, Mapping, Optional, Tuple

import numpy as np

FINITE_ROOTS = ('observation', 'action', 'reward')
_BF16_EXPONENT = 0x7F80
# Largest |value| of a stored observation, reward or action without a
# declared range (module doc). Real envs stay far below: DMC observations
# are O(10), velocities O(100); symlog(1e6) ~ 13.8.
DEFAULT_VALUE_LIMIT = 1e6


@dataclasses.dataclass(frozen=True)
class StepBounds:
  """The plausible values of a stored step (module doc).

  value_limit: largest |value| of a float observation, and of the reward /
    action when they have no range of their own (inf: no limit, finite
    values only).
  reward: (low, high) of a stored reward, where the env declares one.
  action: (low, high) of a stored continuous action (the policy's range).
  one_hot_action: stored actions are one-hot (a discrete policy).
  """
  value_limit: float = DEFAULT_VALUE_LIMIT
  reward: Optional[Tuple[float, float]] = None
  action: Optional[Tuple[float, float]] = None
  one_hot_action: bool = False

  def __post_init__(self):
    limit = self.value_limit
    if isinstance(limit, bool) or not isinstance(limit, (int, float)) or not (
        limit > 0):
      raise ValueError(f'the replay value limit (--replay_value_limit) must '
                       f'be > 0 (inf: none), got {limit!r}')
    for name in ('reward', 'action'):
      pair = getattr(self, name)
      if pair is not None and not (
          len(pair) == 2 and all(math.isfinite(v) for v in pair)
          and pair[0] <= pair[1]):
        raise ValueError(f'StepBounds.{name} must be (low, high), finite, '
                         f'low <= high; got {pair!r}')


def _within(x: np.ndarray, pair: Tuple[float, float]) -> np.ndarray:
  # Rewards are summed in float64 and stored as float32: one float32 step
  # of slack so an exact sum at the edge is never refused.
  lo, hi = pair
  slack = 1e-6 * max(1.0, abs(lo), abs(hi))
  return (x >= lo - slack) & (x <= hi + slack)


def _plausible(name: str, x: np.ndarray, bounds: StepBounds):
  """(element-wise ok, what is wrong) of a finite float leaf (module doc)."""
  if name == 'reward' and bounds.reward is not None:
    lo, hi = bounds.reward
    return _within(x, bounds.reward), (
        f"is outside the env's declared range [{lo:g}, {hi:g}]")
  if name == 'action' and bounds.one_hot_action:
    ok = ((x == 0) | (x == 1)) & (np.sum(x, -1, keepdims=True) <= 1)
    return ok, 'is not one-hot (a discrete policy stores one-hot actions)'
  if name == 'action' and bounds.action is not None:
    lo, hi = bounds.action
    return _within(x, bounds.action), (
        f"is outside the policy's range [{lo:g}, {hi:g}]")
  big = float(np.max(np.abs(x))) if x.size else 0.0
  return np.abs(x) <= bounds.value_limit, (
      f'holds |value| {big:.3g} > the replay value limit '
      f'{bounds.value_limit:g} (--replay_value_limit)')


def finite(x: np.ndarray) -> np.ndarray:
  """Element-wise: finite floats; for uint16 (bf16 bits of a packed deter,
  spec 5.7) an exponent that is not all ones; True for other integers."""
  x = np.asarray(x)
  if x.dtype.kind == 'f':
    return np.isfinite(x)
  if x.dtype == np.uint16:
    return (x & _BF16_EXPONENT) != _BF16_EXPONENT
  return np.ones(x.shape, bool)


def _flat(tree: Mapping[str, Any], prefix: str = ''):
  for k in sorted(tree):
    v = tree[k]
    name = f'{prefix}{k}'
    if isinstance(v, Mapping):
      yield from _flat(v, name + '/')
    else:
      yield name, np.asarray(v)


def step_problems(steps: Mapping[str, Any], lead_ndim: int, classes: int,
                  num_workers: Optional[int] = None,
                  bounds: Optional[StepBounds] = None
                  ) -> Tuple[np.ndarray, Dict[str, str]]:
  """Rows with a problem of the module doc in ``steps`` (the nested layout
  of ``agent.types`` with ``lead_ndim`` leading axes); ``bounds``: the
  plausible values (None: ``StepBounds()``, the value limit alone).

  Returns (bad: bool of the first axis, or a scalar for ``lead_ndim`` 0;
  {key: what is wrong} for every key with a problem, in key order)."""
  bad = None
  reasons: Dict[str, str] = {}
  bounds = StepBounds() if bounds is None else bounds

  def mark(name, ok, what):
    nonlocal bad
    ok = np.asarray(ok)
    if ok.ndim > lead_ndim:
      ok = ok.reshape(ok.shape[:lead_ndim] + (-1,)).all(-1)
    if lead_ndim > 1:
      ok = ok.reshape(ok.shape[0], -1).all(-1)
    if not ok.all():
      reasons.setdefault(name, what)
    bad = ~ok if bad is None else bad | ~ok

  for name, x in _flat(steps):
    root = name.split('/', 1)[0]
    if root in FINITE_ROOTS and x.dtype.kind == 'f':
      ok = np.isfinite(x)
      mark(name, ok, 'contains NaN' if np.isnan(x).any() else 'contains Inf')
      mark(name, *_plausible(name, np.where(ok, x, 0), bounds))
    elif name == 'latent/deter':
      mark(name, finite(x), 'contains NaN or Inf' + (
          ' (bf16 bits)' if x.dtype == np.uint16 else ''))
    elif name == 'latent/stoch':
      mark(name, x < classes, f'holds a class index >= classes ({classes})')
    elif name == 'step_id' and x.shape[-1:] == (2,):
      ok = (x[..., 0] >= 0) & (x[..., 1] >= 0)
      if num_workers is not None:
        ok &= x[..., 0] < num_workers
      mark(name, ok, 'is outside [0, num_workers) x [0, inf)' if
           num_workers is not None else 'is negative')
  if bad is None:
    bad = np.zeros((), bool)
  return bad, reasons
