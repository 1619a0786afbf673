"""Reverb replay benchmark (spec 5.1, 5.3, 5.7-5.9).

Prints, at one size preset (default size12m, DMC walker-like obs: 24 floats,
6 actions):
  * insert throughput of WindowAdder.add_batch with 16 workers (steps/s),
  * sample + assemble throughput of ReplaySampler.sample_train, batches [16, 65]
    with latents and the LatentStore lookup/overlay (batches/s), the unpack
    (batch assembly) time alone, and the write-back time of one batch,
  * bytes per stored step: from the signature (the logical step layout of
    agent/types.py, 4,271 B at size12m with bf16 deter bits + uint8 stoch,
    spec 5.7) and the packed row width, and the REAL server memory per stored
    step, from the resident memory (VmRSS) of a separate server process: its
    growth per inserted step while filling, and its footprint per stored step
    once the table is at capacity and evicting (goal <= 5 KB at size12m),
  * the batch time as a fraction of a size12m learner update (~3.5 s target).

Step contents are drawn fresh for every step of a worker's stream within any
window (a pool of ``--pool`` >= seq_len + chunk_length distinct vector steps),
with realistic entropy (deter as bf16 bits of normals), so Reverb's chunk
compression is not flattered by repeated rows.

  python bench/replay.py --size=size12m --steps=400 --mem_steps=1000
"""

from __future__ import annotations

import statistics
import subprocess
import sys
import time

from absl import app, flags

import agent  # noqa: F401  (jax compat first)
import numpy as np

from agent import types
from agent.config import make_config
from reverb_tables.adder import DEFAULT_CHUNK_LENGTH, WindowAdder
from reverb_tables.latent_store import LatentStore
from reverb_tables.sampler import ReplaySampler
from reverb_tables.tables import (ONLINE_TABLE, UNIFORM_TABLE,
                                  make_replay_tables, make_server)

FLAGS = flags.FLAGS
flags.DEFINE_string('size', 'size12m', 'Size preset.')
flags.DEFINE_integer('workers', 16, 'Env workers (streams).')
flags.DEFINE_integer('steps', 400, 'Vector steps inserted (per worker) for the '
                     'throughput phase.')
flags.DEFINE_integer('batches', 50, 'Timed training batches.')
flags.DEFINE_integer('chunk_length', DEFAULT_CHUNK_LENGTH,
                     'WindowAdder chunk length.')
flags.DEFINE_integer('pool', 160, 'Distinct vector steps cycled through '
                     '(>= seq_len + chunk_length: no repeated rows in a chunk '
                     'or window).')
flags.DEFINE_integer('mem_steps', 1000, 'Vector steps per memory interval '
                     '(two intervals are measured); 0 skips the memory phase.')
flags.DEFINE_integer('mem_churn', 2, 'Intervals of --mem_steps inserted at '
                     'capacity (FIFO eviction) before the footprint is read.')
flags.DEFINE_float('learner_update_s', 3.5,
                   'Learner update time to compare with (size12m target).')
flags.DEFINE_bool('serve', False, 'Internal: run as the memory-phase server '
                  'process (prints its port, serves until stdin closes).')
flags.DEFINE_bool('image', False, 'Pixel steps: a 64x64x3 uint8 frame per '
                  'step (spec 2.10), real frames of --image_task (one episode '
                  'stream per worker under random actions; DMC renders with '
                  'MuJoCo EGL), instead of the walker vectors.')
flags.DEFINE_string('image_task', 'dmc:cartpole_swingup',
                    'SUITE:TASK whose frames --image stores: dmc:<task> '
                    '(vision), atari:<game> or crafter:reward (the run\'s own '
                    'env stack, experiments/envs/suites.make_env).')
flags.DEFINE_integer('serve_capacity', 0, 'Internal: replay_capacity of the '
                     'memory-phase server.')

VECTOR_SPACES = types.EnvSpaces(
    obs={'orientations': (14,), 'height': (), 'velocity': (9,)}, act_dim=6)
