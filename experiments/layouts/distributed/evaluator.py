"""The evaluator node of the Launchpad program (spec 7.3): when to evaluate.

``program.make_evaluator_node`` builds its ``experiments.run.evaluator
.Evaluator`` (eval envs, the builder's evaluation policy, the state of a
resume or an in-place restart), the first grid point and the run's
metrics log both write eval rows to (``metrics.OpenOnUse``).
"""

from __future__ import annotations

import threading
from typing import Any, Dict, Optional

import agent  # noqa: F401  (jax compat before anything imports acme)
from agent.learner import StopRequested
from experiments.layouts import stopping
from experiments.run import metrics
from experiments.run.config import next_multiple


class EvaluatorNode:
  """Spec 7.3 evaluation when the counter passes a multiple of
  ``--eval_every`` env steps and once more at the end (``evaluate_final``,
  the step limiter's step 3); rows and scores as in the single-process run.
  """

  def __init__(self, *, settings, evaluator, counter,
               next_eval: Optional[int], logger: metrics.OpenOnUse):
    """``logger``: the run's metrics logger (eval rows), the one
    ``evaluator`` writes to."""
    self._settings = settings
    self._stop = stopping.NodeStop()
    self._counter = counter
    self._logger = logger
    self.evaluator, self.next_eval = evaluator, next_eval
    self._final_request: Optional[int] = None
    self._final_done = threading.Event()
    self._final_row: Optional[Dict[str, Any]] = None

  def get_state(self) -> Dict[str, Any]:
    return {**self.evaluator.get_state(), 'next_eval': self.next_eval}

  def evaluate_final(self, env_step: int) -> Optional[Dict[str, Any]]:
    """Final evaluation at ``env_step`` (skipped if one ran there)."""
    self._final_request = int(env_step)
    while not self._final_done.wait(0.5):
      if self._stop.program.is_set():
        return None
    return self._final_row

  def run(self) -> None:
    stopping.run_guarded(self._settings, 'evaluator', self._loop,
                         on_failure=self._final_done.set,
                         cleanup=self._logger.close, restartable=True)
    stopping.serve_until_learner_done(self._settings)
    self.evaluator.close()

  def _loop(self) -> None:
    stop = self._stop.program
    while not stop.wait(self._settings.dist.poll_s):
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
        self.next_eval = next_multiple(env_steps,
                                       self._settings.run.eval_every)

  def _evaluate(self, env_step: int) -> Dict[str, Any]:
    row = self.evaluator.evaluate(env_step, self._stop.program.is_set)
    if row is None:
      raise StopRequested()
    return row
