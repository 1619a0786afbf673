"""The evaluator node of the Launchpad program (spec 7.3)."""

from __future__ import annotations

import threading
from typing import Any, Dict, Optional

import agent  # noqa: F401  (jax compat before anything imports acme)
from agent.learner import StopRequested
from experiments.layouts.distributed.node_utils import (
    call_until, lp_hooks, run_guarded)
from experiments.layouts.distributed.spec import ProgramSpec, node_restart
from experiments.run import metrics
from experiments.run.config import next_multiple
from experiments.run.evaluator import Evaluator


class EvaluatorNode:
  """Spec 7.3 evaluation (``experiments.run.evaluator.Evaluator``) when the counter
  passes a multiple of ``--eval_every`` env steps and once more at the end
  (``evaluate_final``); rows and scores as in the single-process run."""

  def __init__(self, spec: ProgramSpec, learner, counter):
    import jax

    from agent.builder import seed_keys

    self._spec, run = spec, spec.run
    self._stop_event, self._stopper = lp_hooks()
    self._counter = counter
    builder = spec.builder(device_prefetch=False)
    self._logger = None
    # k > 0: restarted in place after the node died (issue 22): new eval env
    # seeds and policy stream; the next evaluation is the next grid point
    # after the counter's env steps now (the dead process may have done the
    # ones since the checkpoint).
    restart = node_restart()
    key = jax.random.fold_in(seed_keys(spec.config.seed)['eval'], spec.segment)
    if restart:
      key = jax.random.fold_in(key, restart)
    self.evaluator = Evaluator(run, builder, spec.segment, learner, key,
                               self._get_logger, restart=restart)
    self.evaluator.set_state((spec.run_state or {}).get('evaluator') or {})
    env_steps = int(spec.counts.get('env_steps', 0))
    if restart:
      env_steps = int(call_until(counter.get_counts, self._stop_event.is_set)
                      .get('env_steps', env_steps))
    self.next_eval = (next_multiple(env_steps, run.eval_every)
                      if run.eval_every else None)
    self._final_request: Optional[int] = None
    self._final_done = threading.Event()
    self._final_row: Optional[Dict[str, Any]] = None

  def _get_logger(self):
    if self._logger is None:
      self._logger = metrics.RunLogger(self._spec.run.logdir)
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
      run_guarded(self._spec, 'evaluator', self._loop,
                  on_failure=self._final_done.set, restartable=True)
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
        self.next_eval = next_multiple(env_steps, self._spec.run.eval_every)

  def _evaluate(self, env_step: int) -> Dict[str, Any]:
    row = self.evaluator.evaluate(env_step, self._stop_event.is_set)
    if row is None:
      raise StopRequested()
    return row
