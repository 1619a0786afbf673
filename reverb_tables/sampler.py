"""Training / report batches from the Reverb replay (spec 5.3, 5.4, 5.8, 5.9).

``sample_train`` (spec 5.3): the online queue is popped first, oldest first,
without blocking when it is empty (spec 5.4); the remaining rows are drawn
uniformly, independently and with replacement from ``uniform``.
``sample_report`` never pops the queue (spec 5.3, 6.4).

Annotation (spec 5.3): is_first[:, 0] = True; is_last |= is_first shifted left
by one (the last column gets False), marking the step before a mid-window
is_first as last.

Replay context (spec 5.8, 5.9): the latents of every index of every row that
has an entry in the LatentStore (the freshest write-back, always newer than the
collection-time latents stored in Reverb) are replaced by it; in particular
index 0, the context step, starts the RSSM from the freshest stored latent.
``write_back`` stores the posteriors of indices 1..64 after an update.

Seeding (spec 6.5): Reverb's Uniform selector runs inside the server and has
no seed, so uniform draws are not reproducible from ``config.seed`` (the
reference fixes its selector rng to 0; spec 6.5 asks Ajax to derive it from
config.seed). ``seed`` is kept for API stability only; see docs/deviations.md
"Replay".

Unpacking: items are stored as one packed uint8 column [65, width]
(``reverb_tables.packing``); the rows of a batch are stacked once and each leaf
is copied out of the [B, 65, width] buffer into a C-contiguous array of its
spec dtype (~1.5 ms for [16, 65] at size12m), so batches have the nested
layout of ``agent.types`` exactly as before.

Invalid items (defence in depth): every step that enters through
the adder was checked there, but the Reverb port takes inserts from anyone
who reaches it. A sampled item whose column has the wrong shape, or a step
with a problem of ``reverb_tables.step_checks`` (non-finite or implausible
values, latent classes out of range, a step id outside the latent store's
workers: the adder's rule, with the same ``StepBounds``), is
deleted from its table, counted (``num_dropped``, ``replay/dropped_items``)
and replaced by another uniform draw, so it never reaches the update, where
it would be taken for divergence or crash the latent store. After
``MAX_DROPS_IN_A_ROW`` such items without one valid batch the replay is
taken to be unusable and sampling raises.

Queue size check: the queue size is read with ``tables.table_stats`` (the
server info without decoding signatures, ~0.05 ms in process). The local ``reverb.Table.can_sample`` costs < 1 us
but is wrong after a checkpoint restore (the server replaces the Python tables),
and the Python client has no sample timeout, so the server is asked.
"""

from __future__ import annotations

import contextlib
import os
import sys
import threading
from typing import Any, Dict, List, Optional

import numpy as np
import reverb

from reverb_tables.config import ReplayConfig
from reverb_tables.adder import step_layout_from_server
from reverb_tables.latent_store import LatentStore
from reverb_tables.packing import StepLayout
from reverb_tables.step_checks import StepBounds, step_problems
from reverb_tables.tables import ONLINE_TABLE, UNIFORM_TABLE, table_stats

LATENT_KEY = 'latent'
STEP_ID_KEY = 'step_id'
# Invalid items dropped in a row (without one valid batch) after which the
# replay is unusable (module doc).
MAX_DROPS_IN_A_ROW = 10_000


def annotate(batch: Dict[str, Any]) -> Dict[str, Any]:
  """In-place spec 5.3 annotation of a [B, L, ...] batch; returns it."""
  is_first = batch['is_first']
  is_first[:, 0] = True
  nxt = np.zeros_like(is_first)
  nxt[:, :-1] = is_first[:, 1:]
  batch['is_last'] = np.logical_or(batch['is_last'], nxt)
  return batch


