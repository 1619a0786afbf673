"""The actor nodes of the Launchpad program.

Each runs an ``acme.EnvironmentLoop`` (``experiments.run.env_loop``) with an
actor from ``builder.make_actor`` over its slice of the env workers.
"""

from __future__ import annotations

import os
import threading
import time
import traceback
from typing import Any, Dict, List, Optional

import agent  # noqa: F401  (jax compat before anything imports acme)
from agent.learner import StopRequested
from experiments.layouts.distributed.node_utils import (
    SyncedCounter, call_until, exit_now, in_launchpad, lp_hooks, record_error,
    wait_for_replay)
from experiments.layouts.distributed.spec import ProgramSpec, node_restart
from experiments.run import env_loop, rundir
from experiments.run.config import log, segment_seed

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

    self._spec, run, c = spec, spec.run, spec.config
    self._id = int(actor_id)
    self._stop_event, self._stopper = lp_hooks()
    self._halt, self._pause = threading.Event(), threading.Event()
    self._paused = threading.Event()
    self._error: Optional[BaseException] = None
    self._learner = learner
    # k > 0: restarted in place by the supervisor after the node died (issue
    # 22): new env seeds, a new policy stream and step ids past any the
    # dead process can have used.
    self._restart = node_restart()
    self._n = spec.envs_per_actor
    self._offset, self._name = self._id * self._n, f'actor/{self._id}'
    seed = segment_seed(c.seed, spec.segment, restart=self._restart)
    self.env = run.make_env(self._n, seed, self._offset)
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
    if self._restart:
      state = self.adder.get_state()
      jump = self._restart * spec.restart_index_jump
      self.adder.set_state({**state, 'lengths': [
          x + jump for x in state['lengths']]})
      log(f'[{self._name}] restart {self._restart} in place: env seeds of '
          f'restart {self._restart}, step ids from +{jump}')
    # Policy stream of (seed, actor, segment, restart): resumed segments and
    # restarted nodes never repeat it (a remote actor's: join/remote.py).
    key = jax.random.fold_in(jax.random.fold_in(
        seed_keys(c.seed)['actor'], self._id), spec.segment)
    if self._restart:
      key = jax.random.fold_in(key, self._restart)
    self.actor = builder.make_actor(
        key, builder.make_policy(builder.make_networks()), self.adder, learner,
        num_envs=self._n, update_period=spec.dist.update_period,
        versioned=True)
    self._client = self.actor.variable_client
    self._counter = SyncedCounter(counter, time_delta=spec.dist.counter_sync_s)
    self._recent_scores: List[float] = []

    observer = env_loop.EpisodeObserver(
        self._n, on_episode=self._on_episode,
        env_step=lambda: int(self._counter.get_counts().get('env_steps', 0)))
    self.loop = env_loop.VectorEnvironmentLoop(
        self.env, self.actor, self._counter, observers=[observer],
        should_stop=self._should_stop_acting,
        runtime_terminator=in_launchpad())
    self._pid, self._t0 = os.getpid(), time.perf_counter()
    self._steps = 0
    self._lag = {'sum': 0.0, 'count': 0, 'max': None}

  def _on_episode(self, ep) -> None:
    """A finished training episode: scores.jsonl, recent scores."""
    run = self._spec.run
    rundir.append_score(run.logdir, run.task, ep.env_step, ep.score,
                        self._spec.config.seed)
    self._recent_scores = (self._recent_scores + [ep.score])[-5:]

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
      if self._spec.dist.restarts_in_place:
        # Nothing of an actor needs saving: exit now and let the supervisor
        # restart this node (or stop the program once its restarts are used).
        exit_now(1)
      self._stopper()
    # Serve get_state() until the learner's final checkpoint is written.
    self._spec.wait_for_learner()
    self._halt.set()
    thread.join(5.0)
    if thread.is_alive():
      # Blocked in a Reverb insert that the stopped learner will never
      # unblock: nothing is left to save, so leave without waiting for it.
      log(f'[{self._name}] acting thread blocked in Reverb; exiting')
      exit_now(1 if failed else 0)
    self.env.close()
    if failed:
      raise RuntimeError(f'{self._name} failed: {self._error!r}')

  def _act(self) -> None:
    try:
      while True:     # the learner may not be up yet
        try:
          call_until(self._client.update_and_wait, self._stopping)
          break
        except StopRequested:
          raise
        except Exception as e:  # noqa: BLE001
          if not any(w in str(e).lower()
                     for w in ('deadline', 'unavailable', 'timed out')):
            raise
          log(f'[{self._name}] waiting for the learner: {e}')
      self.loop.run()
      if self._pause.is_set():
        self._do_pause()
    except StopRequested:
      pass
    except BaseException as e:  # noqa: BLE001  (reported by run())
      self._error = e
      if not self._stop_event.is_set():
        log(f'[{self._name}] acting failed:\n{traceback.format_exc()}')

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
        log(f'[{self._name}] {what} flush at pause failed: {e}')
    self._paused.set()
    log(f'[{self._name}] paused')
