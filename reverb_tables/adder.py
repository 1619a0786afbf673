"""Stride-1 sliding-window adder on Reverb's TrajectoryWriter (spec 5.1-5.4).

One TrajectoryWriter (one stream) per env worker. Episodes are concatenated in
the stream and boundaries exist only as is_first / is_last flags (spec 5.1), so
windows freely cross episode boundaries and are never cut or padded there
(spec 5.2; Acme's SequenceAdder pads/cuts at episode ends, so it is not used).

Insert rule (spec 5.1): when step n (0-indexed) of worker w is appended and the
worker's stream holds at least L = config.seq_len = 65 steps, the item covering
steps n-64 .. n is inserted into ``uniform``; every step becomes the start of
exactly one item.

Online queue (spec 5.4): lengths[w] counts the steps worker w added before the
current one. If an item is inserted and lengths[w] % 65 == 0 (n = 65, 130, ...)
the same window (starts 1, 66, 131, ...) is also inserted into ``online``.

Step ids (spec 5.1 'stepid', here int64 (worker, index)): the adder fills
``step_id = (w, lengths[w])``; the learner-side LatentStore (spec 5.7-5.9) is
keyed by it. Counters survive restarts through ``get_state``/``set_state`` so
ids stay unique across a resume (a new writer after a restart cannot reference
pre-restart steps, so each worker needs 65 fresh steps before its next item).

Storage: each step is validated in the nested layout of ``agent.types`` and
then packed into one uint8 row (``reverb_tables.packing``), the single column
of the tables, so Reverb keeps one chunk-slice list per item instead of one
per leaf.

Chunking: the column is chunked ``chunk_length`` steps at a time (memory and
sampling speed, see ``DEFAULT_CHUNK_LENGTH``). An item reaches the server only
when the chunk holding its last step is finalised, so the newest
<= chunk_length - 1 items per worker are not yet sampleable
(docs/deviations.md "Replay"); ``flush()`` forces them out.
"""

from __future__ import annotations

from typing import Any, Dict, Mapping, Optional

import numpy as np
import reverb
import tree

from reverb_tables.config import ReplayConfig
from reverb_tables.packing import PACKED_KEY, StepLayout
from reverb_tables.step_checks import StepBounds, step_problems
from reverb_tables.tables import ONLINE_TABLE, UNIFORM_TABLE

STEP_ID_KEY = 'step_id'
# Steps per Reverb chunk (bench/replay.py at size12m, packed rows; see
# docs/deviations.md "Replay"). Server memory per stored step while filling:
# ~11.5 KB at 1, ~4.75 KB at 16, ~4.6 KB at 32, ~4.7 KB at 48; 32 also inserts
# fastest. Cost: the newest <= 31 items per worker wait for their chunk.
DEFAULT_CHUNK_LENGTH = 32
# Reverb's TrajectoryWriter logs "The number of pending items is alarmingly
# high" once a writer holds 50 unsent + unconfirmed items.
_PENDING_ITEMS_WARNING = 50


def default_max_in_flight_items(chunk_length: int) -> int:
  """Unconfirmed items a writer may hold before ``add`` blocks.

  At least chunk_length + 2 (the items waiting for the open chunk plus an
  online push), so back-pressure never forces a premature chunk;
  2 * chunk_length + 2 leaves room for items in transit, capped below
  Reverb's pending-items warning (a blocked 'ratio' rate limiter would
  otherwise fill the writer up to the cap and log that warning).
  """
  cap = _PENDING_ITEMS_WARNING - 4
  return max(chunk_length + 2, min(2 * chunk_length + 2, cap))


def _path_name(path) -> str:
  return '/'.join(str(p) for p in path)


class _LeafSpec:
  """Shape/dtype of one per-step leaf, from dm_env specs or tf.TensorSpec."""

  def __init__(self, path, shape, dtype):
    self.path = tuple(path)
    self.name = _path_name(path)
    self.shape = tuple(int(d) for d in shape)
    self.dtype = np.dtype(dtype)


