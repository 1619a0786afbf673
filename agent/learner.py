"""Acme learner for DreamerV3 (Algorithm J, spec 5.3, 5.8, 5.9, 6.3).

`DreamerLearner.step()` is one gradient update of the synchronous loop:

  batch = next(iterator)                 # ReplayIterator: online queue first,
                                         # then uniform (5.3, 5.4), one batch
                                         # ahead (6.3b), latents overlaid (5.8)
  state, metrics, outs = update(state, batch)    # agent.learning (Algorithm J)
  write_back(batch['step_id'][:, 1:], outs)      # fresh posteriors (5.9),
                                                 # computed with pre-update params
  counter / logger                               # metrics

The jitted update compiles once (check ``update_cache_size() == 1``); the
batch is validated on the host (``agent.learning.check_batch``) before the
first call and whenever its shapes change.

``get_variables(['policy'])`` returns the acting parameters (enc, dyn, pol;
``agent.acting.acting_params``, spec 6.3a) for actors; 'params' returns every
trainable parameter. Because the update donates its input state, returned
variables are copies (made at most once per update) that stay valid after
later updates. ``save()`` / ``restore()`` round-trip the full
``TrainingState`` (params, slow critic, optimizer, return normaliser, update
count, rng) as numpy trees.

The same learner runs in one process (``experiments.layouts.scheduled``) and as
the Launchpad learner node (``experiments/layouts/distributed/learner.py``): the iterator only
needs ``__next__`` and ``write_back`` (``ReplayIterator`` over a
``ReplaySampler`` on a Reverb client), and the learner is the
``core.VariableSource`` of the actors.
"""

from __future__ import annotations

import queue
import threading
import time
from typing import Any, Callable, Dict, Iterator, List, Optional, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from acme import core
from acme.utils import counting

from agent import acting
from agent import learning
from agent import networks as nets_lib
from agent.parallel import LearnerPlacement, check_batch_size
from reverb_tables.sampler import overlay_latents

VARIABLE_NAMES = ('policy', 'params')


class StopRequested(Exception):
  """The run is stopping (raised out of a blocked wait for a batch)."""


