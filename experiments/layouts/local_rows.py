"""The one-process run's train rows, episode scores and progress lines.

``LocalRows(parts, ...)`` writes what ``experiments.layouts.local.Trainer``
reports: a train row (docs/metrics.md) over the interval since the last one,
each finished episode to scores.jsonl, and the progress line with its ETA.
It reads the run's pieces and counts from ``local_parts.LocalParts``; the
metrics logger is opened (``open``) once the run directory is settled.
"""

from __future__ import annotations

import time
from typing import List, Optional

from experiments.run import metrics, rundir


class LocalRows:
  """Rows, scores and progress of one process (module doc).

  ``eval_s`` / ``checkpoint_s``: seconds spent evaluating / checkpointing,
  the rows' 'eval' and 'checkpoint' parts; ``recent_scores``: the last five
  episode scores (kept across resumes); ``last_row_step``: the env step of
  the last train row (None before one)."""

  def __init__(self, parts, *, segment: int, recent_scores: List[float]):
    self._parts = parts
    self._run, self._config = parts.run_config, parts.experiment.config
    self._segment = segment
    self.recent_scores = list(recent_scores)
    self.logger: Optional[metrics.RunLogger] = None
    self.eval_s = self.checkpoint_s = 0.0
    self.last_row_step: Optional[int] = None
    self._scores: List[float] = []
    self._lengths: List[int] = []
    self._mark: Optional[metrics.Tally] = None
    self._prog_mark = None
    self._eta = metrics.Eta()

  def open(self) -> None:
    self.logger = metrics.RunLogger(self._run.logdir)

  def start(self) -> None:
    """The first row's interval starts now."""
    self._eta = metrics.Eta()
    self._scores, self._lengths = [], []
    self.last_row_step = None
    self._mark = self.tally()

  def record_episode(self, ep) -> None:
    rundir.append_score(self._run.logdir, self._run.task, ep.env_step,
                        ep.score, self._config.seed, ep.stats)
    self.recent_scores = (self.recent_scores + [ep.score])[-5:]
    self._scores.append(ep.score)
    self._lengths.append(ep.length)

  def tally(self) -> metrics.Tally:
    p = self._parts
    return metrics.learner_tally(
        env_steps=p.env_steps, agent_steps=p.agent_steps,
        updates=p.updates, episodes=p.episodes,
        server_info=p.client.server_info(), dataset=p.dataset,
        learner_timings=p.learner.timings,
        parts={'env': p.env.step_s, 'policy': p.actor.timings['policy_s'],
               'replay_add': p.actor.timings['add_s'],
               'eval': self.eval_s, 'checkpoint': self.checkpoint_s})

  def write(self, wall_time: float) -> None:
    """A train row over the interval since the last one."""
    p = self._parts
    now = self.tally()
    row = metrics.train_row(
        now, self._mark, config=self._config, segment=self._segment,
        wall_time=wall_time, scores=self._scores,
        lengths=self._lengths, other_part=True,
        learner_metrics=p.learner.pop_metric_means(),
        extra={'replay/items': p.adder.num_items,
               'replay/online_items': p.adder.num_online_items,
               'replay/owed_updates': p.agent.owed_updates,
               **p.health.row()})
    self.logger.write(row)
    self.last_row_step = p.env_steps
    self._scores, self._lengths = [], []
    self._mark = now

  def progress(self, wall_time: float, final: bool) -> str:
    """The progress line: env steps, updates, rate, scores and ETA."""
    p, target = self._parts, self._run.env_steps
    recent = self._prog_mark
    now = time.perf_counter()
    if recent is None or final:
      fps = p.env_steps / max(wall_time, 1e-9)
    else:
      fps = (p.env_steps - recent[1]) / max(now - recent[0], 1e-9)
    self._prog_mark = (now, p.env_steps)
    self._eta.mark(wall_time, p.env_steps, training=p.updates > 0)
    return metrics.progress_line(
        p.env_steps, target, p.updates, fps, wall_time, self.recent_scores,
        final=final, eta=self._eta.seconds_left(p.env_steps, target))
