"""Side-by-side pairs: this project's learner update against the official one.

  python bench/pairs.py --official_python=/tmp/official/venv/bin/python \
      --src=/tmp/official/src --size=size1m --pairs=5

Runs `bench/learner.py` (this interpreter) and `bench/official.py` (the
official implementation's own venv, setup in that file's docstring) as
separate processes, alternating in an ABBA order (ours, theirs, theirs, ours,
...) so that drift in the host's speed hits both alike. Each process reports
its median seconds per update; a pair is one run of each, next to each
other. Prints every pair's ratio (official / ours) and the median and mean
over the pairs: on a shared host one process can run 10-20 % slower than the
next, so a single pair is not a measurement (bench/results/
learner_cpu_2core.txt).
"""

from __future__ import annotations

import os
import re
import statistics
import subprocess
import sys

from absl import app, flags

FLAGS = flags.FLAGS
flags.DEFINE_string('official_python', None, "The official venv's python.")
flags.DEFINE_string('src', None, 'Checkout of danijar/dreamerv3 (bench/official.py --src).')
flags.DEFINE_string('size', 'size1m', 'Size preset (both sides).')
flags.DEFINE_integer('pairs', 5, 'Pairs to run.')
flags.DEFINE_integer('updates', None, 'Timed updates per process (default 15 for '
                     'size1m, 6 otherwise).')
flags.DEFINE_bool('image', False, "Both sides on one 64x64x3 uint8 'image' "
                  'observation (the CNN, spec 2.10).')
flags.mark_flags_as_required(['official_python', 'src'])
flags.register_validator('pairs', lambda n: n >= 1, message='--pairs must be >= 1')

HERE = os.path.dirname(os.path.abspath(__file__))
_MEDIAN = re.compile(r'update_s_median=([0-9.]+)')


def _time(cmd) -> float:
  out = subprocess.run(cmd, capture_output=True, text=True, check=False)
  found = _MEDIAN.findall(out.stdout + out.stderr)
  if out.returncode or not found:
    raise RuntimeError(f'{cmd[1]} failed (rc {out.returncode}):\n'
                       f'{(out.stdout + out.stderr)[-2000:]}')
  return float(found[-1])


def main(argv):
  del argv
  updates = FLAGS.updates or (15 if FLAGS.size == 'size1m' else 6)
  ours = [sys.executable, os.path.join(HERE, 'learner.py'), f'--size={FLAGS.size}',
          f'--updates={updates}', f'--image={FLAGS.image}'] + (
              [] if FLAGS.size == 'size1m' else ['--warmup=1'])
  theirs = [FLAGS.official_python, os.path.join(HERE, 'official.py'),
            f'--src={FLAGS.src}', f'--size={FLAGS.size}', f'--updates={updates}',
            f'--image={int(FLAGS.image)}']
  ratios = []
  for i in range(FLAGS.pairs):
    if i % 2 == 0:
      o, f = _time(ours), _time(theirs)
    else:
      f, o = _time(theirs), _time(ours)
    ratios.append(f / o)
    print(f'pair {i + 1}: ours {o:.3f} s | official {f:.3f} s -> {f / o:.2f}x', flush=True)
  print(f'size={FLAGS.size} pairs={len(ratios)} ratio median={statistics.median(ratios):.2f}x '
        f'mean={statistics.mean(ratios):.2f}x min={min(ratios):.2f}x max={max(ratios):.2f}x')


if __name__ == '__main__':
  app.run(main)
