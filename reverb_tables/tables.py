"""Reverb tables and server for the DreamerV3 replay (spec 5.1, 5.4, 6.1).

Two tables share the same chunks (spec 5.1, 5.4):

  ``uniform``  every 65-step window (stride 1), Uniform sampler, FIFO eviction
               at ``config.replay_capacity`` items (spec 5.1, 5.5: uniform only).
  ``online``   a FIFO queue (``reverb.Table.queue``) holding the non-overlapping
               windows that start at 1, 66, 131, ... of each worker stream
               (spec 5.4). Training pops it first (spec 5.3).

Items are windows of ``config.seq_len`` = T + replay_context = 65 steps
(spec 5.1, 5.8). Logically an item is ``agent.types.step_spec`` with a leading
time axis of that length (``window_signature``); the tables store it packed as
one uint8 column [65, width] (``packed_window_signature``,
``reverb_tables.packing``), which cuts Reverb's per-item, per-column chunk
bookkeeping. The adder packs and the sampler unpacks, so callers only see the
nested layout.

Rate limiting (spec 6.1): the ``uniform`` table takes the limiter it is
given: the builder's SampleToInsertRatio that holds train_ratio
(``agent.builder.DreamerBuilder.make_rate_limiter``, as acme's builders make
their own), or MinSize(1) by default, for tools that drive sampling
themselves.

  One process (the learner stepped by the spec 6.1 schedule after every
      transition): the layout adapts the builder's table from its own
      ``rate_limiter_info`` (``for_one_process``), as acme's one-process
      runner adapts a builder's tables: the same ratio with a band that covers
      what the synchronous loop cannot avoid, so the limiter never blocks the
      exact schedule: items wait in their workers' open chunks (up to
      ``num_workers * (chunk_length - 1)`` items the server has not seen,
      ``reverb_tables.adder``), so min_size_to_sample is lowered and the error
      buffer widened by that many inserts. ``can_sample`` lets the loop ask
      before an update instead of blocking (Acme's ``LocalLayout`` asks
      ``table.can_sample`` for its queues the same way): an update the limiter
      would refuse is deferred, never a deadlock
      (``experiments.layouts.scheduled``).
"""

from __future__ import annotations

import logging
from typing import List, Optional, Sequence

import reverb
import tensorflow as tf
import tree

from reverb_tables.config import ReplayConfig
from reverb_tables.packing import StepLayout

UNIFORM_TABLE = 'uniform'
ONLINE_TABLE = 'online'
TABLE_NAMES = (UNIFORM_TABLE, ONLINE_TABLE)


def window_signature(step_spec, config: ReplayConfig):
  """Per-step dm_env specs -> nested ``tf.TensorSpec`` of one item [65, ...].

  spec 5.1: an item is ``config.seq_len`` consecutive steps of one worker.
  ``config``: a ReplayConfig or any object with its fields.
  """
  config = ReplayConfig.of(config)
  length = config.seq_len

  def to_tensor_spec(path, spec):
    name = '/'.join(str(p) for p in path)
    return tf.TensorSpec((length,) + tuple(spec.shape), tf.as_dtype(spec.dtype),
                         name=name)

  return tree.map_structure_with_path(to_tensor_spec, step_spec)


def packed_window_signature(step_spec, config: ReplayConfig):
  """The stored table signature: ``{'step': uint8 [65, width]}``.

  The column name records the packing layout (``reverb_tables.packing``), so
  the nested step spec can be read back from the server
  (``reverb_tables.adder.step_spec_from_server``).
  """
  config = ReplayConfig.of(config)
  return StepLayout.from_step_spec(step_spec).signature(config.seq_len)


