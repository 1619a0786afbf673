r"""DreamerV3 as a Launchpad program (``local_mp``), in Acme's distributed layout.

``build_program(spec)`` follows ``acme.jax.layouts.distributed_layout``:

  replay     ``lp.ReverbNode`` with the builder's tables ('ratio': the uniform
             table's SampleToInsertRatio couples actors and learner, spec 6.1
             "parallel"); Reverb checkpoints in ``<logdir>/checkpoints/reverb``.
  counter    ``lp.CourierNode`` over an ``acme.utils.counting.Counter``
             (actor_steps, env_steps, episodes, learner_steps).
  learner    ``lp.CourierNode``: the builder's ``DreamerLearner`` over the
             builder's dataset (one batch ahead, spec 6.3b), the variable
             source of the actors; writes metrics rows and checkpoints.
  actor      ``num_actors`` x ``lp.CourierNode`` running an
             ``acme.EnvironmentLoop`` (``experiments.env_loop``) with the
             builder's actor over ``num_envs / num_actors`` envs.
  evaluator  (with ``--eval_episodes`` > 0) spec 7.3 evaluations every
             ``--eval_every`` env steps and at the end.
  limiter    the step budget (``acme.utils.lp_utils.StepsLimiter``'s job).

What Acme's layout lacks is added here as small named pieces: the learner
also owns the latent write-back store (spec 5.9); checkpoints pair the Reverb
checkpoint with every actor's adder counters (step ids); a step budget that
ends with a final checkpoint and evaluation rather than a bare ``lp.stop()``;
resume (``experiments.rundir``, the same run directory as one process).

Worker ids: all actors write into one global layout of ``num_envs`` env
workers; actor k's adder has ``worker_offset = k * n`` (n envs per actor), so
step ids (worker, index) stay unique across actors and the learner's single
``LatentStore`` keeps one ring per global worker.

Stopping: the step budget ends in ``StepLimiter`` -> ``actor.pause()`` (all)
-> ``learner.finish()`` (final checkpoint) -> ``evaluator.evaluate_final()``
-> ``lp.stop()``. A Ctrl-C or SIGTERM of the launcher makes Launchpad send
SIGTERM to every node; the learner then writes a final checkpoint while the
replay server, counter, actors and evaluator wait for it (a marker file, at
most ``stop_grace_s``), and Launchpad's termination notice (``stop_grace_s``
+ 30 s) kills whatever is left. Every node process also gets SIGTERM if the
launcher dies (``experiments/lp_init.py``).

Checkpoints (``experiments.rundir``): the learner checkpoints the Reverb
server first and then reads every actor's adder counters, so the saved
step-id counters are never behind an item in the Reverb checkpoint
(``run_state.json`` has ``"mode": "distributed"``). See docs/deviations.md
"Distributed runs".
"""

from __future__ import annotations

import dataclasses
import functools
import json
import os
import sys
import threading
import time
import traceback
from typing import Any, Callable, Dict, List, Optional, Sequence

import numpy as np

import agent  # noqa: F401  (jax compat before anything imports acme)
from acme.utils import counting
from agent.config import DreamerConfig
from agent.learner import StopRequested
from agent.types import EnvSpaces
from experiments import rundir

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
  update_period: the actors' ``VariableClient`` update_period (vector steps
    between asynchronous parameter fetches).
  lag_probe_every: vector steps between the actors' parameter-lag probes.
  counter_sync_s: time_delta of the actors' and learner's child Counters.
  poll_s: poll interval of the limiter, evaluator and learner bookkeeping.
  stop_grace_s: after a stop signal, the longest the replay server, actors
    and evaluator wait for the learner's final checkpoint.
  rpc_timeout_s: courier call timeout of the actors' and learner's RPCs.
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
  run: rundir.RunConfig
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

  @property
  def learner_done_path(self) -> str:
    return os.path.join(self.launch_dir, LEARNER_DONE_FILE)

  @property
  def counts(self) -> Dict[str, float]:
    return dict((self.run_state or {}).get('counts', {}))

  def builder(self, **kwargs):
    from agent.builder import DreamerBuilder
    run = self.run
    return DreamerBuilder(self.config, self.spaces, num_envs=run.num_envs,
                          rate_limiter='ratio', chunk_length=run.chunk_length,
                          eval_policy=run.eval_policy, prefetch=run.prefetch,
                          **kwargs)

  def wait_for_learner(self) -> bool:
    """Blocks until the learner's final checkpoint is written (or the grace)."""
    deadline = time.monotonic() + self.dist.stop_grace_s
    while not os.path.exists(self.learner_done_path):
      if time.monotonic() >= deadline:
        return False
      time.sleep(0.1)
    return True


