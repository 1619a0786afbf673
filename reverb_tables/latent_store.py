"""Learner-side store of the freshest replay-context latents (spec 5.7-5.9).

The reference overwrites the stored latents of replayed steps after every
update (spec 5.9) and starts each training row from the stored latent of its
index 0 (spec 5.8, Algorithm J). Reverb items are immutable, so the freshest
latents live here instead, keyed by step id (worker, index) (spec 5.1
'stepid'); the sampler overlays them on the collection-time latents stored in
Reverb (spec 5.7).

Layout: per-worker rings [num_workers, cap] indexed by ``index % cap``, plus a
stored-id array so a lookup only hits a slot that really holds that step.
``cap`` defaults to ``ring_capacity``: ceil(replay_capacity / num_workers) +
seq_len, i.e. the steps of one worker a full replay can reference (spec 5.1
capacity). Arrays grow on demand (doubling) up to ``cap`` as the slots in use
(``index % cap``) reach further, so memory follows the data actually seen
(250K DMC steps at size12m: ~1 GB), not the 5e6 capacity. A worker whose step
ids jump ahead by a multiple of ``cap`` (``id_jump``: an actor restarted in
place, a joined remote actor) starts again at slot 0 and allocates nothing
new.

Write-backs for steps that the ring has already recycled are skipped, like the
reference skips rows whose chunk was evicted (spec 5.6); so are latents that
are not finite or hold a class index >= classes (``reverb_tables.step_checks``:
a diverged update must not hand later batches a NaN replay context), counted
in ``num_invalid``. Stored values use the
packed format of ``agent.latents.pack`` (deter as bf16 bits in uint16 or f32,
stoch as uint8 class indices, spec 5.7).
"""

from __future__ import annotations

import json
import math
from typing import Dict, Mapping, Optional, Tuple

import numpy as np

from reverb_tables.config import ReplayConfig, latent_store_np_dtype
from reverb_tables.files import atomic_write
from reverb_tables.step_checks import finite

_MIN_ALLOC = 1024


def ring_capacity(config: ReplayConfig, num_workers: int) -> int:
  """Default ring size per worker (module doc): the steps of one worker that
  a full replay can reference (spec 5.1 capacity), plus one sequence."""
  config = ReplayConfig.of(config)
  return math.ceil(config.replay_capacity / int(num_workers)) + config.seq_len


