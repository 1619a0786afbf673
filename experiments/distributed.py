r"""DreamerV3 as a Launchpad program (``local_mp``): replay, learner, actors.

``build_program(spec)`` returns an ``lp.Program`` with these node groups:

  replay     ``lp.ReverbNode``: the builder's ``uniform`` + ``online`` tables
             with ``rate_limiter='ratio'`` (SampleToInsertRatio, spec 6.1
             "parallel"); loads/saves Reverb checkpoints in
             ``<logdir>/checkpoints/reverb``.
  counter    ``CounterNode`` (courier) holding an ``acme.utils.counting.Counter``
             (actor_steps, env_steps, episodes, learner_steps).
  limiter    ``StepLimiter`` (Acme's ``StepsLimiter`` pattern): when the
             counter reaches ``--env_steps`` it pauses the actors, asks the
             learner for a final checkpoint, the evaluator for a final
             evaluation, and calls ``lp.stop()``.
  learner    ``LearnerNode``: the ``DreamerLearner`` (Algorithm J), the
             variable source of every actor, the latent write-back store
             (spec 5.9) and the writer of metrics rows and checkpoints.
  actor      ``num_actors`` x ``ActorNode``: each steps its own
             ``VectorEnv`` of ``num_envs / num_actors`` envs with a
             ``DreamerActor`` and pulls acting parameters through Acme's
             ``VariableClient`` (``update_period`` vector steps).
  evaluator  ``EvaluatorNode`` (only with ``--eval_episodes`` > 0): spec 7.3
             evaluations every ``--eval_every`` env steps and at the end.

Replay ratio (spec 6.1 "parallel"): only the rate limiter of the ``uniform``
table couples actors and learner. The learner samples in a background thread
(Reverb blocks there, so the learner can still stop, log and checkpoint) one
batch ahead of the update (spec 6.3b prefetch); the fresh latents of the
write-back store are overlaid in the learner thread just before the update,
so every update sees the previous update's write-back (spec 5.8, 5.9).

Worker ids: all actors write into one global layout of ``num_envs`` env
workers; actor k owns workers ``[k*n, (k+1)*n)`` (n = envs per actor), so step
ids (worker, index) stay unique across actors and the learner's single
``LatentStore`` keeps one ring per global worker.

Stopping: the step budget ends in ``StepLimiter`` -> ``actor.pause()`` (all)
-> ``learner.finish()`` (final checkpoint) -> ``evaluator.evaluate_final()``
-> ``lp.stop()``. A Ctrl-C or SIGTERM of the launcher makes Launchpad send
SIGTERM to every node; the learner then writes a final checkpoint while the
replay server, counter, actors and evaluator wait for it (a marker file, at
most ``stop_grace_s``), and
Launchpad's termination notice (``stop_grace_s`` + 30 s) kills whatever is
left. Every node process also gets SIGTERM if the launcher dies
(``experiments/lp_init.py``).

Checkpoints (``<logdir>/checkpoints/ckpt-<agent steps>``, the layout of
``experiments/train.py``): the learner checkpoints the Reverb server first and
then reads every actor's adder counters, so the saved step-id counters are
never behind an item in the Reverb checkpoint. ``run_state.json`` has
``"mode": "distributed"``. See docs/deviations.md "Distributed runs".
"""

from __future__ import annotations

import dataclasses
import functools
import json
import os
import pickle
import queue
import shutil
import sys
import threading
import time
import traceback
from typing import Any, Callable, Dict, List, Optional, Sequence

import numpy as np

import agent  # noqa: F401  (jax compat before anything imports acme)
from agent.config import DreamerConfig
from agent.types import EnvSpaces
from experiments import train as train_lib

MODE = 'distributed'
GROUPS = ('replay', 'counter', 'limiter', 'learner', 'actor', 'evaluator')
LEARNER_DONE_FILE = 'learner_done'
SUMMARY_FILE = 'summary.json'
ERRORS_DIR = 'errors'
TERMINALS = ('output_to_files', 'current_terminal')
# Each actor's adder counters are saved + this margin: an item whose last step
# reached the Reverb checkpoint a moment before the actor bumped its counter
# can never share a step id with a step written after the resume.
STEP_ID_MARGIN = 1


@dataclasses.dataclass(frozen=True)
class DistributedConfig:
  """Settings of the Launchpad program (the RunConfig holds the run's).

  num_actors: actor nodes; ``RunConfig.num_envs`` (total envs) must divide.
  update_period: the actors' ``VariableClient`` update_period: a parameter
    fetch is started every ``update_period`` vector steps (asynchronously).
  lag_probe_every: vector steps between the actors' parameter-lag probes.
  counter_sync_s: ``Counter`` time_delta of actor and learner counters.
  poll_s: poll interval of the limiter, evaluator and learner bookkeeping.
  stop_grace_s: after a stop signal, the longest the replay server, actors
    and evaluator wait for the learner's final checkpoint.
  rpc_timeout_s: courier call timeout of the actors' and learner's RPCs.
  prefetch: sample the next batch during the current update (spec 6.3b).
  terminal: Launchpad local_mp terminal ('output_to_files' writes each
    node's output to ``<logdir>/lp_logs/segment-<n>/<group>/<i>``).
  """
  num_actors: int = 2
  update_period: int = 1
  lag_probe_every: int = 10
  counter_sync_s: float = 0.5
  poll_s: float = 0.5
  stop_grace_s: float = 60.0
  rpc_timeout_s: float = 60.0
  prefetch: bool = True
  terminal: str = 'output_to_files'

  def __post_init__(self):
    if self.num_actors < 1:
      raise ValueError(f'--num_actors must be >= 1, got {self.num_actors}')
    if self.update_period < 1:
      raise ValueError(f'--actor_update_period must be >= 1, got '
                       f'{self.update_period}')
    if self.lag_probe_every < 1:
      raise ValueError('lag_probe_every must be >= 1')
    if self.stop_grace_s <= 0:
      raise ValueError(f'--stop_grace must be > 0 seconds, got {self.stop_grace_s}')
    if self.terminal not in TERMINALS:
      raise ValueError(f'--lp_terminal must be one of {TERMINALS}, got '
                       f'{self.terminal!r}')

  @property
  def termination_notice_s(self) -> int:
    """Launchpad's notice before it kills nodes that ignore a stop."""
    return int(self.stop_grace_s + 30)


@dataclasses.dataclass
class ProgramSpec:
  """Everything a node needs (pickled into every node process).

  run_state: the ``run_state.json`` of the checkpoint resumed from (or None);
  resume: that checkpoint's path; segment: resume count (env seeds move with
  it, as in the single-process run); launch_dir: a per-launch scratch folder
  (marker files, errors, summary).
  """
  run: Any                      # experiments.train.RunConfig
  config: DreamerConfig
  dist: DistributedConfig
  spaces: EnvSpaces
  launch_dir: str
  segment: int = 0
  resume: Optional[str] = None
  run_state: Optional[Dict[str, Any]] = None

  def __post_init__(self):
    if self.run.num_envs % self.dist.num_actors:
      raise ValueError(
          f'--num_envs {self.run.num_envs} (total training envs) must be a '
          f'multiple of --num_actors {self.dist.num_actors}')

  @property
  def envs_per_actor(self) -> int:
    return self.run.num_envs // self.dist.num_actors

  def worker_offset(self, actor_id: int) -> int:
    return actor_id * self.envs_per_actor

  @property
  def reverb_dir(self) -> str:
    return os.path.join(train_lib.checkpoint_root(self.run.logdir),
                        train_lib.REVERB_DIR)

  @property
  def learner_done_path(self) -> str:
    return os.path.join(self.launch_dir, LEARNER_DONE_FILE)

  @property
  def counts(self) -> Dict[str, float]:
    return dict((self.run_state or {}).get('counts', {}))