class ReplaySampler:
  """Assembles annotated [B, 65, ...] numpy batches (spec 5.3, 5.8).

  Args:
    client: ``reverb.Client`` of the replay server.
    config: a ReplayConfig (or any object with its fields, e.g. DreamerConfig);
      reads batch_size, seq_len, online_queue, seed.
    latent_store: optional LatentStore with write-back latents (spec 5.9).
    seed: unused for item selection (Reverb's Uniform selector is server-side
      and unseedable; module doc and docs/deviations.md "Replay").
    step_spec: per-step spec; read from the ``uniform`` signature if omitted.
    take_online: whether this sampler pops the online queue (spec 5.4). Of
      several learner processes only one does: a queue item popped by
      another process between the size check and the pop would leave this
      one blocked on the empty queue (Reverb's pop cannot time out).
    peer_uniform_rows: uniform rows the other learner processes draw along
      with each batch of this one (they sample in step with it); counted in
      ``num_uniform_rows`` so the row counts, and the spec 6.1 ratio made
      from them, are the whole learner's.
    num_workers: env workers of the step-id layout (the latent store's);
      an item with a step id of another worker is dropped (module doc).
    bounds: the plausible values of a step (``step_checks.StepBounds``,
      the adders'); None: the value limit alone.
  """

  def __init__(self, client: reverb.Client, config: ReplayConfig,
               latent_store: Optional[LatentStore] = None,
               seed: Optional[int] = None, step_spec: Any = None, *,
               uniform_table: str = UNIFORM_TABLE,
               online_table: str = ONLINE_TABLE, take_online: bool = True,
               peer_uniform_rows: int = 0,
               num_workers: Optional[int] = None,
               bounds: Optional[StepBounds] = None):
    config = ReplayConfig.of(config)
    self._bounds = StepBounds() if bounds is None else bounds
    self._client = client
    self._config = config
    self._store = latent_store
    self.seed = config.seed if seed is None else seed
    self._uniform_table = uniform_table
    self._online_table = online_table
    self._take_online = bool(take_online)
    self._peer_rows = int(peer_uniform_rows)
    if step_spec is None:                   # the layout the tables store
      self._layout = step_layout_from_server(client, uniform_table)
    else:
      self._layout = StepLayout.from_step_spec(step_spec)
    if num_workers is None and latent_store is not None:
      num_workers = latent_store.num_workers
    self._num_workers = num_workers
    self.num_online_rows = 0
    self.num_uniform_rows = 0
    self.num_dropped = 0            # invalid items deleted (module doc)
    self.last_drop_reason = ''

  @property
  def latent_store(self) -> Optional[LatentStore]:
    return self._store

  # -- sampling -----------------------------------------------------------------
  def online_size(self) -> int:
    """Items currently in the online queue (spec 5.4)."""
    return int(table_stats(self._client)[self._online_table].current_size)

  def sample_train(self, batch_size: Optional[int] = None) -> Dict[str, Any]:
    """Online rows first (non-blocking), then uniform rows (spec 5.3, 5.4)."""
    batch_size = batch_size or self._config.batch_size
    rows: List[np.ndarray] = []
    if self._config.online_queue and self._take_online:
      num_online = min(batch_size, self.online_size())
      if num_online:
        rows += self._sample(self._online_table, num_online)
        self.num_online_rows += len(rows)
    num_uniform = batch_size - len(rows)
    if num_uniform:
      rows += self._sample(self._uniform_table, num_uniform)
      self.num_uniform_rows += num_uniform
    self.num_uniform_rows += self._peer_rows
    return self._assemble(rows)

  def sample_report(self, batch_size: Optional[int] = None) -> Dict[str, Any]:
    """Uniform rows only; never pops the online queue (spec 5.3, 6.4)."""
    batch_size = batch_size or self._config.batch_size
    return self._assemble(self._sample(self._uniform_table, batch_size))

  # -- write-back ---------------------------------------------------------------
  def write_back(self, step_ids, latents) -> int:
    """Stores fresh posteriors of trained steps (spec 5.9).

    Args:
      step_ids: int [B, T, 2], the batch's ``step_id[:, 1:]``.
      latents: packed {'deter': [B, T, D], 'stoch': [B, T, S] uint8}
        (``agent.latents.pack`` of the training posteriors).
    Returns: entries written.
    """
    if self._store is None:
      raise ValueError('ReplaySampler has no latent_store to write back to')
    latents = {k: np.asarray(v) for k, v in latents.items()}
    return self._store.update(np.asarray(step_ids), latents)

  # -- internals ----------------------------------------------------------------
  def _sample(self, table: str, num: int) -> List[np.ndarray]:
    """``num`` valid packed items of ``table``, each uint8 [seq_len, width];
    invalid ones are deleted, counted and drawn again (module doc), from the
    uniform table (an online item popped is gone either way)."""
    rows: List[np.ndarray] = []
    dropped = set()        # an item drawn twice in one draw counts once
    while len(rows) < num:
      got = self._draw(table, num - len(rows))
      bad = [key for key, data in got if data is None]
      good = [(key, data) for key, data in got if data is not None]
      if good:
        steps = self._layout.unpack(np.stack([d for _, d in good]))
        invalid, reasons = step_problems(steps, 2, self._config.classes,
                                         self._num_workers, self._bounds)
        for (key, data), no in zip(good, np.atleast_1d(invalid)):
          (bad.append(key) if no else rows.append(data))
        if reasons:
          name, what = next(iter(reasons.items()))
          self.last_drop_reason = f'step key {name!r} {what}'
      if bad:
        new = set(bad) - dropped
        self._client.mutate_priorities(table, deletes=sorted(new))
        self.num_dropped += len(new)
        dropped |= new
        table = self._uniform_table
        if len(dropped) >= MAX_DROPS_IN_A_ROW:
          raise ValueError(
              f'{len(dropped)} invalid replay items in a row (the last: '
              f'{self.last_drop_reason}): the replay holds no usable data. '
              'Something other than this run\'s actors writes to its Reverb '
              'server (docs/security.md).')
    return rows

  def _draw(self, table: str, num: int) -> List[tuple]:
    """``num`` sampled items as (key, packed uint8 [seq_len, width]), the
    data None when the item's columns are not that layout."""
    want = (self._config.seq_len, self._layout.width)
    # ``client.sample`` keeps one item in flight (buffer_size=1), a round
    # trip per item; the same pybind sampler with all ``num`` in flight lets
    # the server fetch them together (~2x faster for [16, 65] at size12m).
    sampler = new_sampler(self._client, table, num)
    out = []
    for _ in range(num):
      item = sampler.GetNextTrajectory()   # key, prob, size, priority, data
      data = item[4:]
      ok = (len(data) == 1 and np.shape(data[0]) == want and
            getattr(data[0], 'dtype', None) == np.uint8)
      if not ok:
        self.last_drop_reason = (
            f'table {table!r} returned columns '
            f'{[list(np.shape(x)) for x in data]}, the packed step layout '
            f'needs one uint8 {list(want)}')
      out.append((int(item[0]), data[0] if ok else None))
    return out

  def _assemble(self, rows: List[np.ndarray]) -> Dict[str, Any]:
    batch = annotate(self._layout.unpack(np.stack(rows)))
    return overlay_latents(batch, self._store)


