"""Packed replay storage (reverb_tables/packing.py): one uint8 column per step.

The packing is lossless (bitwise), its layout is recorded in the table
signature, and batches sampled from a real in-process ``reverb.Server`` come
back in the nested agent/types.py layout with exact dtypes, also for the
byte-plane ('planes') encoding that only large leaves (deter at >= size1m) use.
"""

import agent  # noqa: F401  (jax compat aliases before any acme import)

import jax
import numpy as np
import pytest
import tree

from agent import types
from agent.config import make_config
from reverb_tables import packing
from reverb_tables.adder import WindowAdder, step_spec_from_server
from reverb_tables.sampler import ReplaySampler
from reverb_tables.tables import (UNIFORM_TABLE, make_replay_tables,
                                  make_server, packed_window_signature,
                                  window_signature)

SPACES = types.EnvSpaces(obs={'a': (3,), 'b': ()}, act_dim=2)


def random_bits(spec, lead, rng):
  """Arbitrary bit patterns of a leaf (NaN/Inf/-0/denormal floats included)."""
  shape = tuple(lead) + tuple(spec.shape)
  dtype = np.dtype(spec.dtype)
  if dtype == np.bool_:
    return rng.random(shape) < 0.5
  raw = rng.integers(0, 256, shape + (dtype.itemsize,), dtype=np.uint8)
  return raw.view(dtype).reshape(shape)


@pytest.mark.parametrize('size,deter_dtype', [('tiny', 'bfloat16'),
                                              ('size1m', 'float32'),
                                              ('size12m', 'bfloat16')])
def test_pack_unpack_is_bitwise_lossless(size, deter_dtype):
  """Every leaf, any bit pattern, survives pack -> unpack exactly, with its
  dtype, shape and C order, for one step and for [B, T] batches."""
  config = make_config(size=size, latent_store_dtype=deter_dtype)
  spec = types.step_spec(SPACES, config)
  layout = packing.StepLayout.from_step_spec(spec)
  deter = layout.field('latent/deter')
  want = packing.PLANES if config.deter >= 256 else packing.RAW
  assert deter.encoding == want
  assert all(f.encoding == packing.RAW for f in layout.fields
             if f.name != 'latent/deter')
  rng = np.random.default_rng(0)
  flat = [random_bits(s, (6,), rng) for s in tree.flatten(spec)]
  flat[-1][:] = np.array([[3, -1], [0, 2**62]] * 3, np.int64)  # step_id
  rows = layout.pack(flat, 6)
  assert rows.shape == (6, layout.width) and rows.dtype == np.uint8
  for batch_rows, lead in ((rows, (6,)), (rows.reshape(2, 3, -1), (2, 3))):
    back = layout.unpack(batch_rows)
    for x, s, got in zip(flat, tree.flatten(spec), tree.flatten(back)):
      assert got.dtype == s.dtype and got.shape == lead + s.shape
      assert got.flags['C_CONTIGUOUS']
      assert got.reshape(x.shape).tobytes() == x.tobytes()


def test_signature_is_one_column_carrying_the_layout():
  """The tables store one uint8 [65, width] column whose name records the
  layout; it decodes back to agent.types.step_spec. A per-leaf (unpacked)
  signature or a width mismatch is rejected with a clear error."""
  config = make_config(size='size12m', batch_length=64)
  spec = types.step_spec(SPACES, config)
  sig = packed_window_signature(spec, config)
  assert list(sig) == [packing.PACKED_KEY]
  layout = packing.StepLayout.from_step_spec(spec)
  assert tuple(sig['step'].shape) == (65, layout.width)
  # 4,096 B deter + 256 B packed sign bits, the rest as in the signature.
  assert layout.width == sum(
      int(np.prod(s.shape)) * np.dtype(s.dtype).itemsize
      for s in tree.flatten(spec)) + config.deter // 8
  back = packing.StepLayout.from_signature(sig, length=65)
  assert back == layout
  for a, b in zip(tree.flatten(spec), tree.flatten(back.step_spec())):
    assert (a.shape, a.dtype, a.name) == (b.shape, b.dtype, b.name)
  tables = make_replay_tables(spec, config)
  assert all(t.info.signature == sig for t in tables)
  with pytest.raises(ValueError, match='not a packed replay step'):
    packing.StepLayout.from_signature(window_signature(spec, config))
  import tensorflow as tf
  bad = {'step': tf.TensorSpec((65, layout.width + 1), tf.uint8,
                               name=sig['step'].name)}
  with pytest.raises(ValueError, match='needs uint8'):
    packing.StepLayout.from_signature(bad)