# --- small helpers ------------------------------------------------------------


def _lp_hooks():
  """(stop event, program stopper) of this node; inert outside Launchpad."""
  try:
    import launchpad as lp
    from launchpad import context
    return lp.stop_event(), context.get_context().program_stopper
  except (RuntimeError, AssertionError, AttributeError):
    event = threading.Event()
    return event, event.set


def _touch(path: str) -> None:
  os.makedirs(os.path.dirname(path), exist_ok=True)
  with open(path, 'a'):
    pass


def record_error(spec: ProgramSpec, node: str) -> None:
  """Writes the current exception's traceback to <launch_dir>/errors/<node>."""
  text = traceback.format_exc()
  rundir.log(f'[{node}] failed:\n{text}')
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


def wait_for_replay(client, stop: Callable[[], bool], poll: float = 0.5):
  """Blocks until the Reverb server answers (it may start after us)."""
  while True:
    try:
      return client.server_info(timeout=5)
    except Exception:  # noqa: BLE001  (server not up yet)
      if stop():
        raise StopRequested()
      time.sleep(poll)


class SyncedCounter(counting.Counter):
  """``acme.utils.counting.Counter`` child with ``flush()``: sends the local
  counts to the parent now (before a checkpoint or a pause), so the counts the
  limiter and the checkpoints read are exact at those points."""

  def flush(self) -> Dict[str, float]:
    self._last_sync_time = 0.0
    return self.get_counts()


# --- replay and counter nodes -------------------------------------------------------


def make_replay_tables(spec: ProgramSpec):
  """The builder's tables with the 'ratio' rate limiter (spec 6.1 parallel).

  Runs in the replay process; it also registers a Launchpad stop handler that
  keeps the server up after a stop signal until the learner has written its
  final checkpoint (at most ``stop_grace_s``)."""
  tables = spec.builder().make_replay_tables()
  try:
    import launchpad as lp
    lp.register_stop_handler(lambda *_: spec.wait_for_learner())
  except Exception:  # noqa: BLE001  (outside a Launchpad process)
    pass
  return tables


def make_reverb_checkpointer(path: str):
  """``DefaultCheckpointer`` on ``path``: loads the latest checkpoint there."""
  import reverb
  os.makedirs(path, exist_ok=True)
  return reverb.checkpointers.DefaultCheckpointer(path=path)


class CounterNode(counting.Counter):
  """The root Counter (restored on resume); ``run()`` serves until the program
  stops and then until the learner's final checkpoint (which reads it)."""

  def __init__(self, spec: ProgramSpec, state: Optional[Dict[str, Any]] = None):
    super().__init__()
    self._spec = spec
    if state:
      self.restore(state)

  def run(self) -> None:
    _lp_hooks()[0].wait()
    self._spec.wait_for_learner()


# --- learner --------------------------------------------------------------------------


