"""The scores a report reads and the official curves it compares them with
(spec 7.5, 7.7): a run's episodes (``scores.jsonl``, or its evaluation
episodes while no training episode has ended), the anchor curves in
``experiments/data/``, their binned means and the table's rows. The CLI, the
table text and the figure: ``report.py``.
"""

from __future__ import annotations

import collections
import dataclasses
import gzip
import json
import math
import os
from typing import Dict, List, Optional, Sequence, Tuple, Union

import numpy as np

from experiments.run.log_files import EVAL_DIR, SCORES_FILE, normalize_task

DATA_DIR = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(
    __file__))), 'data')
ANCHOR_FILE = os.path.join(DATA_DIR, 'dmc_proprio-dreamerv3.json.gz')
VISION_ANCHOR_FILE = os.path.join(DATA_DIR, 'dmc_vision-dreamerv3.json.gz')
ATARI_ANCHOR_FILE = os.path.join(DATA_DIR, 'atari100k-dreamerv3.json.gz')
ATARI_PPO_FILE = os.path.join(DATA_DIR, 'atari100k-ppo_fixhp.json.gz')


def anchor_file(image: bool, suite: str = 'dmc') -> str:
  """The official curves a run is plotted against: Atari 100K for an
  Atari run, DMC vision for a run that observes images (spec 2.10), DMC
  proprio otherwise."""
  if suite == 'atari':
    return ATARI_ANCHOR_FILE
  return VISION_ANCHOR_FILE if image else ANCHOR_FILE
LAST_N = 5          # "last-5 mean" of the table
BINSIZE = 10_000    # widest curve bin in env steps (the anchor curves' spacing)
BINS_PER_RUN = 25   # a shorter run gets bins of 1/25 of its length
EVAL_SCORES_FILE = os.path.join(EVAL_DIR, SCORES_FILE)
_REQUIRED = ('task', 'env_step', 'score', 'seed')

PathLike = Union[str, os.PathLike]


# --- reading -----------------------------------------------------------------


@dataclasses.dataclass
class Run:
  """All episodes of one (logdir, seed) on one task, sorted by env_step."""
  task: str
  logdir: str
  seed: int
  steps: np.ndarray
  scores: np.ndarray
  source: str = 'train'   # 'eval': no training episode had ended (module doc)

  @property
  def label(self) -> str:
    return f'{os.path.basename(os.path.normpath(self.logdir)) or self.logdir} s{self.seed}'


class NoEpisodeYet(ValueError):
  """The run directory exists, but no episode of it has ended yet."""


def _read_episodes(path: str) -> List[Tuple[str, float, float, int]]:
  """(task, env_step, score, seed) of every line of a scores JSONL file;
  ValueError naming the file and line for a malformed one."""
  out = []
  with open(path) as f:
    for lineno, line in enumerate(f, 1):
      if not line.strip():
        continue
      where = f'{path}:{lineno}'
      try:
        rec = json.loads(line)
      except json.JSONDecodeError as e:
        raise ValueError(f'{where}: not valid JSON ({e.msg})') from e
      if not isinstance(rec, dict):
        raise ValueError(f'{where}: expected a JSON object, got {type(rec).__name__}')
      missing = [k for k in _REQUIRED if k not in rec]
      if missing:
        raise ValueError(f'{where}: missing field(s) {missing}; need {list(_REQUIRED)}')
      try:
        step, score, seed = float(rec['env_step']), float(rec['score']), int(rec['seed'])
      except (TypeError, ValueError) as e:
        raise ValueError(f'{where}: bad value ({e})') from e
      if not (math.isfinite(step) and math.isfinite(score)):
        raise ValueError(f'{where}: non-finite env_step or score: {rec}')
      out.append((normalize_task(rec['task']), step, score, seed))
  return out


def episodes_of(logdir: PathLike) -> Tuple[List[Tuple[str, float, float, int]], str]:
  """(episodes, source) a report of ``logdir`` plots: its training episodes
  (``scores.jsonl``; a path to such a file is read as it is), or, while none
  has ended, its evaluation episodes (``eval/scores.jsonl``, source 'eval').

  FileNotFoundError when ``logdir`` does not exist; ``NoEpisodeYet`` when
  neither file has an episode; ValueError for a malformed line."""
  logdir = os.fspath(logdir)
  if os.path.isfile(logdir):                 # the jsonl file itself
    rows = _read_episodes(logdir)
    if not rows:
      raise NoEpisodeYet(f'{logdir} holds no episode: a line is added when an '
                         'episode ends, and none has ended yet')
    return rows, 'train'
  if not os.path.isdir(logdir):
    raise FileNotFoundError(f'no run directory at {logdir} (a run writes '
                            f'{SCORES_FILE} there, one line per episode)')
  for name, source in ((SCORES_FILE, 'train'), (EVAL_SCORES_FILE, 'eval')):
    path = os.path.join(logdir, name)
    rows = _read_episodes(path) if os.path.exists(path) else []
    if rows:
      return rows, source
  raise NoEpisodeYet(
      f'no episode has ended yet in {logdir}: {SCORES_FILE} gets a line when '
      f'a training episode ends and {EVAL_SCORES_FILE} when an evaluation '
      'episode does, and neither has one (the run stopped before its first '
      'episode and first evaluation ended; train longer, or wait)')


