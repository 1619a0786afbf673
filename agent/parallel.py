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

Several processes (hosts): after ``initialize_processes`` (JAX's own
``jax.distributed.initialize``; on the CPU its gloo collectives) the mesh
spans every process's devices, ``learner_devices / processes`` from each.
Each process samples its share of the batch (``local_batch_size`` rows) and
``put_batch`` assembles the global batch from the processes' rows
(``jax.make_array_from_process_local_data``): the same update, partitioned
over hosts (spec 4.3: the gradient is the mean over the data axis). Every process must run each update together, so ``UpdateGate``
holds them in step over the coordination service's key-value store (a
collective that one process enters while another still waits on Reverb
would time out: gloo gives up after 30 s).
"""

from __future__ import annotations

import contextvars
import signal
import threading
import time
from typing import Any, Callable, Optional

import jax
import numpy as np
from jax.experimental import multihost_utils
from jax.sharding import Mesh, NamedSharding, PartitionSpec

DATA_AXIS = 'data'
# The mesh of the update being traced (``jax.sharding.use_mesh`` cannot be
# entered inside ``jax.jit``, and the update is traced inside it).
_TRACING_MESH: contextvars.ContextVar = contextvars.ContextVar(
    'dreamer_tracing_mesh', default=None)


def check_batch_size(batch_size: int, num_devices: int) -> None:
  """ValueError unless the batch splits evenly over the learner devices (the
  one place this rule lives: the builder and a learner made without one
  call it, before anything is written)."""
  if num_devices < 1 or batch_size % num_devices:
    raise ValueError(f'--batch_size {batch_size} must be a multiple of '
                     f'--learner_devices {num_devices} (each device trains on '
                     'batch_size / learner_devices rows)')


def check_processes(num_devices: int, processes: int) -> None:
  """ValueError unless the learner devices split evenly over the learner
  processes (each process gives the mesh the same number of devices)."""
  if processes < 1 or num_devices % processes:
    raise ValueError(f'--learner_devices {num_devices} must be a multiple of '
                     f'--learner_processes {processes} (each learner process '
                     'gives the same number of devices)')


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


def initialize_processes(coordinator_address: str, num_processes: int,
                         process_id: int, timeout_s: int = 300,
                         gloo_host: str = '') -> None:
  """Joins this process to a multi-process learner (``jax.distributed``).

  Must run before anything touches a jax device. On the CPU it selects the
  gloo collectives (``jax_cpu_collectives_implementation``), so processes
  on one machine (127.0.0.1) or several reduce gradients over TCP. Gloo
  listens on the address of this machine's host name unless ``gloo_host``
  names another (``use_gloo_host``); the coordination service (process 0)
  listens on ``coordinator_address`` itself. A no-op for
  ``num_processes == 1``."""
  if num_processes <= 1:
    return
  if not 0 <= process_id < num_processes:
    raise ValueError(f'process id {process_id} is not in [0, {num_processes})')
  jax.config.update('jax_cpu_collectives_implementation', 'gloo')
  if gloo_host:
    use_gloo_host(gloo_host)
  # jax.distributed's preemption notifier takes over SIGTERM (it only
  # records it); the process's own stop handling gets it back.
  main = threading.current_thread() is threading.main_thread()
  term = signal.getsignal(signal.SIGTERM) if main else None
  # Process 0 runs the coordination service: it listens on the address the
  # others are given, not on every interface (jax's default '[::]:port').
  jax.distributed.initialize(
      coordinator_address=coordinator_address, num_processes=num_processes,
      process_id=process_id, initialization_timeout=timeout_s,
      coordinator_bind_address=coordinator_address if process_id == 0
      else None)
  if main and term is not None:
    signal.signal(signal.SIGTERM, term)


def use_gloo_host(host: str) -> None:
  """Makes the CPU backend's gloo collectives listen on ``host`` (a name or
  address the other learner hosts reach).

  Why: jax creates gloo with its defaults (``make_cpu_client``), which bind
  to the address this machine's host name resolves to; on many machines
  that is 127.0.0.1 or 127.0.1.1 (Debian's /etc/hosts), which no other host
  can reach. jax has no setting for it, so this registers the CPU backend
  again (before it is made) with jax's own gloo collectives given the
  host."""
  from jax._src import distributed, xla_bridge  # noqa: PLC0415  (no public hook)
  from jax._src.lib import xla_client  # noqa: PLC0415

  def make_cpu_client():
    collectives = xla_client._xla.make_gloo_tcp_collectives(  # noqa: SLF001
        distributed_client=distributed.global_state.client, hostname=host)
    return xla_bridge.make_cpu_client(collectives=collectives)

  xla_bridge.register_backend_factory('cpu', make_cpu_client, priority=0,
                                      fail_quietly=False)


def _kv_client():
  """The coordination service's client (``jax.distributed``'s own; the one
  handle jax gives to its key-value store and barriers)."""
  from jax._src import distributed  # noqa: PLC0415  (no public accessor)
  client = distributed.global_state.client
  if client is None:
    raise RuntimeError('jax.distributed is not initialized')
  return client


class UpdateGate:
  """Holds the processes of a multi-process learner in step (module doc).

  Before update ``n`` every process has its batch: each other process sets
  ``ready/<n>/<id>`` and waits for ``go/<n>``; process 0 waits for every
  ``ready`` and then sets ``go/<n>`` to '1', or to '0' when it stops. So
  the update's collectives start together (within the key-value round
  trip), however long Reverb's rate limiter held one of them, and a stop
  decided by process 0 reaches the others before or instead of an update.

  Why our own: jax offers ``wait_at_barrier``, but a barrier cannot be
  left when the run stops while a peer is blocked on Reverb; polling the
  key-value store with a stop check can.
  """

  PREFIX = 'dreamer/update_gate'

  def __init__(self, poll_s: float = 0.5):
    self._client = _kv_client()
    self.process = jax.process_index()
    self.processes = jax.process_count()
    self._poll_ms = max(1, int(poll_s * 1000))

  def _key(self, *parts) -> str:
    return '/'.join((self.PREFIX,) + tuple(str(p) for p in parts))

  def stopped(self) -> bool:
    """Whether process 0 has announced the stop (non-blocking)."""
    try:
      return self._client.key_value_try_get(self._key('stop')) == '1'
    except Exception:  # noqa: BLE001  (not set)
      return False

  def _get(self, key: str, should_stop: Callable[[], bool]) -> Optional[str]:
    while True:
      t0 = time.monotonic()
      try:
        return self._client.blocking_key_value_get(key, self._poll_ms)
      except Exception:  # noqa: BLE001  (timed out: check the stop, wait on)
        if should_stop():
          return None
        # A service that is gone fails at once: do not spin on it.
        time.sleep(max(0.0, self._poll_ms / 1000 - (time.monotonic() - t0)))

  def enter(self, n: int, should_stop: Callable[[], bool]) -> bool:
    """Called with update ``n``'s batch in hand; True: run the update
    (every process will), False: the run stops (no process will)."""
    if self.process == 0:
      for p in range(1, self.processes):
        if self._get(self._key('ready', n, p), should_stop) is None:
          self.stop(n)
          return False
      self._client.key_value_set(self._key('go', n), '1')
      if n >= 2:                                   # keep the store small
        for key in [self._key('go', n - 2)] + [
            self._key('ready', n - 2, p) for p in range(1, self.processes)]:
          try:
            self._client.key_value_delete(key)
          except Exception:  # noqa: BLE001
            pass
      return True
    self._client.key_value_set(self._key('ready', n, self.process), '1')
    go = self._get(self._key('go', n), lambda: should_stop() or self.stopped())
    return go == '1'

  def stop(self, n: int) -> None:
    """Process 0: no process runs update ``n`` or any later one."""
    if self.process != 0:
      return
    for key, value in ((self._key('stop'), '1'), (self._key('go', n), '0')):
      try:
        self._client.key_value_set(key, value)
      except Exception:  # noqa: BLE001  (already set)
        pass


class LearnerPlacement:
  """Where the learner's state, batches and acting params live.

  Args:
    num_devices: devices of the data axis: the first ``num_devices`` of
      ``jax.devices()`` in one process; with several processes
      (``jax.distributed``), ``num_devices / processes`` local devices of
      each, so the mesh spans every host.
    policy_device: index into this process's ``jax.local_devices()`` of the
      device that serves acting params (default the first).
  """

  def __init__(self, num_devices: int = 1, policy_device: int = 0):
    devices = jax.devices()
    local = jax.local_devices()
    self.processes = jax.process_count()
    if not 1 <= num_devices <= len(devices):
      raise ValueError(
          f'--learner_devices={num_devices}, but jax sees {len(devices)} '
          f'device(s) ({devices[0].platform}); on a CPU, '
          'XLA_FLAGS=--xla_force_host_platform_device_count=N makes N')
    check_processes(num_devices, self.processes)
    if not 0 <= policy_device < len(local):
      raise ValueError(f'--policy_device={policy_device}, but jax sees '
                       f'{len(local)} device(s) in this process')
    self.num_devices = int(num_devices)
    self.policy_device = local[policy_device]
    self.mesh: Optional[Mesh] = None
    if self.processes > 1:
      per = self.num_devices // self.processes
      chosen = [d for p in range(self.processes)
                for d in [x for x in devices if x.process_index == p][:per]]
      self.mesh = Mesh(np.array(chosen), (DATA_AXIS,))
    elif self.num_devices > 1:
      self.mesh = Mesh(np.array(devices[:self.num_devices]), (DATA_AXIS,))

  @property
  def multi_process(self) -> bool:
    return self.processes > 1

  @property
  def process_index(self) -> int:
    return jax.process_index()

  def local_batch_size(self, batch_size: int) -> int:
    """Rows this process samples per update (its share of the batch)."""
    return batch_size // self.processes

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
    """The TrainingState on the learner devices (replicated over the mesh).
    With several processes every one passes the same host state."""
    if not self.sharded:
      return jax.device_put(state)
    if self.multi_process:
      return jax.tree_util.tree_map(
          lambda x: jax.make_array_from_process_local_data(
              self.replicated, np.asarray(x)), state)
    return jax.device_put(state, self.replicated)

  def put_batch(self, batch):
    """A host batch on the learner devices, rows split over the data axis.
    With several processes ``batch`` holds this process's rows and the
    result is the global batch (the processes' rows in process order)."""
    if not self.sharded:
      return batch
    if self.multi_process:
      return jax.tree_util.tree_map(
          lambda x: jax.make_array_from_process_local_data(
              self.batch, np.asarray(x)), batch)
    return jax.device_put(batch, self.batch)

  def host(self, tree):
    """Numpy copies of replicated arrays (state, metrics) without running
    anything on the devices: every process holds a full replica."""
    if not self.multi_process:
      return jax.device_get(tree)
    return jax.tree_util.tree_map(
        lambda x: np.asarray(x.addressable_data(0)) if isinstance(x, jax.Array)
        else np.asarray(x), tree)

  def gather_rows(self, tree):
    """Numpy of row-split arrays (the update's write-back latents), every
    row on every process; ``tree`` may also be this process's host rows
    (``step_id``), gathered in the same process order as ``put_batch``."""
    if not self.multi_process:
      return jax.tree_util.tree_map(np.asarray, tree)
    return jax.tree_util.tree_map(
        np.asarray, multihost_utils.process_allgather(tree, tiled=True))

  def put_policy(self, params: Any):
    """Acting params on the policy device."""
    return jax.device_put(params, self.policy_device)
