"""Reverb replay: windows, online queue, annotation, latents, validation, resume.

Every test runs a real in-process ``reverb.Server`` on localhost (no mocks)
with the tiny model preset; each names the spec item it checks.
"""

import agent  # noqa: F401  (jax compat aliases before any acme import)

import os

import numpy as np
import pytest
import reverb

from agent import types
from agent.builder import DreamerBuilder
from agent.config import make_config
from reverb_tables import checkpoint as ckpt
from reverb_tables.adder import WindowAdder, step_spec_from_server
from reverb_tables.latent_store import LatentStore
from experiments.layouts.scheduled import TrainSchedule
from reverb_tables.sampler import ReplaySampler, annotate
from reverb_tables.tables import (for_one_process, ONLINE_TABLE, UNIFORM_TABLE,
                                  make_replay_tables, make_server)

SPACES = types.EnvSpaces(obs={'a': (3,), 'b': ()}, act_dim=2)


def tiny(**kw):
  kw.setdefault('size', 'tiny')
  kw.setdefault('batch_size', 4)
  kw.setdefault('batch_length', 8)
  kw.setdefault('replay_capacity', 10_000)
  return make_config(**kw)


def make_step(config, worker, n, ep_len=None, first_at=()):
  """Deterministic step content of (worker, index n); no step_id (adder fills)."""
  is_first = (n % ep_len == 0) if ep_len else (n in first_at or n == 0)
  is_last = (n % ep_len == ep_len - 1) if ep_len else False
  return {
      'observation': {'a': np.array([worker, n, n % 7], np.float32),
                      'b': np.float32(n)},
      'action': np.array([0.01 * n, -0.01 * n], np.float32),
      'reward': np.float32(0.0 if is_first else 0.1 * n),
      'is_first': np.bool_(is_first),
      'is_last': np.bool_(is_last),
      'is_terminal': np.bool_(False),
      'latent': {
          'deter': np.full(config.deter, (worker * 1000 + n) % 65536, np.uint16),
          'stoch': np.full(config.stoch, n % config.classes, np.uint8)},
  }


def stack_steps(steps):
  import jax
  return jax.tree_util.tree_map(lambda *xs: np.stack(xs), *steps)


class Replay:
  """A server + adder + sampler on a tiny config (test helper)."""

  def __init__(self, config, num_workers, checkpoint_dir=None,
               per_worker_capacity=None):
    self.config = config
    self.num_workers = num_workers
    self.spec = types.step_spec(SPACES, config)
    self.tables = make_replay_tables(self.spec, config)
    self.server = make_server(self.tables, checkpoint_dir=checkpoint_dir)
    self.client = self.server.localhost_client()
    self.adder = WindowAdder(self.client, config, num_workers)
    self.store = LatentStore(config, num_workers, per_worker_capacity)
    self.sampler = ReplaySampler(self.client, config, self.store)

  def add_steps(self, num_steps, **kw):
    for n in range(num_steps):
      self.adder.add_batch(stack_steps(
          [make_step(self.config, w, int(self.adder.lengths[w]), **kw)
           for w in range(self.num_workers)]))
    self.adder.flush()

  def size(self, table=UNIFORM_TABLE):
    return int(self.client.server_info()[table].current_size)

  def close(self):
    self.adder.close()
    self.server.stop()


@pytest.fixture
def replay_factory():
  made = []

  def factory(*args, **kw):
    made.append(Replay(*args, **kw))
    return made[-1]

  yield factory
  for r in made:
    r.close()


def check_window_content(config, batch, i, ep_len=None):
  """Row i holds steps start..start+L-1 of one worker, unpadded (spec 5.1)."""
  worker, start = batch['step_id'][i, 0]
  idx = start + np.arange(config.seq_len)
  np.testing.assert_array_equal(batch['step_id'][i, :, 0], worker)
  np.testing.assert_array_equal(batch['step_id'][i, :, 1], idx)
  np.testing.assert_array_equal(batch['observation']['b'][i], idx)
  np.testing.assert_array_equal(batch['observation']['a'][i, :, 0], worker)
  np.testing.assert_allclose(batch['action'][i, :, 0], 0.01 * idx, rtol=1e-6)
  if ep_len:
    want_first = (idx % ep_len == 0)
    want_first[0] = True                                  # annotation
    np.testing.assert_array_equal(batch['is_first'][i], want_first)