def load_scores(logdirs: Union[PathLike, Sequence[PathLike]]) -> Dict[str, List[Run]]:
  """Each logdir's episodes (``episodes_of``) -> {task: [Run, ...]}.

  Raises FileNotFoundError for a missing run directory, ``NoEpisodeYet``
  (a ValueError) when one has no episode yet, and ValueError for a
  malformed line (its file and line number are named).
  """
  if isinstance(logdirs, (str, os.PathLike)):
    logdirs = [logdirs]
  if not logdirs:
    raise ValueError('no logdir given')
  buckets = collections.defaultdict(list)
  for logdir in logdirs:
    rows, source = episodes_of(logdir)
    for task, step, score, seed in rows:
      buckets[(task, os.fspath(logdir), seed, source)].append((step, score))
  runs = collections.defaultdict(list)
  for (task, logdir, seed, source), rows in sorted(buckets.items()):
    rows.sort(key=lambda r: r[0])  # stable: same-step episodes keep file order
    arr = np.asarray(rows, np.float64)
    runs[task].append(Run(task, logdir, seed, arr[:, 0], arr[:, 1], source))
  return dict(runs)


@dataclasses.dataclass
class Anchor:
  """Official curves of one task: xs [T] env steps, ys [seeds, T]."""
  task: str
  xs: np.ndarray
  ys: np.ndarray

  @property
  def mean(self) -> np.ndarray:
    return self.ys.mean(0)

  def at(self, env_step: float) -> Tuple[float, float, float, float]:
    """(anchor step, mean, min, max) at the anchor step nearest env_step."""
    i = int(np.argmin(np.abs(self.xs - env_step)))
    col = self.ys[:, i]
    return float(self.xs[i]), float(col.mean()), float(col.min()), float(col.max())


def load_anchors(path: PathLike = ANCHOR_FILE) -> Dict[str, Anchor]:
  """Official curves -> {task: Anchor} (gzip JSON list of {task, method, seed, xs, ys})."""
  with gzip.open(path, 'rt') as f:
    runs = json.load(f)
  by_task = collections.defaultdict(list)
  for run in runs:
    by_task[normalize_task(run['task'])].append(run)
  anchors = {}
  for task, group in sorted(by_task.items()):
    xs = np.asarray(group[0]['xs'], np.float64)
    if all(np.array_equal(np.asarray(run['xs'], np.float64), xs) for run in group):
      ys = np.asarray([run['ys'] for run in group], np.float64)
    else:
      # Per-episode curves (the DMC-vision file): each run's episodes binned
      # to BINSIZE, on the bins every run has.
      per_run = [binned(np.asarray(r['xs'], np.float64),
                        np.asarray(r['ys'], np.float64)) for r in group]
      xs = np.asarray(sorted(set.intersection(*(set(b.tolist())
                                                for b, _ in per_run))), np.float64)
      if not len(xs):
        raise ValueError(f'{path}: runs of {task} share no {BINSIZE:.0f}-step bin')
      ys = np.asarray([[dict(zip(b.tolist(), m.tolist()))[x] for x in xs]
                       for b, m in per_run], np.float64)
    anchors[task] = Anchor(task, xs, ys)
  return anchors


# --- statistics --------------------------------------------------------------


def binned(steps: np.ndarray, scores: np.ndarray,
           binsize: float = BINSIZE) -> Tuple[np.ndarray, np.ndarray]:
  """Mean score per bin; a bin is labelled by its centre k*binsize (nearest)."""
  keys = np.round(steps / binsize).astype(np.int64)
  uniq = np.unique(keys)
  means = np.asarray([scores[keys == k].mean() for k in uniq])
  return uniq * binsize, means


def mean_curve(runs: Sequence[Run], binsize: float = BINSIZE):
  """Mean over runs of the binned curves (bins where any run has data)."""
  per_run = [dict(zip(*binned(r.steps, r.scores, binsize))) for r in runs]
  xs = sorted(set().union(*per_run))
  ys = [np.mean([c[x] for c in per_run if x in c]) for x in xs]
  return np.asarray(xs, np.float64), np.asarray(ys, np.float64)


@dataclasses.dataclass
class Row:
  task: str
  runs: int
  episodes: int
  step: float            # mean over runs of the last env step
  step_lo: float
  step_hi: float
  ours: float            # mean over runs of the last-5 mean
  official: Optional[Tuple[float, float, float, float]]  # (step, mean, min, max)


def summarize(runs_by_task: Dict[str, List[Run]], anchors: Dict[str, Anchor],
              last_n: int = LAST_N) -> List[Row]:
  rows = []
  for task, runs in sorted(runs_by_task.items()):
    lasts = [float(r.steps[-1]) for r in runs]
    ours = float(np.mean([r.scores[-last_n:].mean() for r in runs]))
    step = float(np.mean(lasts))
    official = anchors[task].at(step) if task in anchors else None
    rows.append(Row(task, len(runs), sum(len(r.steps) for r in runs), step,
                    min(lasts), max(lasts), ours, official))
  return rows
