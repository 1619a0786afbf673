"""The actor nodes of the Launchpad program: acting.

Each runs an ``acme.EnvironmentLoop`` (``experiments.run.env_loop``) with an
actor from ``builder.make_actor`` over its slice of the env workers;
``program.make_actor_node`` builds those pieces (env, adder with the step-id
state of a resume or an in-place restart, actor) and hands them over.
"""

from __future__ import annotations

import os
import threading
import time
import traceback
from typing import Any, Dict, List, Optional

import agent  # noqa: F401  (jax compat before anything imports acme)
from agent.learner import StopRequested
from experiments.layouts import stopping
from experiments.layouts.distributed.rpc import call_until
from experiments.run import env_loop, rundir
from experiments.run.config import log


class ActorNode:
  """One actor process: ``acme.EnvironmentLoop`` + ``DreamerActor``.

  The loop runs in a daemon thread: a Reverb insert blocked by the rate
  limiter blocks in C++, and the main thread must stay free to take
  Launchpad's stop signal, serve RPCs and exit. Courier methods:
  ``get_state()`` (adder counters, for checkpoints), ``get_stats()``
  (cumulative timings, parameter-lag probes, scores) and ``pause()`` (stop
  acting, flush the adder and the counts; the step limiter's step 1,
  ``experiments.layouts.stopping``).

  Args: the settings, this actor's id and first env worker, its env, adder
  and actor, its (synced child) counter, and the learner's handle (the
  parameter-lag probes).
  """

  def __init__(self, *, settings, actor_id: int, offset: int, env, adder,
               actor, counter, learner):
    self._settings = settings
    self._id, self._offset, self._n = int(actor_id), int(offset), env.num_envs
    self._name = f'actor/{self._id}'
    self._stop = stopping.NodeStop()
    self._halt, self._pause = threading.Event(), threading.Event()
    self._paused = threading.Event()
    self._error: Optional[BaseException] = None
    self._failed = False             # acting failed before any stop
    self.env, self.adder, self.actor = env, adder, actor
    self._learner, self._counter = learner, counter
    self._client = actor.variable_client
    self._recent_scores: List[float] = []
    observer = env_loop.EpisodeObserver(
        self._n, on_episode=self._on_episode,
        env_step=lambda: int(self._counter.get_counts().get('env_steps', 0)))
    self.loop = env_loop.VectorEnvironmentLoop(
        env, actor, counter, observers=[observer],
        should_stop=self._should_stop_acting,
        runtime_terminator=stopping.in_launchpad())
    self._pid, self._t0 = os.getpid(), time.perf_counter()
    self._steps = 0
    self._lag = {'sum': 0.0, 'count': 0, 'max': None}

  def _on_episode(self, ep) -> None:
    """A finished training episode: scores.jsonl, recent scores."""
    run = self._settings.run
    rundir.append_score(run.logdir, run.task, ep.env_step, ep.score,
                        self._settings.config.seed, ep.stats)
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
    # Nothing of an actor needs saving: after a failure it exits for the
    # supervisor to restart it in place (restartable), or stops the program
    # and, once the learner is done, re-raises.
    stopping.run_guarded(self._settings, self._name,
                         lambda: self._watch(thread),
                         cleanup=lambda: self._wind_down(thread),
                         restartable=True, stop=self._stop)

  def _watch(self, thread: threading.Thread) -> None:
    """Until acting ends or the program stops; raises what acting raised
    (unless the program was stopping)."""
    program_stop = self._stop.program
    while thread.is_alive() and not program_stop.wait(0.2):
      pass
    self._failed = self._error is not None and not program_stop.is_set()
    if self._failed:
      raise RuntimeError(f'{self._name} failed: {self._error!r}')

  def _wind_down(self, thread: threading.Thread) -> None:
    # Serve get_state() until the learner's final checkpoint is written.
    stopping.serve_until_learner_done(self._settings)
    self._halt.set()
    thread.join(5.0)
    if thread.is_alive():
      # Blocked in a Reverb insert that the stopped learner will never
      # unblock: nothing is left to save, so leave without waiting for it.
      log(f'[{self._name}] acting thread blocked in Reverb; exiting')
      stopping.exit_now(1 if self._failed else 0)
    self.env.close()

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
      if not self._stop.program.is_set():
        log(f'[{self._name}] acting failed:\n{traceback.format_exc()}')

  def _stopping(self) -> bool:
    return self._stop.program.is_set() or self._halt.is_set()

  def _should_stop_acting(self) -> bool:
    """Polled by the loop between vector steps: stop/pause, lag probes."""
    self._steps += 1
    if self._steps % self._settings.dist.lag_probe_every == 0:
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
