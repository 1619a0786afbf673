"""The learner node's train rows (docs/metrics.md): the run's counts, the
learner's metrics, the actors' timings and parameter lag, the remote
actors' ``join/*`` and the health counts, on the ``--log_every`` grid.

Construction order (``program.make_learner_node``): ``RunCounts`` (the
counts and the metrics log) comes first, since the learner's
``metrics.LearnerRows`` write into its log at its env step; ``TrainRows``
needs the learner and its dataset, so it comes after them. The dataset
polls the rows while it waits for a batch through a ``WaitHooks`` made
before it, which the rows join once they exist (``TrainRows.poll``)."""

from __future__ import annotations

import dataclasses
import time
from typing import Any, Callable, Dict, List, Optional

import numpy as np

from experiments.run import health, metrics
from experiments.run import restarts as restart_log
from experiments.run.config import log, next_multiple


@dataclasses.dataclass
class Progress:
  """The learner's update count and wall time across resumes."""
  learner: Any
  base_updates: int = 0
  wall0: float = 0.0
  t_start: float = dataclasses.field(default_factory=time.perf_counter)

  @property
  def updates(self) -> int:
    return self.base_updates + self.learner.num_steps

  @property
  def wall_time(self) -> float:
    return self.wall0 + time.perf_counter() - self.t_start


class WaitHooks:
  """What the learner's dataset runs while it waits for a batch (its
  ``on_wait``): every function ``add``-ed, in order."""

  def __init__(self):
    self._hooks: List[Callable[[], None]] = []

  def add(self, hook: Callable[[], None]) -> None:
    self._hooks.append(hook)

  def __call__(self) -> None:
    for hook in self._hooks:
      hook()


class RunCounts:
  """The run's counts as the learner node last read them from the counter
  (``counts``, ``env_steps``) and the run's metrics log (``logger``: train
  and learner rows), opened on first use."""

  def __init__(self, settings, counter):
    """``counter``: the learner's synced counter."""
    self._counter = counter
    self.counts: Dict[str, float] = dict(settings.counts)
    self.logger = metrics.OpenOnUse(settings.run.logdir)

  @property
  def env_steps(self) -> int:
    return int(self.counts.get('env_steps', 0))

  def read(self) -> bool:
    """Reads the counter; False (the counts stay) when it does not answer."""
    try:
      self.counts = self._counter.get_counts()
    except Exception as e:  # noqa: BLE001
      log(f'[learner] counter unreachable: {e}')
      return False
    return True

  def flush(self) -> None:
    try:
      self.counts = self._counter.flush()
    except Exception:  # noqa: BLE001  (the counter is gone: the last counts)
      pass

  def close(self) -> None:
    self.logger.close()


class TrainRows:
  """Counts from the counter every ``poll_s``; a train row when they pass
  the next multiple of ``--log_every`` (``poll``) and whenever asked
  (``write``: the final row, the persistent-skip stop)."""

  def __init__(self, *, settings, run_counts: RunCounts, progress: Progress,
               learner, dataset, replay, actors, join=None):
    """``join``: the join service's handle (None without one)."""
    self._settings, self._progress = settings, progress
    self._learner, self._dataset, self._replay = learner, dataset, replay
    self._run_counts, self._actors, self._join = run_counts, list(actors), join
    self.next_log = next_multiple(int(self.counts.get('env_steps', 0)),
                                  settings.run.log_every)
    self.last_row: Dict[str, Any] = {}
    self.last_row_step: Optional[int] = None
    # Persistent skipped updates stop the run (spec 4.9); their counts go in
    # the rows, and the last row is written right before the stop.
    self.health = health.SkipGuard(settings.run.max_skipped_updates,
                                   settings.run.logdir, on_stop=self.write)
    self._mark: Optional[metrics.Tally] = None
    self._prev_actor_stats: Dict[int, Dict[str, Any]] = {}
    self._join_scores: List[float] = []
    self._last_poll = 0.0

  @property
  def counts(self) -> Dict[str, float]:
    return self._run_counts.counts

  @property
  def env_steps(self) -> int:
    return self._run_counts.env_steps

  def start(self) -> None:
    self._mark = self._tally()

  def poll(self) -> None:
    now = time.perf_counter()
    if now - self._last_poll < self._settings.dist.poll_s:
      return
    self._last_poll = now
    if not self._run_counts.read():
      return
    if self.env_steps >= self.next_log:
      self.write()
      self.next_log = next_multiple(self.env_steps,
                                    self._settings.run.log_every)

  def flush_counts(self) -> None:
    self._run_counts.flush()

  def write(self) -> None:
    now = self._tally()
    settings = self._settings
    row = metrics.train_row(
        now, self._mark or now, config=settings.config,
        segment=settings.segment, wall_time=self._progress.wall_time,
        learner_metrics=self._learner.pop_metric_means(),
        extra={**self.health.row(),
               **self._join_row(), 'num_actors': settings.dist.num_actors,
               'run/restarts': restart_log.count_restarts(settings.run.logdir),
               **self._actor_row()})
    self._run_counts.logger().write(row)
    self.last_row = {k: v for k, v in row.items()
                     if not k.startswith('train/')}
    self.last_row_step = now.env_steps
    self._mark = now

  def close(self) -> None:
    self._run_counts.close()

  def _tally(self) -> metrics.Tally:
    c = self.counts
    return metrics.learner_tally(
        env_steps=c.get('env_steps', 0), agent_steps=c.get('actor_steps', 0),
        updates=self._progress.updates, episodes=c.get('episodes', 0),
        server_info=self._replay.server_info(), dataset=self._dataset,
        learner_timings=self._learner.timings)

  def _actor_row(self) -> Dict[str, Any]:
    """Mean env / policy / add fractions of the actors' wall time since the
    last row (``time/env_frac``, ``time/policy_frac``,
    ``time/replay_add_frac``), parameter lag (learner updates) and the
    actors' recent episode scores (remote actors' included)."""
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
    """The join service's ``join/*`` metrics (none when it does not answer)."""
    if self._join is None:
      return {}
    try:
      row = dict(self._join.row())
    except Exception as e:  # noqa: BLE001  (restarting: the next row has it)
      log(f'[learner] join service unreachable: {e}')
      return {}
    self._join_scores = row.pop('recent_scores', [])
    return row