class ReplayIterator:
  """The learner's dataset: training batches one ahead (spec 5.3, 5.8, 6.3b).

  A background thread calls ``sampler.sample_train()`` (a ``ReplaySampler``
  without a latent store: online queue first, then uniform rows; Reverb's
  rate limiter may block there). ``next()`` takes that batch, overlays the
  freshest latents of ``latent_store`` (spec 5.8) in the caller's thread and
  returns it; with ``prefetch`` the next batch is requested as soon as one is
  handed out, so it is drawn while the update runs (amount 1, spec 6.3b).
  Without ``prefetch`` it is requested inside ``next()``: the strict
  synchronous order (sample after the previous write-back).

  Write-back order (docs/deviations.md "Training loop"): the overlay happens
  in ``next()``, after every earlier ``write_back``, so each update sees the
  previous update's posteriors whichever mode; with prefetch only the choice
  of items (and the online-queue pop) is made one update earlier.

  Like ``acme.jax.utils.prefetch`` (which keeps buffer_size - 1 >= 1 batches
  queued and a producer that cannot be stopped), but exactly one batch ahead,
  with the overlay after the previous write-back and a wait that ends with
  ``StopRequested`` once ``should_stop()`` is true; ``on_wait()`` runs about
  every second while blocked (bookkeeping of a learner process). With
  ``put`` (``jax.device_put`` to a device, or ``LearnerPlacement.put_batch``
  of a data-parallel learner, ``agent.parallel``) the overlaid batch goes
  to the learner's devices (``step_id`` stays on the host for the
  write-back). ``batch_size``: rows per batch (default the config's; a
  process of a multi-process learner samples its share).

  Timings: ``wait_s`` (caller blocked waiting for a batch) and ``sample_s``
  (time inside ``sample_train``).
  """

  def __init__(self, sampler, latent_store, *, prefetch: bool = True,
               should_stop: Callable[[], bool] = lambda: False,
               on_wait: Optional[Callable[[], None]] = None,
               put: Optional[Callable[[Any], Any]] = None,
               batch_size: Optional[int] = None, wait_slice: float = 0.05):
    self.sampler = sampler
    self.latent_store = latent_store
    self._prefetch = bool(prefetch)
    self._should_stop = should_stop
    self._on_wait = on_wait
    self._put = put
    self._batch_size = batch_size
    self._slice = wait_slice
    self._queue: queue.Queue = queue.Queue()
    self._requests = threading.Semaphore(0)
    self._pending = False
    self._closed = False
    self.wait_s = 0.0
    self.sample_s = 0.0
    self.batches = 0
    self._wait_since: Optional[float] = None
    self._thread = threading.Thread(target=self._work, name='replay-sampler',
                                    daemon=True)
    self._thread.start()

  @property
  def prefetch(self) -> bool:
    return self._prefetch

  @property
  def idle_s(self) -> float:
    """``wait_s`` including a wait still in progress."""
    since = self._wait_since
    return self.wait_s + (time.perf_counter() - since if since else 0.0)

  def __iter__(self):
    return self

  def _request(self) -> None:
    if not self._pending:
      self._requests.release()
      self._pending = True

  def _work(self) -> None:
    while True:
      self._requests.acquire()
      if self._closed:
        return
      t0 = time.perf_counter()
      try:
        batch = self.sampler.sample_train(self._batch_size)
      except Exception as e:  # noqa: BLE001  (handed to the caller)
        self._queue.put(e)
        return
      self.sample_s += time.perf_counter() - t0
      self._queue.put(batch)

  def __next__(self) -> Dict[str, Any]:
    self._request()
    t0 = self._wait_since = time.perf_counter()
    last_hook = t0
    try:
      while True:
        try:
          item = self._queue.get(timeout=self._slice)
          break
        except queue.Empty:
          if self._should_stop():
            raise StopRequested()
          now = time.perf_counter()
          if self._on_wait is not None and now - last_hook >= 1.0:
            self._on_wait()
            last_hook = now
    finally:
      self._wait_since = None
      self.wait_s += time.perf_counter() - t0
    if isinstance(item, Exception):
      raise item
    self._pending = False
    if self._prefetch:
      self._request()
    self.batches += 1
    batch = overlay_latents(item, self.latent_store)
    if self._put is not None:
      step_id = batch.pop('step_id')
      batch = self._put(batch)
      batch['step_id'] = step_id
    return batch

  def write_back(self, step_ids, latents) -> int:
    """Stores fresh posteriors (spec 5.9) in the latent store."""
    return self.latent_store.update(
        np.asarray(step_ids), {k: np.asarray(v) for k, v in latents.items()})

  def close(self) -> None:
    self._closed = True
    self._requests.release()


