"""Data-parallel learner placement on JAX's own engine (``jax.sharding``).

``LearnerPlacement(num_devices)`` builds a one-axis device mesh ('data') over
the first ``num_devices`` devices. The train step is jitted with the
``TrainingState`` replicated and every batch leaf split along its leading
(batch) axis; XLA's SPMD partitioner then runs each device on B / N rows and
inserts the all-reduces that make the batch means (losses, gradients, the
return normaliser's percentiles) global. Nothing here averages gradients by
hand: the update is the 1-device update, partitioned. Acting params go to one
``policy_device`` (the official code's ``--jax.policy_devices``).

With ``num_devices == 1`` nothing is sharded and the update is jitted as
before (one device, no mesh), so the default is unchanged.

Random numbers: jax's threefry is partitionable (``jax_threefry_partitionable``,
the default since jax 0.5), so a sharded update draws the same bits as the
unsharded one; the remaining difference between N devices and 1 is the order
of the floating-point reductions over the batch (each device sums its rows,
then the all-reduce sums the partial sums).
"""

from __future__ import annotations

import contextvars
from typing import Any, Optional

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec

DATA_AXIS = 'data'
# The mesh of the update being traced (``jax.sharding.use_mesh`` cannot be
# entered inside ``jax.jit``, and the update is traced inside it).
_TRACING_MESH: contextvars.ContextVar = contextvars.ContextVar(
    'dreamer_tracing_mesh', default=None)


def check_batch_size(batch_size: int, num_devices: int) -> None:
  """ValueError unless the batch splits evenly over the learner devices (the
  one place this rule lives: flags, builder and learner call it)."""
  if num_devices < 1 or batch_size % num_devices:
    raise ValueError(f'--batch_size {batch_size} must be a multiple of '
                     f'--learner_devices {num_devices} (each device trains on '
                     'batch_size / learner_devices rows)')


def data_parallel_tracing() -> bool:
  """True while the update is traced for a data-parallel placement."""
  return _TRACING_MESH.get() is not None


def shard_rows(x, axis: int = 0):
  """``x`` with its batch-row axis ``axis`` split over the data axis, when the
  update is being traced for a data-parallel placement (no-op otherwise).

  XLA's partitioner follows the batch's sharding on its own, except where a
  tensor does not come from the batch: the sampling noise of the observe and
  imagine scans. Left replicated, it made the partitioner run both scans
  replicated (every device on every row, after all-gathering their inputs);
  pinning the noise and the imagination starts to the row split keeps the
  scans data-parallel."""
  mesh = _TRACING_MESH.get()
  if mesh is None:
    return x
  spec = [None] * x.ndim
  spec[axis] = DATA_AXIS
  return jax.lax.with_sharding_constraint(
      x, NamedSharding(mesh, PartitionSpec(*spec)))


class LearnerPlacement:
  """Where the learner's state, batches and acting params live.

  Args:
    num_devices: devices of the data axis (the first ``num_devices`` of
      ``jax.devices()``, which spans every host after
      ``jax.distributed.initialize``).
    policy_device: index into ``jax.devices()`` of the device that serves
      acting params (default the first).
  """

  def __init__(self, num_devices: int = 1, policy_device: int = 0):
    devices = jax.devices()
    if not 1 <= num_devices <= len(devices):
      raise ValueError(
          f'--learner_devices={num_devices}, but jax sees {len(devices)} '
          f'device(s) ({devices[0].platform}); on a CPU, '
          'XLA_FLAGS=--xla_force_host_platform_device_count=N makes N')
    if not 0 <= policy_device < len(devices):
      raise ValueError(f'--policy_device={policy_device}, but jax sees '
                       f'{len(devices)} device(s)')
    self.num_devices = int(num_devices)
    self.policy_device = devices[policy_device]
    self.mesh: Optional[Mesh] = None
    if self.num_devices > 1:
      self.mesh = Mesh(np.array(devices[:self.num_devices]), (DATA_AXIS,))

  @property
  def sharded(self) -> bool:
    return self.mesh is not None

  @property
  def replicated(self) -> Optional[NamedSharding]:
    """Sharding of the TrainingState and the metrics (None: one device)."""
    return NamedSharding(self.mesh, PartitionSpec()) if self.mesh else None

  @property
  def batch(self) -> Optional[NamedSharding]:
    """Sharding of every batch leaf: rows split over the data axis."""
    return (NamedSharding(self.mesh, PartitionSpec(DATA_AXIS)) if self.mesh
            else None)

  def jit_update(self, update):
    """``update(state, batch) -> (state, metrics, outs)`` jitted for this
    placement; the input state is donated."""
    if not self.sharded:
      return jax.jit(update, donate_argnums=0)
    mesh = self.mesh

    def traced(state, batch):
      token = _TRACING_MESH.set(mesh)          # shard_rows sees the mesh
      try:
        return update(state, batch)
      finally:
        _TRACING_MESH.reset(token)
    return jax.jit(traced, donate_argnums=0,
                   in_shardings=(self.replicated, self.batch),
                   out_shardings=(self.replicated, self.replicated, self.batch))

  def put_state(self, state):
    """The TrainingState on the learner devices (replicated over the mesh)."""
    if not self.sharded:
      return jax.device_put(state)
    return jax.device_put(state, self.replicated)

  def put_batch(self, batch):
    """A host batch on the learner devices, rows split over the data axis."""
    if not self.sharded:
      return batch
    return jax.device_put(batch, self.batch)

  def put_policy(self, params: Any):
    """Acting params on the policy device."""
    return jax.device_put(params, self.policy_device)