def step_layout_from_server(client: reverb.Client, table: str = UNIFORM_TABLE,
                            timeout: Optional[int] = 30) -> StepLayout:
  """The packing layout recorded in a table signature (``packing``)."""
  info = client.server_info(timeout)
  if table not in info:
    raise ValueError(f'Reverb server has no table {table!r}; has {sorted(info)}')
  signature = info[table].signature
  if signature is None:
    raise ValueError(f'Table {table!r} has no signature; pass step_spec')
  return StepLayout.from_signature(signature)


def step_spec_from_server(client: reverb.Client, table: str = UNIFORM_TABLE,
                          timeout: Optional[int] = 30):
  """Per-step dm_env specs read back from a table signature (time axis dropped).

  Equal to ``agent.types.step_spec`` of the spaces the tables were built with
  (decoded from the packed column's layout, ``reverb_tables.packing``).
  """
  return step_layout_from_server(client, table, timeout).step_spec()


class WindowAdder:
  """Writes per-worker streams and inserts 65-step windows (spec 5.1-5.4).

  Args:
    client: a ``reverb.Client`` of the replay server.
    config: a ReplayConfig (or any object with its fields, e.g. DreamerConfig);
      reads seq_len, online_queue, replay_capacity.
    num_workers: number of env workers (one stream each).
    step_spec: per-step spec (``agent.types.step_spec``); read from the
      ``uniform`` table signature when omitted.
    chunk_length: steps per Reverb chunk (see module doc and
      ``DEFAULT_CHUNK_LENGTH``); <= seq_len.
    max_in_flight_items: items a writer may hold unconfirmed before ``add``
      blocks (back-pressure from a 'ratio' rate limiter). Defaults to
      ``default_max_in_flight_items(chunk_length)``.
    worker_offset: the step ids of local worker w are (worker_offset + w,
      index): actor processes that own slices of one global worker layout
      (the Launchpad program) write ids that are unique across actors.
    bounds: the plausible values of a step (``step_checks.StepBounds``);
      None: the value limit alone.
  """

  def __init__(self, client: reverb.Client, config: ReplayConfig,
               num_workers: int, step_spec: Any = None, *,
               chunk_length: int = DEFAULT_CHUNK_LENGTH,
               max_in_flight_items: Optional[int] = None,
               uniform_table: str = UNIFORM_TABLE,
               online_table: str = ONLINE_TABLE, worker_offset: int = 0,
               bounds: Optional[StepBounds] = None):
    if num_workers <= 0:
      raise ValueError(f'num_workers must be positive, got {num_workers}')
    if worker_offset < 0:
      raise ValueError(f'worker_offset must be >= 0, got {worker_offset}')
    self._worker_offset = int(worker_offset)
    self._bounds = StepBounds() if bounds is None else bounds
    config = ReplayConfig.of(config)
    self._client = client
    self._config = config
    self._num_workers = int(num_workers)
    self._length = config.seq_len
    self._chunk_length = int(min(max(1, chunk_length), self._length))
    self._max_in_flight = (default_max_in_flight_items(self._chunk_length)
                           if max_in_flight_items is None
                           else int(max_in_flight_items))
    self._uniform_table = uniform_table
    self._online_table = online_table
    self._online = bool(config.online_queue)
    if step_spec is None:                   # the layout the tables store
      self._layout = step_layout_from_server(client, uniform_table)
      step_spec = self._layout.step_spec()
    else:
      self._layout = StepLayout.from_step_spec(step_spec)
    self._spec = tree.map_structure_with_path(
        lambda p, s: _LeafSpec(p, s.shape, s.dtype), step_spec)
    self._flat_spec = tree.flatten(self._spec)
    assert [f.name for f in self._layout.fields] == [
        leaf.name for leaf in self._flat_spec], 'layout / spec order mismatch'
    if STEP_ID_KEY not in step_spec:
      raise ValueError(f'step spec has no {STEP_ID_KEY!r} key')
    sid = self._spec[STEP_ID_KEY]
    if sid.shape != (2,) or sid.dtype.kind != 'i':
      raise ValueError(f'{STEP_ID_KEY!r} must be int[2], got {sid.dtype}'
                       f'{list(sid.shape)}')
    # lengths[w]: steps added by worker w so far (spec 5.4), persisted.
    self._lengths = np.zeros(self._num_workers, np.int64)
    # steps held by the current writer of w (< lengths after a restore).
    self._stream = np.zeros(self._num_workers, np.int64)
    self._num_items = 0
    self._num_online = 0
    self._writers = [self._make_writer() for _ in range(self._num_workers)]

  # -- public properties --------------------------------------------------------
  @property
  def worker_offset(self) -> int:
    return self._worker_offset

  @property
  def num_workers(self) -> int:
    return self._num_workers

  @property
  def lengths(self) -> np.ndarray:
    """Steps added per worker (spec 5.4 ``lengths``), a copy."""
    return self._lengths.copy()

  @property
  def num_items(self) -> int:
    """len(replay) in items (spec 6.2 gate): created items, capped at the
    FIFO capacity (spec 5.1). Counts items not yet flushed to the server."""
    return min(self._num_items, self._config.replay_capacity)

  @property
  def num_items_created(self) -> int:
    return self._num_items

  @property
  def num_online_items(self) -> int:
    return self._num_online

  # -- writing ------------------------------------------------------------------
  def add(self, worker: int, step: Mapping[str, Any]) -> None:
    """Adds one step of ``worker`` (a nested dict without leading axis)."""
    if not 0 <= int(worker) < self._num_workers:
      raise ValueError(f'worker {worker} out of range [0, {self._num_workers})')
    worker = int(worker)
    flat = self._validate(step, np.array([worker], np.int64), batched=False)
    self._append(worker, self._layout.pack(flat, 1)[0])
    self._writers[worker].flush(block_until_num_items=self._max_in_flight)

  def add_batch(self, steps: Mapping[str, Any]) -> None:
    """Adds one step for every worker; leaves have leading [num_workers].

    The whole batch is validated before anything is written (a bad step
    raises ValueError naming the key and leaves the replay untouched).
    """
    flat = self._validate(steps, np.arange(self._num_workers, dtype=np.int64),
                          batched=True)
    rows = self._layout.pack(flat, self._num_workers)
    for w in range(self._num_workers):
      self._append(w, rows[w])
    for w in range(self._num_workers):
      self._writers[w].flush(block_until_num_items=self._max_in_flight)

  def flush(self, timeout_ms: Optional[int] = None) -> None:
    """Forces every created item onto the server (finalises open chunks)."""
    for writer in self._writers:
      writer.flush(timeout_ms=timeout_ms)

  def close(self) -> None:
    """Flushes and closes the writers (the adder is unusable afterwards)."""
    for writer in self._writers:
      writer.flush()
      writer.close()
    self._writers = []

  # -- state --------------------------------------------------------------------
  def get_state(self) -> Dict[str, Any]:
    """Counters to save with a replay checkpoint (JSON-able)."""
    return {'lengths': [int(x) for x in self._lengths],
            'num_items': int(self._num_items),
            'num_online_items': int(self._num_online)}

  def set_state(self, state: Mapping[str, Any]) -> None:
    """Restores counters after a resume; opens fresh writer streams.

    Call before the first ``add``. Step ids continue from the saved
    ``lengths``, so the latent store keys stay unique (spec 5.9).
    """
    lengths = np.asarray(state['lengths'], np.int64)
    if lengths.shape != (self._num_workers,):
      raise ValueError(f'saved lengths have shape {lengths.shape}, adder has '
                       f'{self._num_workers} workers')
    if (lengths < 0).any():
      raise ValueError('saved lengths must be non-negative')
    self._lengths = lengths.copy()
    self._num_items = int(state.get('num_items', 0))
    self._num_online = int(state.get('num_online_items', 0))
    # History does not survive a restart: restart the streams.
    for writer in self._writers:
      writer.flush()
      writer.close()
    self._writers = [self._make_writer() for _ in range(self._num_workers)]
    self._stream[:] = 0

  # -- internals ----------------------------------------------------------------
  def _make_writer(self) -> reverb.TrajectoryWriter:
    # num_keep_alive_refs = seq_len bounds the writer's memory (spec 5.1).
    writer = self._client.trajectory_writer(num_keep_alive_refs=self._length)
    writer.configure((PACKED_KEY,), num_keep_alive_refs=self._length,
                     max_chunk_length=self._chunk_length)
    return writer

  def _append(self, worker: int, row: np.ndarray) -> None:
    """Appends one packed step (uint8 [width]) to the stream of ``worker``."""
    writer = self._writers[worker]
    writer.append({PACKED_KEY: row})
    n = int(self._lengths[worker])           # index of this step (spec 5.4)
    self._stream[worker] += 1
    if self._stream[worker] >= self._length:  # spec 5.1: window ending at n
      trajectory = {PACKED_KEY: writer.history[PACKED_KEY][-self._length:]}
      writer.create_item(self._uniform_table, 1.0, trajectory)
      self._num_items += 1
      if self._online and n % self._length == 0:  # spec 5.4: n = 65, 130, ...
        writer.create_item(self._online_table, 1.0, trajectory)
        self._num_online += 1
    self._lengths[worker] = n + 1

  def _validate(self, steps, workers: np.ndarray, batched: bool):
    """Checks keys, shapes, dtypes and values (``reverb_tables.step_checks``:
    finite and plausible, latent classes in range); returns flat numpy
    leaves.

    Nothing is written here, so a bad step leaves the replay untouched.
    step_id is filled with (worker, lengths[worker]) when absent or None and
    must equal it when given.
    """
    if not isinstance(steps, Mapping):
      raise ValueError(f'step must be a dict, got {type(steps).__name__}')
    steps = dict(steps)
    sid_dtype = self._spec[STEP_ID_KEY].dtype
    expected = np.stack([workers + self._worker_offset, self._lengths[workers]],
                        -1).astype(sid_dtype)
    if not batched:
      expected = expected[0]
    given_ids = steps.get(STEP_ID_KEY) is not None
    if not given_ids:
      steps[STEP_ID_KEY] = expected
    self._check_keys(steps, self._spec, ())
    lead = (len(workers),) if batched else ()
    flat = []
    for leaf in self._flat_spec:
      value = steps
      for p in leaf.path:
        value = value[p]
      arr = _as_array(value, leaf)
      want = lead + leaf.shape
      if arr.shape != want:
        raise ValueError(f'step key {leaf.name!r}: shape {list(arr.shape)}, '
                         f'expected {list(want)}')
      if arr.dtype != leaf.dtype:
        raise ValueError(f'step key {leaf.name!r}: dtype {arr.dtype}, '
                         f'expected {leaf.dtype}')
      if leaf.path == (STEP_ID_KEY,) and given_ids and not np.array_equal(
          arr, expected):
        raise ValueError(
            f'step key {STEP_ID_KEY!r} must be (worker, lengths[worker]) = '
            f'{expected.tolist()}, got {arr.tolist()}; omit it and the adder '
            'fills it')
      flat.append(arr)
    values = tree.unflatten_as(self._spec, flat)
    _, problems = step_problems(values, len(lead), self._config.classes,
                                bounds=self._bounds)
    for name, what in problems.items():   # reverb_tables.step_checks
      raise ValueError(f'step key {name!r} {what}')
    return flat

  def _check_keys(self, value, spec, path) -> None:
    if isinstance(spec, _LeafSpec):
      return
    name = _path_name(path) or 'step'
    if not isinstance(value, Mapping):
      raise ValueError(f'step key {name!r} must be a dict with keys '
                       f'{sorted(spec)}, got {type(value).__name__}')
    missing = sorted(set(spec) - set(value))
    if missing:
      raise ValueError('step is missing key(s) ' + ', '.join(
          repr(_path_name(path + (k,))) for k in missing))
    extra = sorted(set(value) - set(spec))
    if extra:
      raise ValueError('step has unexpected key(s) ' + ', '.join(
          repr(_path_name(path + (k,))) for k in extra))
    for k in spec:
      self._check_keys(value[k], spec[k], path + (k,))


def _as_array(value, leaf: _LeafSpec) -> np.ndarray:
  """numpy arrays keep their dtype (checked strictly); Python scalars are cast."""
  if isinstance(value, (bool, int, float)) and not isinstance(value, np.generic):
    if leaf.dtype.kind == 'b' and not isinstance(value, bool):
      raise ValueError(f'step key {leaf.name!r}: expected bool, got '
                       f'{type(value).__name__}')
    return np.asarray(value, leaf.dtype)
  arr = np.asarray(value)
  if arr.dtype == object:
    raise ValueError(f'step key {leaf.name!r}: not a numeric array')
  return arr
