"""What a run reports, written once for both layouts (docs/metrics.md).

  RunLogger     metrics.jsonl + TensorBoard, an acme Logger (one O_APPEND
                write per row, so several processes can share the file)
  LearnerRows   the learner's acme Logger: 'learner' rows every N updates
  Tally         the cumulative counts a train row is computed from
  train_row     the 'train' row of both layouts: one definition per metric
  eval_row      the 'eval' row (spec 7.3)
  progress_line the live progress line on stderr; Eta its time left

The log and eval grids use ``experiments.run.config.next_multiple``.
"""

from __future__ import annotations

import collections
import dataclasses
import json
import math
import os
import time
from typing import Any, Callable, Dict, Mapping, Optional, Sequence

import numpy as np

import agent  # noqa: F401  (jax compat before acme)
from acme.utils.loggers import base as loggers_base
from experiments.run.private_files import open_run_file
from experiments.run.log_files import METRICS_FILE, TB_DIR, jsonable


class RunLogger(loggers_base.Logger):
  """metrics.jsonl + TensorBoard scalars, an ``acme.utils.loggers.Logger``.

  Rows are dicts with 'kind' ('train' / 'eval') and 'env_step' (the
  TensorBoard step); each row is one O_APPEND write, so the learner and the
  evaluator processes of a distributed run can share the file. The file is
  never opened through a symbolic link (``private_files.open_run_file``).
  """

  def __init__(self, logdir: str, tensorboard: bool = True):
    self._logdir = logdir
    self._path = os.path.join(logdir, METRICS_FILE)
    self._tb = None
    if tensorboard:
      import tensorflow as tf
      self._tf = tf
      self._tb = tf.summary.create_file_writer(os.path.join(logdir, TB_DIR))

  def write(self, row: Mapping[str, Any]) -> None:
    clean = {k: jsonable(v) for k, v in row.items()}
    line = (json.dumps(clean) + '\n').encode()
    fd = open_run_file(self._path, os.O_WRONLY | os.O_APPEND | os.O_CREAT,
                       root=self._logdir)
    try:
      os.write(fd, line)
    finally:
      os.close(fd)
    if self._tb is not None:
      step = int(row.get('env_step', 0))
      prefix = {'eval': 'eval/', 'learner': 'learner/'}.get(row.get('kind'), '')
      with self._tb.as_default():
        for k, v in clean.items():
          if k in ('env_step', 'kind') or isinstance(v, bool) or not isinstance(
              v, (int, float)):
            continue
          name = k if (k.startswith('eval/') or not prefix) else prefix + k
          self._tf.summary.scalar(name, v, step=step)
      self._tb.flush()

  def close(self) -> None:
    if self._tb is not None:
      self._tb.close()
      self._tb = None


class OpenOnUse:
  """A ``RunLogger`` on ``logdir`` opened on first use: calling it returns
  the logger, so it can be handed to a piece made before anything writes;
  ``close()`` closes it if it was opened."""

  def __init__(self, logdir: str):
    self._logdir = logdir
    self._logger: Optional[RunLogger] = None

  def __call__(self) -> RunLogger:
    if self._logger is None:
      self._logger = RunLogger(self._logdir)
    return self._logger

  def close(self) -> None:
    if self._logger is not None:
      self._logger.close()


class LearnerRows(loggers_base.Logger):
  """The learner's acme Logger in both layouts: ``kind: 'learner'`` rows.

  ``agent.learner.DreamerLearner`` writes, every ``--learner_log_every``
  updates, the means of its metrics over those updates (``updates_in_mean``
  of them) and the global ``learner_steps``; this adds the run's env step and
  appends the row to metrics.jsonl with the metric names of the train rows
  (``train/<name>``). Rows keyed by update count are what
  ``bench/parity.py`` compares against the official code.
  """

  def __init__(self, logger_fn: Callable[[], Any],
               env_step_fn: Callable[[], Optional[int]]):
    self._logger_fn, self._env_step_fn = logger_fn, env_step_fn

  def write(self, data: Mapping[str, Any]) -> None:
    data = dict(data)
    row = {'kind': 'learner', 'updates': int(data.pop('learner_steps')),
           'updates_in_mean': int(data.pop('updates_in_mean')),
           'env_step': self._env_step_fn()}
    row.update({f'train/{k}': v for k, v in data.items()})
    self._logger_fn().write(row)

  def close(self) -> None:
    pass