# --- spec 5.1 / 5.2 ---------------------------------------------------------------
def test_windows_cross_episode_boundaries(replay_factory):
  """spec 5.1, 5.2: stride-1 windows of 65 (here 9) steps cross episode ends.

  Every step of a worker starts exactly one item once L steps exist; windows
  are not cut or padded at is_last and hold mid-window is_first flags.
  """
  config = tiny()
  replay = replay_factory(config, num_workers=2)
  num_steps, ep_len = 14, 5
  replay.add_steps(num_steps, ep_len=ep_len)
  per_worker = num_steps - config.seq_len + 1
  assert replay.adder.num_items == 2 * per_worker
  assert replay.size() == 2 * per_worker
  batch = replay.sampler.sample_report(400)
  starts = {tuple(x) for x in batch['step_id'][:, 0]}
  assert starts == {(w, s) for w in range(2) for s in range(per_worker)}
  crossing = 0
  for i in range(len(batch['step_id'])):
    check_window_content(config, batch, i, ep_len=ep_len)
    crossing += batch['is_first'][i, 1:].any()
  assert crossing > 0  # windows with a mid-window is_first exist


# --- spec 5.4 / 5.3 -----------------------------------------------------------------
def test_online_queue_starts_and_train_pops_first(replay_factory):
  """spec 5.4, 5.3: online items start at 1, 66, 131 (real 65-step windows);
  training pops them first, oldest first; report never pops; an empty queue
  does not block and uniform rows fill the batch."""
  config = tiny(batch_length=64, batch_size=4)
  assert config.seq_len == 65
  replay = replay_factory(config, num_workers=2)
  replay.add_steps(200)                      # n = 65, 130, 195 push per worker
  assert replay.adder.num_online_items == 6
  assert replay.size(ONLINE_TABLE) == 6
  replay.sampler.sample_report()
  assert replay.size(ONLINE_TABLE) == 6      # report never pops (spec 6.4)

  first = replay.sampler.sample_train()      # 4 online rows
  assert replay.size(ONLINE_TABLE) == 2
  second = replay.sampler.sample_train()     # 2 online + 2 uniform rows
  assert replay.size(ONLINE_TABLE) == 0
  assert replay.sampler.num_online_rows == 6
  assert replay.sampler.num_uniform_rows == 2
  online = np.concatenate([first['step_id'][:, 0], second['step_id'][:2, 0]])
  for w in range(2):
    starts = online[online[:, 0] == w, 1].tolist()
    assert starts == [1, 66, 131]            # FIFO per worker
  for b in (first, second):
    for i in range(config.batch_size):
      check_window_content(config, b, i)
  third = replay.sampler.sample_train()      # empty queue: uniform, no block
  assert third['step_id'].shape == (4, 65, 2)
  assert replay.sampler.num_online_rows == 6
  # Process k >= 1 of a multi-process learner never pops the queue; process
  # 0 counts the rows the others draw with each of its batches.
  replay.add_steps(65)
  assert replay.size(ONLINE_TABLE) == 2
  peer = ReplaySampler(replay.client, config, None, take_online=False)
  assert peer.sample_train(2)['step_id'].shape == (2, 65, 2)
  assert replay.size(ONLINE_TABLE) == 2 and peer.num_online_rows == 0
  first_of_two = ReplaySampler(replay.client, config, None,
                               peer_uniform_rows=2)
  first_of_two.sample_train(2)               # its 2 online rows + 2 of the peer
  assert (first_of_two.num_online_rows, first_of_two.num_uniform_rows) == (2, 2)
  assert replay.size(ONLINE_TABLE) == 0