# --- small helpers ------------------------------------------------------------


def _log(msg: str) -> None:
  print(msg, file=sys.stderr, flush=True)


def _lp_hooks():
  """(stop event, program stopper) of this node; inert outside Launchpad."""
  try:
    import launchpad as lp
    from launchpad import context
    return lp.stop_event(), context.get_context().program_stopper
  except (RuntimeError, AssertionError, AttributeError):
    event = threading.Event()
    return event, event.set


def _wait_for_file(path: str, timeout: float, poll: float = 0.1) -> bool:
  deadline = time.monotonic() + timeout
  while not os.path.exists(path):
    if time.monotonic() >= deadline:
      return False
    time.sleep(poll)
  return True


def _touch(path: str) -> None:
  os.makedirs(os.path.dirname(path), exist_ok=True)
  with open(path, 'a'):
    pass


def record_error(spec: ProgramSpec, node: str) -> None:
  """Writes the current exception's traceback to <launch_dir>/errors/<node>."""
  text = traceback.format_exc()
  _log(f'[{node}] failed:\n{text}')
  try:
    path = os.path.join(spec.launch_dir, ERRORS_DIR, node.replace('/', '_'))
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, 'w') as f:
      f.write(text)
  except OSError:
    pass


def _call_until(fn: Callable[[], Any], stop: Callable[[], bool],
                poll: float = 0.2):
  """Runs a (blocking RPC) ``fn`` in a thread; returns its result, or raises
  ``StopRequested`` once ``stop()`` is true first (signals stay deliverable)."""
  box: Dict[str, Any] = {}
  done = threading.Event()

  def target():
    try:
      box['value'] = fn()
    except BaseException as e:  # noqa: BLE001  (re-raised in the caller)
      box['error'] = e
    done.set()

  threading.Thread(target=target, daemon=True).start()
  while not done.wait(poll):
    if stop():
      raise StopRequested()
  if 'error' in box:
    raise box['error']
  return box['value']


def _is_timeout(e: Exception) -> bool:
  text = str(e).lower()
  return 'deadline' in text or 'unavailable' in text or 'timed out' in text


def wait_for_replay(client, stop: Callable[[], bool], poll: float = 0.5):
  """Blocks until the Reverb server answers (it may start after us)."""
  while True:
    try:
      return client.server_info(timeout=5)
    except Exception:  # noqa: BLE001  (server not up yet)
      if stop():
        raise StopRequested()
      time.sleep(poll)


class StopRequested(Exception):
  """The program is stopping (raised out of blocking waits)."""


# --- replay node ----------------------------------------------------------------


def make_replay_tables(spec: ProgramSpec):
  """The builder's tables with the 'ratio' rate limiter (spec 6.1 parallel).

  Runs in the replay process; it also registers a Launchpad stop handler that
  keeps the server up after a stop signal until the learner has written its
  final checkpoint (at most ``stop_grace_s``).
  """
  from agent.builder import DreamerBuilder
  tables = DreamerBuilder(spec.config, spec.spaces, num_envs=spec.run.num_envs,
                          rate_limiter='ratio',
                          chunk_length=spec.run.chunk_length
                          ).make_replay_tables()
  try:
    import launchpad as lp
    lp.register_stop_handler(functools.partial(_replay_stop_handler, spec))
  except Exception:  # noqa: BLE001  (outside a Launchpad process)
    pass
  return tables


def _replay_stop_handler(spec: ProgramSpec, *unused) -> None:
  del unused
  if not _wait_for_file(spec.learner_done_path, spec.dist.stop_grace_s):
    _log('[replay] the learner did not finish its checkpoint within '
         f'{spec.dist.stop_grace_s:.0f}s; stopping the server anyway')


def make_reverb_checkpointer(path: str):
  """``DefaultCheckpointer`` on ``path``: loads the latest checkpoint there."""
  import reverb
  os.makedirs(path, exist_ok=True)
  return reverb.checkpointers.DefaultCheckpointer(path=path)


# --- counter node ----------------------------------------------------------------


class CounterNode:
  """The root ``acme.utils.counting.Counter`` (restored on resume).

  Courier methods are the Counter's (``increment``, ``get_counts``, ``save``).
  ``run()`` serves until the program stops and then, like the other nodes,
  until the learner's final checkpoint (which reads the counts) is written.
  """

  def __init__(self, spec: ProgramSpec,
               state: Optional[Dict[str, Any]] = None):
    from acme.utils import counting
    self._spec = spec
    self._counter = counting.Counter()
    if state:
      self._counter.restore(state)
    self._stop_event, _ = _lp_hooks()

  def increment(self, **counts) -> Dict[str, float]:
    return self._counter.increment(**counts)

  def get_counts(self) -> Dict[str, float]:
    return self._counter.get_counts()

  def save(self) -> Dict[str, Any]:
    return self._counter.save()

  def run(self) -> None:
    self._stop_event.wait()
    _wait_for_file(self._spec.learner_done_path, self._spec.dist.stop_grace_s)


class BufferedCounter:
  """Child of the counter node with Acme ``Counter`` semantics.

  ``increment`` buffers locally and sends the buffer to the parent (one RPC)
  at most every ``time_delta`` seconds, like ``acme.utils.counting.Counter``
  with a parent; ``flush()`` sends it now (before a checkpoint or a pause), so
  the counts the limiter and the checkpoints see are exact at those points.
  """

  def __init__(self, parent, time_delta: float = 0.5):
    self._parent = parent
    self._delta = float(time_delta)
    self._pending: Dict[str, float] = {}
    self._cache: Dict[str, float] = {}
    self._last = float('-inf')
    self._lock = threading.Lock()

  def increment(self, **counts) -> Dict[str, float]:
    with self._lock:
      for k, v in counts.items():
        self._pending[k] = self._pending.get(k, 0) + v
    return self.get_counts()

  def get_counts(self) -> Dict[str, float]:
    if time.monotonic() - self._last >= self._delta:
      return self.flush()
    with self._lock:
      out = dict(self._cache)
      for k, v in self._pending.items():
        out[k] = out.get(k, 0) + v
    return out

  def flush(self) -> Dict[str, float]:
    with self._lock:
      pending, self._pending = self._pending, {}
      self._last = time.monotonic()
    try:
      self._cache = dict(self._parent.increment(**pending))
    except Exception:  # noqa: BLE001  (keep the counts for the next try)
      with self._lock:
        for k, v in pending.items():
          self._pending[k] = self._pending.get(k, 0) + v
      raise
    return dict(self._cache)


# --- learner ------------------------------------------------------------------------


