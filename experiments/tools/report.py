"""Score report: our DMC-proprio episode scores against the official DreamerV3 curves.

  python experiments/tools/report.py --logdir DIR [DIR ...] [--out PNG]

Inputs
  DIR/scores.jsonl: one JSON object per finished training episode,
    {"task": "walker_walk", "env_step": 123456, "score": 812.3, "seed": 0}
  env_step is agent steps x action repeat (spec 7.5 logger x-axis) and score is
  the episode return of the stochastic acting policy (spec 7.3, 7.7).
  experiments.run.log_files.append_score() writes such lines. You can pass
  several logdirs. A run is (logdir, seed), so two logdirs that both use
  seed 0 stay two runs. A run in which no training episode has ended yet
  (shorter than one episode) is reported from its evaluation episodes,
  DIR/eval/scores.jsonl (same lines), and the table says so.

Anchors
  experiments/data/dmc_proprio-dreamerv3.json.gz holds the official 5-seed
  DreamerV3 curves (2023 agent, xs = env steps 10K..490K). SOURCE.md in the
  same folder describes it. Anchor task names 'dmc_walker_walk' are mapped to
  'walker_walk'.

Outputs
  * A PNG (default DIR/report.png, the file a run writes at its end) with one
    panel per task: score vs env steps. It shows our per-run curves and their
    mean (episodes averaged in bins of 1/25 of the run, at most 10K env
    steps, the anchors' spacing; each episode in the bin whose centre is
    nearest), and the official mean with its min-max band over the 5 seeds.
  * A markdown table, printed and returned by make_report(). Per task it
    gives our last-5 mean and the official mean at the nearest anchor step.
    Our last-5 mean is the mean over runs of each run's last 5 episodes. Its
    step is the mean over runs of each run's last env step.

Atari runs (``--anchors experiments/data/atari100k-dreamerv3.json.gz``, what
an Atari run's own report uses) are plotted against the official Atari 100K
curves, and the table is followed by human-normalised scores (ours, DreamerV3,
PPO) with their mean and median (``experiments/tools/atari_scores.py``).

The spec 7.7 targets at 490K are a task mean of 757.8 and a median of 868.5.
"""

from __future__ import annotations

import argparse
import math
import os
import sys
from typing import Dict, List, Optional, Sequence, Union

import numpy as np

if __package__ in (None, ''):  # run as a script: make the repo root importable
  sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(
      os.path.abspath(__file__)))))

from experiments.run.config import log  # noqa: E402
from experiments.run.log_files import REPORT_FILE  # noqa: E402
from experiments.tools import atari_scores, crafter_report  # noqa: E402
# The scores and curves a report reads (one home: curves.py); their names
# stay importable from here.
from experiments.tools.curves import (  # noqa: E402,F401
    Anchor, ANCHOR_FILE, anchor_file, ATARI_ANCHOR_FILE, ATARI_PPO_FILE,
    binned, BINS_PER_RUN, BINSIZE, DATA_DIR,
    episodes_of, EVAL_SCORES_FILE, LAST_N, load_anchors, load_scores,
    mean_curve, NoEpisodeYet, PathLike, Row, Run, summarize,
    VISION_ANCHOR_FILE)


def _kstep(x: float) -> str:
  if x >= 1e6:
    return f'{x / 1e6:.2f}M'
  return f'{x / 1e3:.0f}K' if x >= 1e3 else f'{x:.0f}'


def step_labels(values: Sequence[float]) -> List[str]:
  """Tick labels of an env-step axis, distinct at every budget: plain
  numbers below 10K, then K or M with the fewest decimals that write every
  tick exactly (ticks 500 apart on a 3K run read 0, 500, 1,000, ..., not 0,
  0K, 1K, 1K, 2K; 2,500 on a 10K run is 2.5K, not 2K)."""
  vals = [float(v) for v in values]
  top = max((abs(v) for v in vals), default=0.0)
  scale, unit = ((1e6, 'M') if top >= 1e6 else
                 (1e3, 'K') if top >= 1e4 else (1.0, ''))
  decimals = 0                 # the fewest that write every tick exactly
  while decimals < 3 and any(
      abs(round(v / scale, decimals) - v / scale) > 1e-9 * max(1.0, top / scale)
      for v in vals):
    decimals += 1
  return ['0' if v == 0 else f'{v / scale:,.{decimals}f}{unit}' for v in vals]


