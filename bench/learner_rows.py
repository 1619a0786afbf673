"""Our run's learner rows as a markdown table: how the policy, the world
model and the advantages moved through a run, the table each signal seed's
write-up carries (bench/results/*/signal/seed*.md, docs/atari.md and
docs/crafter.md "Learning signal").

  python bench/learner_rows.py --logdir runs/atari_boxing_signal/0 [--every 10000]

It reads DIR/metrics.jsonl, the run's own log (``kind: train`` rows, one per
``--log_every`` env steps, each a mean over that stretch), and prints per row:
env steps, updates, the policy entropy (spec 3.4; ln |A| is the uniform
policy), the reconstruction loss (the sum of the ``loss/rec_*`` terms, spec
2.9), the reward loss, the imagined reward mean, the advantage magnitude,
the return normaliser's 5 / 95 % percentiles (spec 3.6) and the wall time.
``bench/official_signal.py table`` prints the same columns for the official
side; this reads our log, whose names and layout differ.

Stdlib only.
"""

from __future__ import annotations

import argparse
import json
import os
from typing import List, Optional, Sequence

HEADER = ('| env steps | updates | policy entropy | rec loss | reward loss '
          '| imag reward | adv_mag | ret [lo, hi] | wall (min) |\n'
          '|---:|---:|---:|---:|---:|---:|---:|---|---:|')
NEEDED = ('env_step', 'updates', 'wall_time', 'train/policy_entropy',
          'train/loss/rew', 'train/imag_reward_mean', 'train/adv_mag',
          'train/ret_lo', 'train/ret_hi')


def read_rows(path: str) -> List[dict]:
  """The ``kind: train`` rows of a metrics.jsonl that hold learner means
  (rows logged before the first update have none); SystemExit naming the
  file or line it cannot use."""
  if not os.path.isfile(path):
    raise SystemExit(f'{path}: no such file (a run writes metrics.jsonl in its --logdir)')
  rows = []
  with open(path) as f:
    for lineno, line in enumerate(f, 1):
      if not line.strip():
        continue
      try:
        rec = json.loads(line)
      except json.JSONDecodeError as e:
        raise SystemExit(f'{path}:{lineno}: not JSON ({e.msg})') from None
      if rec.get('kind') != 'train' or rec.get('train/policy_entropy') is None:
        continue
      missing = [k for k in NEEDED if rec.get(k) is None]
      if missing:
        raise SystemExit(f'{path}:{lineno}: a train row without {missing}')
      rows.append(rec)
  return rows


def format_row(rec: dict) -> str:
  rec_loss = sum(v for k, v in rec.items() if k.startswith('train/loss/rec_'))
  return (f'| {rec["env_step"] / 1000:g}K | {rec["updates"]:,} '
          f'| {rec["train/policy_entropy"]:.3f} | {rec_loss:.0f} '
          f'| {rec["train/loss/rew"]:.2f} | {rec["train/imag_reward_mean"]:+.4f} '
          f'| {rec["train/adv_mag"]:.3f} '
          f'| [{rec["train/ret_lo"]:.2f}, {rec["train/ret_hi"]:.2f}] '
          f'| {rec["wall_time"] / 60:.1f} |')


def table(rows: Sequence[dict], every: int = 0) -> str:
  """The markdown table; with ``every``, only rows at multiples of it."""
  kept = [r for r in rows if not every or r['env_step'] % every == 0]
  return '\n'.join([HEADER, *map(format_row, kept)])


def main(argv: Optional[Sequence[str]] = None) -> str:
  p = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  p.add_argument('--logdir', required=True)
  p.add_argument('--every', type=int, default=0,
                 help='keep only rows at multiples of this many env steps')
  args = p.parse_args(argv)
  if args.every < 0:
    p.error(f'--every={args.every}: give 0 (all rows) or a positive step count')
  out = table(read_rows(os.path.join(args.logdir, 'metrics.jsonl')), args.every)
  print(out)
  return out


if __name__ == '__main__':
  main()