class PrefetchIterator:
  """Training batches sampled in a background thread (spec 5.3, 6.3b).

  The thread calls ``sampler.sample_train()`` (online queue first, then
  uniform rows; Reverb's rate limiter blocks there). ``next()`` waits for that
  batch in short slices, so a stop request (``should_stop()``) ends the wait
  with ``StopRequested`` and ``on_wait()`` can run bookkeeping meanwhile. With
  ``prefetch`` the next batch is requested as soon as one is handed out, i.e.
  it is drawn while the current update runs (amount 1, spec 6.3b); without,
  it is requested inside ``next()``.

  The sampler has no latent store; ``next()`` overlays the store's freshest
  latents (spec 5.8) in the caller's thread, so every batch sees all earlier
  write-backs and the store is never read and written concurrently.

  Timings: ``wait_s`` (caller blocked waiting for a batch: the learner's idle
  time) and ``sample_s`` (thread time inside ``sample_train``).
  """

  def __init__(self, sampler, latent_store, *, prefetch: bool = True,
               should_stop: Callable[[], bool] = lambda: False,
               on_wait: Optional[Callable[[], None]] = None,
               wait_slice: float = 0.05):
    self._sampler = sampler
    self._store = latent_store
    self._prefetch = bool(prefetch)
    self._should_stop = should_stop
    self._on_wait = on_wait
    self._slice = wait_slice
    self._queue: queue.Queue = queue.Queue()
    self._requests = threading.Semaphore(1 if self._prefetch else 0)
    self._pending = self._prefetch
    self._closed = False
    self.wait_s = 0.0
    self.sample_s = 0.0
    self.batches = 0
    self._wait_since: Optional[float] = None
    self._thread = threading.Thread(target=self._work, name='replay-sampler',
                                    daemon=True)
    self._thread.start()

  @property
  def sampler(self):
    return self._sampler

  @property
  def idle_s(self) -> float:
    """``wait_s`` including a wait still in progress."""
    since = self._wait_since
    return self.wait_s + (time.perf_counter() - since if since else 0.0)

  @property
  def latent_store(self):
    return self._store

  def __iter__(self):
    return self

  def _work(self) -> None:
    while True:
      self._requests.acquire()
      if self._closed:
        return
      t0 = time.perf_counter()
      try:
        batch = self._sampler.sample_train()
      except Exception as e:  # noqa: BLE001  (handed to the caller)
        self._queue.put(e)
        return
      self.sample_s += time.perf_counter() - t0
      self._queue.put(batch)

  def __next__(self) -> Dict[str, Any]:
    if not self._pending:
      self._requests.release()
      self._pending = True
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
      self._requests.release()
      self._pending = True
    self.batches += 1
    return self._overlay(item)

  def _overlay(self, batch: Dict[str, Any]) -> Dict[str, Any]:
    fresh, found = self._store.lookup(batch['step_id'])
    if found.any():
      latent = batch['latent']
      for key in ('deter', 'stoch'):
        latent[key] = np.where(found[..., None], fresh[key], latent[key])
    return batch

  def write_back(self, step_ids, latents) -> int:
    """Stores fresh posteriors (spec 5.9), as ``ReplaySampler.write_back``."""
    return self._store.update(np.asarray(step_ids),
                              {k: np.asarray(v) for k, v in latents.items()})

  def close(self) -> None:
    self._closed = True
    self._requests.release()


class _FixedState:
  """Something with ``get_state()`` (for ``save_replay_state(adder=...)``)."""

  def __init__(self, state):
    self._state = state

  def get_state(self):
    return self._state