@pytest.mark.parametrize('deter_dtype', ['bfloat16', 'float32'])
def test_sampled_windows_equal_inserted_steps_bitwise(deter_dtype):
  """spec 5.1, 5.7 through a real server at size1m (deter 512, 'planes'):
  each sampled row is the exact inserted steps of its window (arbitrary deter
  bits, stoch indices, flags) in the nested layout with spec dtypes, and the
  spec read back from the server matches agent.types.step_spec."""
  config = make_config(size='size1m', batch_size=4, batch_length=8,
                       replay_capacity=1000, latent_store_dtype=deter_dtype)
  spec = types.step_spec(SPACES, config)
  server = make_server(make_replay_tables(spec, config))
  try:
    client = server.localhost_client()
    back = step_spec_from_server(client, UNIFORM_TABLE)
    for a, b in zip(tree.flatten(spec), tree.flatten(back)):
      assert (a.shape, a.dtype) == (b.shape, b.dtype)
    adder = WindowAdder(client, config, num_workers=2)   # spec from server
    rng = np.random.default_rng(1)
    stored = []
    for n in range(20):
      step = jax.tree_util.tree_map(
          lambda s: random_bits(s, (2,), rng), spec)
      step['observation'] = {k: rng.normal(size=v.shape).astype(np.float32)
                             for k, v in step['observation'].items()}
      step['action'] = rng.normal(size=(2, 2)).astype(np.float32)
      step['reward'] = rng.normal(size=(2,)).astype(np.float32)
      step['is_first'][:] = n == 0
      step['is_last'][:] = False
      step['latent']['stoch'] = rng.integers(
          0, config.classes, (2, config.stoch), dtype=np.uint8)
      # Any finite deter bits: the adder refuses NaN / Inf latents
      # (test_pack_unpack_is_bitwise_lossless covers those patterns).
      deter = step['latent']['deter']
      bits = deter.view(np.uint16 if deter.itemsize == 2 else np.uint32)
      top = 0x7F80 if deter.itemsize == 2 else 0x7F800000
      bits[(bits & top) == top] ^= top & (top >> 1)
      del step['step_id']
      adder.add_batch(step)
      stored.append(step)
    adder.flush()
    sampler = ReplaySampler(client, config)                # spec from server
    batch = sampler.sample_report(40)
    for x, s in zip(tree.flatten(batch), tree.flatten(spec)):
      assert x.dtype == s.dtype and x.shape == (40, 9) + s.shape
      assert x.flags['C_CONTIGUOUS']
    for i in range(40):
      worker, start = batch['step_id'][i, 0]
      for t in range(config.seq_len):
        want = jax.tree_util.tree_map(lambda v: v[worker],
                                      stored[start + t])
        got = jax.tree_util.tree_map(lambda v: v[i, t], batch)
        np.testing.assert_array_equal(got['step_id'], [worker, start + t])
        assert got['latent']['deter'].tobytes() == (
            want['latent']['deter'].tobytes())
        np.testing.assert_array_equal(got['latent']['stoch'],
                                      want['latent']['stoch'])
        for k in ('a', 'b'):
          np.testing.assert_array_equal(got['observation'][k],
                                        want['observation'][k])
        np.testing.assert_array_equal(got['action'], want['action'])
        np.testing.assert_array_equal(got['reward'], want['reward'])
        assert got['is_terminal'] == want['is_terminal']
    adder.close()
  finally:
    server.stop()


def test_default_in_flight_items_never_force_a_chunk_or_warn():
  """Back-pressure bound: >= chunk_length + 2 (items waiting for the open
  chunk plus an online push, so no premature chunk) and, where possible,
  below Reverb's 50-pending-items warning."""
  from reverb_tables.adder import (DEFAULT_CHUNK_LENGTH,
                                   default_max_in_flight_items)
  for c in range(1, 66):
    k = default_max_in_flight_items(c)
    assert k >= c + 2
    if c + 2 <= 46:
      assert k <= 46
  assert default_max_in_flight_items(16) == 34       # 2c + 2, as before
  assert default_max_in_flight_items(DEFAULT_CHUNK_LENGTH) == 46