def id_jump(config: ReplayConfig, num_workers: int, at_least: int) -> int:
  """The smallest step-id jump >= ``at_least`` that is a multiple of both
  ``seq_len`` (the online queue keeps its phase, spec 5.4) and the ring size
  (the jumped worker restarts at slot 0, so the store allocates nothing new):
  how far a worker's step ids move when a new process takes it over."""
  config = ReplayConfig.of(config)
  unit = math.lcm(ring_capacity(config, num_workers), config.seq_len)
  return max(1, -(-int(at_least) // unit)) * unit


class LatentStore:
  """Freshest packed latents per step id (spec 5.8, 5.9).

  Args:
    config: a ReplayConfig (or any object with its fields, e.g. DreamerConfig);
      reads replay_capacity, seq_len, deter, stoch, latent_store_dtype.
    num_workers: number of env workers (one ring each).
    per_worker_capacity: ring size; see the module doc for the default.
  """

  def __init__(self, config: ReplayConfig, num_workers: int,
               per_worker_capacity: Optional[int] = None):
    config = ReplayConfig.of(config)
    if num_workers <= 0:
      raise ValueError(f'num_workers must be positive, got {num_workers}')
    self._num_workers = int(num_workers)
    if per_worker_capacity is None:
      per_worker_capacity = ring_capacity(config, num_workers)
    if per_worker_capacity <= 0:
      raise ValueError('per_worker_capacity must be positive')
    self._cap = int(per_worker_capacity)
    self._deter_dim = int(config.deter)
    self._stoch_dim = int(config.stoch)
    self._classes = int(config.classes)
    self.num_invalid = 0           # write-backs refused (module doc)
    self._deter_dtype = np.dtype(latent_store_np_dtype(config))
    self._alloc = 0
    self._ids = np.zeros((self._num_workers, 0), np.int64)
    self._deter = np.zeros((self._num_workers, 0, self._deter_dim),
                           self._deter_dtype)
    self._stoch = np.zeros((self._num_workers, 0, self._stoch_dim), np.uint8)

  # -- properties ---------------------------------------------------------------
  @property
  def num_workers(self) -> int:
    return self._num_workers

  @property
  def per_worker_capacity(self) -> int:
    return self._cap

  @property
  def allocated(self) -> int:
    """Slots currently allocated per worker (<= per_worker_capacity)."""
    return self._alloc

  def __len__(self) -> int:
    """Number of steps with a stored latent."""
    return int((self._ids >= 0).sum())

  @property
  def nbytes(self) -> int:
    return self._ids.nbytes + self._deter.nbytes + self._stoch.nbytes

  # -- update / lookup ----------------------------------------------------------
  def update(self, step_ids, latents: Mapping[str, np.ndarray]) -> int:
    """Stores packed latents for step ids [..., 2] (spec 5.9 write-back).

    Args:
      step_ids: int [..., 2] (worker, index).
      latents: {'deter': [..., D] store dtype, 'stoch': [..., S] uint8}, as
        returned by ``agent.latents.pack``.

    Returns:
      The number of entries written (recycled slots are skipped, spec 5.6).
    """
    ids = self._check_ids(step_ids)
    lead = ids.shape[:-1]
    deter = np.asarray(latents['deter'])
    stoch = np.asarray(latents['stoch'])
    if deter.shape != lead + (self._deter_dim,):
      raise ValueError(f'latent deter shape {list(deter.shape)}, expected '
                       f'{list(lead + (self._deter_dim,))}')
    if deter.dtype != self._deter_dtype:
      raise ValueError(f'latent deter dtype {deter.dtype}, expected '
                       f'{self._deter_dtype} (pack with agent.latents.pack)')
    if stoch.shape != lead + (self._stoch_dim,):
      raise ValueError(f'latent stoch shape {list(stoch.shape)}, expected '
                       f'{list(lead + (self._stoch_dim,))} (class indices)')
    if stoch.dtype != np.uint8:
      raise ValueError(f'latent stoch dtype {stoch.dtype}, expected uint8 '
                       '(pack with agent.latents.pack)')
    ids = ids.reshape(-1, 2)
    if not len(ids):
      return 0
    deter = deter.reshape(-1, self._deter_dim)
    stoch = stoch.reshape(-1, self._stoch_dim)
    valid = finite(deter).all(-1) & (stoch < self._classes).all(-1)
    self.num_invalid += int((~valid).sum())
    worker, index = ids[:, 0], ids[:, 1]
    slot = index % self._cap
    self._grow(int(slot.max()) + 1)
    # Skip steps whose slot already holds a newer step (recycled, spec 5.6).
    keep = (self._ids[worker, slot] <= index) & valid
    worker, index, slot = worker[keep], index[keep], slot[keep]
    self._ids[worker, slot] = index
    self._deter[worker, slot] = deter[keep]
    self._stoch[worker, slot] = stoch[keep]
    return int(keep.sum())

  def lookup(self, step_ids) -> Tuple[Dict[str, np.ndarray], np.ndarray]:
    """Returns (packed latents [..., D]/[..., S], found [...] bool).

    Entries that are not found are zeros; use ``found`` to select.
    """
    ids = self._check_ids(step_ids)
    lead = ids.shape[:-1]
    worker = ids[..., 0].reshape(-1)
    index = ids[..., 1].reshape(-1)
    slot = index % self._cap
    inside = slot < self._alloc
    slot_c = np.where(inside, slot, 0)
    if self._alloc:
      found = inside & (self._ids[worker, slot_c] == index)
      deter = self._deter[worker, slot_c]
      stoch = self._stoch[worker, slot_c]
      deter[~found] = 0
      stoch[~found] = 0
    else:
      found = np.zeros(len(index), bool)
      deter = np.zeros((len(index), self._deter_dim), self._deter_dtype)
      stoch = np.zeros((len(index), self._stoch_dim), np.uint8)
    return ({'deter': deter.reshape(lead + (self._deter_dim,)),
             'stoch': stoch.reshape(lead + (self._stoch_dim,))},
            found.reshape(lead))

  # -- persistence ---------------------------------------------------------------
  def save(self, path: str) -> None:
    """Writes an .npz atomically (``reverb_tables.files.atomic_write``)."""
    meta = {'num_workers': self._num_workers, 'cap': self._cap,
            'deter': self._deter_dim, 'stoch': self._stoch_dim,
            'deter_dtype': self._deter_dtype.str, 'alloc': self._alloc}
    atomic_write(path, lambda f: np.savez(
        f, meta=np.asarray(json.dumps(meta)), ids=self._ids,
        deter=self._deter, stoch=self._stoch))

  def restore(self, path: str) -> None:
    """Loads a file written by ``save``; shapes must match this store."""
    with np.load(path, allow_pickle=False) as data:
      meta = json.loads(str(data['meta']))
      mine = {'num_workers': self._num_workers, 'cap': self._cap,
              'deter': self._deter_dim, 'stoch': self._stoch_dim,
              'deter_dtype': self._deter_dtype.str}
      diff = {k: (meta.get(k), v) for k, v in mine.items() if meta.get(k) != v}
      if diff:
        raise ValueError(f'latent store file {path} does not match this store '
                         f'(saved, current): {diff}')
      self._ids = np.array(data['ids'])
      self._deter = np.array(data['deter'])
      self._stoch = np.array(data['stoch'])
    self._alloc = self._ids.shape[1]

  # -- internals ----------------------------------------------------------------
  def _check_ids(self, step_ids) -> np.ndarray:
    ids = np.asarray(step_ids)
    if ids.ndim < 1 or ids.shape[-1] != 2 or ids.dtype.kind not in 'iu':
      raise ValueError(f'step_ids must be int [..., 2], got {ids.dtype}'
                       f'{list(ids.shape)}')
    ids = ids.astype(np.int64, copy=False)
    if ids.size and (ids[..., 0].min() < 0 or
                     ids[..., 0].max() >= self._num_workers):
      raise ValueError(f'step_ids worker outside [0, {self._num_workers})')
    if ids.size and ids[..., 1].min() < 0:
      raise ValueError('step_ids index must be non-negative')
    return ids

  def _grow(self, needed: int) -> None:
    if needed <= self._alloc or self._alloc >= self._cap:
      return
    new = min(self._cap, max(needed, 2 * self._alloc, _MIN_ALLOC))
    extra = new - self._alloc
    w = self._num_workers
    self._ids = np.concatenate(
        [self._ids, np.full((w, extra), -1, np.int64)], 1)
    self._deter = np.concatenate(
        [self._deter, np.zeros((w, extra, self._deter_dim), self._deter_dtype)],
        1)
    self._stoch = np.concatenate(
        [self._stoch, np.zeros((w, extra, self._stoch_dim), np.uint8)], 1)
    self._alloc = new