def _step_formatter():
  from matplotlib.ticker import Formatter

  class StepFormatter(Formatter):
    """``step_labels`` over the axis' ticks."""

    def format_ticks(self, values):
      return step_labels(values)

    def __call__(self, x, pos=None):
      return step_labels([x])[0]
  return StepFormatter()


def format_table(rows: Sequence[Row], last_n: int = LAST_N) -> str:
  """Markdown table: task, our last-N mean at the last step, official mean there."""
  lines = [
      f'| task | runs | episodes | last env step | ours: last-{last_n} mean | '
      'official mean @ step | official min-max |',
      '|---|---:|---:|---:|---:|---:|---:|',
  ]
  for r in rows:
    step = _kstep(r.step) if r.step_lo == r.step_hi else \
        f'{_kstep(r.step_lo)}-{_kstep(r.step_hi)}'
    if r.official:
      ostep, omean, omin, omax = r.official
      off = f'{omean:.1f} @ {_kstep(ostep)}'
      rng = f'{omin:.1f}-{omax:.1f}'
    else:
      off, rng = 'n/a (no anchor)', 'n/a'
    lines.append(f'| {r.task} | {r.runs} | {r.episodes} | {step} | {r.ours:.1f} | '
                 f'{off} | {rng} |')
  with_anchor = [r for r in rows if r.official]
  if len(with_anchor) > 1:
    ours = np.mean([r.ours for r in with_anchor])
    off = np.mean([r.official[1] for r in with_anchor])
    lines.append(f'| **mean ({len(with_anchor)} tasks)** | | | | {ours:.1f} | '
                 f'{off:.1f} | |')
  return '\n'.join(lines)


# --- plotting ----------------------------------------------------------------


def panel_scale(runs: Sequence[Run], anchor: Optional[Anchor],
                binsize: float = BINSIZE, xmax: Optional[float] = None):
  """(bin size, (x left, x right), (y low, y high)) of one task's panel.

  Bins of 1/25 of the run, never wider than ``binsize`` (the anchors' 10K),
  so a short run shows a curve (a 15K-step run: 600-step bins, not two
  points). With official curves (the DMC-proprio tasks): a y-axis from 0
  (or below) to 1,000 (or above), the benchmark's scale. Without (gym,
  gymnasium, your own task): a y-axis that fits the scores (a run whose
  scores sit at -500 is not drawn on a 0..1,000 axis)."""
  our_max = max(float(r.steps[-1]) for r in runs)
  lo = min(float(r.scores.min()) for r in runs)
  hi = max(float(r.scores.max()) for r in runs)
  binsize = min(binsize, max(1.0, our_max / BINS_PER_RUN))
  if anchor is not None:
    lo, hi = min(0.0, lo), max(1000.0, hi)
  if hi - lo < 1e-9:                      # flat scores: a unit-wide band
    lo, hi = lo - 0.5, hi + 0.5
  right = xmax if xmax else max(our_max, binsize) * 1.05
  pad = 0.03 * (hi - lo)
  return binsize, (0.0, right), (lo - pad, hi + pad)


