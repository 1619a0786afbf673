"""Long-run health: the persistent-skip rule, once for both layouts.

A non-finite batch, loss or gradient skips the update (``agent.learning``,
Algorithm J; docs/deviations.md "Non-finite batches"): params, optimizer,
return normaliser and slow critic stay as they were and the update reports
``skipped_update = 1``. One skipped update is harmless. A run whose updates
keep being skipped has stopped learning (e.g. a learning rate so large that
one update blew the params up, after which every loss is non-finite) and
would spend its whole budget doing nothing.

A skip for a non-finite replay batch is not divergence: it says the data
was bad, not the params. Such skips are counted on their own
(``learner/bad_batches``) and neither extend nor end a streak; only
updates skipped for a non-finite loss or gradient from a finite batch do.
(The sampler drops invalid items before they reach a batch,
``reverb_tables.sampler``, so a bad batch means the checks there missed
something.)

``SkipGuard`` is that rule. Both layouts' learner loops feed it every
update's metrics (the one-process ``experiments/layouts/local.py`` through
``SkipGuard.watch(learner)``, the Launchpad learner node
``experiments/layouts/distributed/learner.py`` by ``observe``). After
``--max_skipped_updates`` consecutive skipped updates it raises
``PersistentSkipError``: the message names the count and the last complete
checkpoint, and the run stops without writing another one (a failed run
never checkpoints; ``rundir.write_checkpoint`` also refuses non-finite
learner state, ``rundir.check_finite_state``). Its counts go into every train
row (``row()``: ``learner/skipped_updates``, ``learner/skip_streak``;
docs/metrics.md), and one last row is written when it stops the run.

The reference has a rule of this kind only for fp16 loss scaling:
``optax.apply_if_finite(max_consecutive_errors=1000)`` (spec 4.9), which
after that many consecutive non-finite steps applies the update anyway. Here
the run stops instead, so that no non-finite update is ever applied.
"""

from __future__ import annotations

from typing import Any, Callable, Dict, Mapping, Optional

from experiments.run import rundir
from experiments.run.config import check_max_skipped, log


class PersistentSkipError(RuntimeError):
  """``max_skipped_updates`` consecutive updates were skipped (module doc)."""


class SkipGuard:
  """Counts skipped updates and stops the run when they persist (module doc).

  Args:
    max_consecutive: consecutive skipped updates that stop the run
      (``--max_skipped_updates``); 0 never stops.
    logdir: the run directory (its last checkpoint is named in the error).
    on_stop: called right before the error is raised (the layouts write a
      last train row, so the metrics show the streak that stopped the run).
  """

  def __init__(self, max_consecutive: int, logdir: str,
               on_stop: Optional[Callable[[], Any]] = None):
    self.max_consecutive = check_max_skipped(max_consecutive)
    self.logdir = logdir
    self._on_stop = on_stop
    self.updates = 0               # updates observed (this process)
    self.skipped = 0               # of them skipped
    self.streak = 0                # consecutive skips of divergence, now
    self.bad_batches = 0           # skips for a non-finite batch (bad data)

  def observe(self, metrics: Mapping[str, Any]) -> None:
    """One update's metrics (``agent.learning``: ``skipped_update``,
    ``nonfinite_batch``); raises ``PersistentSkipError`` when the streak
    reaches ``max_consecutive``."""
    self.updates += 1
    if float(metrics.get('skipped_update', 0.0)) < 0.5:
      self.streak = 0
      return
    self.skipped += 1
    if float(metrics.get('nonfinite_batch', 0.0)) >= 0.5:
      self.bad_batches += 1        # bad data, not divergence (module doc)
      return
    self.streak += 1
    if self.max_consecutive and self.streak >= self.max_consecutive:
      message = self.message()
      if self._on_stop is not None:
        try:
          self._on_stop()
        except Exception as e:  # noqa: BLE001  (the stop is what matters)
          log(f'[health] could not write the last row: {e!r}')
      raise PersistentSkipError(message)

  def message(self) -> str:
    """The stop message: the count, the cause and the last checkpoint."""
    cause = ('each for a non-finite loss or gradient from a finite batch; '
             f'{self.bad_batches} more updates were skipped for a non-finite '
             'batch')
    ckpt = rundir.latest_run_checkpoint(self.logdir)
    where = 'none was written yet'
    if ckpt is not None:
      where = ckpt
      try:
        where += (f' (update {rundir.load_run_state(ckpt)["learner"]["updates"]},'
                  ' finite params)')
      except (ValueError, KeyError, TypeError):
        pass
    return (f'the last {self.streak} updates in a row were skipped '
            f'(--max_skipped_updates={self.max_consecutive}; {self.skipped} '
            f'of the {self.updates} updates of this process): {cause}. '
            'Training has diverged, so the run stops here and writes no '
            f'checkpoint. The last good checkpoint: {where}. Its '
            'params are those of the last applied update: fix the cause '
            '(e.g. a smaller --config_overrides=lr=...) before resuming from '
            'it, or start a new --logdir.')

  def row(self) -> Dict[str, int]:
    """The train-row fields (docs/metrics.md)."""
    return {'learner/skipped_updates': self.skipped,
            'learner/skip_streak': self.streak,
            'learner/bad_batches': self.bad_batches}

  def watch(self, learner) -> '_WatchedLearner':
    """``learner`` whose ``step()`` feeds this guard; every other attribute
    is the learner's (the one-process layout hands it to
    ``experiments.layouts.scheduled.ScheduledUpdates``)."""
    return _WatchedLearner(learner, self)


class _WatchedLearner:
  """A learner whose ``step()`` is observed by a ``SkipGuard``."""

  def __init__(self, learner, guard: SkipGuard):
    self._learner, self._guard = learner, guard

  def step(self):
    metrics = self._learner.step()
    self._guard.observe(metrics)
    return metrics

  def __getattr__(self, name):
    return getattr(self._learner, name)
