"""What the update's matrix products alone cost: a floor under the update time.

  python bench/dot_ceiling.py --size=size12m

Reads every dot of the compiled (optimised) update's HLO, rolled as it runs:
its operand shapes and physical layouts, its contracting and batch dims, and
how many times it executes per update (the trip counts of the while loops it
sits in). Times each distinct dot standalone, on operands laid out as in the
program, and sums time x executions. That sum is what the update would take
if everything but the products were free and each product ran as fast as it
does alone, with the data hot. Against it, the fraction of the measured f32
matmul peak an update can reach at best is flops / (that sum) / peak.

Reported apart: matrix products (both sides wider than one row / column) and
the matrix-vector products (the row sums and GEMV-style reductions that
XLA:CPU emits as dots), and the products by part (scans, the rest). The goal
of 80 % of the peak at size12m: this tool says whether the products
themselves allow it on this backend.
"""

from __future__ import annotations

import collections
import functools
import re
import statistics
import time

from absl import app, flags

import agent  # noqa: F401  (jax compat first)
import jax
import jax.numpy as jnp
import numpy as np

from agent import config as config_lib
from bench import common

FLAGS = flags.FLAGS
flags.DEFINE_string('size', 'size1m', 'Size preset.')
flags.DEFINE_float('seconds', 0.03, 'Length of one timing of a distinct dot (back-to-back runs).')
flags.DEFINE_integer('top', 25, 'Distinct dots to list, by total time.')

_SHAPE = re.compile(r'^(\w+)\[([\d,]*)\](?:\{([\d,]*)[^}]*\})?')
_INSTR = re.compile(r'^\s*(?:ROOT )?%(\S+) = (\S+) ([\w-]+)\((.*?)\)(.*)$')


def _shape(text: str):
  """'f32[16,256]{1,0}' -> (dims, minor_to_major)."""
  m = _SHAPE.match(text)
  dims = tuple(int(d) for d in m.group(2).split(',') if d)
  mtm = tuple(int(d) for d in m.group(3).split(',')) if m.group(3) else tuple(
      reversed(range(len(dims))))
  return dims, mtm


def _dims(meta: str, key: str):
  m = re.search(key + r'=\{([\d,]*)\}', meta)
  return tuple(int(d) for d in m.group(1).split(',') if d) if m else ()


def _executions(comps: dict, entry: str) -> dict:
  """Computation -> executions per update (while bodies x known trip count)."""
  calls = collections.defaultdict(list)        # caller -> [(callee, multiplier)]
  for name, lines in comps.items():
    for line in lines:
      trip = re.search(r'"known_trip_count":\{"n":"(\d+)"', line)
      n = int(trip.group(1)) if trip else 1
      for key, callee in re.findall(r'(body|condition|calls|to_apply)=%([^,\s}]+)', line):
        calls[name].append((callee, n if key in ('body', 'condition') else 1))
      for group in re.findall(r'branch_computations=\{([^}]*)\}', line):
        calls[name].extend((c.strip().lstrip('%'), 1) for c in group.split(','))
  count = collections.Counter()

  def visit(name, n):
    count[name] += n
    for callee, k in calls.get(name, ()):
      visit(callee, n * k)

  visit(entry, 1)
  return count


def _part(op_name: str) -> str:
  if 'jvp(jvp(while' in op_name or 'transpose(jvp(transpose(jvp(while' in op_name:
    return 'observe scan'
  if 'jvp(while' in op_name:
    return 'imagination'
  return 'outside the scans'


def collect_dots(text: str):
  """[(signature, executions, part, source)] for every dot in the HLO."""
  comps, entry = common.computations(text)
  runs = _executions(comps, entry)
  out = []
  for name, lines in comps.items():
    shapes = {}
    for line in lines:
      m = _INSTR.match(line)
      if m:
        shapes[m.group(1)] = m.group(2)
      p = re.match(r'^\s*%(\S+) = (\S+) parameter\(', line)
      if p:
        shapes[p.group(1)] = p.group(2)
    for line in lines:
      m = _INSTR.match(line)
      if not m or m.group(3) != 'dot' or runs[name] == 0:
        continue
      ops = [o.strip().lstrip('%') for o in m.group(4).split(',')]
      meta = m.group(5)
      lhs, rhs = _shape(shapes[ops[0]]), _shape(shapes[ops[1]])
      sig = (lhs, rhs, _dims(meta, 'lhs_contracting_dims'), _dims(meta, 'rhs_contracting_dims'),
             _dims(meta, 'lhs_batch_dims'), _dims(meta, 'rhs_batch_dims'))
      op = re.search(r'op_name="([^"]*)"', meta)
      src = re.search(r'source_file="(?:[^"]*/)?([^"/]*)" source_line=(\d+)', meta)
      out.append((sig, runs[name], _part(op.group(1) if op else ''),
                  f'{src.group(1)}:{src.group(2)}' if src else ''))
  return out