# --- spec 5.3 annotation ----------------------------------------------------------
def test_annotation_marks_is_first_and_is_last():
  """spec 5.3: is_first[:, 0] = True; is_last |= roll(is_first, -1), last col False."""
  is_first = np.array([[False, False, True, False],
                       [False, True, False, True]])
  is_last = np.array([[False, False, False, True],
                      [False, False, False, False]])
  batch = annotate({'is_first': is_first.copy(), 'is_last': is_last.copy()})
  np.testing.assert_array_equal(batch['is_first'], [[1, 0, 1, 0], [1, 1, 0, 1]])
  np.testing.assert_array_equal(batch['is_last'], [[0, 1, 0, 1], [1, 0, 1, 0]])


def test_sampled_batch_annotated_and_jit_ready(replay_factory):
  """spec 5.3: sampled rows are annotated (an abandoned episode gets is_last
  before the mid-window is_first) and arrays are contiguous with spec dtypes."""
  config = tiny()
  replay = replay_factory(config, num_workers=1)
  # is_first at 0 and 6 with no is_last before 6 (abandoned episode).
  replay.add_steps(12, first_at=(6,))
  batch = replay.sampler.sample_report(200)
  spec = types.step_spec(SPACES, config)
  import jax
  for x, s in zip(jax.tree_util.tree_leaves(batch),
                  jax.tree_util.tree_leaves(spec)):
    assert x.dtype == s.dtype and x.flags['C_CONTIGUOUS']
    assert x.shape == (200, config.seq_len) + s.shape
  for i in range(200):
    start = batch['step_id'][i, 0, 1]
    idx = start + np.arange(config.seq_len)
    want_first = (idx == 6) | (np.arange(config.seq_len) == 0)
    np.testing.assert_array_equal(batch['is_first'][i], want_first)
    want_last = np.zeros(config.seq_len, bool)
    want_last[:-1] = want_first[1:]
    np.testing.assert_array_equal(batch['is_last'][i], want_last)


# --- spec 5.8 / 5.9 latents -------------------------------------------------------
def test_write_back_visible_in_next_sample(replay_factory):
  """spec 5.8, 5.9: write-back of indices 1..T replaces those latents in the
  next sample of the same steps, including index 0 (the replay context) of a
  window that starts at a written step; unwritten steps keep Reverb's."""
  config = tiny()
  replay = replay_factory(config, num_workers=1)
  replay.add_steps(config.seq_len + 1)       # items start at 0 and 1
  batch = replay.sampler.sample_report(50)
  row = np.flatnonzero(batch['step_id'][:, 0, 1] == 0)[:1]
  ids = batch['step_id'][row, 1:]            # trained indices 1..T of start 0
  fresh = {'deter': np.full(ids.shape[:2] + (config.deter,), 7, np.uint16),
           'stoch': np.full(ids.shape[:2] + (config.stoch,), 3, np.uint8)}
  assert replay.sampler.write_back(ids, fresh) == config.batch_length
  written = set(ids[0, :, 1].tolist())
  after = replay.sampler.sample_report(100)
  assert {int(s) for s in after['step_id'][:, 0, 1]} == {0, 1}
  for i in range(100):
    for t in range(config.seq_len):
      n = int(after['step_id'][i, t, 1])
      deter = after['latent']['deter'][i, t]
      stoch = after['latent']['stoch'][i, t]
      if n in written:
        assert (deter == 7).all() and (stoch == 3).all(), (i, t, n)
      else:
        assert (deter == n % 65536).all() and (stoch == n % config.classes).all()
  # A window starting at a written step uses the store at index 0 (spec 5.8).
  rows = after['step_id'][:, 0, 1] == min(written)
  assert rows.any()
  assert (after['latent']['deter'][rows, 0] == 7).all()