def figure(runs_by_task: Dict[str, List[Run]], anchors: Dict[str, Anchor],
           binsize: float = BINSIZE, xmax: Optional[float] = None,
           ncols: int = 4):
  """The report's matplotlib figure: one panel per task, our runs and their
  mean, the official mean and min-max band."""
  import matplotlib
  matplotlib.use('Agg')
  import matplotlib.pyplot as plt

  tasks = sorted(runs_by_task)
  ncols = max(1, min(ncols, len(tasks)))
  nrows = int(math.ceil(len(tasks) / ncols))
  fig, axes = plt.subplots(nrows, ncols, figsize=(4.2 * ncols, 3.2 * nrows),
                           squeeze=False)
  handles = {}
  for ax, task in zip(axes.flat, tasks):
    runs = runs_by_task[task]
    anchor = anchors.get(task)
    task_bins, (_, right), ylim = panel_scale(runs, anchor, binsize, xmax)
    if anchor is not None:
      keep = anchor.xs <= right + task_bins
      if not keep.any():
        keep[0] = True
      xs, ys = anchor.xs[keep], anchor.ys[:, keep]
      handles['band'] = ax.fill_between(xs, ys.min(0), ys.max(0), color='tab:gray',
                                        alpha=0.25, lw=0,
                                        label=f'official min-max ({len(ys)} seeds)')
      (handles['official'],) = ax.plot(xs, ys.mean(0), color='black', lw=1.6,
                                       ls='--', marker='x' if len(xs) < 8 else None,
                                       label='official DreamerV3 mean')
    for r in (runs if len(runs) > 1 else ()):
      bx, by = binned(r.steps, r.scores, task_bins)
      (handles['run'],) = ax.plot(bx, by, color='tab:blue', lw=0.8, alpha=0.45,
                                  marker='.' if len(bx) < 8 else None,
                                  label='ours, per run')
    mx, my = mean_curve(runs, task_bins)
    (handles['ours'],) = ax.plot(mx, my, color='tab:blue', lw=2.2,
                                 marker='o' if len(mx) < 8 else None, ms=4,
                                 label='ours, mean')
    source = (', evaluation episodes' if all(r.source == 'eval' for r in runs)
              else '')
    ax.set_title(f'{task}  ({len(runs)} run{"s" if len(runs) > 1 else ""}'
                 f'{source})', fontsize=10)
    ax.set_xlim(0, right)
    ax.set_ylim(*ylim)
    ax.xaxis.set_major_formatter(_step_formatter())
    ax.grid(alpha=0.3, lw=0.5)
    ax.tick_params(labelsize=8)
  for i, ax in enumerate(axes.flat):
    if i >= len(tasks):
      ax.axis('off')
    elif i + ncols >= len(tasks):  # no panel below: label the x axis
      ax.set_xlabel('env steps', fontsize=9)
  for ax in axes[:, 0]:
    ax.set_ylabel('episode score', fontsize=9)
  order = [handles[k] for k in ('ours', 'run', 'official', 'band') if k in handles]
  legend_cols = len(order) if ncols >= 3 else min(len(order), 2)
  legend_rows = int(math.ceil(len(order) / legend_cols))
  fig.legend(order, [h.get_label() for h in order], loc='upper center',
             ncol=legend_cols, fontsize=9, frameon=False)
  fig.tight_layout(rect=(0, 0, 1, 1 - 0.3 * legend_rows / (3.2 * nrows)))
  return fig


def plot(runs_by_task: Dict[str, List[Run]], anchors: Dict[str, Anchor],
         out_png: PathLike, binsize: float = BINSIZE,
         xmax: Optional[float] = None, ncols: int = 4) -> None:
  """Writes ``figure(...)`` to ``out_png``."""
  import matplotlib.pyplot as plt
  fig = figure(runs_by_task, anchors, binsize, xmax, ncols)
  out_dir = os.path.dirname(os.path.abspath(out_png))
  os.makedirs(out_dir, exist_ok=True)
  fig.savefig(out_png, dpi=110)
  plt.close(fig)


# --- entry points ------------------------------------------------------------


