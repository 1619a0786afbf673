"""Human-normalised Atari scores: the Atari 100K report table (spec 7.6).

  hns = (score - random) / (human - random)

per game, with the random and human scores of
``experiments/data/atari_human_random.json`` (its "source" field cites the
published tables). ``hns_table`` turns the report's rows (our last-N mean
per game at its mean last env step) and the official curves (DreamerV3 and
PPO, ``experiments/data/atari100k-*.json.gz``, read at the anchor step
nearest ours) into a markdown table with the mean and median over the games
of the run, the benchmark's two summary numbers.

This module reads only its data file: ``experiments/tools/report.py`` calls
it with what it has loaded (no import back, so no cycle).
"""

from __future__ import annotations

import json
import os
from typing import Dict, Mapping, Optional, Sequence, Tuple

import numpy as np

DATA_FILE = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(
    __file__))), 'data', 'atari_human_random.json')


def reference_scores(path: str = DATA_FILE) -> Dict[str, Tuple[float, float]]:
  """{game: (random, human)} in the report's task spelling ('ms_pacman')."""
  with open(path) as f:
    games = json.load(f)['games']
  return {game: (float(v['random']), float(v['human']))
          for game, v in games.items()}


def is_atari_task(task: str, reference: Optional[Mapping] = None) -> bool:
  return task in (reference if reference is not None else reference_scores())


def normalised(game: str, score: float,
               reference: Optional[Mapping] = None) -> float:
  """The human-normalised score of ``score`` in ``game`` (ValueError for a
  game without published random / human scores)."""
  reference = reference if reference is not None else reference_scores()
  if game not in reference:
    raise ValueError(f'no random / human score for Atari game {game!r}; '
                     f'{DATA_FILE} has: {", ".join(sorted(reference))}')
  random, human = reference[game]
  return (float(score) - random) / (human - random)


def _cell(value: Optional[float]) -> str:
  return '-' if value is None else f'{value:.3f}'


def hns_table(rows: Sequence, anchors: Mapping[str, Mapping],
              reference: Optional[Mapping] = None) -> str:
  """Markdown: per game our raw and human-normalised last-N mean, then each
  official method's HNS at the anchor step nearest ours; a mean and a
  median row over the games. ``rows`` have ``task``, ``step`` and ``ours``
  (``report.Row``); ``anchors`` is {method: {task: report.Anchor}}. Games
  without reference scores are left out and named below the table."""
  reference = reference if reference is not None else reference_scores()
  methods = list(anchors)
  kept = [row for row in rows if row.task in reference]
  if not kept:
    return ''
  head = ['game', 'env steps', 'ours', 'ours HNS'] + [f'{m} HNS' for m in methods]
  lines = ['| ' + ' | '.join(head) + ' |',
           '|' + '---|' * len(head)]
  columns = {name: [] for name in ['ours'] + methods}
  for row in kept:
    ours = normalised(row.task, row.ours, reference)
    columns['ours'].append(ours)
    cells = [row.task, f'{row.step:,.0f}', f'{row.ours:.1f}', _cell(ours)]
    for method in methods:
      anchor = anchors[method].get(row.task)
      value = (normalised(row.task, anchor.at(row.step)[1], reference)
               if anchor is not None else None)
      columns[method].append(value)
      cells.append(_cell(value))
    lines.append('| ' + ' | '.join(cells) + ' |')
  for name, fn in (('mean', np.mean), ('median', np.median)):
    cells = [f'**{name}** ({len(kept)} games)', '', '']
    for column in ['ours'] + methods:
      values = [v for v in columns[column] if v is not None]
      cells.append(_cell(float(fn(values))) if values else '-')
    lines.append('| ' + ' | '.join(cells) + ' |')
  left_out = sorted({row.task for row in rows} - {row.task for row in kept})
  text = ('\n\nHuman-normalised scores, (score - random) / (human - random) '
          f'({os.path.basename(DATA_FILE)}); official methods at the anchor '
          'step nearest ours:\n\n' + '\n'.join(lines))
  if left_out:
    text += f'\n\nNo random / human score for: {", ".join(left_out)}.'
  return text