class DreamerLearner(core.Learner):
  """Wraps ``agent.learning.make_train_step`` (Algorithm J) as an Acme learner.

  Args:
    networks: ``agent.networks.make_networks(spaces, config)``.
    iterator: yields [B, T+1] replay batches (agent/types.py layout); if it
      has ``write_back(step_ids, latents)`` that is used for spec 5.9.
    random_key: jax key for ``TrainingState`` init (params and update rng).
    write_back: optional explicit write-back callable (overrides the
      iterator's); pass ``False`` to disable write-back.
    counter: acme Counter; incremented with ``learner_steps``.
    logger: acme Logger; gets, every ``log_every`` updates (counted by
      ``counter``'s ``learner_steps``, so windows stay aligned across a
      resume), the means of every metric over the updates since its last
      write, with ``updates_in_mean`` and the counts.
    log_every: updates between logger writes (0 = never).
    train_step: a prebuilt ``learning.TrainStep`` to share (tests, bench).
    placement: ``agent.parallel.LearnerPlacement``: the learner devices (the
      update runs data-parallel over them) and the device that serves acting
      params; default one device.
    gate: with several learner processes, their ``agent.parallel.UpdateGate``
      (every process runs each update together; ``step`` raises
      ``StopRequested`` when process 0 stops the run). ``should_stop`` is
      the gate's stop check while it waits.
  """

  def __init__(self, networks: nets_lib.DreamerNetworks, iterator: Iterator,
               random_key, *, write_back: Any = None,
               counter: Optional[counting.Counter] = None, logger=None,
               log_every: int = 0,
               train_step: Optional[learning.TrainStep] = None,
               placement: Optional[LearnerPlacement] = None,
               gate=None, should_stop: Callable[[], bool] = lambda: False):
    self._nets = networks
    self._config = networks.config
    self._iterator = iterator
    if write_back is None:
      write_back = getattr(iterator, 'write_back', None)
    self._write_back = write_back or None
    self._counter = counter or counting.Counter()
    self._logger = logger
    self._log_every = int(log_every)
    self._placement = placement or LearnerPlacement()
    check_batch_size(self._config.batch_size, self._placement.num_devices)
    self._train_step = train_step or learning.make_train_step(
        networks, placement=self._placement)
    self._update = self._train_step.update
    self._gate, self._should_stop = gate, should_stop
    self._state = self._placement.put_state(
        self._placement.host(self._train_step.init(random_key)))
    self._checked_shapes = None
    self._variables_cache = (None, None)
    self.num_steps = 0
    self.last_metrics: Dict[str, float] = {}
    self._metric_sums: Dict[str, float] = {}
    self._metric_count = 0
    self._window_sums: Dict[str, float] = {}
    self._window_count = 0
    self.timings = {'sample_s': 0.0, 'update_s': 0.0, 'write_back_s': 0.0}

  # -- training -------------------------------------------------------------------
  def step(self) -> Dict[str, float]:
    """One update: sample, update, write back, count, log. Returns metrics."""
    t0 = time.perf_counter()
    batch = next(self._iterator)
    if self._gate is not None and not self._gate.enter(self.num_steps,
                                                       self._should_stop):
      raise StopRequested()
    t1 = time.perf_counter()
    place = self._placement
    ids = np.asarray(batch['step_id'])
    host_ids = ids[:, 1:]
    if place.multi_process:
      # step_id holds this process's rows: checked with the global row count,
      # then made a global array (jit takes no host rows of one process).
      rows = np.shape(batch['is_first'])[0]
      self._check({**batch, 'step_id': np.broadcast_to(
          np.zeros((), ids.dtype), (rows,) + ids.shape[1:])})
      batch = {**batch, 'step_id': place.put_batch(ids)}
    else:
      self._check(batch)
    self._state, metrics, outs = self._update(self._state, batch)
    outs = place.gather_rows(outs)                        # blocks on the update
    metrics = {k: float(v) for k, v in place.host(metrics).items()}
    t2 = time.perf_counter()
    if self._write_back is not None:     # every row, in every process (5.9)
      self._write_back(place.gather_rows(host_ids), outs)
    t3 = time.perf_counter()
    self.timings['sample_s'] += t1 - t0
    self.timings['update_s'] += t2 - t1
    self.timings['write_back_s'] += t3 - t2
    self.num_steps += 1
    self.last_metrics = metrics
    for k, v in metrics.items():
      self._metric_sums[k] = self._metric_sums.get(k, 0.0) + v
    self._metric_count += 1
    counts = self._counter.increment(learner_steps=1)
    if self._logger is not None and self._log_every:
      self._log_window(metrics, counts)
    return metrics

  def stop_peers(self) -> None:
    """Process 0 of a multi-process learner: the other processes stop
    before their next update (no-op in one process)."""
    if self._gate is not None:
      self._gate.stop(self.num_steps)

  def peers_stopped(self) -> bool:
    """Whether process 0 has stopped the multi-process learner."""
    return self._gate is not None and self._gate.stopped()

  def _log_window(self, metrics, counts) -> None:
    """Accumulates ``metrics``; at every ``log_every``-th update (global
    count) writes their means over the window to the logger."""
    for k, v in metrics.items():
      self._window_sums[k] = self._window_sums.get(k, 0.0) + v
    self._window_count += 1
    if int(counts.get('learner_steps', self.num_steps)) % self._log_every == 0:
      n = self._window_count
      means = {k: v / n for k, v in self._window_sums.items()}
      self._logger.write({**means, 'updates_in_mean': float(n),
                          'learner_steps': int(counts.get('learner_steps',
                                                          self.num_steps))})
      self._window_sums, self._window_count = {}, 0

  def pop_metric_means(self) -> Dict[str, float]:
    """Means of every metric over the steps since the last call (for logs)."""
    if not self._metric_count:
      return {}
    out = {k: v / self._metric_count for k, v in self._metric_sums.items()}
    out['updates_in_mean'] = float(self._metric_count)
    self._metric_sums, self._metric_count = {}, 0
    return out

  def _check(self, batch) -> None:
    shapes = jax.tree_util.tree_map(lambda x: (np.shape(x), np.dtype(x.dtype)),
                                    batch)
    if shapes != self._checked_shapes:
      learning.check_batch(batch, self._nets.spaces, self._config)
      self._checked_shapes = shapes

  def update_cache_size(self) -> int:
    """Compilations of the jitted update so far (must stay 1)."""
    return int(self._update._cache_size())

  # -- variables ------------------------------------------------------------------
  @property
  def state(self) -> learning.TrainingState:
    return self._state

  @property
  def counter(self) -> counting.Counter:
    return self._counter

  def get_variables(self, names: Sequence[str]) -> List[Any]:
    """'policy' -> acting params (enc, dyn, pol); 'params' -> all params.

    Copies made at most once per update, valid after later (donating) updates.
    """
    step = self.num_steps
    cached_step, cached = self._variables_cache
    if cached_step != step:
      cached = {}
      self._variables_cache = (step, cached)
    out = []
    for name in names:
      if name not in VARIABLE_NAMES:
        raise ValueError(f'unknown variable collection {name!r}; valid: '
                         f'{list(VARIABLE_NAMES)}')
      if name not in cached:
        params = self._state.params
        if name == 'policy':
          params = acting.acting_params(params)     # select, then copy
        if self._placement.multi_process:   # a host copy: runs nothing on the
          params = self._placement.host(params)   # devices the peers share
        else:
          params = jax.tree_util.tree_map(jnp.copy, params)
        if name == 'policy':
          params = self._placement.put_policy(params)
        cached[name] = params
      out.append(cached[name])
    return out

  # -- checkpointing --------------------------------------------------------------
  def save(self) -> learning.TrainingState:
    """The full TrainingState as numpy arrays (host copy)."""
    return self._placement.host(self._state)

  def restore(self, state: learning.TrainingState) -> None:
    """Loads a TrainingState saved by ``save`` (structure, shapes and dtypes
    must match this learner's; ValueError otherwise). It may have been saved
    with another number of learner devices: ``save`` gathers to the host."""
    template = self._state
    t_leaves, t_def = jax.tree_util.tree_flatten(template)
    leaves, s_def = jax.tree_util.tree_flatten(state)
    if t_def != s_def:
      raise ValueError('saved TrainingState has a different structure than this '
                       'learner (different model size or env?)')
    new = []
    for t, x in zip(t_leaves, leaves):
      x = np.asarray(x)
      if x.shape != t.shape or x.dtype != t.dtype:
        raise ValueError(f'saved TrainingState leaf {x.dtype}{list(x.shape)} '
                         f'does not match {t.dtype}{list(t.shape)}')
      new.append(x)
    self._state = self._placement.put_state(
        jax.tree_util.tree_unflatten(t_def, new))
    self._variables_cache = (None, None)
