"""How many XLA ops one learner update executes: per scan body x trip count.

  python bench/hlo_ops.py --size=size12m

Counts the instructions of the compiled (optimised) update's HLO, on this
backend: each while loop's body (with its known trip count) and the ops
outside the loops, leaving out parameters, tuples, get-tuple-element,
bitcasts and constants. On an accelerator each counted op is about one
kernel launch, so ops x per-launch latency bounds the update from below
when the kernels are small (the 25 ms H200 size12m update).
Loops inside other computations are listed but not added to the total.
"""

from __future__ import annotations

import re

from absl import app, flags

import agent  # noqa: F401  (jax compat first)
import jax

from agent import config as config_lib
from bench import common

FLAGS = flags.FLAGS
flags.DEFINE_string('size', 'size1m', 'Size preset.')

_FREE = ('parameter', 'get-tuple-element', 'tuple', 'bitcast', 'constant')


def _ops(lines):
  out = 0
  for line in lines:
    m = re.search(r'= \S+ ([\w-]+)\(', line)
    if m and m.group(1) not in _FREE:
      out += 1
  return out


def main(_):
  c = config_lib.make_config(size=FLAGS.size)
  text = common.update_hlo(c)
  comps, entry = common.computations(text)
  total = _ops(comps[entry])
  print(f'size={c.size} backend={jax.default_backend()} ops outside the loops: {total}')
  for name, lines in comps.items():
    for line in lines:
      if ' while(' not in line:
        continue
      body = re.search(r'body=%([^,\s]+)', line).group(1)
      trip = re.search(r'"known_trip_count":\{"n":"(\d+)"', line)
      n, ops = (int(trip.group(1)) if trip else 1), _ops(comps[body])
      if name == entry:
        total += n * ops
      print(f'  loop in {name[:24]:24s} trips={n:4d} body ops={ops:4d} -> {n * ops:6d}')
  print(f'ops per update (entry + top-level loops): {total}')


if __name__ == '__main__':
  app.run(main)