def test_latent_store_ring_recycling_and_save_restore(tmp_path):
  """spec 5.9, 5.6: bounded per-worker ring; a stale write-back for a recycled
  slot is skipped; lookup only hits the exact step id; npz save/restore."""
  config = tiny()
  store = LatentStore(config, num_workers=2, per_worker_capacity=10)

  def lat(ids, v):
    return {'deter': np.full(ids.shape[:-1] + (config.deter,), v, np.uint16),
            'stoch': np.full(ids.shape[:-1] + (config.stoch,),
                             v % config.classes, np.uint8)}

  ids = np.array([[0, 3], [1, 3], [0, 13]])
  assert store.update(ids, {k: v for k, v in lat(ids, 5).items()}) == 3
  got, found = store.lookup(np.array([[0, 3], [1, 3], [0, 13], [1, 13]]))
  np.testing.assert_array_equal(found, [False, True, True, False])  # 3 recycled
  assert (got['deter'][1] == 5).all() and (got['deter'][3] == 0).all()
  old = np.array([[0, 3]])
  assert store.update(old, lat(old, 9)) == 0    # slot holds newer step 13
  with pytest.raises(ValueError, match='deter dtype'):
    store.update(old, {'deter': np.zeros((1, config.deter), np.float32),
                       'stoch': np.zeros((1, config.stoch), np.uint8)})
  # A NaN deter (bf16 bits 0x7FC0) or a class index >= classes is never
  # stored: later batches must not start from it.
  bad_ids = np.array([[1, 4], [1, 5]])
  bad = {'deter': np.zeros((2, config.deter), np.uint16),
         'stoch': np.zeros((2, config.stoch), np.uint8)}
  bad['deter'][0, 7] = 0x7FC0
  bad['stoch'][1, 3] = config.classes
  assert store.update(bad_ids, bad) == 0 and store.num_invalid == 2
  assert not store.lookup(bad_ids)[1].any()
  path = str(tmp_path / 'latents.npz')
  store.save(path)
  other = LatentStore(config, num_workers=2, per_worker_capacity=10)
  other.restore(path)
  got2, found2 = other.lookup(np.array([[1, 3], [0, 13]]))
  assert found2.all() and (got2['stoch'] == 5 % config.classes).all()
  with pytest.raises(ValueError, match='does not match'):
    LatentStore(config, num_workers=3, per_worker_capacity=10).restore(path)


# --- validation ---------------------------------------------------------------------
def test_invalid_steps_raise_naming_key_and_keep_data_readable(replay_factory):
  """spec 5.1 (stored step layout of agent/types.py): a wrong shape, wrong
  dtype, missing key, NaN or a wrong step_id raises ValueError naming the key
  before anything is written; the stored items stay readable."""
  config = tiny()
  replay = replay_factory(config, num_workers=2)
  replay.add_steps(config.seq_len + 2)
  items, lengths = replay.adder.num_items, replay.adder.lengths

  def good():
    return stack_steps([make_step(config, w, int(lengths[w])) for w in range(2)])

  bad = good()
  bad['observation']['a'] = np.zeros((2, 4), np.float32)
  with pytest.raises(ValueError, match="'observation/a'.*shape"):
    replay.adder.add_batch(bad)
  bad = good()
  bad['action'] = bad['action'].astype(np.float64)
  with pytest.raises(ValueError, match="'action'.*dtype"):
    replay.adder.add_batch(bad)
  bad = good()
  bad['latent']['deter'] = bad['latent']['deter'].astype(np.float32)
  with pytest.raises(ValueError, match="'latent/deter'.*dtype"):
    replay.adder.add_batch(bad)
  bad = good()
  del bad['is_terminal']
  with pytest.raises(ValueError, match="missing.*'is_terminal'"):
    replay.adder.add_batch(bad)
  bad = good()
  bad['observation']['b'][1] = np.nan        # only worker 1 is bad
  with pytest.raises(ValueError, match="'observation/b' contains NaN"):
    replay.adder.add_batch(bad)
  bad = good()
  bad['action'][0, 1] = np.inf
  with pytest.raises(ValueError, match="'action' contains Inf"):
    replay.adder.add_batch(bad)
  bad = good()
  bad['step_id'] = np.array([[0, 99], [1, 99]], np.int64)
  with pytest.raises(ValueError, match="'step_id'"):
    replay.adder.add_batch(bad)
  single = make_step(config, 0, int(lengths[0]))
  single['reward'] = np.float64(1.0)
  with pytest.raises(ValueError, match="'reward'.*dtype"):
    replay.adder.add(0, single)

  # Nothing was written: counters and table unchanged, data readable.
  np.testing.assert_array_equal(replay.adder.lengths, lengths)
  assert replay.adder.num_items == items
  replay.adder.flush()
  assert replay.size() == items
  batch = replay.sampler.sample_report(50)
  for i in range(50):
    check_window_content(config, batch, i)
  # And the streams continue normally (batched and single-worker adds).
  replay.adder.add_batch(good())
  replay.adder.add(1, make_step(config, 1, int(lengths[1]) + 1))
  replay.adder.flush()
  assert replay.size() == items + 3
  np.testing.assert_array_equal(replay.adder.lengths, lengths + [1, 2])
  batch = replay.sampler.sample_report(300)
  assert int(batch['step_id'][:, 0, 1].max()) == int(lengths[1]) + 1 - 8