def make_report(logdirs: Union[PathLike, Sequence[PathLike]], out_png: PathLike,
                anchors_path: PathLike = ANCHOR_FILE, binsize: float = BINSIZE,
                xmax: Optional[float] = None, last_n: int = LAST_N) -> str:
  """Write the PNG to out_png and return the markdown table (see module doc)."""
  if last_n < 1:
    raise ValueError(f'last_n must be >= 1, got {last_n}')
  if binsize <= 0:
    raise ValueError(f'binsize must be positive, got {binsize}')
  runs_by_task = load_scores(logdirs)
  anchors = load_anchors(anchors_path)
  plot(runs_by_task, anchors, out_png, binsize=binsize, xmax=xmax)
  rows = summarize(runs_by_task, anchors, last_n)
  table = format_table(rows, last_n)
  if os.path.abspath(anchors_path) == os.path.abspath(ATARI_ANCHOR_FILE):
    table += atari_scores.hns_table(rows, {
        'DreamerV3': anchors, 'PPO': load_anchors(ATARI_PPO_FILE)})
  from_eval = sorted({r.logdir for runs in runs_by_task.values()
                      for r in runs if r.source == 'eval'})
  if from_eval:
    table += (f'\n\nNo training episode has ended yet in {", ".join(from_eval)}: '
              f'its rows are its evaluation episodes ({EVAL_SCORES_FILE}).')
  table += crafter_report.section(logdirs, out_png)
  return table + watch_links(logdirs)


def write_run_report(logdir: PathLike,
                     anchors_path: PathLike = ANCHOR_FILE) -> Optional[str]:
  """The end-of-run report of either layout: ``<logdir>/report.png`` and the
  table, logged; from the evaluation episodes while no training episode has
  ended; None (logged why) when no episode of either kind has."""
  out = os.path.join(os.fspath(logdir), REPORT_FILE)
  try:
    table = make_report(logdir, out, anchors_path=anchors_path)
  except (FileNotFoundError, ValueError) as e:
    log(f'[report] skipped: {e}')
    return None
  log(table)
  log(f'[report] wrote {out}')
  return table


def watch_links(logdirs: Union[PathLike, Sequence[PathLike]]) -> str:
  """Markdown links to the videos and open-loop plots that
  ``experiments/tools/watch.py`` wrote into ``<logdir>/watch/`` ('' if none)."""
  if isinstance(logdirs, (str, os.PathLike)):
    logdirs = [logdirs]
  lines = []
  for logdir in logdirs:
    folder = os.path.join(os.fspath(logdir), 'watch')
    if not os.path.isdir(folder):
      continue
    for name in sorted(os.listdir(folder)):
      path = os.path.join(folder, name)
      if name.endswith(('.mp4', '.gif')):
        lines.append(f'- video of the policy: [{name}]({path})')
      elif name.endswith('.png'):
        lines.append(f'- world-model open-loop prediction: ![{name}]({path})')
  return ('\n\nWatching (experiments/tools/watch.py):\n' + '\n'.join(lines)) if lines else ''


def main(argv=None) -> int:
  parser = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
  parser.add_argument('--logdir', nargs='+', action='extend', required=True,
                      help='run directories holding scores.jsonl (several allowed)')
  parser.add_argument('--out', default=None,
                      help=f'PNG path (default: <first logdir>/{REPORT_FILE})')
  parser.add_argument('--anchors', default=ANCHOR_FILE, help='official curves file')
  parser.add_argument('--binsize', type=float, default=BINSIZE,
                      help='widest curve bin in env steps (default 10000; '
                      'a run shorter than 250K gets bins of 1/25 of it)')
  parser.add_argument('--xmax', type=float, default=None,
                      help='x-axis limit in env steps (default: our last step)')
  parser.add_argument('--last', type=int, default=LAST_N,
                      help='episodes per run in the table mean (default 5)')
  args = parser.parse_args(argv)
  out = args.out
  if out is None:
    first = args.logdir[0]
    out = os.path.join(first if os.path.isdir(first) else os.path.dirname(first) or '.',
                       REPORT_FILE)
  try:
    table = make_report(args.logdir, out, args.anchors, args.binsize, args.xmax,
                        args.last)
  except (FileNotFoundError, ValueError) as e:
    print(f'error: {e}', file=sys.stderr)
    return 2
  print(table)
  print(f'\nwrote {out}')
  return 0


if __name__ == '__main__':
  sys.exit(main())