class LearnerNode:
  """The learner process: DreamerLearner + variable source + checkpoints.

  Courier methods: ``get_variables(names)`` ('policy': acting params as
  numpy, 'num_updates': their update count), ``get_num_updates()``,
  ``finish()`` (final checkpoint; returns a summary) and ``get_summary()``.
  """

  def __init__(self, spec: ProgramSpec, replay, counter, actors: Sequence[Any],
               evaluator=None):
    import jax

    from agent.builder import DreamerBuilder, seed_keys
    from reverb_tables.latent_store import LatentStore
    from reverb_tables.sampler import ReplaySampler

    self._spec = spec
    run, c = spec.run, spec.config
    self._stop_event, self._stopper = _lp_hooks()
    self._finish_requested = threading.Event()
    self._finished = threading.Event()
    self._replay = replay
    self._counter_client = counter
    self._actors = list(actors)
    self._evaluator = evaluator
    self._builder = DreamerBuilder(c, spec.spaces, num_envs=run.num_envs,
                                   rate_limiter='ratio',
                                   chunk_length=run.chunk_length,
                                   eval_policy=run.eval_policy)
    info = wait_for_replay(replay, self._should_stop)
    self._check_signatures(info)
    self._store = LatentStore(c, run.num_envs)
    sampler = ReplaySampler(replay, c, latent_store=None, seed=c.seed,
                            step_spec=self._builder.step_spec)
    self._iterator = PrefetchIterator(
        sampler, self._store, prefetch=spec.dist.prefetch,
        should_stop=self._should_stop, on_wait=self._periodic)
    self._sampler = sampler
    self._counter = BufferedCounter(counter, spec.dist.counter_sync_s)
    networks = self._builder.make_networks()
    self._learner = self._builder.make_learner(
        seed_keys(c.seed)['learner'], networks, self._iterator, replay,
        self._counter)
    self._jax = jax
    self._base_updates = 0
    self._wall0 = 0.0
    self._next_log = run.log_every
    self._last_eval_state = None
    if spec.resume:
      self._restore(spec.resume, spec.run_state)
    self._publish()
    self._logger = None
    self._summary: Optional[Dict[str, Any]] = None
    self._last_ckpt: Optional[str] = None
    self._last_row_step = None
    self._counts: Dict[str, float] = dict(spec.counts)
    self._t_start = time.perf_counter()
    self._mark = None

  # -- courier methods ------------------------------------------------------------
  def get_variables(self, names: Sequence[str]) -> List[Any]:
    version, policy = self._published
    out = []
    for name in names:
      if name == 'policy':
        out.append(policy)
      elif name == 'num_updates':
        out.append(version)
      else:
        raise ValueError(f"unknown variable {name!r}; valid: 'policy', "
                         "'num_updates'")
    return out

  def get_num_updates(self) -> int:
    return self._published[0]

  def finish(self) -> Dict[str, Any]:
    """Stops training, writes the final checkpoint; returns the summary."""
    self._finish_requested.set()
    while not self._finished.wait(0.5):
      pass
    return self._summary or {}

  def get_summary(self) -> Optional[Dict[str, Any]]:
    return self._summary

  # -- main thread -------------------------------------------------------------------
  def run(self) -> None:
    try:
      self._loop()
      self._final()
    except Exception:  # noqa: BLE001
      record_error(self._spec, 'learner')
      _touch(self._spec.learner_done_path)
      self._finished.set()
      self._stopper()
      raise
    finally:
      self._iterator.close()
    if self._finish_requested.is_set():
      # Keep serving the final parameters (final evaluation) until the stop.
      self._stop_event.wait()

  def _should_stop(self) -> bool:
    return self._stop_event.is_set() or self._finish_requested.is_set()

  def _loop(self) -> None:
    run = self._spec.run
    last_ckpt = time.perf_counter()
    self._mark = self._snapshot()
    while not self._should_stop():
      try:
        self._learner.step()
      except StopRequested:
        break
      self._publish()
      self._periodic()
      if time.perf_counter() - last_ckpt >= run.checkpoint_every:
        self._save_checkpoint()
        last_ckpt = time.perf_counter()

  def _periodic(self) -> None:
    now = time.perf_counter()
    if now - getattr(self, '_last_poll', 0.0) < self._spec.dist.poll_s:
      return
    self._last_poll = now
    try:
      self._counts = self._counter.get_counts()
    except Exception as e:  # noqa: BLE001
      _log(f'[learner] counter unreachable: {e}')
      return
    if self._counts.get('env_steps', 0) >= self._next_log:
      self._write_row()
      log_every = self._spec.run.log_every
      self._next_log = (int(self._counts.get('env_steps', 0)) // log_every + 1
                        ) * log_every

  def _final(self) -> None:
    try:
      self._counts = self._counter.flush()
    except Exception:  # noqa: BLE001
      pass
    env_steps = int(self._counts.get('env_steps', 0))
    if self._last_row_step != env_steps and self._mark is not None:
      self._write_row()
    ckpt = self._save_checkpoint()
    _touch(self._spec.learner_done_path)
    self._summary = self._make_summary(ckpt)
    self._finished.set()
    if self._logger is not None:
      self._logger.close()
      self._logger = None

  def _make_summary(self, ckpt) -> Dict[str, Any]:
    c = self._counts
    last = getattr(self, '_last_row', {}) or {}
    return {
        'checkpoint': ckpt or self._last_ckpt,
        'env_steps': int(c.get('env_steps', 0)),
        'agent_steps': int(c.get('actor_steps', 0)),
        'episodes': int(c.get('episodes', 0)),
        'updates': self.num_updates,
        'stopped_by_signal': self._stop_event.is_set() and
                             not self._finish_requested.is_set(),
        'update_cache_size': self._learner.update_cache_size(),
        'last_row': last,
    }

  @property
  def num_updates(self) -> int:
    return self._base_updates + self._learner.num_steps

  def _publish(self) -> None:
    params = self._learner.get_variables(['policy'])[0]
    self._published = (self.num_updates, self._jax.device_get(params))

  # -- bookkeeping -------------------------------------------------------------------
  def _check_signatures(self, info) -> None:
    for table in self._builder.make_replay_tables():
      name = table.name
      if name not in info or info[name].signature != table.info.signature:
        raise ValueError(
            f'the Reverb server (checkpoint in {self._spec.reverb_dir}) stores '
            f'table {name!r} in another layout than this code writes; resume '
            'with the version that wrote it or use a new --logdir')

  def _snapshot(self) -> Dict[str, float]:
    info = self._replay.server_info()
    rl = info['uniform'].rate_limiter_info
    it = self._iterator
    t = self._learner.timings
    return {
        't': time.perf_counter(), 'env_steps': self._counts.get('env_steps', 0),
        'updates': self.num_updates,
        'inserts': int(rl.insert_stats.completed),
        'samples': int(rl.sample_stats.completed),
        'uniform_rows': self._sampler.num_uniform_rows,
        'online_rows': self._sampler.num_online_rows,
        'wait_s': it.idle_s, 'sample_s': it.sample_s,
        'update_s': t['update_s'], 'write_back_s': t['write_back_s'],
        'uniform_size': int(info['uniform'].current_size),
        'online_size': int(info['online'].current_size),
    }

  def _actor_stats(self) -> List[Dict[str, Any]]:
    stats = []
    for actor in self._actors:
      try:
        stats.append(actor.get_stats())
      except Exception:  # noqa: BLE001  (an actor may be stopping)
        pass
    return stats

  def _write_row(self) -> None:
    if self._logger is None:
      self._logger = MetricsWriter(self._spec.run.logdir)
    c, run = self._spec.config, self._spec.run
    snap = self._snapshot()
    mark = self._mark or snap
    dt = max(snap['t'] - mark['t'], 1e-9)
    T = c.batch_length
    counts = self._counts
    env_steps = int(counts.get('env_steps', 0))
    d_ins = snap['inserts'] - mark['inserts']
    d_smp = snap['samples'] - mark['samples']
    d_rows = (snap['uniform_rows'] - mark['uniform_rows'] +
              snap['online_rows'] - mark['online_rows'])
    fill = c.train_fill
    row = {
        'kind': 'train', 'env_step': env_steps,
        'agent_step': int(counts.get('actor_steps', 0)),
        'updates': self.num_updates,
        'episodes': int(counts.get('episodes', 0)),
        'segment': self._spec.segment,
        'wall_time': self._wall0 + time.perf_counter() - self._t_start,
        'num_actors': self._spec.dist.num_actors,
        'fps/env_steps_per_s': (env_steps - mark['env_steps']) / dt,
        'fps/updates_per_s': (snap['updates'] - mark['updates']) / dt,
        'replay/uniform_size': snap['uniform_size'],
        'replay/online_size': snap['online_size'],
        'replay/uniform_rows': snap['uniform_rows'],
        'replay/online_rows': snap['online_rows'],
        'replay/latent_store_entries': len(self._store),
        'replay/inserts': snap['inserts'],
        'replay/samples': snap['samples'],
        'replay/ratio_target': c.train_ratio,
        # samples x T / inserted steps (items), the limiter's quantity:
        'replay/ratio': snap['samples'] * T / max(1, snap['inserts']),
        # the same after the train_fill warm-up (spec 6.2) the limiter allows:
        'replay/ratio_after_fill': (snap['samples'] * T / (snap['inserts'] - fill)
                                    if snap['inserts'] > fill else None),
        'replay/ratio_window': d_smp * T / d_ins if d_ins > 0 else None,
        # uniform + popped online rows (the online rows are not rate limited):
        'replay/ratio_all_rows_window': d_rows * T / d_ins if d_ins > 0 else None,
        'learner/idle_frac': (snap['wait_s'] - mark['wait_s']) / dt,
        'learner/update_frac': (snap['update_s'] - mark['update_s']) / dt,
        'learner/write_back_frac': (snap['write_back_s'] -
                                    mark['write_back_s']) / dt,
        'learner/sample_thread_frac': (snap['sample_s'] - mark['sample_s']) / dt,
    }
    stats = self._actor_stats()
    prev = getattr(self, '_prev_actor_stats', {})
    lag_n = lag_sum = 0.0
    lag_max = None
    fracs: Dict[str, List[float]] = {'env': [], 'policy': [], 'add': []}
    scores = []
    for s in stats:
      p = prev.get(s['actor_id'])
      if p is None or p.get('pid') != s.get('pid'):
        p = {k: 0.0 for k in s}
      wall = max(s['wall_s'] - p.get('wall_s', 0.0), 1e-9)
      for k in fracs:
        fracs[k].append((s[f'{k}_s'] - p.get(f'{k}_s', 0.0)) / wall)
      lag_n += s['lag_count'] - p.get('lag_count', 0)
      lag_sum += s['lag_sum'] - p.get('lag_sum', 0)
      if s['lag_max_recent'] is not None:
        lag_max = max(lag_max or 0, s['lag_max_recent'])
      scores += s['recent_scores']
    self._prev_actor_stats = {s['actor_id']: s for s in stats}
    row['actor/param_lag_updates_mean'] = lag_sum / lag_n if lag_n else None
    row['actor/param_lag_updates_max'] = lag_max
    for k, v in fracs.items():
      row[f'actor/{k}_frac'] = float(np.mean(v)) if v else None
    row['episode/recent_score_mean'] = float(np.mean(scores)) if scores else None
    for k, v in self._learner.pop_metric_means().items():
      row[f'train/{k}'] = v
    self._logger.write(row)
    self._last_row = {k: v for k, v in row.items() if not k.startswith('train/')}
    self._last_row_step = env_steps
    self._mark = snap

  # -- checkpoints ---------------------------------------------------------------------
  def _save_checkpoint(self) -> Optional[str]:
    """Atomic ckpt-* (module doc); None when a node did not answer."""
    from reverb_tables import checkpoint as rckpt
    spec, run, c = self._spec, self._spec.run, self._spec.config
    t0 = time.perf_counter()
    try:
      reverb_path = self._replay.checkpoint()
      actor_states = [a.get_state() for a in self._actors]   # after Reverb's
      if self._evaluator is not None:
        try:
          self._last_eval_state = self._evaluator.get_state()
        except Exception:  # noqa: BLE001  (keep the last known one)
          pass
      self._counter.flush()
      counter_state = self._counter_client.save()
      counts = self._counter_client.get_counts()
    except Exception as e:  # noqa: BLE001
      _log(f'[learner] checkpoint skipped, a node did not answer: {e}')
      return None
    lengths = np.full(run.num_envs, -1, np.int64)
    for s in actor_states:
      lengths[s['offset']:s['offset'] + s['num_envs']] = np.asarray(
          s['lengths'], np.int64) + STEP_ID_MARGIN
    if (lengths < 0).any():
      _log('[learner] checkpoint skipped: actor states do not cover every '
           'env worker')
      return None
    adder_state = {'lengths': lengths.tolist(),
                   'num_items': int(sum(s['num_items'] for s in actor_states)),
                   'num_online_items': int(sum(s['num_online_items']
                                               for s in actor_states))}
    root = train_lib.checkpoint_root(run.logdir)
    tmp = os.path.join(root, f'{train_lib.TMP_PREFIX}{os.getpid()}-'
                       f'{time.time_ns()}')
    os.makedirs(tmp)
    rckpt.save_replay_state(tmp, reverb_path, adder=_FixedState(adder_state),
                            latent_store=self._store)
    rckpt.atomic_write(os.path.join(tmp, train_lib.LEARNER_FILE),
                       pickle.dumps(self._learner.save(),
                                    protocol=pickle.HIGHEST_PROTOCOL))
    rckpt.atomic_write(os.path.join(tmp, train_lib.CONFIG_FILE), json.dumps({
        'config': dataclasses.asdict(c),
        'spaces': {'obs': {k: list(v) for k, v in spec.spaces.obs.items()},
                   'act_dim': spec.spaces.act_dim,
                   'discrete': spec.spaces.discrete},
        'run': {k: getattr(run, k) for k in train_lib.RESUME_FIXED},
        'mode': MODE,
        'distributed': {'num_actors': spec.dist.num_actors},
    }, indent=1).encode())
    logdir = run.logdir
    state = {
        'mode': MODE,
        'segment': spec.segment,
        'num_actors': spec.dist.num_actors,
        'actors': actor_states,
        'evaluator': self._last_eval_state,
        'counter': counter_state,
        'counts': counts,
        'learner': {
            'updates': self.num_updates,
            'online_rows': self._sampler.num_online_rows,
            'uniform_rows': self._sampler.num_uniform_rows,
            'wall_time': self._wall0 + time.perf_counter() - self._t_start,
            'next_log': self._next_log,
        },
        'files': {
            'metrics_bytes': _file_size(os.path.join(logdir,
                                                     train_lib.METRICS_FILE)),
            'scores_bytes': _file_size(os.path.join(logdir,
                                                    train_lib.SCORES_FILE)),
            'eval_scores_bytes': _file_size(os.path.join(
                logdir, train_lib.EVAL_DIR, train_lib.SCORES_FILE)),
        },
        'time': time.time(),
    }
    rckpt.atomic_write(os.path.join(tmp, train_lib.RUN_STATE_FILE),
                       json.dumps(state, indent=1, default=_json_default).encode())
    agent_steps = int(counts.get('actor_steps', 0))
    final = os.path.join(root, f'{train_lib.CKPT_PREFIX}{agent_steps:012d}')
    if os.path.exists(final):
      shutil.rmtree(final)
    os.rename(tmp, final)
    train_lib.clean_checkpoints(logdir)
    self._last_ckpt = final
    _log(f'[ckpt] {final} ({time.perf_counter() - t0:.1f}s, '
         f'{self.num_updates} updates)')
    return final

  def _restore(self, ckpt: str, state: Dict[str, Any]) -> None:
    from reverb_tables import checkpoint as rckpt
    rckpt.load_replay_state(ckpt, None, latent_store=self._store)
    with open(os.path.join(ckpt, train_lib.LEARNER_FILE), 'rb') as f:
      self._learner.restore(pickle.load(f))
    s = state['learner']
    self._base_updates = int(s['updates'])
    self._sampler.num_online_rows = int(s['online_rows'])
    self._sampler.num_uniform_rows = int(s['uniform_rows'])
    self._wall0 = float(s['wall_time'])
    self._next_log = int(s['next_log'])
    self._last_eval_state = state.get('evaluator')
    _log(f'[learner] resumed from {ckpt}: {self._base_updates} updates, '
         f'{len(self._store)} stored latents')