def test_step_spec_from_server_matches_types():
  """spec 5.1: the table signature is agent.types.step_spec with a time axis."""
  config = tiny()
  spec = types.step_spec(SPACES, config)
  tables = make_replay_tables(spec, config)
  server = make_server(tables)
  try:
    back = step_spec_from_server(server.localhost_client())
    import jax
    for a, b in zip(jax.tree_util.tree_leaves(spec),
                    jax.tree_util.tree_leaves(back)):
      assert a.shape == b.shape and a.dtype == b.dtype
  finally:
    server.stop()


def test_ratio_rate_limiter_table_and_capacity_check():
  """spec 6.1 (parallel script SamplesPerInsert) and spec 5.1 capacity check."""
  config = tiny(train_ratio=512, batch_length=8, train_fill=16)
  tables = DreamerBuilder(config, SPACES, num_envs=1).make_replay_tables()
  info = tables[0].info.rate_limiter_info
  # uniform rows per insert = rows per insert less the online share (1/65).
  assert info.samples_per_insert == pytest.approx(512 / 8 - 1 / config.seq_len)
  assert info.min_size_to_sample == 16
  assert info.max_diff - info.min_diff == pytest.approx(
      2 * max(4 * config.batch_size, 512 / 8))
  no_queue = tiny(train_ratio=512, batch_length=8, online_queue=False)
  assert DreamerBuilder(no_queue, SPACES, num_envs=1).make_replay_tables(
  )[0].info.rate_limiter_info.samples_per_insert == 64
  # One process: the band covers the items waiting in 4 workers' open chunks.
  # The layout adapts the builder's table from its own limiter info.
  sync = for_one_process(tables, num_workers=4, chunk_length=8)
  sinfo = sync[0].info.rate_limiter_info
  lag = 4 * 7
  assert sinfo.samples_per_insert == info.samples_per_insert
  assert sinfo.min_size_to_sample == 1          # max(1, 16 - lag)
  assert sinfo.max_diff - sinfo.min_diff == pytest.approx(
      info.max_diff - info.min_diff + 2 * info.samples_per_insert * lag)
  assert sync[0].info.max_size == tables[0].info.max_size
  assert sync[0].info.signature == tables[0].info.signature
  assert sync[1] is tables[1]
  with pytest.raises(ValueError, match='capacity'):
    tiny(replay_capacity=10)
  # Without a limiter (tools that drive sampling themselves): MinSize(1).
  plain = make_replay_tables(types.step_spec(SPACES, config), config)
  assert plain[0].info.rate_limiter_info.min_size_to_sample == 1


