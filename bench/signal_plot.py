"""The learning-signal comparison across seeds: our runs, the random policy
and (where run) the official code at the same reduced budget, on one plot
and in one table.

  python bench/signal_plot.py --out crafter_signal.png --window 20000 --end 60000 \\
      --group ours bench/results/crafter/signal/scores_s{0,1}.jsonl \\
      --group random bench/results/crafter/signal/random_scores_s{0,1,2}.jsonl \\
      --group 'official code' bench/results/crafter/signal/official_scores_s0.jsonl

Each file is a scores JSONL with one line per finished episode: ours
(``experiments/tools/report.py``'s input, ``env_step`` and ``score``) or the
official logger's (``step`` and ``episode/score``, what
``bench/official_signal.py`` keeps). The plot shows
each run's binned episode scores (thin) and each group's mean over its runs
(thick). The table gives, per run, the episodes that ended in the last
``--window`` env steps of that run, their mean score and, for Crafter lines
(an ``achievements`` field), the Crafter score of those episodes; then each
group's mean and range over its runs. report.py compares runs of one kind
with the official curves; this puts several kinds of run side by side at a
budget the official curves do not cover, which report.py has no input for.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np

if __package__ in (None, ''):
  sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from experiments.tools import crafter_report  # noqa: E402
from experiments.tools.curves import binned, mean_curve, Run  # noqa: E402

COLORS = ('tab:blue', 'tab:gray', 'tab:orange', 'tab:green', 'tab:red')


def read(path: str) -> Tuple[np.ndarray, np.ndarray, List[Tuple[float, dict]]]:
  """(env steps, scores, [(env step, achievements)]) of the episodes in
  ``path``, sorted by env step; ValueError naming the line it cannot read."""
  rows, counts = [], []
  with open(path) as f:
    for lineno, line in enumerate(f, 1):
      if not line.strip():
        continue
      rec = json.loads(line)
      if 'env_step' in rec and 'score' in rec:
        step, score = float(rec['env_step']), float(rec['score'])
      elif 'step' in rec and 'episode/score' in rec:
        step, score = float(rec['step']), float(rec['episode/score'])
      else:
        raise ValueError(f'{path}:{lineno}: neither env_step/score nor '
                         f'step/episode/score: {sorted(rec)}')
      rows.append((step, score))
      if 'achievements' in rec:
        counts.append((step, rec['achievements']))
  if not rows:
    raise ValueError(f'{path} holds no episode')
  arr = np.asarray(sorted(rows))
  return arr[:, 0], arr[:, 1], counts


def window_of(path: str, window: float, end: Optional[float] = None
              ) -> Tuple[int, float, Optional[float]]:
  """(episodes, mean score, Crafter score or None) over the episodes that
  ended in the last ``window`` env steps before ``end`` (the run's budget;
  None: its last episode) of the run in ``path``."""
  steps, scores, counts = read(path)
  start = (steps.max() if end is None else end) - window
  keep = steps >= start
  last = [c for step, c in counts if step >= start]
  crafter = (crafter_report.crafter_score(crafter_report.success_rates(last))
             if last else None)
  return int(keep.sum()), float(scores[keep].mean()), crafter


def table(groups: Dict[str, List[str]], window: float,
          end: Optional[float] = None) -> str:
  """Markdown: one row per run, then one per group (mean and range)."""
  lines = [f'| group | run | episodes in the last {window:,.0f} env steps | '
           'mean score | Crafter score (%) |', '|---|---|---:|---:|---:|']
  summary = []
  for name, paths in groups.items():
    means, crafters = [], []
    for path in paths:
      n, mean, crafter = window_of(path, window, end)
      means.append(mean)
      if crafter is not None:
        crafters.append(crafter)
      cell = f'{crafter:.2f}' if crafter is not None else ''
      lines.append(f'| {name} | {os.path.basename(path)} | {n} | {mean:.2f} | {cell} |')
    cell = (f'{np.mean(crafters):.2f} ({min(crafters):.2f}-{max(crafters):.2f})'
            if crafters else '')
    summary.append(f'| **{name}**, {len(paths)} run(s) | mean (range) | | '
                   f'{np.mean(means):.2f} ({min(means):.2f}-{max(means):.2f}) | {cell} |')
  return '\n'.join(lines + summary)


def plot(groups: Dict[str, List[str]], out: str, title: str, bins: int) -> None:
  """Each run binned (thin) and each group's mean (thick), vs env steps."""
  import matplotlib
  matplotlib.use('Agg')
  import matplotlib.pyplot as plt
  fig, ax = plt.subplots(figsize=(6.4, 3.8))
  for color, (name, paths) in zip(COLORS, groups.items()):
    runs = [Run(name, path, 0, *read(path)[:2]) for path in paths]
    binsize = max(r.steps[-1] for r in runs) / bins
    for r in runs:
      ax.plot(*binned(r.steps, r.scores, binsize), color=color, lw=0.7, alpha=0.4)
    ax.plot(*mean_curve(runs, binsize), color=color, lw=2.2,
            label=f'{name} (mean of {len(runs)})')
  ax.set_xlabel('env steps')
  ax.set_ylabel('episode score')
  ax.set_title(title, fontsize=10)
  ax.grid(alpha=0.3, lw=0.5)
  ax.legend(fontsize=8, frameon=False)
  fig.tight_layout()
  fig.savefig(out, dpi=110)
  plt.close(fig)


def main(argv: Optional[Sequence[str]] = None) -> int:
  parser = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
  parser.add_argument('--group', nargs='+', action='append', required=True,
                      metavar=('NAME', 'SCORES'),
                      help='a group name, then its runs\' scores JSONL files')
  parser.add_argument('--out', required=True, help='PNG path')
  parser.add_argument('--title', default='')
  parser.add_argument('--window', type=float, default=20000,
                      help='the table\'s last env steps per run (default 20000)')
  parser.add_argument('--end', type=float, default=None,
                      help='the runs\' budget in env steps; the window ends '
                      'there (default: each run\'s last episode)')
  parser.add_argument('--bins', type=int, default=12, help='curve bins per run')
  args = parser.parse_args(argv)
  groups = {}
  for name, *paths in args.group:
    if not paths:
      parser.error(f'--group {name} names no scores file')
    groups[name] = paths
  plot(groups, args.out, args.title, args.bins)
  print(table(groups, args.window, args.end))
  print(f'\nwrote {args.out}')
  return 0


if __name__ == '__main__':
  sys.exit(main())