@dataclasses.dataclass
class Tally:
  """Cumulative counts at one moment, from which ``train_row`` computes a
  row's rates over the interval between two tallies.

  Counts: env / agent steps, updates and finished episodes of the run; the
  learner's uniform and online rows (spec 5.3); the uniform table's
  rate-limiter inserts and samples (Reverb's own counts); the table sizes;
  the latent store's entries; invalid items the sampler dropped and
  invalid latents the store refused (``reverb_tables.step_checks``). Seconds (cumulative, per process): ``idle_s``
  the learner waited for a batch, ``sample_thread_s`` the dataset's sampling
  thread worked, and ``parts``: {part: seconds} of the wall time spent in
  each part of the loop ('env', 'policy', 'replay_add', 'learner_sample',
  'learner_update', 'learner_write_back', ...), in the process doing it.
  """
  t: float
  env_steps: int
  agent_steps: int
  updates: int
  episodes: int
  uniform_rows: int
  online_rows: int
  inserts: int
  samples: int
  uniform_size: int
  online_size: int
  latent_entries: int
  dropped_items: int
  invalid_latents: int
  idle_s: float
  sample_thread_s: float
  parts: Dict[str, float]


def learner_tally(*, env_steps: int, agent_steps: int, updates: int,
                  episodes: int, server_info, dataset, learner_timings,
                  parts: Optional[Mapping[str, float]] = None) -> Tally:
  """A ``Tally`` of the learner's side, in either layout: the uniform table's
  limiter counts and both tables' sizes from Reverb's ``server_info``, the
  dataset's rows, latents and waits, the learner's timings, plus the
  caller's counts and its own loop ``parts``."""
  limiter = server_info['uniform'].rate_limiter_info
  t = learner_timings
  return Tally(
      t=time.perf_counter(), env_steps=int(env_steps),
      agent_steps=int(agent_steps), updates=int(updates),
      episodes=int(episodes), uniform_rows=dataset.sampler.num_uniform_rows,
      online_rows=dataset.sampler.num_online_rows,
      inserts=int(limiter.insert_stats.completed),
      samples=int(limiter.sample_stats.completed),
      uniform_size=int(server_info['uniform'].current_size),
      online_size=int(server_info['online'].current_size),
      latent_entries=len(dataset.latent_store),
      dropped_items=dataset.sampler.num_dropped,
      invalid_latents=dataset.latent_store.num_invalid, idle_s=dataset.idle_s,
      sample_thread_s=dataset.sample_s,
      parts={**dict(parts or {}), 'learner_sample': t['sample_s'],
             'learner_update': t['update_s'],
             'learner_write_back': t['write_back_s']})


def _rate(num: float, den: float) -> Optional[float]:
  return num / den if den > 0 else None


def train_row(now: Tally, mark: Tally, *, config, segment: int,
              wall_time: float, scores: Optional[Sequence[float]] = None,
              lengths: Sequence[float] = (), other_part: bool = False,
              learner_metrics: Optional[Mapping[str, float]] = None,
              extra: Optional[Mapping[str, Any]] = None) -> Dict[str, Any]:
  """The 'train' row of docs/metrics.md, for the interval ``mark`` -> ``now``.

  The one definition of each metric, for both layouts. ``replay/ratio`` is
  the spec 6.1 quantity, replayed steps trained per agent step:
  (uniform + online rows) x T / agent steps, which the schedule (one
  process) or the rate limiter (Launchpad) holds at ``train_ratio``;
  ``replay/ratio_after_fill`` is the limiter's own quantity (uniform samples
  x T per insert past ``train_fill``). ``scores`` / ``lengths``: training
  episodes finished in the interval (None: the layout does not see them,
  and the row has no ``episode/`` counts). ``other_part``: add
  ``time/other_frac``, the rest of a one-process loop's wall time.
  """
  dt = max(now.t - mark.t, 1e-9)
  T = config.batch_length
  rows = now.uniform_rows + now.online_rows
  d_rows = rows - mark.uniform_rows - mark.online_rows
  d_agent = now.agent_steps - mark.agent_steps
  row = {
      'kind': 'train', 'env_step': int(now.env_steps),
      'agent_step': int(now.agent_steps), 'updates': int(now.updates),
      'episodes': int(now.episodes), 'segment': int(segment),
      'wall_time': float(wall_time),
      'fps/env_steps_per_s': (now.env_steps - mark.env_steps) / dt,
      'fps/updates_per_s': (now.updates - mark.updates) / dt,
      'replay/uniform_size': int(now.uniform_size),
      'replay/online_size': int(now.online_size),
      'replay/uniform_rows': int(now.uniform_rows),
      'replay/online_rows': int(now.online_rows),
      'replay/latent_store_entries': int(now.latent_entries),
      'replay/dropped_items': int(now.dropped_items),
      'replay/invalid_latents': int(now.invalid_latents),
      'replay/inserts': int(now.inserts), 'replay/samples': int(now.samples),
      'replay/ratio_target': float(config.train_ratio),
      'replay/ratio': _rate(rows * T, now.agent_steps),
      'replay/ratio_window': _rate(d_rows * T, d_agent),
      'replay/ratio_after_fill': _rate(now.samples * T,
                                       now.inserts - config.train_fill),
      'learner/idle_frac': (now.idle_s - mark.idle_s) / dt,
      'learner/sample_thread_frac': (now.sample_thread_s -
                                     mark.sample_thread_s) / dt,
  }
  if scores is not None:
    row.update({
        'episode/count': len(scores),
        'episode/score_mean': float(np.mean(scores)) if len(scores) else None,
        'episode/score_max': float(np.max(scores)) if len(scores) else None,
        'episode/length_mean': (float(np.mean(lengths)) if len(lengths)
                                else None)})
  rest = dt
  for part, seconds in now.parts.items():
    spent = seconds - mark.parts.get(part, 0.0)
    row[f'time/{part}_frac'] = spent / dt
    rest -= spent
  if other_part:
    row['time/other_frac'] = max(0.0, rest / dt)
  row.update(extra or {})
  for k, v in (learner_metrics or {}).items():
    row[f'train/{k}'] = v
  return row


