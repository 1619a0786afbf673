"""In-process A/B of learner-update variants (DreamerConfig overrides).

Compiles every variant once in the same process, then times them in
interleaved rounds (A B C A B C ...) so machine-load drift hits all variants
alike, and prints each variant's median seconds per update, its ratio to the
first variant and its compile time. Each variant is compiled once, ahead of time.

  python bench/ab.py --size=size1m --variants=scan_unroll=1,scan_unroll=2 --rounds=10

A variant is ``name=value[;name=value]`` of DreamerConfig fields ('base' = no
override). Names starting with ``xla_`` are XLA compiler options for that
variant's executable only (e.g. ``xla_cpu_prefer_vector_width=512``), so
compiler flags get an in-process A/B too.
"""

from __future__ import annotations

import ast
import statistics
import time

from absl import app, flags

import agent  # noqa: F401  (jax compat first)
import jax

from agent import config as config_lib
from agent import learning, networks, synthetic

FLAGS = flags.FLAGS
flags.DEFINE_string('size', 'size1m', 'Size preset.')
flags.DEFINE_list('variants', ['base'], 'Variants: name=value[;name=value] or base.')
flags.DEFINE_integer('rounds', 10, 'Interleaved timed rounds.')
flags.DEFINE_integer('per_round', 1, 'Updates per variant per round.')


def _parse(variant: str):
  """-> (DreamerConfig overrides, XLA compiler options)."""
  if variant == 'base':
    return {}, {}
  out, xla = {}, {}
  for part in variant.split(';'):
    name, raw = part.split('=', 1)
    if name.startswith('xla_'):
      xla[name] = raw
      continue
    try:
      out[name] = ast.literal_eval(raw)
    except (ValueError, SyntaxError):
      out[name] = raw
  return out, xla


def main(_):
  spaces = synthetic.WALKER_SPACES
  runs = []
  for variant in FLAGS.variants:
    overrides, xla = _parse(variant)
    c = config_lib.make_config(size=FLAGS.size, **overrides)
    ts = learning.make_train_step(networks.make_networks(spaces, c))
    state = ts.init(jax.random.PRNGKey(0))
    batch = jax.device_put(synthetic.make_batch(spaces, c))
    t0 = time.perf_counter()
    update = ts.update.lower(state, batch).compile(compiler_options=xla or None)
    state, metrics, _ = update(state, batch)
    jax.block_until_ready(state)
    compile_s = time.perf_counter() - t0
    state, metrics, _ = update(state, batch)          # warm-up
    jax.block_until_ready(state)
    runs.append({'name': variant, 'update': update, 'state': state, 'batch': batch,
                 'compile_s': compile_s, 'times': [],
                 'loss': float(metrics['loss/total'])})
  for _ in range(FLAGS.rounds):
    for r in runs:
      for _ in range(FLAGS.per_round):
        t = time.perf_counter()
        r['state'], metrics, outs = r['update'](r['state'], r['batch'])
        jax.block_until_ready((r['state'], metrics, outs))
        r['times'].append(time.perf_counter() - t)
  base = statistics.median(runs[0]['times'])
  print(f'size={FLAGS.size} rounds={FLAGS.rounds} x {FLAGS.per_round}')
  for r in runs:
    med = statistics.median(r['times'])
    print(f'{r["name"]:40s} median={med:.4f}s min={min(r["times"]):.4f}s '
          f'ratio_to_first={med / base:.3f} compile_s={r["compile_s"]:.1f} '
          f'loss={r["loss"]:.4f}')


if __name__ == '__main__':
  app.run(main)