IMAGE_SPACES = types.EnvSpaces(obs={'image': (64, 64, 3)}, act_dim=6)


def spaces():
  return IMAGE_SPACES if FLAGS.image else VECTOR_SPACES


def _random_action(env, rng):
  """A uniform random action: an index for a discrete env, else a vector in
  the protocol's [-1, 1] (spec 7.4)."""
  if env.spaces.discrete:
    return int(rng.integers(env.act_dim))
  return rng.uniform(-1, 1, env.act_dim)


def render_streams(num_workers, length, seed=0):
  """[length][num_workers, 64, 64, 3] uint8: one episode stream of
  --image_task per worker under random actions (a new episode where one
  ends), through the run's own env stack (DMC vision: rendered with EGL)."""
  from experiments.envs import suites
  suite, task = FLAGS.image_task.split(':', 1)
  streams = []
  for w in range(num_workers):
    env = suites.make_env(suite, task, 1 if suite == 'crafter' else
                          (4 if suite == 'atari' else 2), seed + w,
                          image=suite == 'dmc', proprio=suite != 'dmc')
    rng = np.random.default_rng(seed + w)
    frames = [env.reset()['image']]
    while len(frames) < length:   # step() after is_last is the reset
      frames.append(env.step(_random_action(env, rng))['image'])
    env.close()
    streams.append(frames)
  return [np.stack([streams[w][i] for w in range(num_workers)])
          for i in range(length)]


def rss_bytes(pid='self') -> int:
  with open(f'/proc/{pid}/status') as f:
    for line in f:
      if line.startswith('VmRSS:'):
        return int(line.split()[1]) * 1024
  raise RuntimeError(f'no VmRSS for pid {pid}')


def signature_bytes(spec) -> int:
  import jax
  return sum(int(np.prod(s.shape)) * np.dtype(s.dtype).itemsize
             for s in jax.tree_util.tree_leaves(spec))


def random_steps(config, rng, num_workers, frame=None):
  """A step with realistic entropy (deter as bf16 bits of normals); the
  rendered ``frame`` [num_workers, 64, 64, 3] as its observation if given."""
  deter = rng.normal(size=(num_workers, config.deter)).astype(np.float32)
  obs = {'image': frame} if frame is not None else {
      'height': rng.normal(size=(num_workers,)).astype(np.float32),
      'orientations': rng.normal(size=(num_workers, 14)).astype(np.float32),
      'velocity': rng.normal(size=(num_workers, 9)).astype(np.float32)}
  return {
      'observation': obs,
      'action': rng.normal(size=(num_workers, 6)).astype(np.float32),
      'reward': rng.random(num_workers).astype(np.float32),
      'is_first': rng.random(num_workers) < 0.002,
      'is_last': rng.random(num_workers) < 0.002,
      'is_terminal': np.zeros(num_workers, bool),
      'latent': {
          'deter': (deter.view(np.uint32) >> 16).astype(np.uint16),
          'stoch': rng.integers(0, config.classes, (num_workers, config.stoch),
                                dtype=np.uint8)},
  }


def make_pool(config, num_workers):
  if FLAGS.pool < config.seq_len + FLAGS.chunk_length:
    raise ValueError(f'--pool {FLAGS.pool} < seq_len + chunk_length')
  rng = np.random.default_rng(config.seed)
  frames = (render_streams(num_workers, FLAGS.pool) if FLAGS.image
            else [None] * FLAGS.pool)
  return [random_steps(config, rng, num_workers, f) for f in frames]


def serve(config):
  """Memory-phase server process: the replay tables, nothing else."""
  if FLAGS.serve_capacity:
    config = config.replace(replay_capacity=FLAGS.serve_capacity)
  server = make_server(make_replay_tables(types.step_spec(spaces(), config),
                                          config))
  print(server.port, flush=True)
  sys.stdin.read()                       # parent closes stdin when done
  server.stop()


