"""The Launchpad program's worker nodes (``experiments.distributed``).

``LearnerNode``   the builder's DreamerLearner over its prefetching dataset,
                  the actors' variable source, metrics rows and checkpoints.
``ActorNode``     an ``acme.EnvironmentLoop`` (``experiments.env_loop``) with
                  the builder's actor over its slice of the env workers.
``EvaluatorNode`` spec 7.3 evaluations (``experiments.env_loop.Evaluator``).

Construction, stopping and checkpoints: ``experiments/distributed.py``.
"""

from __future__ import annotations

import functools
import os
import sys
import threading
import time
import traceback
import types
from typing import Any, Dict, List, Optional, Sequence

import numpy as np

import agent  # noqa: F401  (jax compat before anything imports acme)
from agent.learner import StopRequested
from experiments import rundir
from experiments.distributed import (
    MODE, STEP_ID_MARGIN, ProgramSpec, SyncedCounter, VersionedVariableClient,
    _call_until, _lp_hooks, _touch, make_environment, record_error,
    wait_for_replay)


# --- learner --------------------------------------------------------------------------


class LearnerNode:
  """The learner process: DreamerLearner + variable source + checkpoints.

  Courier methods: ``get_variables(names)`` ('policy': acting params as
  numpy, 'num_updates': their update count), ``get_num_updates()`` and
  ``finish()`` (final checkpoint; returns a summary).
  """

  def __init__(self, spec: ProgramSpec, replay, counter, actors: Sequence[Any],
               evaluator=None):
    import jax

    from agent.builder import seed_keys
    from reverb_tables import checkpoint as rckpt
    from reverb_tables import tables as tables_lib

    self._spec = spec
    self._jax = jax
    self._stop_event, self._stopper = _lp_hooks()
    self._finish_requested = threading.Event()
    self._finished = threading.Event()
    self._replay, self._counter_client = replay, counter
    self._actors, self._evaluator = list(actors), evaluator
    self._logger = None
    rows = lambda: rundir.LearnerRows(   # noqa: E731
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
    """Mean env / policy / add fractions of the actors' wall time since the
    last row, parameter lag (learner updates) and recent episode scores."""
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
    row = {f'actor/{k}_frac': float(np.mean(v)) if v else None
           for k, v in fracs.items()}
    row['actor/param_lag_updates_mean'] = lags[0] / lags[1] if lags[1] else None
    row['actor/param_lag_updates_max'] = lag_max
    row['episode/recent_score_mean'] = float(np.mean(scores)) if scores else None
    return row

  def _run_logger(self) -> 'rundir.RunLogger':  # shared by train and learner rows
    self._logger = self._logger or rundir.RunLogger(self._spec.run.logdir)
    return self._logger

  def _write_row(self) -> None:
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
    self._run_logger().write(row)
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
        adder=types.SimpleNamespace(get_state=lambda: adder_state),
        latent_store=self._dataset.latent_store,
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


# --- actors --------------------------------------------------------------------------


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
  """Spec 7.3 evaluation (``experiments.env_loop.Evaluator``) when the counter
  passes a multiple of ``--eval_every`` env steps and once more at the end
  (``evaluate_final``); rows and scores as in the single-process run."""

  def __init__(self, spec: ProgramSpec, learner, counter):
    import jax

    from agent.builder import seed_keys
    from experiments import env_loop

    self._spec, run = spec, spec.run
    self._stop_event, self._stopper = _lp_hooks()
    self._counter = counter
    builder = spec.builder(device_prefetch=False)
    self._logger = None
    self.evaluator = env_loop.Evaluator(
        run, spec.config, spec.spaces, spec.segment, learner,
        builder.make_policy(builder.make_networks(), evaluation=True),
        jax.random.fold_in(seed_keys(spec.config.seed)['eval'], spec.segment),
        self._get_logger, functools.partial(make_environment, spec))
    self.evaluator.set_state((spec.run_state or {}).get('evaluator') or {})
    env_steps = int(spec.counts.get('env_steps', 0))
    self.next_eval = ((env_steps // run.eval_every + 1) * run.eval_every
                      if run.eval_every else None)
    self._final_request: Optional[int] = None
    self._final_done = threading.Event()
    self._final_row: Optional[Dict[str, Any]] = None

  def _get_logger(self):
    if self._logger is None:
      self._logger = rundir.RunLogger(self._spec.run.logdir)
    return self._logger

  def get_state(self) -> Dict[str, Any]:
    return {**self.evaluator.get_state(), 'next_eval': self.next_eval}

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
    self.evaluator.close()

  def _loop(self) -> None:
    stop = self._stop_event
    while not stop.wait(self._spec.dist.poll_s):
      if self._final_request is not None:
        step = self._final_request
        if self.evaluator.last_eval_step != step:
          self._final_row = self._evaluate(step)
        self._final_done.set()
        stop.wait()
        return
      if self.next_eval is None:
        continue
      env_steps = int(self._counter.get_counts().get('env_steps', 0))
      if env_steps >= self.next_eval:
        self._evaluate(env_steps)
        every = self._spec.run.eval_every
        self.next_eval = (env_steps // every + 1) * every

  def _evaluate(self, env_step: int) -> Dict[str, Any]:
    row = self.evaluator.evaluate(env_step, self._stop_event.is_set)
    if row is None:
      raise StopRequested()
    return row
