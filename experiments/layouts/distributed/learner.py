"""The learner node of the Launchpad program: its training loop.

``program.make_learner_node`` builds the pieces (the builder's learner over
its dataset, restored on resume) and hands them to ``LearnerNode``, which
runs the loop and composes the node's other jobs, each in its home:
``variables.VariableSource`` (the actors' parameters), ``rows.TrainRows``
(metric rows), ``checkpoints.CheckpointCoordinator`` (checkpoints across the
program's processes) and ``experiments.run.health.SkipGuard`` (persistent
skipped updates). Its part in the stop protocol: ``experiments.layouts
.stopping`` (steps 2 and after a signal).
"""

from __future__ import annotations

import threading
import time
from typing import Any, Dict, List, Optional, Sequence

import agent  # noqa: F401  (jax compat before anything imports acme)
from agent.learner import StopRequested
from experiments.layouts import stopping
from experiments.layouts.distributed.checkpoints import CheckpointCoordinator
from experiments.layouts.distributed.rows import Progress, TrainRows
from experiments.layouts.distributed.variables import VariableSource
from experiments.run.config import log


class LearnerNode:
  """The learner process (module doc).

  Courier methods: ``get_variables(names)`` ('policy': acting params as
  numpy, 'num_updates': their update count) and ``get_num_updates()`` (the
  variable source's), ``finish()`` (final checkpoint; returns a summary).
  """

  def __init__(self, *, settings, stop: stopping.NodeStop, learner, dataset,
               progress: Progress, variables: VariableSource, rows: TrainRows,
               checkpoints: CheckpointCoordinator, health, join=None):
    self._settings, self._stop = settings, stop
    self._learner, self._dataset = learner, dataset
    self._progress, self._variables = progress, variables
    self._rows, self._checkpoints, self._health = rows, checkpoints, health
    self._join = join
    self._joiners_stopped = threading.Event()   # remote actors have left
    self._finished = threading.Event()
    self._summary: Optional[Dict[str, Any]] = None

  # -- courier methods ------------------------------------------------------------
  def get_variables(self, names: Sequence[str]) -> List[Any]:
    return self._variables.get_variables(names)

  def get_num_updates(self) -> int:
    return self._variables.get_num_updates()

  def finish(self) -> Dict[str, Any]:
    """Stops training, writes the final checkpoint; returns the summary.

    Remote actors leave first, while the learner still trains: a remote
    actor's last inserts may wait on the rate limiter, which only sampling
    frees."""
    self._stop_joiners()
    self._stop.finish.set()
    while not self._finished.wait(0.5):
      pass
    return self._summary or {}

  # -- main thread -------------------------------------------------------------------
  def run(self) -> None:
    # A failure is recorded even during the stop: the nodes waiting for the
    # final checkpoint must hear that none will come.
    stopping.run_guarded(self._settings, 'learner', self._train,
                         on_failure=self._failed, cleanup=self._dataset.close,
                         record_while_stopping=True, stop=self._stop)
    if self._stop.finish.is_set():
      # Keep serving the final parameters (final evaluation) until the stop.
      self._stop.program.wait()

  def _train(self) -> None:
    self._loop()
    self._final()

  def _failed(self) -> None:
    stopping.mark_learner_done(self._settings.launch_dir)
    self._finished.set()

  def _loop(self) -> None:
    last_ckpt = time.perf_counter()
    self._rows.start()
    try:
      while not self._stop.requested():
        try:
          # train_ratio bounds the learner here (one file past the README
          # table "How a run is wired"): step() takes its batch from the
          # dataset, whose Reverb sample blocks while the uniform table's
          # SampleToInsertRatio says the actors have not inserted enough.
          self._health.observe(self._learner.step())
        except StopRequested:
          break
        self._variables.publish()
        self._rows.poll()
        if time.perf_counter() - last_ckpt >= self._settings.run.checkpoint_every:
          self._checkpoints.save()
          last_ckpt = time.perf_counter()
    finally:
      self._learner.stop_peers()      # other learner processes stop too

  def _stop_joiners(self) -> None:
    """Lets the remote actors leave before the final checkpoint (the join
    service answers 'stop'; their open chunks are flushed), at most
    ``join.slots.LEAVE_WAIT_S``; at once when none is joined."""
    if self._join is None or self._joiners_stopped.is_set():
      return
    try:
      self._join.stop_joiners()
    except Exception as e:  # noqa: BLE001  (the service is gone)
      log(f'[learner] join service unreachable at the stop: {e}')
    self._joiners_stopped.set()

  def _final(self) -> None:
    self._stop_joiners()                      # after a stop signal
    rows = self._rows
    rows.flush_counts()
    if rows.last_row_step != rows.env_steps or self._join is not None:
      rows.write()                # the remote actors' leaving counts too
    ckpt = self._checkpoints.save()
    stopping.mark_learner_done(self._settings.launch_dir)
    c = rows.counts
    self._summary = {
        'checkpoint': ckpt or self._checkpoints.last,
        'env_steps': int(c.get('env_steps', 0)),
        'agent_steps': int(c.get('actor_steps', 0)),
        'episodes': int(c.get('episodes', 0)),
        'updates': self._progress.updates,
        'stopped_by_signal': self._stop.program.is_set() and
                             not self._stop.finish.is_set(),
        'update_cache_size': self._learner.update_cache_size(),
        'last_row': rows.last_row}
    self._finished.set()
    rows.close()
