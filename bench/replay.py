"""Reverb replay benchmark (spec 5.1, 5.3, 5.7-5.9).

Prints, at one size preset (default size12m, DMC walker-like obs: 24 floats,
6 actions):
  * insert throughput of WindowAdder.add_batch with 16 workers (steps/s),
  * sample + assemble throughput of ReplaySampler.sample_train, batches [16, 65]
    with latents and the LatentStore lookup/overlay (batches/s), plus the
    write-back time of one batch,
  * bytes per stored step from the signature (goal <= 5 KB at size12m with
    bf16 deter bits + uint8 stoch, spec 5.7) and the server's measured
    process-memory growth per stored step (chunks + item overhead),
  * the batch time as a fraction of a size12m learner update (~3.5 s target).

  python bench/replay.py --size=size12m --steps=400
"""

from __future__ import annotations

import statistics
import time

from absl import app, flags

import agent  # noqa: F401  (jax compat first)
import numpy as np

from agent import types
from agent.config import make_config
from reverb_tables.adder import WindowAdder
from reverb_tables.latent_store import LatentStore
from reverb_tables.sampler import ReplaySampler
from reverb_tables.tables import make_replay_tables, make_server

FLAGS = flags.FLAGS
flags.DEFINE_string('size', 'size12m', 'Size preset.')
flags.DEFINE_integer('workers', 16, 'Env workers (streams).')
flags.DEFINE_integer('steps', 400, 'Vector steps inserted (per worker).')
flags.DEFINE_integer('batches', 50, 'Timed training batches.')
flags.DEFINE_integer('chunk_length', 16, 'WindowAdder chunk length.')
flags.DEFINE_float('learner_update_s', 3.5,
                   'Learner update time to compare with (size12m target).')

SPACES = types.EnvSpaces(
    obs={'orientations': (14,), 'height': (), 'velocity': (9,)}, act_dim=6)


def rss_bytes() -> int:
  with open('/proc/self/statm') as f:
    return int(f.read().split()[1]) * 4096


def signature_bytes(spec) -> int:
  import jax
  return sum(int(np.prod(s.shape)) * np.dtype(s.dtype).itemsize
             for s in jax.tree_util.tree_leaves(spec))


def random_steps(config, rng, num_workers):
  """A vector step with realistic entropy (deter as bf16 bits of normals)."""
  deter = rng.normal(size=(num_workers, config.deter)).astype(np.float32)
  return {
      'observation': {
          'height': rng.normal(size=(num_workers,)).astype(np.float32),
          'orientations': rng.normal(size=(num_workers, 14)).astype(np.float32),
          'velocity': rng.normal(size=(num_workers, 9)).astype(np.float32)},
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


def main(_):
  config = make_config(size=FLAGS.size)
  num_workers = FLAGS.workers
  spec = types.step_spec(SPACES, config)
  step_bytes = signature_bytes(spec)
  server = make_server(make_replay_tables(spec, config))
  client = server.localhost_client()
  adder = WindowAdder(client, config, num_workers, spec,
                      chunk_length=FLAGS.chunk_length)
  store = LatentStore(config, num_workers)
  sampler = ReplaySampler(client, config, store, step_spec=spec)
  rng = np.random.default_rng(config.seed)
  pool = [random_steps(config, rng, num_workers) for _ in range(8)]

  # Warm up writers (first chunks, signature fetch) outside the timing.
  for i in range(config.seq_len):
    adder.add_batch(pool[i % 8])
  adder.flush()
  rss0 = rss_bytes()
  t0 = time.perf_counter()
  for i in range(FLAGS.steps):
    adder.add_batch(pool[i % 8])
  adder.flush()
  insert_s = time.perf_counter() - t0
  inserted = FLAGS.steps * num_workers
  mem_per_step = (rss_bytes() - rss0) / inserted

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

  print(f'size={config.size} workers={num_workers} seq_len={config.seq_len} '
        f'batch=[{config.batch_size}, {config.seq_len}] '
        f'chunk_length={FLAGS.chunk_length}')
  print(f'insert: {inserted / insert_s:,.0f} steps/s '
        f'({insert_s / FLAGS.steps * 1e3:.2f} ms per {num_workers}-worker '
        f'vector step)')
  print(f'sample+assemble (incl. latent-store lookup): {1 / batch_s:.1f} '
        f'batches/s ({batch_s * 1e3:.2f} ms median, {batch_mb:.2f} MB/batch, '
        f'{sampler.num_online_rows} online rows popped)')
  print(f'write-back [{config.batch_size}, {config.batch_length}]: '
        f'{wb_s * 1e3:.2f} ms median')
  print(f'bytes per stored step (signature): {step_bytes} B '
        f'({step_bytes / 1024:.2f} KiB; goal <= 5 KB)')
  print(f'server memory per stored step (measured RSS growth, chunks + '
        f'items): {mem_per_step:,.0f} B')
  print(f'latent store: {store.nbytes / 1e6:.1f} MB for '
        f'{len(store)} steps')
  frac = (batch_s + wb_s) / FLAGS.learner_update_s
  print(f'replay time per update vs {FLAGS.learner_update_s:.1f} s learner '
        f'update: {frac * 100:.2f}%')
  adder.close()
  server.stop()


if __name__ == '__main__':
  app.run(main)