# Reverb 0.7's C++ log (reverb/cc/platform/default/logging.h) has no level to
# set: every REVERB_LOG line goes to std::clog, i.e. to fd 2. Its
# Client::NewSampler writes "Sampler and server are owned by the same process
# ... accessed directly without gRPC" on its 1st, 2nd, 4th, 8th, ... call
# (REVERB_LOG_EVERY_POW_2) when the table lives in this process: one line per
# doubling of the updates of a one-process run, news to nobody. new_sampler
# counts the calls the same way and points fd 2 at /dev/null for the
# microseconds of exactly those calls.
_sampler_calls = 0
_calls_lock = threading.Lock()
_mute_lock = threading.Lock()


@contextlib.contextmanager
def _fd2_muted():
  """fd 2 (C++ std::clog / std::cerr) to /dev/null inside the block."""
  try:
    sys.stderr.flush()
  except (AttributeError, ValueError):
    pass
  saved = os.dup(2)
  devnull = os.open(os.devnull, os.O_WRONLY)
  try:
    os.dup2(devnull, 2)
    yield
  finally:
    os.dup2(saved, 2)
    os.close(saved)
    os.close(devnull)


def new_sampler(client: reverb.Client, table: str, num: int):
  """Reverb's pybind sampler of ``num`` items, all in flight at once, with
  Reverb's same-process notice muted (comment above)."""
  global _sampler_calls
  with _calls_lock:
    _sampler_calls += 1
    call = _sampler_calls
  if call & (call - 1):             # not a power of two: Reverb stays quiet
    return client._client.NewSampler(table, num, num)  # noqa: SLF001
  with _mute_lock, _fd2_muted():
    return client._client.NewSampler(table, num, num)  # noqa: SLF001


def overlay_latents(batch: Dict[str, Any],
                    latent_store: Optional[LatentStore]) -> Dict[str, Any]:
  """Replaces the latents of every step found in ``latent_store`` (spec 5.8).

  In place; returns ``batch``. A sampler without a store leaves this to its
  caller (``agent.learner.ReplayIterator`` overlays after the previous
  write-back, in the learner's thread)."""
  if latent_store is not None:
    fresh, found = latent_store.lookup(batch[STEP_ID_KEY])
    if found.any():
      latent = batch[LATENT_KEY]
      for key in ('deter', 'stoch'):
        latent[key] = np.where(found[..., None], fresh[key], latent[key])
  return batch
