"""Checkpoints of the Launchpad program, coordinated by the learner node.

One checkpoint (``experiments.run.rundir.write_checkpoint``, the layout the
one-process run writes too) gathers what several processes hold, in this
order: the Reverb server checkpoints first; then every actor's adder
counters are read (so the saved step-id counters are never behind an item
in the Reverb checkpoint, plus ``STEP_ID_MARGIN``), the evaluator's state
(the last known one if it does not answer), the counter's state and counts
(after a flush of the learner's own), and the join service's claim numbers
(every claim with items in the Reverb checkpoint is counted). A node that
does not answer skips the checkpoint (the previous one stays); the learner's
own state, the latent store and the sampler's rows are this process's.
"""

from __future__ import annotations

import time
from typing import Any, Dict, Optional

import numpy as np

from experiments.layouts.distributed.rows import Progress, TrainRows
from experiments.layouts.distributed.settings import MODE, STEP_ID_MARGIN
from experiments.run import rundir
from experiments.run.config import log


class CheckpointCoordinator:
  """``save()`` writes one checkpoint of the program (module doc)."""

  def __init__(self, *, settings, progress: Progress, learner, dataset,
               replay, synced_counter, counter, actors, evaluator, join,
               rows: TrainRows):
    """``synced_counter``: the learner's ``SyncedCounter`` (flushed first);
    ``counter``: the program's counter node (its state and counts are
    saved); ``evaluator`` and ``join``: None when the program has none."""
    self._settings, self._progress = settings, progress
    self._learner, self._dataset, self._replay = learner, dataset, replay
    self._synced_counter, self._counter = synced_counter, counter
    self._actors, self._evaluator, self._join = list(actors), evaluator, join
    self._rows = rows
    state = settings.run_state or {}
    self._eval_state = state.get('evaluator')
    self._join_state = state.get('learner', {}).get('join') or {
        'num_slots': settings.dist.join_slots, 'num_claims': 0}
    self.last: Optional[str] = None

  def save(self) -> Optional[str]:
    """The new ckpt-* path; None when a node did not answer."""
    settings, run = self._settings, self._settings.run
    t0 = time.perf_counter()
    try:
      reverb_path = rundir.checkpoint_reverb(run.logdir, self._replay)
      actor_states = [a.get_state() for a in self._actors]   # after Reverb's
      if self._evaluator is not None:
        try:
          self._eval_state = self._evaluator.get_state()
        except Exception:  # noqa: BLE001  (keep the last known one)
          pass
      self._synced_counter.flush()
      counter_state = self._counter.save()
      counts = self._counter.get_counts()
      if self._join is not None:      # after Reverb's: every claim with items
        self._join_state = self._join.state()
    except Exception as e:  # noqa: BLE001
      log(f'[learner] checkpoint skipped, a node did not answer: {e}')
      return None
    adder_state = self._adder_state(actor_states)
    if adder_state is None:
      log('[learner] checkpoint skipped: actor states do not cover every env '
          'worker')
      return None
    recent = self._rows.last_row.get('episode/recent_score_mean')
    final = rundir.write_checkpoint(
        run.logdir, int(counts.get('actor_steps', 0)), reverb_path=reverb_path,
        learner_state=self._learner.save(), config=settings.config,
        spaces=settings.spaces, run=run, mode=MODE, adder_state=adder_state,
        latent_store=self._dataset.latent_store,
        run_state=rundir.make_run_state(
            mode=MODE, segment=settings.segment, counts=counts,
            counter=counter_state,
            learner={
                'updates': self._progress.updates,
                **rundir.sampler_state(self._dataset), 'wall_time': self._progress.wall_time,
                'next_log': self._rows.next_log, 'join': self._join_state},
            actors=actor_states, evaluator=self._eval_state,
            recent_scores=[] if recent is None else [recent]))
    self.last = final
    log(f'[ckpt] {final} ({time.perf_counter() - t0:.1f}s, '
        f'{self._progress.updates} updates)')
    return final

  def _adder_state(self, actor_states) -> Optional[Dict[str, Any]]:
    """The actors' adder counters as one adder's over every env worker."""
    lengths = np.full(self._settings.run.num_envs, -1, np.int64)
    for s in actor_states:
      lengths[s['offset']:s['offset'] + s['num_envs']] = np.asarray(
          s['lengths'], np.int64) + STEP_ID_MARGIN
    if (lengths < 0).any():
      return None
    return {'lengths': lengths.tolist(),
            'num_items': int(sum(s['num_items'] for s in actor_states)),
            'num_online_items': int(sum(s['num_online_items']
                                        for s in actor_states))}