def measure_server_memory(config, pool):
  """VmRSS of a separate server process per stored step (real memory).

  Warm-up inserts seq_len + 2 * chunk_length steps per worker (first chunks,
  first items, allocator arenas) -> RSS r0. The table capacity is set so that
  two intervals of ``--mem_steps`` vector steps fill it exactly; ``--mem_churn``
  more intervals then run at capacity (FIFO eviction frees chunks as new ones
  arrive). Returns a dict with the growth per step of the two fill intervals
  and the footprint at capacity after each churn interval,
  (RSS - r0) / (items stored - items at r0).
  """
  import reverb
  num_workers = FLAGS.workers
  warm = config.seq_len + 2 * FLAGS.chunk_length
  items0 = (warm - config.seq_len + 1) * num_workers
  capacity = items0 + 2 * FLAGS.mem_steps * num_workers
  child = subprocess.Popen(
      [sys.executable, __file__, '--serve', f'--size={config.size}',
       f'--serve_capacity={capacity}', f'--image={FLAGS.image}'],
      stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
  try:
    port = int(child.stdout.readline())
    client = reverb.Client(f'localhost:{port}')
    adder = WindowAdder(client, config, num_workers,   # spec from the server
                        chunk_length=FLAGS.chunk_length)
    done = 0

    def drain_online():
      # Nothing trains here: pop the online queue so that it never fills and
      # blocks inserts (its bound is capacity / 65, tables.online_queue_size).
      size = int(client.server_info()[ONLINE_TABLE].current_size)
      if size:
        for _ in client.sample(ONLINE_TABLE, size, emit_timesteps=False):
          pass

    def insert(n):
      nonlocal done
      for i in range(n):
        adder.add_batch(pool[(done + i) % len(pool)])
        if (done + i) % (4 * config.seq_len) == 0:
          drain_online()
      done += n
      adder.flush()
      time.sleep(0.5)                    # let the server settle
      return (rss_bytes(child.pid),
              int(client.server_info()[UNIFORM_TABLE].current_size))

    r0, n0 = insert(warm)
    r1, n1 = insert(FLAGS.mem_steps)
    r2, n2 = insert(FLAGS.mem_steps)
    churn = []                           # at capacity: FIFO eviction churn
    for _ in range(max(1, FLAGS.mem_churn)):
      r3, n3 = insert(FLAGS.mem_steps)
      churn.append((r3 - r0) / (n3 - n0))
    adder.close()
    return {'fill1': (r1 - r0) / (n1 - n0), 'fill2': (r2 - r1) / (n2 - n1),
            'steady': churn[-1], 'churn': churn, 'items': n3}
  finally:
    child.stdin.close()
    child.wait(timeout=60)


def main(_):
  config = make_config(size=FLAGS.size)
  if FLAGS.serve:
    serve(config)
    return
  num_workers = FLAGS.workers
  spec = types.step_spec(spaces(), config)
  step_bytes = signature_bytes(spec)
  pool = make_pool(config, num_workers)

  # --- throughput: in-process server, as in the synchronous loop ------------
  server = make_server(make_replay_tables(spec, config))
  client = server.localhost_client()
  adder = WindowAdder(client, config, num_workers, spec,
                      chunk_length=FLAGS.chunk_length)
  store = LatentStore(config, num_workers)
  sampler = ReplaySampler(client, config, store, step_spec=spec)
  packed_width = adder._layout.width  # pylint: disable=protected-access

  # Warm up writers (first chunks, signature fetch) outside the timing.
  for i in range(config.seq_len):
    adder.add_batch(pool[i % len(pool)])
  adder.flush()
  t0 = time.perf_counter()
  for i in range(FLAGS.steps):
    adder.add_batch(pool[(config.seq_len + i) % len(pool)])
  adder.flush()
  insert_s = time.perf_counter() - t0
  inserted = FLAGS.steps * num_workers

  # Fill the latent store as write-backs would (every stored step).
  total = config.seq_len + FLAGS.steps
  for w in range(num_workers):
    ids = np.stack([np.full(total, w), np.arange(total)], -1)
    store.update(ids, {
        'deter': np.full((total, config.deter), w, np.uint16),
        'stoch': np.zeros((total, config.stoch), np.uint8)})

  for _ in range(3):
    sampler.sample_train()
  times, wb_times = [], []
  for _ in range(FLAGS.batches):
    t = time.perf_counter()
    batch = sampler.sample_train()
    times.append(time.perf_counter() - t)
    ids = batch['step_id'][:, 1:]
    latents = {k: v[:, 1:] for k, v in batch['latent'].items()}
    t = time.perf_counter()
    sampler.write_back(ids, latents)
    wb_times.append(time.perf_counter() - t)
  batch_s = statistics.median(times)
  wb_s = statistics.median(wb_times)
  batch_mb = sum(x.nbytes for x in __import__('jax').tree_util.tree_leaves(
      batch)) / 1e6
  # Batch assembly alone: unpacking a [B, 65, width] buffer into the layout.
  rows = sampler._sample(  # pylint: disable=protected-access
      UNIFORM_TABLE, config.batch_size)
  unpack_times = []
  for _ in range(FLAGS.batches):
    t = time.perf_counter()
    sampler._layout.unpack(np.stack(rows))  # pylint: disable=protected-access
    unpack_times.append(time.perf_counter() - t)
  unpack_s = statistics.median(unpack_times)
  adder.close()
  server.stop()

  print(f'size={config.size} workers={num_workers} seq_len={config.seq_len} '
        f'batch=[{config.batch_size}, {config.seq_len}] '
        f'chunk_length={FLAGS.chunk_length} pool={FLAGS.pool}')
  print(f'insert: {inserted / insert_s:,.0f} steps/s '
        f'({insert_s / FLAGS.steps * 1e3:.2f} ms per {num_workers}-worker '
        f'vector step)')
  print(f'sample+assemble (incl. latent-store lookup): {1 / batch_s:.1f} '
        f'batches/s ({batch_s * 1e3:.2f} ms median, {batch_mb:.2f} MB/batch, '
        f'{sampler.num_online_rows} online rows popped)')
  print(f'  of which unpack (stack + per-leaf copy): {unpack_s * 1e3:.2f} ms '
        'median')
  print(f'write-back [{config.batch_size}, {config.batch_length}]: '
        f'{wb_s * 1e3:.2f} ms median')
  print(f'bytes per stored step (signature, agent/types.py layout): '
        f'{step_bytes} B ({step_bytes / 1024:.2f} KiB); packed row: '
        f'{packed_width} B in 1 column')
  print(f'latent store: {store.nbytes / 1e6:.1f} MB for '
        f'{len(store)} steps')
  frac = (batch_s + wb_s) / FLAGS.learner_update_s
  print(f'replay time per update vs {FLAGS.learner_update_s:.1f} s learner '
        f'update: {frac * 100:.2f}%')

  # --- real memory: RSS of a separate server process ------------------------
  if FLAGS.mem_steps > 0:
    m = measure_server_memory(config, pool)
    print(f'server memory per stored step (VmRSS of a separate server '
          f'process): fill {m["fill1"]:,.0f} B / {m["fill2"]:,.0f} B per '
          f'inserted step (2 x {FLAGS.mem_steps * num_workers:,} steps); at '
          f'capacity ({m["items"]:,} items) after each further '
          f'{FLAGS.mem_steps * num_workers:,} evicting inserts: '
          + ' / '.join(f'{x:,.0f} B' for x in m['churn'])
          + ' per stored step (goal <= 5,000 B)')
    fill = (m['fill1'] + m['fill2']) / 2
    print(f'  -> 250K steps (below capacity, no eviction): '
          f'{fill * 250e3 / 1e9:.2f} GB; a full 5e6 capacity: '
          f'{m["steady"] * 5e6 / 1e9:.1f} GB')

if __name__ == '__main__':
  app.run(main)