# --- checkpoint / resume --------------------------------------------------------------
def test_checkpoint_restore_returns_same_items(replay_factory, tmp_path):
  """spec 5.1 storage + 5.4 queue + 5.9 latents survive a checkpoint: a new
  server from the checkpoint dir has identical table sizes and item contents,
  the adder continues the step ids and older checkpoints are pruned."""
  config = tiny()
  ckdir = str(tmp_path / 'reverb')
  replay = replay_factory(config, num_workers=1, checkpoint_dir=ckdir)
  replay.add_steps(20)                       # 12 items, online at n=9, 18
  ids = np.array([[0, 5], [0, 6]])
  replay.store.update(ids, {'deter': np.full((2, config.deter), 11, np.uint16),
                            'stoch': np.full((2, config.stoch), 2, np.uint8)})
  schedule = TrainSchedule(config)
  schedule(1000, 10**6)
  sizes = (replay.size(), replay.size(ONLINE_TABLE))
  assert sizes == (12, 2)
  before = replay.sampler.sample_report(300)
  first = ckpt.checkpoint_server(replay.client, keep=1, adder=replay.adder)
  path = ckpt.checkpoint_server(replay.client, keep=1, adder=replay.adder)
  assert ckpt.list_checkpoints(ckdir) == [path] and first != path
  state_dir = str(tmp_path / 'state')
  ckpt.save_replay_state(state_dir, path, adder=replay.adder,
                         schedule=schedule, latent_store=replay.store)
  replay.close()

  restored = replay_factory(config, num_workers=1, checkpoint_dir=ckdir)
  schedule2 = TrainSchedule(config)
  ckpt.load_replay_state(state_dir, ckpt.latest_checkpoint(ckdir),
                         adder=restored.adder, schedule=schedule2,
                         latent_store=restored.store)
  assert (restored.size(), restored.size(ONLINE_TABLE)) == sizes
  assert schedule2.get_state() == schedule.get_state()
  after = restored.sampler.sample_report(300)

  def by_start(batch):
    out = {}
    for i in range(len(batch['step_id'])):
      import jax
      row = jax.tree_util.tree_map(lambda x: x[i], batch)
      out[int(row['step_id'][0, 1])] = row
    return out

  b1, b2 = by_start(before), by_start(after)
  assert sorted(b1) == sorted(b2) == list(range(12))
  import jax
  for k in b1:
    jax.tree_util.tree_map(np.testing.assert_array_equal, b1[k], b2[k])
  # Latent-store entries came back and overlay the restored items.
  assert (b2[5]['latent']['deter'][0] == 11).all()
  # The online queue pops the same windows in the same order.
  pops = restored.sampler.sample_train(2)['step_id'][:, 0, 1].tolist()
  assert pops == [1, 10]
  # Step ids continue after the restart; 9 fresh steps before the next item.
  np.testing.assert_array_equal(restored.adder.lengths, [20])
  restored.add_steps(config.seq_len)
  assert restored.size() == 13
  assert restored.sampler.sample_report(200)['step_id'][:, 0, 1].max() == 20
  with pytest.raises(ValueError, match='belongs to Reverb checkpoint'):
    ckpt.load_replay_state(state_dir, str(tmp_path / 'other'))


_NOTICE_SCRIPT = r'''
import sys
import agent  # noqa: F401
import numpy as np
import reverb
from reverb_tables import sampler
server = reverb.Server([reverb.Table.queue('q', 100)])
client = server.localhost_client()
for _ in range(20):
  client.insert([np.zeros(3, np.float32)], {'q': 1.0})
make = ((lambda: client._client.NewSampler('q', 1, 1)) if sys.argv[1] == 'raw'
        else (lambda: sampler.new_sampler(client, 'q', 1)))
for i in range(9):
  make().GetNextTrajectory()
  print(f'after call {i + 1}', file=sys.stderr, flush=True)
server.stop()
'''


@pytest.mark.parametrize('how', ['raw', 'new_sampler'])
def test_same_process_sampler_notice_is_muted_and_stderr_kept(how):
  """Reverb writes "Sampler and server are owned by the same process" on the
  1st, 2nd, 4th and 8th sampler of a process (no log level to set);
  ``new_sampler`` mutes exactly those, and everything else on stderr stays."""
  import subprocess
  import sys
  out = subprocess.run([sys.executable, '-c', _NOTICE_SCRIPT, how],
                       capture_output=True, text=True, timeout=300,
                       cwd=os.path.dirname(os.path.dirname(
                           os.path.abspath(__file__))))
  assert out.returncode == 0, out.stderr[-3000:]
  notices = out.stderr.count('owned by the same process')
  assert notices == (4 if how == 'raw' else 0), out.stderr
  for i in range(1, 10):
    assert f'after call {i}\n' in out.stderr, out.stderr