class MetricsWriter:
  """Appends rows to metrics.jsonl (one line per write, safe with several
  writer processes) and, optionally, TensorBoard scalars (the row format of
  ``experiments/train.py``: step = 'env_step', eval rows under 'eval/')."""

  def __init__(self, logdir: str, tensorboard: bool = True):
    self._path = os.path.join(logdir, train_lib.METRICS_FILE)
    self._tb = None
    if tensorboard:
      import tensorflow as tf
      self._tf = tf
      self._tb = tf.summary.create_file_writer(
          os.path.join(logdir, train_lib.TB_DIR))

  def write(self, row: Dict[str, Any]) -> None:
    clean = {k: _jsonable(v) for k, v in row.items()}
    line = (json.dumps(clean) + '\n').encode()
    fd = os.open(self._path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
      os.write(fd, line)
    finally:
      os.close(fd)
    if self._tb is not None:
      step = int(row.get('env_step', 0))
      with self._tb.as_default():
        for k, v in clean.items():
          if k in ('env_step', 'kind') or isinstance(v, bool) or not isinstance(
              v, (int, float)):
            continue
          self._tf.summary.scalar(k, v, step=step)
      self._tb.flush()

  def close(self) -> None:
    if self._tb is not None:
      self._tb.close()
      self._tb = None


_jsonable = train_lib._jsonable      # same row and file helpers as the
_file_size = train_lib._file_size    # single-process run


def _json_default(x):
  if isinstance(x, (np.integer, np.floating)):
    return x.item()
  if isinstance(x, np.ndarray):
    return x.tolist()
  raise TypeError(f'not JSON serialisable: {type(x).__name__}')


# --- actors --------------------------------------------------------------------------


class SliceAdder:
  """Env workers ``[offset, offset + n)`` of a global ``WindowAdder``.

  The wrapped adder has one stream per env of the whole program, so the step
  ids it writes, (global worker, index), are unique across actors; this view
  is what a ``DreamerActor`` of n envs writes to.
  """

  def __init__(self, adder, offset: int, num_workers: int):
    if offset < 0 or offset + num_workers > adder.num_workers:
      raise ValueError(f'workers [{offset}, {offset + num_workers}) outside '
                       f'the adder\'s {adder.num_workers}')
    self._adder = adder
    self._offset = int(offset)
    self._n = int(num_workers)
    self._add_s = 0.0
    self._since: Optional[float] = None

  @property
  def add_s(self) -> float:
    """Seconds spent in ``add_batch`` (Reverb inserts blocked by the rate
    limiter included), counting a call still in progress."""
    since = self._since
    return self._add_s + (time.perf_counter() - since if since else 0.0)

  @property
  def num_workers(self) -> int:
    return self._n

  @property
  def offset(self) -> int:
    return self._offset

  @property
  def adder(self):
    return self._adder

  @property
  def lengths(self) -> np.ndarray:
    return self._adder.lengths[self._offset:self._offset + self._n]

  def add(self, worker: int, step) -> None:
    if not 0 <= int(worker) < self._n:
      raise ValueError(f'worker {worker} out of range [0, {self._n})')
    self._adder.add(self._offset + int(worker), step)

  def add_batch(self, steps) -> None:
    """Adds one step of each of the n envs (leaves have leading [n])."""
    import jax
    self._since = t0 = time.perf_counter()
    try:
      for w in range(self._n):
        self._adder.add(self._offset + w,
                        jax.tree_util.tree_map(lambda x, w=w: x[w], steps))
    finally:
      self._add_s += time.perf_counter() - t0
      self._since = None

  def flush(self, timeout_ms: Optional[int] = None) -> None:
    self._adder.flush(timeout_ms)


class VersionedVariableClient:
  """Acme ``VariableClient`` over ('policy', 'num_updates').

  ``params`` is what ``DreamerActor`` reads (the acting params); ``version``
  is the learner's update count when they were published.
  """

  def __init__(self, source, update_period: int = 1):
    from acme.jax import variable_utils
    self._client = variable_utils.VariableClient(
        source, ['policy', 'num_updates'], update_period=update_period)

  @property
  def params(self):
    return self._client.params[0]

  @property
  def version(self) -> int:
    return int(self._client.params[1])

  def update(self, wait: bool = False) -> None:
    self._client.update(wait)

  def update_and_wait(self) -> None:
    self._client.update_and_wait()


def make_vector_env(spec: ProgramSpec, num_envs: int, seed: int,
                    first_index: int = 0):
  """``VectorEnv`` whose env i is seeded ``seed * 1000 + first_index + i``."""
  from experiments import envs as envs_lib
  run = spec.run
  venv = envs_lib.VectorEnv(run.task, num_envs, run.action_repeat, seed=seed,
                            time_limit=run.time_limit)
  if first_index:
    for env in venv.envs:
      env.close()
    venv.envs = [envs_lib.DMCEnv(run.task, run.action_repeat,
                                 seed=envs_lib.env_seed(seed, first_index + i),
                                 time_limit=run.time_limit)
                 for i in range(num_envs)]
  return venv


class ActorNode:
  """One actor process: a ``DreamerActor`` over its own ``VectorEnv``.

  The acting loop runs in a daemon thread: a Reverb insert blocked by the
  rate limiter blocks in C++, and the main thread must stay free to take
  Launchpad's stop signal, serve RPCs and exit.

  Courier methods: ``get_state()`` (adder counters, for checkpoints),
  ``get_stats()`` (cumulative timings, parameter-lag probes, scores) and
  ``pause()`` (stop acting, flush the adder and the counts; used by the step
  limiter before the final checkpoint).
  """

  def __init__(self, spec: ProgramSpec, actor_id: int, replay, learner,
               counter):
    import jax

    from agent.actor import DreamerActor
    from agent.builder import DreamerBuilder, seed_keys
    from experiments import envs as envs_lib

    self._spec = spec
    run, c = spec.run, spec.config
    self._id = int(actor_id)
    self._name = f'actor/{self._id}'
    self._n = spec.envs_per_actor
    self._offset = spec.worker_offset(self._id)
    self._stop_event, self._stopper = _lp_hooks()
    self._halt = threading.Event()
    self._pause_requested = threading.Event()
    self._paused = threading.Event()
    self._error: Optional[BaseException] = None
    self._learner = learner
    self._envs_lib = envs_lib
    env_seed = c.seed + train_lib.SEGMENT_SEED_STRIDE * spec.segment
    self.envs = make_vector_env(spec, self._n, env_seed, self._offset)
    builder = DreamerBuilder(c, spec.spaces, num_envs=run.num_envs,
                             rate_limiter='ratio', chunk_length=run.chunk_length)
    wait_for_replay(replay, self._stop_event.is_set)
    inner = builder.make_adder(replay)
    saved = self._saved_adder_state()
    if saved is not None:
      inner.set_state(saved)
    self.adder = SliceAdder(inner, self._offset, self._n)
    policy, mode = builder.make_policy(builder.make_networks())
    self._client = VersionedVariableClient(learner, spec.dist.update_period)
    # Policy stream of (seed, actor, segment): resumed segments never repeat it.
    key = jax.random.fold_in(jax.random.fold_in(
        seed_keys(c.seed)['actor'], self._id), spec.segment)
    self.actor = DreamerActor(policy, spec.spaces, self._n, key, self._client,
                              self.adder, mode=mode)
    self._counter = BufferedCounter(counter, spec.dist.counter_sync_s)
    self._pid = os.getpid()
    self._t0 = time.perf_counter()
    self.agent_steps = 0
    self.episodes = 0
    self._env_s = 0.0
    self._lag_sum = 0.0
    self._lag_count = 0
    self._lag_max_recent: Optional[int] = None
    self._recent_scores: List[float] = []

  def _saved_adder_state(self):
    if not self._spec.resume:
      return None
    with open(os.path.join(self._spec.resume, 'replay_state.json')) as f:
      return json.load(f)['adder']

  # -- courier methods --------------------------------------------------------------
  def get_state(self) -> Dict[str, Any]:
    inner = self.adder.adder
    return {'actor_id': self._id, 'offset': self._offset, 'num_envs': self._n,
            'lengths': self.adder.lengths.tolist(),
            'num_items': inner.num_items_created,
            'num_online_items': inner.num_online_items,
            'num_policy_calls': int(self.actor.num_policy_calls),
            'agent_steps': int(self.agent_steps)}

  def get_stats(self) -> Dict[str, Any]:
    lag_max, self._lag_max_recent = self._lag_max_recent, None
    return {'actor_id': self._id, 'pid': self._pid,
            'wall_s': time.perf_counter() - self._t0,
            'env_s': self._env_s,
            'policy_s': self.actor.timings['policy_s'],
            'add_s': self.adder.add_s,
            'agent_steps': self.agent_steps, 'episodes': self.episodes,
            'lag_sum': self._lag_sum, 'lag_count': self._lag_count,
            'lag_max_recent': lag_max,
            'recent_scores': list(self._recent_scores)}

  def pause(self, timeout: float = 600.0) -> bool:
    """Stops acting after the current vector step; flushes adder and counts."""
    self._pause_requested.set()
    return self._paused.wait(timeout)

  # -- main thread ----------------------------------------------------------------------
  def run(self) -> None:
    thread = threading.Thread(target=self._act, name='acting', daemon=True)
    thread.start()
    while thread.is_alive() and not self._stop_event.wait(0.2):
      pass
    failed = self._error is not None and not self._stop_event.is_set()
    if failed:
      record_error(self._spec, self._name)
      self._stopper()
    # Serve get_state() until the learner's final checkpoint is written.
    _wait_for_file(self._spec.learner_done_path, self._spec.dist.stop_grace_s)
    self._halt.set()
    thread.join(5.0)
    if thread.is_alive():
      # Blocked in a Reverb insert that the stopped learner will never
      # unblock: nothing is left to save, so leave without waiting for it.
      _log(f'[{self._name}] acting thread blocked in Reverb; exiting')
      sys.stdout.flush()
      sys.stderr.flush()
      os._exit(1 if failed else 0)
    self.envs.close()
    if failed:
      raise RuntimeError(f'{self._name} failed: {self._error!r}')

  def _act(self) -> None:
    try:
      self._loop()
    except StopRequested:
      pass
    except BaseException as e:  # noqa: BLE001  (reported by run())
      self._error = e
      if not self._stop_event.is_set():
        _log(f'[{self._name}] acting failed:\n{traceback.format_exc()}')

  def _stopping(self) -> bool:
    return self._stop_event.is_set() or self._halt.is_set()

  def _wait_for_params(self) -> None:
    while True:
      try:
        _call_until(self._client.update_and_wait, self._stopping)
        return
      except StopRequested:
        raise
      except Exception as e:  # noqa: BLE001
        if not _is_timeout(e):
          raise
        _log(f'[{self._name}] waiting for the learner: {e}')

  def _loop(self) -> None:
    spec, run = self._spec, self._spec.run
    obs = self.envs.reset()
    self.actor.observe_first(obs)
    tracker = self._envs_lib.EpisodeTracker(self._n)
    self._wait_for_params()
    from experiments.report import append_score
    probe_every = spec.dist.lag_probe_every
    step = 0
    while not self._stopping():
      if self._pause_requested.is_set():
        self._do_pause()
        return
      action = self.actor.select_action(obs)
      version = self._client.version
      t0 = time.perf_counter()
      next_obs = self.envs.step(action, reset=obs['is_last'])
      self._env_s += time.perf_counter() - t0
      self.actor.observe(action, next_obs)      # may block on the limiter
      self.actor.update()                       # async VariableClient fetch
      self.agent_steps += self._n
      counts = self._counter.increment(actor_steps=self._n,
                                       env_steps=self._n * run.action_repeat)
      for ep in tracker.update(obs, env_step=int(counts.get('env_steps', 0))):
        append_score(run.logdir, run.task, ep.env_step, ep.score,
                     spec.config.seed)
        self.episodes += 1
        self._counter.increment(episodes=1)
        self._recent_scores = (self._recent_scores + [ep.score])[-5:]
      obs = next_obs
      step += 1
      if step % probe_every == 0:
        self._probe_lag(version)

  def _do_pause(self) -> None:
    try:
      self.adder.flush(timeout_ms=60_000)
    except Exception as e:  # noqa: BLE001  (the items are simply not saved)
      _log(f'[{self._name}] adder flush at pause failed: {e}')
    try:
      self._counter.flush()
    except Exception as e:  # noqa: BLE001
      _log(f'[{self._name}] counter flush at pause failed: {e}')
    self._paused.set()
    _log(f'[{self._name}] paused after {self.agent_steps} agent steps')

  def _probe_lag(self, version: int) -> None:
    try:
      lag = int(self._learner.get_num_updates()) - int(version)
    except Exception:  # noqa: BLE001  (learner busy or stopping)
      return
    self._lag_sum += lag
    self._lag_count += 1
    self._lag_max_recent = max(self._lag_max_recent or 0, lag)


# --- evaluator -------------------------------------------------------------------------


class EvaluatorNode:
  """Spec 7.3 evaluation: ``eval_episodes`` envs, one episode each.

  Runs when the counter passes a multiple of ``--eval_every`` env steps and
  once more at the end (``evaluate_final``). Scores go to
  ``eval/scores.jsonl`` and rows with kind 'eval' to metrics.jsonl, as in the
  single-process run.
  """

  def __init__(self, spec: ProgramSpec, learner, counter):
    import jax
    from acme.jax import variable_utils

    from agent.actor import DreamerActor
    from agent.builder import DreamerBuilder, seed_keys
    from experiments import envs as envs_lib

    self._spec = spec
    run, c = spec.run, spec.config
    self._stop_event, self._stopper = _lp_hooks()
    self._counter = counter
    self._envs_lib = envs_lib
    n = run.eval_episodes
    seed = (c.seed + train_lib.EVAL_SEED_OFFSET +
            train_lib.SEGMENT_SEED_STRIDE * spec.segment)
    self.envs = envs_lib.VectorEnv(run.task, n, run.action_repeat, seed=seed,
                                   time_limit=run.time_limit)
    builder = DreamerBuilder(c, spec.spaces, num_envs=run.num_envs,
                             eval_policy=run.eval_policy)
    policy, mode = builder.make_policy(builder.make_networks(), evaluation=True)
    key = jax.random.fold_in(seed_keys(c.seed)['eval'], spec.segment)
    self.actor = DreamerActor(policy, spec.spaces, n, key,
                              variable_utils.VariableClient(learner, 'policy'),
                              None, mode=mode)
    saved = (spec.run_state or {}).get('evaluator') or {}
    self.eval_runs = int(saved.get('eval_runs', 0))
    self.last_eval_step = saved.get('last_eval_step')
    env_steps = int(spec.counts.get('env_steps', 0))
    self.next_eval = ((env_steps // run.eval_every + 1) * run.eval_every
                      if run.eval_every else None)
    self._final_request: Optional[int] = None
    self._final_done = threading.Event()
    self._final_row: Optional[Dict[str, Any]] = None
    self._logger = None

  def get_state(self) -> Dict[str, Any]:
    return {'eval_runs': self.eval_runs, 'last_eval_step': self.last_eval_step,
            'next_eval': self.next_eval}

  def evaluate_final(self, env_step: int) -> Optional[Dict[str, Any]]:
    """Final evaluation at ``env_step`` (skipped if one ran there)."""
    self._final_request = int(env_step)
    while not self._final_done.wait(0.5):
      if self._stop_event.is_set():
        return None
    return self._final_row

  def run(self) -> None:
    try:
      self._loop()
    except StopRequested:
      pass
    except Exception:  # noqa: BLE001
      if not self._stop_event.is_set():
        record_error(self._spec, 'evaluator')
        self._final_done.set()
        self._stopper()
        raise
    finally:
      if self._logger is not None:
        self._logger.close()
    _wait_for_file(self._spec.learner_done_path, self._spec.dist.stop_grace_s)
    self.envs.close()

  def _loop(self) -> None:
    stop = self._stop_event
    while not stop.wait(self._spec.dist.poll_s):
      if self._final_request is not None:
        step = self._final_request
        if self.last_eval_step != step:
          self._final_row = self.evaluate(step)
        self._final_done.set()
        stop.wait()
        return
      if self.next_eval is None:
        continue
      env_steps = int(self._counter.get_counts().get('env_steps', 0))
      if env_steps >= self.next_eval:
        self.evaluate(env_steps)
        every = self._spec.run.eval_every
        self.next_eval = (env_steps // every + 1) * every

  def evaluate(self, env_step: int) -> Dict[str, Any]:
    from experiments.report import append_score
    run = self._spec.run
    t0 = time.perf_counter()
    n = run.eval_episodes
    actor = self.actor
    actor.update(wait=True)

    def should_stop():
      if self._stop_event.is_set():
        raise StopRequested()

    scores, lengths = train_lib.run_eval_episodes(
        actor, self.envs, n, self._envs_lib, should_stop)
    self.eval_runs += 1
    for s in scores:
      append_score(os.path.join(run.logdir, train_lib.EVAL_DIR), run.task,
                   env_step, float(s), self._spec.config.seed)
    row = {'kind': 'eval', 'env_step': int(env_step),
           **train_lib.eval_metrics(scores, lengths, actor.mode,
                                    time.perf_counter() - t0)}
    if self._logger is None:
      self._logger = MetricsWriter(run.logdir)
    self._logger.write(row)
    self.last_eval_step = int(env_step)
    _log(f'[eval] {env_step} env steps: score {row["eval/score_mean"]:.1f} +- '
         f'{row["eval/score_std"]:.1f} over {n} episodes ({actor.mode} policy)')
    return row


# --- step limiter -----------------------------------------------------------------------


class StepLimiter:
  """Stops the program at ``--env_steps`` (Acme ``StepsLimiter`` pattern).

  Polls the counter; at the budget it pauses the actors (their last items
  flushed), asks the learner for its final checkpoint (``finish``), the
  evaluator for the final evaluation, writes
  ``summary.json`` into the launch folder and calls ``lp.stop()``.
  """

  def __init__(self, spec: ProgramSpec, counter, learner, actors=(),
               evaluator=None):
    self._spec = spec
    self._counter = counter
    self._learner = learner
    self._actors = list(actors)
    self._evaluator = evaluator
    self._stop_event, self._stopper = _lp_hooks()

  def run(self) -> None:
    try:
      self._run()
    except StopRequested:
      pass
    except Exception:  # noqa: BLE001
      if not self._stop_event.is_set():
        record_error(self._spec, 'limiter')
        self._stopper()
        raise

  def _run(self) -> None:
    spec = self._spec
    budget = spec.run.env_steps
    stop = self._stop_event
    last_print = 0.0
    while not stop.wait(spec.dist.poll_s):
      counts = _call_until(self._counter.get_counts, stop.is_set)
      env_steps = int(counts.get('env_steps', 0))
      now = time.monotonic()
      if now - last_print >= spec.run.progress_every:
        _log(f'[limiter] {env_steps}/{budget} env steps, '
             f'{int(counts.get("learner_steps", 0))} learner steps (counter)')
        last_print = now
      if env_steps >= budget:
        break
    else:
      return
    _log(f'[limiter] step budget {budget} reached: pausing the actors')
    futures = [actor.futures.pause() for actor in self._actors]
    paused = [_call_until(f.result, stop.is_set) for f in futures]
    _log(f'[limiter] actors paused ({sum(map(bool, paused))}/{len(paused)}); '
         'final checkpoint')
    summary = _call_until(self._learner.finish, stop.is_set)
    if self._evaluator is not None:
      summary['eval'] = _call_until(
          functools.partial(self._evaluator.evaluate_final,
                            summary['env_steps']), stop.is_set)
    summary['stopped_by'] = 'step_limiter'
    from reverb_tables import checkpoint as rckpt
    rckpt.atomic_write(os.path.join(spec.launch_dir, SUMMARY_FILE),
                       json.dumps(summary, default=_json_default).encode())
    _log('[limiter] stopping the program')
    self._stopper()


# --- the program ----------------------------------------------------------------------------


def build_program(spec: ProgramSpec, name: str = 'dreamerv3'):
  """The ``lp.Program`` of the module doc (groups in ``GROUPS``)."""
  import launchpad as lp
  dist = spec.dist
  program = lp.Program(name=name)
  with program.group('replay'):
    replay = program.add_node(lp.ReverbNode(
        functools.partial(make_replay_tables, spec),
        checkpoint_ctor=functools.partial(make_reverb_checkpointer,
                                          spec.reverb_dir)))
  with program.group('counter'):
    counter = program.add_node(lp.CourierNode(
        CounterNode, spec, (spec.run_state or {}).get('counter')))

  def timed(handle, timeout=dist.rpc_timeout_s):
    handle.set_client_kwargs(call_timeout=timeout)
    return handle

  learner_node = lp.CourierNode(LearnerNode)
  learner = timed(learner_node.create_handle())   # actors, evaluator
  learner_untimed = learner_node.create_handle()    # finish(): no timeout
  timed(counter)
  actor_nodes = [lp.CourierNode(ActorNode, spec, k, replay, learner, counter)
                 for k in range(dist.num_actors)]
  actors = [timed(node.create_handle(), 30.0) for node in actor_nodes]
  actors_untimed = [node.create_handle() for node in actor_nodes]   # pause()
  evaluator_node = evaluator = evaluator_untimed = None
  if spec.run.eval_episodes:
    evaluator_node = lp.CourierNode(EvaluatorNode, spec, learner, counter)
    evaluator = timed(evaluator_node.create_handle(), 30.0)
    evaluator_untimed = evaluator_node.create_handle()
  learner_node.configure(spec, replay, counter, actors, evaluator)
  with program.group('learner'):
    program.add_node(learner_node)
  with program.group('actor'):
    for node in actor_nodes:
      program.add_node(node)
  if evaluator_node is not None:
    with program.group('evaluator'):
      program.add_node(evaluator_node)
  with program.group('limiter'):
    program.add_node(lp.CourierNode(StepLimiter, spec, counter,
                                    learner_untimed, actors_untimed,
                                    evaluator_untimed))
  return program


def local_resources(spec: ProgramSpec, init_file: str, groups: Sequence[str]):
  """``{group: lp.PythonProcess}``: init file, env vars, notice period.

  Only the learner may use an accelerator; every other node runs jax on CPU.
  """
  from experiments import lp_init
  base = {'PYTHONUNBUFFERED': '1', 'MUJOCO_GL': 'disable',
          'TF_CPP_MIN_LOG_LEVEL': '1'}
  out = {}
  for group in groups:
    env = dict(base)
    if group != 'learner':
      env['JAX_PLATFORMS'] = 'cpu'
    env[lp_init.NOTICE_ENV] = str(spec.dist.termination_notice_s)
    out[group] = lp_init.python_process(init_file, env=env)
  return out