class LearnerNode:
  """The learner process: DreamerLearner + variable source + checkpoints.

  Courier methods: ``get_variables(names)`` ('policy': acting params as
  numpy, 'num_updates': their update count), ``get_num_updates()``,
  ``finish()`` (final checkpoint; returns a summary) and ``get_summary()``.
  """

  def __init__(self, spec: ProgramSpec, replay, counter, actors: Sequence[Any],
               evaluator=None):
    import jax

    from agent.builder import seed_keys
    from reverb_tables import checkpoint as rckpt

    self._spec = spec
    self._jax = jax
    self._stop_event, self._stopper = _lp_hooks()
    self._finish_requested = threading.Event()
    self._finished = threading.Event()
    self._replay, self._counter_client = replay, counter
    self._actors, self._evaluator = list(actors), evaluator
    builder = spec.builder()
    info = wait_for_replay(replay, self._should_stop)
    for table in builder.make_replay_tables():
      if info.get(table.name) is None or (
          info[table.name].signature != table.info.signature):
        raise ValueError(
            f'the Reverb server (checkpoint in {rundir.reverb_dir(spec.run.logdir)})'
            f' stores table {table.name!r} in another layout than this code '
            'writes; resume with the version that wrote it or use a new --logdir')
    self._dataset = builder.make_dataset_iterator(
        replay, should_stop=self._should_stop, on_wait=self._periodic)
    self._counter = SyncedCounter(counter, time_delta=spec.dist.counter_sync_s)
    self._learner = builder.make_learner(
        seed_keys(spec.config.seed)['learner'], builder.make_networks(),
        self._dataset, replay, self._counter)
    self._base_updates, self._wall0 = 0, 0.0
    self._next_log = spec.run.log_every
    self._last_eval_state = None
    state = spec.run_state
    if spec.resume:
      rckpt.load_replay_state(spec.resume, None,
                              latent_store=self._dataset.latent_store)
      self._learner.restore(rundir.load_learner_state(spec.resume))
      s = state['learner']
      self._base_updates = int(s['updates'])
      self._dataset.sampler.num_online_rows = int(s['online_rows'])
      self._dataset.sampler.num_uniform_rows = int(s['uniform_rows'])
      self._wall0, self._next_log = float(s['wall_time']), int(s['next_log'])
      self._last_eval_state = state.get('evaluator')
      rundir.log(f'[learner] resumed from {spec.resume}: {self._base_updates} '
                 f'updates, {len(self._dataset.latent_store)} stored latents')
    self._publish()
    self._logger = None
    self._summary: Optional[Dict[str, Any]] = None
    self._last_ckpt: Optional[str] = None
    self._last_row: Dict[str, Any] = {}
    self._last_row_step = None
    self._prev_actor_stats: Dict[int, Dict[str, Any]] = {}
    self._counts: Dict[str, float] = dict(spec.counts)
    self._t_start = time.perf_counter()
    self._last_poll = 0.0
    self._mark = None

  # -- courier methods ------------------------------------------------------------
  def get_variables(self, names: Sequence[str]) -> List[Any]:
    version, policy = self._published
    table = {'policy': policy, 'num_updates': version}
    for name in names:
      if name not in table:
        raise ValueError(f"unknown variable {name!r}; valid: {sorted(table)}")
    return [table[name] for name in names]

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
      self._dataset.close()
    if self._finish_requested.is_set():
      # Keep serving the final parameters (final evaluation) until the stop.
      self._stop_event.wait()

  def _should_stop(self) -> bool:
    return self._stop_event.is_set() or self._finish_requested.is_set()

  def _loop(self) -> None:
    last_ckpt = time.perf_counter()
    self._mark = self._snapshot()
    while not self._should_stop():
      try:
        self._learner.step()
      except StopRequested:
        break
      self._publish()
      self._periodic()
      if time.perf_counter() - last_ckpt >= self._spec.run.checkpoint_every:
        self._save_checkpoint()
        last_ckpt = time.perf_counter()

  def _periodic(self) -> None:
    now = time.perf_counter()
    if now - self._last_poll < self._spec.dist.poll_s:
      return
    self._last_poll = now
    try:
      self._counts = self._counter.get_counts()
    except Exception as e:  # noqa: BLE001
      rundir.log(f'[learner] counter unreachable: {e}')
      return
    env_steps = int(self._counts.get('env_steps', 0))
    if env_steps >= self._next_log:
      self._write_row()
      every = self._spec.run.log_every
      self._next_log = (env_steps // every + 1) * every

  def _final(self) -> None:
    try:
      self._counts = self._counter.flush()
    except Exception:  # noqa: BLE001
      pass
    if self._last_row_step != int(self._counts.get('env_steps', 0)):
      self._write_row()
    ckpt = self._save_checkpoint()
    _touch(self._spec.learner_done_path)
    c = self._counts
    self._summary = {
        'checkpoint': ckpt or self._last_ckpt,
        'env_steps': int(c.get('env_steps', 0)),
        'agent_steps': int(c.get('actor_steps', 0)),
        'episodes': int(c.get('episodes', 0)), 'updates': self.num_updates,
        'stopped_by_signal': self._stop_event.is_set() and
                             not self._finish_requested.is_set(),
        'update_cache_size': self._learner.update_cache_size(),
        'last_row': self._last_row}
    self._finished.set()
    if self._logger is not None:
      self._logger.close()

  @property
  def num_updates(self) -> int:
    return self._base_updates + self._learner.num_steps

  def _publish(self) -> None:
    params = self._learner.get_variables(['policy'])[0]
    self._published = (self.num_updates, self._jax.device_get(params))

  # -- metrics -----------------------------------------------------------------------
  def _snapshot(self) -> Dict[str, float]:
    info = self._replay.server_info()
    rl = info['uniform'].rate_limiter_info
    t, it = self._learner.timings, self._dataset
    return {
        't': time.perf_counter(), 'env_steps': self._counts.get('env_steps', 0),
        'updates': self.num_updates,
        'inserts': int(rl.insert_stats.completed),
        'samples': int(rl.sample_stats.completed),
        'rows': it.sampler.num_uniform_rows + it.sampler.num_online_rows,
        'wait_s': it.idle_s, 'sample_s': it.sample_s,
        'update_s': t['update_s'], 'write_back_s': t['write_back_s'],
        'uniform_size': int(info['uniform'].current_size),
        'online_size': int(info['online'].current_size)}

  def _actor_row(self) -> Dict[str, Any]:
    stats = []
    for actor in self._actors:
      try:
        stats.append(actor.get_stats())
      except Exception:  # noqa: BLE001  (an actor may be stopping)
        pass
    fracs: Dict[str, List[float]] = {'env': [], 'policy': [], 'add': []}
    lag_n = lag_sum = 0.0
    lag_max, scores = None, []
    for s in stats:
      p = self._prev_actor_stats.get(s['actor_id'])
      if p is None or p['pid'] != s['pid']:
        p = {k: 0.0 for k in s}
      wall = max(s['wall_s'] - p['wall_s'], 1e-9)
      for k in fracs:
        fracs[k].append((s[f'{k}_s'] - p[f'{k}_s']) / wall)
      lag_n += s['lag_count'] - p['lag_count']
      lag_sum += s['lag_sum'] - p['lag_sum']
      if s['lag_max_recent'] is not None:
        lag_max = max(lag_max or 0, s['lag_max_recent'])
      scores += s['recent_scores']
    self._prev_actor_stats = {s['actor_id']: s for s in stats}
    row = {f'actor/{k}_frac': float(np.mean(v)) if v else None
           for k, v in fracs.items()}
    row['actor/param_lag_updates_mean'] = lag_sum / lag_n if lag_n else None
    row['actor/param_lag_updates_max'] = lag_max
    row['episode/recent_score_mean'] = float(np.mean(scores)) if scores else None
    return row

  def _write_row(self) -> None:
    if self._logger is None:
      self._logger = rundir.RunLogger(self._spec.run.logdir)
    c = self._spec.config
    snap = self._snapshot()
    mark = self._mark or snap
    dt = max(snap['t'] - mark['t'], 1e-9)
    T, fill = c.batch_length, c.train_fill
    d_ins = snap['inserts'] - mark['inserts']
    counts = self._counts
    env_steps = int(counts.get('env_steps', 0))
    row = {
        'kind': 'train', 'env_step': env_steps,
        'agent_step': int(counts.get('actor_steps', 0)),
        'updates': self.num_updates, 'episodes': int(counts.get('episodes', 0)),
        'segment': self._spec.segment,
        'wall_time': self._wall0 + time.perf_counter() - self._t_start,
        'num_actors': self._spec.dist.num_actors,
        'fps/env_steps_per_s': (env_steps - mark['env_steps']) / dt,
        'fps/updates_per_s': (snap['updates'] - mark['updates']) / dt,
        'replay/uniform_size': snap['uniform_size'],
        'replay/online_size': snap['online_size'],
        'replay/uniform_rows': self._dataset.sampler.num_uniform_rows,
        'replay/online_rows': self._dataset.sampler.num_online_rows,
        'replay/latent_store_entries': len(self._dataset.latent_store),
        'replay/inserts': snap['inserts'], 'replay/samples': snap['samples'],
        'replay/ratio_target': c.train_ratio,
        # samples x T / inserted items, the limiter's quantity (uniform rows):
        'replay/ratio': snap['samples'] * T / max(1, snap['inserts']),
        'replay/ratio_after_fill': (snap['samples'] * T / (snap['inserts'] - fill)
                                    if snap['inserts'] > fill else None),
        'replay/ratio_window': ((snap['samples'] - mark['samples']) * T / d_ins
                                if d_ins > 0 else None),
        # uniform + online rows (the ratio the limiter keeps, tables doc):
        'replay/ratio_all_rows_window': ((snap['rows'] - mark['rows']) * T / d_ins
                                         if d_ins > 0 else None),
        'learner/idle_frac': (snap['wait_s'] - mark['wait_s']) / dt,
        'learner/update_frac': (snap['update_s'] - mark['update_s']) / dt,
        'learner/write_back_frac': (snap['write_back_s'] -
                                    mark['write_back_s']) / dt,
        'learner/sample_thread_frac': (snap['sample_s'] - mark['sample_s']) / dt,
        **self._actor_row()}
    for k, v in self._learner.pop_metric_means().items():
      row[f'train/{k}'] = v
    self._logger.write(row)
    self._last_row = {k: v for k, v in row.items() if not k.startswith('train/')}
    self._last_row_step = env_steps
    self._mark = snap

  # -- checkpoints ---------------------------------------------------------------------
  def _save_checkpoint(self) -> Optional[str]:
    """Atomic ckpt-* (module doc); None when a node did not answer."""
    spec, run = self._spec, self._spec.run
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
      rundir.log(f'[learner] checkpoint skipped, a node did not answer: {e}')
      return None
    lengths = np.full(run.num_envs, -1, np.int64)
    for s in actor_states:
      lengths[s['offset']:s['offset'] + s['num_envs']] = np.asarray(
          s['lengths'], np.int64) + STEP_ID_MARGIN
    if (lengths < 0).any():
      rundir.log('[learner] checkpoint skipped: actor states do not cover '
                 'every env worker')
      return None
    adder_state = {'lengths': lengths.tolist(),
                   'num_items': int(sum(s['num_items'] for s in actor_states)),
                   'num_online_items': int(sum(s['num_online_items']
                                               for s in actor_states))}
    final = rundir.write_checkpoint(
        run.logdir, int(counts.get('actor_steps', 0)), reverb_path=reverb_path,
        learner_state=self._learner.save(), config=spec.config,
        spaces=spec.spaces, run=run, mode=MODE,
        adder=_FixedState(adder_state), latent_store=self._dataset.latent_store,
        run_state={
            'segment': spec.segment, 'num_actors': spec.dist.num_actors,
            'actors': actor_states, 'evaluator': self._last_eval_state,
            'counter': counter_state, 'counts': counts,
            'learner': {
                'updates': self.num_updates,
                'online_rows': self._dataset.sampler.num_online_rows,
                'uniform_rows': self._dataset.sampler.num_uniform_rows,
                'wall_time': self._wall0 + time.perf_counter() - self._t_start,
                'next_log': self._next_log}})
    self._last_ckpt = final
    rundir.log(f'[ckpt] {final} ({time.perf_counter() - t0:.1f}s, '
               f'{self.num_updates} updates)')
    return final


class _FixedState:
  """Something with ``get_state()`` (for ``save_replay_state(adder=...)``)."""

  def __init__(self, state):
    self._state = state

  def get_state(self):
    return self._state


# --- actors --------------------------------------------------------------------------


class VersionedVariableClient:
  """Acme ``VariableClient`` over ('policy', 'num_updates'): ``params`` is what
  ``DreamerActor`` reads; ``version`` the learner's update count then."""

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


def make_environment(spec: ProgramSpec, num_envs: int, seed: int,
                     first_index: int = 0):
  """``VectorEnvironment`` whose env i is seeded ``seed * 1000 + first_index + i``."""
  from experiments import env_loop
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
  return env_loop.VectorEnvironment(venv)


class ActorNode:
  """One actor process: ``acme.EnvironmentLoop`` + ``DreamerActor``.

  The loop runs in a daemon thread: a Reverb insert blocked by the rate
  limiter blocks in C++, and the main thread must stay free to take
  Launchpad's stop signal, serve RPCs and exit. Courier methods:
  ``get_state()`` (adder counters, for checkpoints), ``get_stats()``
  (cumulative timings, parameter-lag probes, scores) and ``pause()`` (stop
  acting, flush the adder and the counts; the step limiter's final step).
  """

  def __init__(self, spec: ProgramSpec, actor_id: int, replay, learner,
               counter):
    import jax

    from agent.builder import seed_keys
    from experiments import env_loop
    from experiments.report import append_score

    self._spec, run, c = spec, spec.run, spec.config
    self._id, self._n = int(actor_id), spec.envs_per_actor
    self._offset = self._id * self._n
    self._name = f'actor/{self._id}'
    self._stop_event, self._stopper = _lp_hooks()
    self._halt, self._pause = threading.Event(), threading.Event()
    self._paused = threading.Event()
    self._error: Optional[BaseException] = None
    self._learner = learner
    self.env = make_environment(spec, self._n, run.env_seed(c.seed, spec.segment),
                                self._offset)
    builder = spec.builder(device_prefetch=False)
    wait_for_replay(replay, self._stop_event.is_set)
    self.adder = builder.make_adder(replay, num_workers=self._n,
                                    worker_offset=self._offset)
    if spec.resume:      # step ids continue; item counts per actor
      saved = rundir.read_json(os.path.join(spec.resume,
                                            rundir.REPLAY_STATE_FILE))['adder']
      mine = next(a for a in spec.run_state['actors']
                  if a['offset'] == self._offset)
      self.adder.set_state({
          'lengths': saved['lengths'][self._offset:self._offset + self._n],
          'num_items': mine['num_items'],
          'num_online_items': mine['num_online_items']})
    self._client = VersionedVariableClient(learner, spec.dist.update_period)
    # Policy stream of (seed, actor, segment): resumed segments never repeat it.
    key = jax.random.fold_in(jax.random.fold_in(
        seed_keys(c.seed)['actor'], self._id), spec.segment)
    from agent.actor import DreamerActor
    policy, mode = builder.make_policy(builder.make_networks())
    self.actor = DreamerActor(policy, spec.spaces, self._n, key, self._client,
                              self.adder, mode=mode)
    self._counter = SyncedCounter(counter, time_delta=spec.dist.counter_sync_s)
    self._recent_scores: List[float] = []

    def on_episode(ep):
      append_score(run.logdir, run.task, ep.env_step, ep.score, c.seed)
      self._recent_scores = (self._recent_scores + [ep.score])[-5:]

    observer = env_loop.EpisodeObserver(
        self._n, on_episode=on_episode,
        env_step=lambda: int(self._counter.get_counts().get('env_steps', 0)))
    self.loop = env_loop.VectorEnvironmentLoop(
        self.env, self.actor, self._counter, observers=[observer],
        should_stop=self._should_stop_acting)
    self._pid, self._t0 = os.getpid(), time.perf_counter()
    self._steps = 0
    self._lag = {'sum': 0.0, 'count': 0, 'max': None}

  # -- courier methods --------------------------------------------------------------
  def get_state(self) -> Dict[str, Any]:
    return {'actor_id': self._id, 'offset': self._offset, 'num_envs': self._n,
            'lengths': self.adder.lengths.tolist(),
            'num_items': self.adder.num_items_created,
            'num_online_items': self.adder.num_online_items,
            'num_policy_calls': int(self.actor.num_policy_calls)}

  def get_stats(self) -> Dict[str, Any]:
    lag_max, self._lag['max'] = self._lag['max'], None
    return {'actor_id': self._id, 'pid': self._pid,
            'wall_s': time.perf_counter() - self._t0, 'env_s': self.env.step_s,
            'policy_s': self.actor.timings['policy_s'],
            'add_s': self.actor.timings['add_s'],
            'lag_sum': self._lag['sum'], 'lag_count': self._lag['count'],
            'lag_max_recent': lag_max,
            'recent_scores': list(self._recent_scores)}

  def pause(self, timeout: float = 600.0) -> bool:
    """Stops acting after the current vector step; flushes adder and counts."""
    self._pause.set()
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
    self._spec.wait_for_learner()
    self._halt.set()
    thread.join(5.0)
    if thread.is_alive():
      # Blocked in a Reverb insert that the stopped learner will never
      # unblock: nothing is left to save, so leave without waiting for it.
      rundir.log(f'[{self._name}] acting thread blocked in Reverb; exiting')
      sys.stdout.flush()
      sys.stderr.flush()
      os._exit(1 if failed else 0)
    self.env.close()
    if failed:
      raise RuntimeError(f'{self._name} failed: {self._error!r}')

  def _act(self) -> None:
    try:
      while True:     # the learner may not be up yet
        try:
          _call_until(self._client.update_and_wait, self._stopping)
          break
        except StopRequested:
          raise
        except Exception as e:  # noqa: BLE001
          if not any(w in str(e).lower()
                     for w in ('deadline', 'unavailable', 'timed out')):
            raise
          rundir.log(f'[{self._name}] waiting for the learner: {e}')
      self.loop.run()
      if self._pause.is_set():
        self._do_pause()
    except StopRequested:
      pass
    except BaseException as e:  # noqa: BLE001  (reported by run())
      self._error = e
      if not self._stop_event.is_set():
        rundir.log(f'[{self._name}] acting failed:\n{traceback.format_exc()}')

  def _stopping(self) -> bool:
    return self._stop_event.is_set() or self._halt.is_set()

  def _should_stop_acting(self) -> bool:
    """Polled by the loop between vector steps: stop/pause, lag probes."""
    self._steps += 1
    if self._steps % self._spec.dist.lag_probe_every == 0:
      try:
        lag = int(self._learner.get_num_updates()) - self._client.version
        self._lag['sum'] += lag
        self._lag['count'] += 1
        self._lag['max'] = max(self._lag['max'] or 0, lag)
      except Exception:  # noqa: BLE001  (learner busy or stopping)
        pass
    return self._stopping() or self._pause.is_set()

  def _do_pause(self) -> None:
    for what, fn in (('adder', lambda: self.adder.flush(timeout_ms=60_000)),
                     ('counter', self._counter.flush)):
      try:
        fn()
      except Exception as e:  # noqa: BLE001  (those items are not saved)
        rundir.log(f'[{self._name}] {what} flush at pause failed: {e}')
    self._paused.set()
    rundir.log(f'[{self._name}] paused')


# --- evaluator -------------------------------------------------------------------------


class EvaluatorNode:
  """Spec 7.3 evaluation: ``eval_episodes`` envs, one episode each, when the
  counter passes a multiple of ``--eval_every`` env steps and once more at the
  end (``evaluate_final``); rows and scores as in the single-process run."""

  def __init__(self, spec: ProgramSpec, learner, counter):
    import jax
    from acme.jax import variable_utils

    from agent.actor import DreamerActor
    from agent.builder import seed_keys

    self._spec, run, c = spec, spec.run, spec.config
    self._stop_event, self._stopper = _lp_hooks()
    self._counter = counter
    n = run.eval_episodes
    self.env = make_environment(spec, n, run.env_seed(c.seed, spec.segment,
                                                      evaluation=True))
    builder = spec.builder(device_prefetch=False)
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
    self._spec.wait_for_learner()
    self.env.close()

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
    from experiments import env_loop
    from experiments.report import append_score
    run = self._spec.run
    t0 = time.perf_counter()
    self.actor.update(wait=True)
    scores, lengths = env_loop.run_eval_episodes(self.actor, self.env,
                                                 self._stop_event.is_set)
    if scores is None:
      raise StopRequested()
    self.eval_runs += 1
    for s in scores:
      append_score(os.path.join(run.logdir, rundir.EVAL_DIR), run.task,
                   env_step, float(s), self._spec.config.seed)
    row = rundir.eval_row(env_step, scores, lengths, self.actor.mode,
                          time.perf_counter() - t0)
    if self._logger is None:
      self._logger = rundir.RunLogger(run.logdir)
    self._logger.write(row)
    self.last_eval_step = int(env_step)
    rundir.log(f'[eval] {env_step} env steps: score {row["eval/score_mean"]:.1f}'
               f' +- {row["eval/score_std"]:.1f} over {len(scores)} episodes '
               f'({self.actor.mode} policy)')
    return row


# --- step limiter -----------------------------------------------------------------------


class StepLimiter:
  """Stops the program at ``--env_steps``: ``acme.utils.lp_utils.StepsLimiter``
  polls the counter and calls ``lp.stop()``; this one first pauses the actors
  (their last items flushed), asks the learner for its final checkpoint, the
  evaluator for the final evaluation, and writes ``summary.json``."""

  def __init__(self, spec: ProgramSpec, counter, learner, actors=(),
               evaluator=None):
    self._spec, self._counter, self._learner = spec, counter, learner
    self._actors, self._evaluator = list(actors), evaluator
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
    spec, stop = self._spec, self._stop_event
    budget = spec.run.env_steps
    last_print = 0.0
    while not stop.wait(spec.dist.poll_s):
      counts = _call_until(self._counter.get_counts, stop.is_set)
      env_steps = int(counts.get('env_steps', 0))
      if time.monotonic() - last_print >= spec.run.progress_every:
        rundir.log(f'[limiter] {env_steps}/{budget} env steps, '
                   f'{int(counts.get("learner_steps", 0))} learner steps')
        last_print = time.monotonic()
      if env_steps >= budget:
        break
    else:
      return
    rundir.log(f'[limiter] step budget {budget} reached: pausing the actors')
    futures = [actor.futures.pause() for actor in self._actors]
    paused = [_call_until(f.result, stop.is_set) for f in futures]
    rundir.log(f'[limiter] actors paused ({sum(map(bool, paused))}/'
               f'{len(paused)}); final checkpoint')
    summary = _call_until(self._learner.finish, stop.is_set)
    if self._evaluator is not None:
      summary['eval'] = _call_until(
          functools.partial(self._evaluator.evaluate_final,
                            summary['env_steps']), stop.is_set)
    summary['stopped_by'] = 'step_limiter'
    rundir.atomic_write(os.path.join(spec.launch_dir, SUMMARY_FILE),
                        json.dumps(summary, default=rundir.jsonable))
    rundir.log('[limiter] stopping the program')
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
                                          rundir.reverb_dir(spec.run.logdir))))
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
