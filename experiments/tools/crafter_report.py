"""Crafter's report: the success rate of each achievement and the Crafter score.

Input: the 'achievements' of each line of ``<logdir>/scores.jsonl`` (how
often each of the 22 achievements was done in that episode, written by the
Crafter env's ``episode_stats``; ``experiments/envs/crafter.py``).

Definitions (Hafner 2021, "Benchmarking the Spectrum of Agent
Capabilities", ICLR 2022; the score is its "geometric mean with an
offset of 1 %", as the crafter repository's analysis code computes it):

* the success rate s_i of achievement i is the percentage of a run's
  episodes in which it was unlocked at least once (all training episodes of
  the run's budget, as the paper's 1M-step protocol counts them);
* the Crafter score is S = exp((1/N) sum_i ln(1 + s_i)) - 1 over the N = 22
  success rates in percent (a geometric mean, offset by 1 so that a rate of
  0 counts), also in percent.

A run is (logdir, seed), as in ``experiments/tools/report.py``; the table
gives each run's score and their mean, the bars the success rates averaged
over the runs (the paper's Figure 5 style, on a log scale).
"""

from __future__ import annotations

import collections
import json
import math
import os
from typing import Dict, List, Mapping, Sequence, Tuple, Union

import numpy as np

from experiments.run.rundir import SCORES_FILE

# The Crafter paper's number of achievements (the score's N).
NUM_ACHIEVEMENTS = 22
BARS_FILE = 'report_crafter.png'

PathLike = Union[str, os.PathLike]
Counts = Mapping[str, int]


def read_achievements(logdir: PathLike) -> Dict[int, List[Dict[str, int]]]:
  """{seed: [achievement counts of each episode, in file order]} from the
  lines of ``logdir``'s training scores file that carry 'achievements' ({}
  when none does); ValueError naming the file and line for a malformed one."""
  path = os.fspath(logdir)
  if os.path.isdir(path):
    path = os.path.join(path, SCORES_FILE)
  out = collections.defaultdict(list)
  if not os.path.isfile(path):
    return {}
  with open(path) as f:
    for lineno, line in enumerate(f, 1):
      if not line.strip():
        continue
      try:
        rec = json.loads(line)
      except json.JSONDecodeError as e:
        raise ValueError(f'{path}:{lineno}: not valid JSON ({e.msg})') from e
      counts = rec.get('achievements') if isinstance(rec, dict) else None
      if counts is None:
        continue
      if not isinstance(counts, dict) or not all(
          isinstance(v, int) and v >= 0 for v in counts.values()):
        raise ValueError(f'{path}:{lineno}: achievements must map names to '
                         f'counts >= 0, got {counts!r}')
      out[int(rec.get('seed', 0))].append(dict(counts))
  return dict(out)


def success_rates(episodes: Sequence[Counts]) -> Dict[str, float]:
  """{achievement: percent of ``episodes`` that unlocked it (count >= 1)}.

  Every episode must name the same ``NUM_ACHIEVEMENTS`` achievements (the
  env writes all of them, 0 for those never done)."""
  if not episodes:
    raise ValueError('no episode with achievements: success rates need at '
                     'least one finished Crafter episode')
  names = sorted(episodes[0])
  if len(names) != NUM_ACHIEVEMENTS:
    raise ValueError(f'a Crafter episode has {NUM_ACHIEVEMENTS} achievements, '
                     f'this one names {len(names)}: {names}')
  for i, ep in enumerate(episodes):
    if sorted(ep) != names:
      raise ValueError(f'episode {i} names achievements {sorted(ep)}, episode '
                       f'0 names {names}')
  return {name: 100.0 * sum(ep[name] >= 1 for ep in episodes) / len(episodes)
          for name in names}


