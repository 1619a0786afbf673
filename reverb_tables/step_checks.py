"""What makes a stored step's values valid (spec 5.1, 5.7, 2.9): one rule,
used where steps enter the replay and where they leave it.

``WindowAdder`` refuses a step with any of these problems before anything is
written (a ValueError naming the key); ``ReplaySampler`` drops a sampled
item that has one (an item that reached the server some other way, e.g.
by a client that wrote to the Reverb port directly) instead of training on
it; ``LatentStore`` never stores a latent that is not finite.

  observation, action, reward   finite (no NaN or Inf)
  latent/deter                  finite; bf16 bits (uint16): exponent not all
                                ones (spec 5.7)
  latent/stoch                  class indices < classes (spec 5.7)
  step_id                       worker in [0, num_workers), index >= 0
                                (spec 5.1 'stepid')

Shapes and dtypes are the adder's own check (and the table signature's).
"""

from __future__ import annotations

from typing import Any, Dict, Mapping, Optional, Tuple

import numpy as np

FINITE_ROOTS = ('observation', 'action', 'reward')
_BF16_EXPONENT = 0x7F80


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
                  num_workers: Optional[int] = None
                  ) -> Tuple[np.ndarray, Dict[str, str]]:
  """Rows with a problem of the module doc in ``steps`` (the nested layout
  of ``agent.types`` with ``lead_ndim`` leading axes).

  Returns (bad: bool of the first axis, or a scalar for ``lead_ndim`` 0;
  {key: what is wrong} for every key with a problem, in key order)."""
  bad = None
  reasons: Dict[str, str] = {}

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