def eval_row(env_step: int, scores, lengths, mode: str, seconds: float,
             **extra) -> Dict[str, Any]:
  """The eval metrics row of docs/metrics.md."""
  return {'kind': 'eval', 'env_step': int(env_step), **extra,
          'eval/policy': mode, 'eval/episodes': len(scores),
          'eval/score_mean': float(np.mean(scores)),
          'eval/score_std': float(np.std(scores)),
          'eval/score_min': float(np.min(scores)),
          'eval/score_max': float(np.max(scores)),
          'eval/length_mean': float(np.mean(lengths)),
          'eval/seconds': seconds}


def fmt_steps(x: float) -> str:
  if x >= 1e6:
    return f'{x / 1e6:.2f}M'
  if x >= 1e3:
    return f'{x / 1e3:.1f}K'
  return f'{int(x)}'


def fmt_secs(s: float) -> str:
  if not math.isfinite(s):
    return '?'
  s = int(s)
  if s >= 3600:
    return f'{s // 3600}h{(s % 3600) // 60:02d}m'
  if s >= 60:
    return f'{s // 60}m{s % 60:02d}s'
  return f'{s}s'


class Eta:
  """Time left at the recent rate, for the progress line.

  ``mark(wall, env_steps, training)`` at every progress line. The rate is the
  env steps per second of wall time between the oldest and the newest mark
  of the last ``window_s`` seconds, counting only marks taken while training
  runs: while the replay fills, env steps come many times faster than they
  will once updates run, and the whole-run average mixes both (the paper
  protocol's first ETA said 1 h for a 76 h run). ``seconds_left`` is None
  (the line says "estimating") until two such marks exist."""

  def __init__(self, window_s: float = 300.0):
    self.window_s = float(window_s)
    self._marks: collections.deque = collections.deque()

  def mark(self, wall: float, env_steps: int, training: bool) -> None:
    if not training:
      self._marks.clear()
      return
    if self._marks and wall <= self._marks[-1][0]:
      return                             # the same row read again
    self._marks.append((float(wall), int(env_steps)))
    while (len(self._marks) > 2 and
           self._marks[-1][0] - self._marks[1][0] >= self.window_s):
      self._marks.popleft()

  def rate(self) -> Optional[float]:
    """Env steps per second over the window (None while estimating)."""
    if len(self._marks) < 2:
      return None
    (t0, s0), (t1, s1) = self._marks[0], self._marks[-1]
    return (s1 - s0) / (t1 - t0) if s1 > s0 else None

  def seconds_left(self, env_steps: int, target: int) -> Optional[float]:
    rate = self.rate()
    return None if rate is None else max(0, target - env_steps) / rate


def progress_line(env_steps: int, target: int, updates: int, fps: float,
                  wall: float, scores=(), extra: str = '', final=False,
                  eta: Optional[float] = None) -> str:
  """The live progress line of both layouts. ``eta``: seconds left at the
  recent rate (``Eta``), None while estimating; the final line has none."""
  scores = ', '.join(f'{s:.0f}' for s in scores) or '-'
  line = (f'[{"done" if final else "run"}] {fmt_steps(env_steps)}/'
          f'{fmt_steps(target)} env steps | {updates} updates | '
          f'{fps:.1f} env steps/s | last scores: {scores}{extra} | '
          f'elapsed {fmt_secs(wall)}')
  if final:
    return line
  return line + (' | ETA estimating' if eta is None else
                 f' | ETA {fmt_secs(eta)}')
