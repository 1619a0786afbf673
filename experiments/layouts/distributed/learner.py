"""The learner node of the Launchpad program.

The builder's ``DreamerLearner`` over its prefetching dataset, the actors'
variable source, the train and learner metric rows, and the checkpoints.
"""

from __future__ import annotations

import threading
import time
import types
from typing import Any, Dict, List, Optional, Sequence

import numpy as np

import agent  # noqa: F401  (jax compat before anything imports acme)
from agent import parallel
from agent.learner import StopRequested
from experiments.layouts.distributed.node_utils import (
    SyncedCounter, lp_hooks, record_error, touch, wait_for_replay)
from experiments.layouts.distributed.spec import (
    MODE, STEP_ID_MARGIN, ProgramSpec)
from experiments.run import health, metrics, rundir
from experiments.run import restarts as restart_log
from experiments.run.config import log, next_multiple


class LearnerNode:
  """The learner process: DreamerLearner + variable source + checkpoints.

  Courier methods: ``get_variables(names)`` ('policy': acting params as
  numpy, 'num_updates': their update count), ``get_num_updates()``,
  ``finish()`` (final checkpoint; returns a summary). With remote actors,
  ``join`` is the join service (``join/service.py``): its rows go into the
  train rows, its claim numbers into the checkpoints, and the remote actors
  leave before the final checkpoint (``stop_joiners``).
  """

  def __init__(self, spec: ProgramSpec, replay, counter, actors: Sequence[Any],
               evaluator=None, join=None):
    # Process 0 of a multi-process learner (before anything touches jax's
    # devices); the others are ``learner_peer.LearnerPeerNode``s.
    parallel.initialize_processes(spec.coordinator_address,
                                  spec.dist.learner_processes, 0,
                                  gloo_host=spec.dist.gloo_host)
    import jax

    from agent.builder import seed_keys
    from reverb_tables import checkpoint as rckpt
    from reverb_tables import tables as tables_lib

    self._spec = spec
    self._jax = jax
    self._stop_event, self._stopper = lp_hooks()
    self._finish_requested = threading.Event()
    self._joiners_stopped = threading.Event()   # remote actors have left
    self._finished = threading.Event()
    self._replay, self._counter_client = replay, counter
    self._actors, self._evaluator = list(actors), evaluator
    self._join = join
    # The join service's claim numbers, saved in checkpoints (the last known).
    self._join_state = (spec.run_state or {}).get('learner', {}).get(
        'join') or {'num_slots': spec.dist.join_slots, 'num_claims': 0}
    self._join_scores: list = []
    self._logger = None
    rows = lambda: metrics.LearnerRows(   # noqa: E731
        self._run_logger, lambda: int(self._counts.get('env_steps', 0)))
    builder = spec.builder(learner_logger_fn=rows,
                           learner_log_every=spec.run.learner_log_every)
    info = wait_for_replay(replay, self._should_stop)
    tables_lib.check_signatures(info, builder.make_replay_tables(),
                                rundir.reverb_dir(spec.run.logdir))
    self._dataset = builder.make_dataset_iterator(
        replay, should_stop=self._should_stop, on_wait=self._periodic)
    self._counter = SyncedCounter(counter, time_delta=spec.dist.counter_sync_s)
    self._learner = builder.make_learner(
        seed_keys(spec.config.seed)['learner'], builder.make_networks(),
        self._dataset, replay, self._counter, should_stop=self._should_stop)
    self._base_updates, self._wall0 = 0, 0.0
    self._next_log = next_multiple(int(spec.counts.get('env_steps', 0)),
                                   spec.run.log_every)
    self._last_eval_state = None
    state = spec.run_state
    if spec.resume:
      rckpt.load_replay_state(spec.resume, None,
                              latent_store=self._dataset.latent_store)
      self._learner.restore(rundir.load_learner_state(
          spec.resume, self._learner.state))
      s = state['learner']
      self._base_updates = int(s['updates'])
      self._dataset.sampler.num_online_rows = int(s['online_rows'])
      self._dataset.sampler.num_uniform_rows = int(s['uniform_rows'])
      self._wall0 = float(s['wall_time'])
      self._last_eval_state = state.get('evaluator')
      log(f'[learner] resumed from {spec.resume}: {self._base_updates} '
                 f'updates, {len(self._dataset.latent_store)} stored latents')
    self._publish()
    # Persistent skipped updates stop the run (issue 22, spec 4.9).
    self._health = health.SkipGuard(
        spec.run.max_skipped_updates, spec.run.logdir, on_stop=self._write_row)
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
    """Stops training, writes the final checkpoint; returns the summary.

    Remote actors leave first, while the learner still trains: a remote
    actor's last inserts may wait on the rate limiter, which only sampling
    frees."""
    self._stop_joiners()
    self._finish_requested.set()
    while not self._finished.wait(0.5):
      pass
    return self._summary or {}

  # -- main thread -------------------------------------------------------------------
  def run(self) -> None:
    try:
      self._loop()
      self._final()
    except Exception:  # noqa: BLE001
      record_error(self._spec, 'learner')
      touch(self._spec.learner_done_path)
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
    self._mark = self._tally()
    try:
      while not self._should_stop():
        try:
          # train_ratio bounds the learner here: step() takes its batch from
          # the dataset, whose Reverb sample blocks while the uniform table's
          # SampleToInsertRatio limiter (builder.make_replay_tables, 'ratio')
          # says the actors have not inserted enough for train_ratio.
          self._health.observe(self._learner.step())
        except StopRequested:
          break
        self._publish()
        self._periodic()
        if time.perf_counter() - last_ckpt >= self._spec.run.checkpoint_every:
          self._save_checkpoint()
          last_ckpt = time.perf_counter()
    finally:
      self._learner.stop_peers()      # other learner processes stop too

  def _periodic(self) -> None:
    now = time.perf_counter()
    if now - self._last_poll < self._spec.dist.poll_s:
      return
    self._last_poll = now
    try:
      self._counts = self._counter.get_counts()
    except Exception as e:  # noqa: BLE001
      log(f'[learner] counter unreachable: {e}')
      return
    env_steps = int(self._counts.get('env_steps', 0))
    if env_steps >= self._next_log:
      self._write_row()
      self._next_log = next_multiple(env_steps, self._spec.run.log_every)

  def _stop_joiners(self) -> None:
    """Lets the remote actors leave before the final checkpoint (the join
    service answers 'stop'; their open chunks are flushed), at most
    ``join.slots.LEAVE_WAIT_S``; at once when none is joined."""
    if self._join is None or self._joiners_stopped.is_set():
      return
    try:
      self._join.stop_joiners()
    except Exception as e:  # noqa: BLE001  (the service is gone: nothing to wait for)
      log(f'[learner] join service unreachable at the stop: {e}')
    self._joiners_stopped.set()

  def _final(self) -> None:
    self._stop_joiners()                      # after a stop signal
    try:
      self._counts = self._counter.flush()
    except Exception:  # noqa: BLE001
      pass
    if (self._last_row_step != int(self._counts.get('env_steps', 0)) or
        self._join is not None):      # the remote actors' leaving counts too
      self._write_row()
    ckpt = self._save_checkpoint()
    touch(self._spec.learner_done_path)
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
  def _tally(self) -> metrics.Tally:
    c = self._counts
    return metrics.learner_tally(
        env_steps=c.get('env_steps', 0), agent_steps=c.get('actor_steps', 0),
        updates=self.num_updates, episodes=c.get('episodes', 0),
        server_info=self._replay.server_info(), dataset=self._dataset,
        learner_timings=self._learner.timings)

  def _actor_row(self) -> Dict[str, Any]:
    """Mean env / policy / add fractions of the actors' wall time since the
    last row (``time/env_frac``, ``time/policy_frac``,
    ``time/replay_add_frac``), parameter lag (learner updates) and the
    actors' recent episode scores."""
    fracs: Dict[str, List[float]] = {'env': [], 'policy': [], 'add': []}
    lags, lag_max, scores, prev = [0.0, 0.0], None, [], self._prev_actor_stats
    for actor in self._actors:
      try:
        s = actor.get_stats()
      except Exception:  # noqa: BLE001  (an actor may be stopping)
        continue
      p = prev.get(s['actor_id'])
      p = p if p and p['pid'] == s['pid'] else {k: 0.0 for k in s}
      prev[s['actor_id']] = s
      wall = max(s['wall_s'] - p['wall_s'], 1e-9)
      for k in fracs:
        fracs[k].append((s[f'{k}_s'] - p[f'{k}_s']) / wall)
      lags[0] += s['lag_sum'] - p['lag_sum']
      lags[1] += s['lag_count'] - p['lag_count']
      if s['lag_max_recent'] is not None:
        lag_max = max(lag_max or 0, s['lag_max_recent'])
      scores += s['recent_scores']
    scores += self._join_scores
    names = {'env': 'env', 'policy': 'policy', 'add': 'replay_add'}
    row = {f'time/{names[k]}_frac': float(np.mean(v)) if v else None
           for k, v in fracs.items()}
    row['actor/param_lag_updates_mean'] = lags[0] / lags[1] if lags[1] else None
    row['actor/param_lag_updates_max'] = lag_max
    row['episode/recent_score_mean'] = float(np.mean(scores)) if scores else None
    return row

  def _join_row(self) -> Dict[str, Any]:
    """The join service's ``join/*`` metrics (none when it does not answer)
    and its claim numbers for the next checkpoint."""
    if self._join is None:
      return {}
    try:
      row = dict(self._join.row())
      self._join_state = self._join.state()
    except Exception as e:  # noqa: BLE001  (restarting: the next row has it)
      log(f'[learner] join service unreachable: {e}')
      return {}
    self._join_scores = row.pop('recent_scores', [])
    return row

  def _run_logger(self) -> metrics.RunLogger:  # train and learner rows
    self._logger = self._logger or metrics.RunLogger(self._spec.run.logdir)
    return self._logger

  def _write_row(self) -> None:
    now = self._tally()
    actors = self._actor_row()
    row = metrics.train_row(
        now, self._mark or now, config=self._spec.config,
        segment=self._spec.segment,
        wall_time=self._wall0 + time.perf_counter() - self._t_start,
        learner_metrics=self._learner.pop_metric_means(),
        extra={**self._health.row(), **self._join_row(),
               'num_actors': self._spec.dist.num_actors,
               'run/restarts': restart_log.count_restarts(self._spec.run.logdir),
               **actors})
    self._run_logger().write(row)
    self._last_row = {k: v for k, v in row.items() if not k.startswith('train/')}
    self._last_row_step = now.env_steps
    self._mark = now

  # -- checkpoints ---------------------------------------------------------------------
  def _save_checkpoint(self) -> Optional[str]:
    """Atomic ckpt-* (module doc); None when a node did not answer."""
    spec, run = self._spec, self._spec.run
    t0 = time.perf_counter()
    try:
      rundir.keep_reverb_checkpoint(run.logdir)  # Reverb drops its last one
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
      if self._join is not None:      # after Reverb's: every claim with items
        self._join_state = self._join.state()
    except Exception as e:  # noqa: BLE001
      log(f'[learner] checkpoint skipped, a node did not answer: {e}')
      return None
    lengths = np.full(run.num_envs, -1, np.int64)
    for s in actor_states:
      lengths[s['offset']:s['offset'] + s['num_envs']] = np.asarray(
          s['lengths'], np.int64) + STEP_ID_MARGIN
    if (lengths < 0).any():
      log('[learner] checkpoint skipped: actor states do not cover '
                 'every env worker')
      return None
    adder_state = {'lengths': lengths.tolist(),
                   'num_items': int(sum(s['num_items'] for s in actor_states)),
                   'num_online_items': int(sum(s['num_online_items']
                                               for s in actor_states))}
    recent = self._last_row.get('episode/recent_score_mean')
    final = rundir.write_checkpoint(
        run.logdir, int(counts.get('actor_steps', 0)), reverb_path=reverb_path,
        learner_state=self._learner.save(), config=spec.config,
        spaces=spec.spaces, run=run, mode=MODE,
        adder=types.SimpleNamespace(get_state=lambda: adder_state),
        latent_store=self._dataset.latent_store,
        run_state=rundir.make_run_state(
            mode=MODE, segment=spec.segment, counts=counts,
            counter=counter_state,
            learner={
                'updates': self.num_updates,
                'online_rows': self._dataset.sampler.num_online_rows,
                'uniform_rows': self._dataset.sampler.num_uniform_rows,
                'wall_time': self._wall0 + time.perf_counter() - self._t_start,
                'next_log': self._next_log,
                'transitions': int(counts.get('actor_steps', 0)),
                'owed_updates': 0, 'join': self._join_state},
            actors=actor_states, evaluator=self._last_eval_state,
            recent_scores=[] if recent is None else [recent]))
    self._last_ckpt = final
    log(f'[ckpt] {final} ({time.perf_counter() - t0:.1f}s, '
        f'{self.num_updates} updates)')
    return final