def _flops(sig) -> float:
  (ld, _), (rd, _), lc, rc, lb, rb = sig
  k = np.prod([ld[i] for i in lc]) if lc else 1
  b = np.prod([ld[i] for i in lb]) if lb else 1
  m = np.prod([ld[i] for i in range(len(ld)) if i not in lc and i not in lb])
  n = np.prod([rd[i] for i in range(len(rd)) if i not in rc and i not in rb])
  return 2.0 * b * m * n * k


def _is_matrix_product(sig) -> bool:
  (ld, _), (rd, _), lc, rc, lb, rb = sig
  m = np.prod([ld[i] for i in range(len(ld)) if i not in lc and i not in lb])
  n = np.prod([rd[i] for i in range(len(rd)) if i not in rc and i not in rb])
  return m > 1 and n > 1


def time_dot(sig, seconds: float) -> float:
  """Seconds of the dot alone, operands in the program's layouts.

  Products run back to back in one compiled loop (as many as fill about
  `seconds`), so a small dot's time is not one Python dispatch. Each takes one element of the previous
  product into its lhs (a one-element update in place), so XLA can neither
  hoist the product out of the loop nor overlap two of them.
  """
  (ld, lm), (rd, rm), lc, rc, lb, rb = sig

  def physical(dims, mtm, key):
    major = tuple(reversed(mtm))
    x = jax.random.normal(key, tuple(dims[i] for i in major), jnp.float32)
    return x, tuple(major.index(i) for i in range(len(dims)))

  (x, px), (y, py) = physical(ld, lm, jax.random.PRNGKey(0)), physical(rd, rm, jax.random.PRNGKey(1))
  first = (0,) * x.ndim

  @functools.partial(jax.jit, static_argnums=2)
  def f(x, y, reps):
    def body(_, x):
      out = jax.lax.dot_general(jnp.transpose(x, px), jnp.transpose(y, py),
                                ((lc, rc), (lb, rb)))
      return x.at[first].set(out.reshape(-1)[0] * 1e-30 + x[first])
    return jax.lax.fori_loop(0, reps, body, x)

  def run(reps):
    f(x, y, reps).block_until_ready()
    times = []
    for _ in range(3):
      t = time.perf_counter()
      f(x, y, reps).block_until_ready()
      times.append(time.perf_counter() - t)
    return min(times) / reps

  return run(max(5, min(2000, int(seconds / run(5)))))


def main(_):
  c = config_lib.make_config(size=FLAGS.size)
  text = common.update_hlo(c)
  dots = collect_dots(text)
  distinct = collections.defaultdict(lambda: [0, collections.Counter(), set()])
  for sig, n, part, src in dots:
    distinct[sig][0] += n
    distinct[sig][1][part] += n
    distinct[sig][2].add(src)
  rows = []
  for sig, (n, parts, srcs) in distinct.items():
    t = time_dot(sig, FLAGS.seconds)
    rows.append((t * n, t, n, sig, parts, sorted(srcs)))
  peak = statistics.median(common.matmul_gflops() for _ in range(3))
  total = sum(r[0] for r in rows)
  flops = sum(_flops(r[3]) * r[2] for r in rows)
  mat = [r for r in rows if _is_matrix_product(r[3])]
  print(f'size={c.size} dots in the HLO={len(dots)} distinct={len(rows)} '
        f'executions per update={sum(r[2] for r in rows)}  matmul peak={peak:.1f} GFLOP/s')
  print(f'{"ms/update":>9} {"runs":>5} {"GFLOP/s":>8}  lhs x rhs (contracting; batch)          source')
  for tot, t, n, sig, parts, srcs in sorted(rows, key=lambda r: -r[0])[:FLAGS.top]:
    (ld, lm), (rd, rm), lc, rc, lb, rb = sig
    print(f'{tot * 1e3:9.2f} {n:5d} {_flops(sig) / t / 1e9:8.1f}  '
          f'{list(ld)}{{{",".join(map(str, lm))}}} x {list(rd)}{{{",".join(map(str, rm))}}} '
          f'({list(lc)},{list(rc)}; {list(lb)},{list(rb)})  {",".join(srcs)[:40]}')
  by_part = collections.defaultdict(float)
  for tot, t, n, sig, parts, srcs in rows:
    for part, k in parts.items():
      by_part[part] += t * k
  print('\nproducts alone, by part (ms per update):')
  for part, ms in sorted(by_part.items()):
    print(f'  {part:20} {ms * 1e3:8.1f}')
  mat_t = sum(r[0] for r in mat)
  mat_f = sum(_flops(r[3]) * r[2] for r in mat)
  print(f'\nmatrix products: {mat_t:.3f} s, {mat_f / 1e9:.1f} GFLOP, {mat_f / mat_t / 1e9:.0f} GFLOP/s alone')
  print(f'all dots (with GEMV-style reductions): {total:.3f} s, {flops / 1e9:.1f} GFLOP')
  print(f'best case, everything but the dots free: {flops / total / 1e9:.0f} GFLOP/s = '
        f'{flops / total / 1e9 / peak:.2f} of the matmul peak')


if __name__ == '__main__':
  app.run(main)
