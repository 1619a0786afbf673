"""Learner update benchmark (issue: spec-exact, fast learner).

Prints, for one size and dtype: compile seconds, median seconds per update over
>= 10 updates after warm-up, FLOPs per update (XLA cost analysis), achieved
GFLOP/s, this machine's measured f32 matmul GFLOP/s, peak memory, and the number
of compilations (must be 1) and minor page faults per update (agent/memory.py).

  python bench/learner.py --size=size12m --dtype=float32 --updates=10
  XLA_FLAGS=--xla_force_host_platform_device_count=2 \
      python bench/learner.py --size=size1m --devices=2   # data-parallel

With --devices=N the update runs data-parallel over N devices
(agent/parallel.py); it also prints the bytes the update's collectives
(the gradient all-reduce and the batch statistics) move per update, from the
compiled HLO.
"""

from __future__ import annotations

import resource
import statistics
import time

from absl import app, flags

import agent  # noqa: F401  (jax compat first)
import jax

from agent import config as config_lib
from agent import learning, memory, networks, synthetic
from agent.parallel import LearnerPlacement
from bench import common

FLAGS = flags.FLAGS
flags.DEFINE_string('size', 'size1m', 'Size preset.')
flags.DEFINE_enum('dtype', 'float32', ['float32', 'bfloat16'], 'Compute dtype.')
flags.DEFINE_integer('updates', 10, 'Timed updates after warm-up.')
flags.DEFINE_integer('warmup', 2, 'Untimed updates after compilation.')
flags.DEFINE_integer('devices', 1, 'Learner devices (data-parallel update).')
flags.DEFINE_bool('image', False, 'DMC-vision observations: one 64x64x3 uint8 '
                  "'image' (the CNN of spec 2.10) instead of the walker vectors.")


def count_flops(spaces, config, state, batch) -> float:
  """FLOPs of one update from XLA's cost analysis of the HLO with every scan
  unrolled (the analysis counts a while-loop body once, so the rolled program
  would under-count the 64-step observe and 15-step imagine scans)."""
  unrolled = learning.make_train_step(
      networks.make_networks(spaces, config.replace(scan_unroll=0)))
  cost = unrolled.update.lower(state, batch).cost_analysis()
  cost = cost[0] if isinstance(cost, (list, tuple)) else cost
  return float(cost.get('flops', float('nan'))) if cost else float('nan')


def main(_):
  c = config_lib.make_config(size=FLAGS.size, compute_dtype=FLAGS.dtype)
  spaces = synthetic.IMAGE_SPACES if FLAGS.image else synthetic.WALKER_SPACES
  nets = networks.make_networks(spaces, c)
  placement = LearnerPlacement(FLAGS.devices)
  ts = learning.make_train_step(nets, placement=placement)
  state = placement.put_state(ts.init(jax.random.PRNGKey(0)))
  batch = synthetic.make_batch(spaces, c)
  batch = (placement.put_batch(batch) if placement.sharded
           else jax.device_put(batch))
  print(f'size={c.size} dtype={c.compute_dtype} params={networks.count_params(state.params):,} '
        f'B={c.batch_size} T={c.batch_length} H={c.imag_horizon} devices={jax.devices()}')

  t0 = time.perf_counter()
  lowered = ts.update.lower(state, batch)
  compiled = lowered.compile()
  compile_s = time.perf_counter() - t0
  flops = (count_flops(spaces, c, state, batch) if not placement.sharded
           else float('nan'))          # cost analysis is per-device there
  collectives = common.collective_bytes(compiled.as_text())

  for _ in range(FLAGS.warmup):
    state, metrics, outs = ts.update(state, batch)
  jax.block_until_ready(state)
  times = []
  faults0 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
  for _ in range(FLAGS.updates):
    t = time.perf_counter()
    state, metrics, outs = ts.update(state, batch)
    jax.block_until_ready((state, metrics, outs))
    times.append(time.perf_counter() - t)
  faults = (resource.getrusage(resource.RUSAGE_SELF).ru_minflt - faults0) / len(times)
  med = statistics.median(times)
  peak_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
  mm = common.matmul_gflops()
  print(f'compile_s={compile_s:.1f}')
  if placement.sharded:
    print(f'collectives_per_update={collectives}')
  print(f'update_s_median={med:.3f} (min {min(times):.3f}, max {max(times):.3f}, n={len(times)})')
  print(f'flops_per_update={flops / 1e9:.1f} GFLOP (XLA cost analysis, scans unrolled)')
  print(f'achieved_gflops={flops / med / 1e9:.1f}  matmul_peak_gflops={mm:.1f}  '
        f'fraction_of_peak={flops / med / 1e9 / mm:.2f}')
  print(f'peak_rss_mb={peak_mb:.0f}  minor_page_faults_per_update={faults:.0f} '
        f'(malloc tuned: {memory._applied}, agent/memory.py)')
  print(f'compilations={ts.update._cache_size()}  loss={float(metrics["loss/total"]):.3f}')


if __name__ == '__main__':
  app.run(main)