def online_queue_size(config: ReplayConfig) -> int:
  """Capacity of the online queue (spec 5.4 says unbounded).

  A Reverb queue blocks inserts when full, so the bound is set to the number of
  non-overlapping windows a full replay holds (capacity / 65, 76.9K at 5e6):
  with 16 workers the queue gains 16/65 items per vector step and training pops
  up to B per update, so it can only fill if nothing trains for >= capacity
  transitions.
  """
  return max(1, config.replay_capacity // config.seq_len)


def sync_lag_items(num_workers: int, chunk_length: int) -> int:
  """Items of a one-process loop that only its own progress sends to the
  server: the ones waiting in each worker's open chunk (module doc)."""
  return int(num_workers) * max(0, int(chunk_length) - 1)


def table_stats(client: reverb.Client, timeout: Optional[int] = None):
  """``{table: schema_pb2.TableInfo}`` (current_size, rate_limiter_info, ...)
  without decoding the signatures: ``client.server_info()`` decodes every
  table's signature through TensorFlow's structure coder, which is most of
  its ~0.5 ms; the sampler and the one-process loop ask every update."""
  from reverb.cc import schema_pb2
  out = {}
  for raw in client._client.ServerInfo(timeout or 0):  # noqa: SLF001
    info = schema_pb2.TableInfo.FromString(raw)
    out[info.name] = info
  return out


def can_sample(client: reverb.Client, num_samples: int,
               table: str = UNIFORM_TABLE) -> bool:
  """Whether ``table``'s rate limiter lets ``num_samples`` more samples
  through now (SampleToInsertRatio's rule, from ``table_stats``)."""
  info = table_stats(client)[table]
  rl = info.rate_limiter_info
  if info.current_size < rl.min_size_to_sample:
    return False
  diff = (rl.insert_stats.completed * rl.samples_per_insert
          - rl.sample_stats.completed - num_samples)
  return diff >= rl.min_diff


def make_replay_tables(step_spec, config: ReplayConfig,
                       rate_limiter=None) -> List[reverb.Table]:
  """Builds ``[uniform, online]`` (spec 5.1, 5.4, 5.5).

  Args:
    step_spec: per-step dm_env specs, ``agent.types.step_spec(spaces, config)``.
    config: a ReplayConfig (or any object with its fields, e.g. DreamerConfig)
      (capacity, seq_len).
    rate_limiter: the uniform table's ``reverb.rate_limiters`` limiter
      (module doc); None: MinSize(1).
  """
  config = ReplayConfig.of(config)
  signature = packed_window_signature(step_spec, config)
  online = reverb.Table.queue(                  # spec 5.4: FIFO, pop on sample
      name=ONLINE_TABLE, max_size=online_queue_size(config),
      signature=signature)
  return [_uniform_table(signature, config.replay_capacity,
                         rate_limiter or reverb.rate_limiters.MinSize(1)),
          online]


def _uniform_table(signature, max_size: int, rate_limiter):
  return reverb.Table(
      name=UNIFORM_TABLE,
      sampler=reverb.selectors.Uniform(),       # spec 5.5: uniform only
      remover=reverb.selectors.Fifo(),          # spec 5.1: FIFO eviction
      max_size=max_size,                        # spec 5.1: items, not episodes
      rate_limiter=rate_limiter, signature=signature)


def for_one_process(tables: Sequence[reverb.Table], *, num_workers: int,
                    chunk_length: int) -> List[reverb.Table]:
  """The builder's 'ratio' tables adapted to one process (module doc): the
  uniform table keeps its ratio, read back from its own
  ``rate_limiter_info``, and its band grows by the ``sync_lag_items`` that
  ``num_workers`` workers' open chunks of ``chunk_length`` hold back. What
  acme's one-process runner does to a builder's tables
  (``_disable_insert_blocking``): the layout, not the builder, knows whether
  actor and learner share a thread, and the config is not read again.
  Reverb 0.x has no ``Table.replace``, so the table is rebuilt from its info
  (signature, capacity; the sampler and remover are the uniform table's)."""
  lag = sync_lag_items(num_workers, chunk_length)
  out = []
  for table in tables:
    if table.name == UNIFORM_TABLE:
      info = table.info
      rl = info.rate_limiter_info
      spi = rl.samples_per_insert
      error_buffer = (rl.max_diff - rl.min_diff) / 2 + spi * lag
      table = _uniform_table(
          info.signature, info.max_size,
          reverb.rate_limiters.SampleToInsertRatio(
              samples_per_insert=spi,
              min_size_to_sample=max(1, rl.min_size_to_sample - lag),
              error_buffer=error_buffer))
    out.append(table)
  return out


def check_signatures(info, tables: Sequence[reverb.Table],
                     checkpoint_dir: str) -> None:
  """ValueError if a server (``server_info()`` result ``info``, e.g. restored
  from ``checkpoint_dir``) stores any of ``tables`` in another layout."""
  for table in tables:
    if info.get(table.name) is None or (
        info[table.name].signature != table.info.signature):
      raise ValueError(
          f'the Reverb checkpoint in {checkpoint_dir} stores table '
          f'{table.name!r} in another layout than this code writes (an '
          'incompatible version of reverb_tables wrote it); resume with that '
          'version or start a new --logdir')


def make_server(tables: Sequence[reverb.Table], port: Optional[int] = None,
                checkpoint_dir: Optional[str] = None) -> reverb.Server:
  """Starts an in-process Reverb server (``port=None`` picks a free port).

  With ``checkpoint_dir`` the server uses ``DefaultCheckpointer(checkpoint_dir)``:
  ``client.checkpoint()`` writes there, and at construction the server loads
  the latest checkpoint found there (resume, see ``reverb_tables.checkpoint``).

  Note: when a checkpoint is loaded, the server replaces the tables with the
  restored ones, so the ``tables`` objects passed in no longer reflect the
  live state; query sizes with ``client.server_info()``.
  """
  checkpointer = None
  if checkpoint_dir is not None:
    checkpointer = reverb.checkpointers.DefaultCheckpointer(path=checkpoint_dir)
  server = reverb.Server(tables=list(tables), port=port,
                         checkpointer=checkpointer)
  logging.info('Reverb replay server on port %d (checkpoint_dir=%s)',
               server.port, checkpoint_dir)
  return server