def crafter_score(rates: Mapping[str, float]) -> float:
  """The Crafter score (module doc) of ``NUM_ACHIEVEMENTS`` success rates in
  percent."""
  values = list(rates.values())
  if len(values) != NUM_ACHIEVEMENTS:
    raise ValueError(f'the Crafter score averages {NUM_ACHIEVEMENTS} success '
                     f'rates, got {len(values)}')
  if not all(0.0 <= v <= 100.0 for v in values):
    raise ValueError(f'success rates are percentages in [0, 100]: {values}')
  return math.exp(sum(math.log1p(v) for v in values) / len(values)) - 1.0


def runs_of(logdirs: Union[PathLike, Sequence[PathLike]]
            ) -> List[Tuple[str, int, Dict[str, float], int]]:
  """[(logdir, seed, success rates, episodes)] of every run with Crafter
  episodes."""
  if isinstance(logdirs, (str, os.PathLike)):
    logdirs = [logdirs]
  out = []
  for logdir in logdirs:
    for seed, episodes in sorted(read_achievements(logdir).items()):
      out.append((os.fspath(logdir), seed, success_rates(episodes),
                  len(episodes)))
  return out


def mean_rates(runs) -> Dict[str, float]:
  """The success rates averaged over runs."""
  names = sorted(runs[0][2])
  return {n: float(np.mean([rates[n] for _, _, rates, _ in runs])) for n in names}


def format_table(runs) -> str:
  """Markdown: each run's Crafter score and episodes, the mean score, then
  the mean success rate per achievement."""
  lines = ['| Crafter run | episodes | score (%) |', '|---|---:|---:|']
  scores = []
  for logdir, seed, rates, n in runs:
    scores.append(crafter_score(rates))
    lines.append(f'| {logdir} seed {seed} | {n} | {scores[-1]:.2f} |')
  lines.append(f'| mean over {len(runs)} run(s) | | {np.mean(scores):.2f} |')
  lines += ['', '| achievement | success rate (%) |', '|---|---:|']
  lines += [f'| {name} | {rate:.1f} |' for name, rate in mean_rates(runs).items()]
  return '\n'.join(lines)


def plot_bars(runs, out_png: PathLike) -> None:
  """The success-rate bars (mean over runs, log scale as in the paper)."""
  import matplotlib
  matplotlib.use('Agg')
  import matplotlib.pyplot as plt
  rates = mean_rates(runs)
  score = float(np.mean([crafter_score(r) for _, _, r, _ in runs]))
  fig, ax = plt.subplots(figsize=(10, 4))
  names = list(rates)
  # log(1 + s): the score's own scale, and a rate of 0 stays drawable.
  ax.bar(range(len(names)), [1.0 + rates[n] for n in names], color='tab:blue')
  ax.set_yscale('log')
  ax.set_ylim(1.0, 101.0 * 1.2)
  ax.set_yticks([1, 2, 11, 101])
  ax.set_yticklabels(['0', '1', '10', '100'])
  ax.set_ylabel('success rate (%)')
  ax.set_xticks(range(len(names)))
  ax.set_xticklabels([n.replace('_', ' ') for n in names], rotation=60,
                     ha='right', fontsize=8)
  ax.set_title(f'Crafter: {len(runs)} run(s), score {score:.2f} %')
  fig.tight_layout()
  os.makedirs(os.path.dirname(os.path.abspath(out_png)), exist_ok=True)
  fig.savefig(out_png, dpi=110)
  plt.close(fig)


def section(logdirs: Union[PathLike, Sequence[PathLike]],
            report_png: PathLike) -> str:
  """The report's Crafter part: '' when no run has Crafter episodes; else
  the table, after writing the bars beside ``report_png``."""
  runs = runs_of(logdirs)
  if not runs:
    return ''
  out = bars_path(report_png)
  plot_bars(runs, out)
  return f'\n\n{format_table(runs)}\n\nAchievement bars: ![{BARS_FILE}]({out})'


def bars_path(report_png: PathLike) -> str:
  """Where ``section`` writes the bars for a report at ``report_png``."""
  return os.path.join(os.path.dirname(os.path.abspath(report_png)), BARS_FILE)
