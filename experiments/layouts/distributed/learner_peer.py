"""The other processes of a multi-process learner (``--learner_processes``).

Process 0 is the ``LearnerNode`` (variable source, metric rows,
checkpoints). Each process k >= 1 joins it through ``jax.distributed``
(``agent.parallel.initialize_processes``), builds the same learner over its
own dataset on the one Reverb server, and runs every update together with
process 0 (``agent.parallel.UpdateGate``): it samples its share of the batch
(``batch_size / learner_processes`` rows), the update runs data-parallel over
every process's devices, and the write-back latents of all rows reach every
process's latent store, so each store holds what one learner's would (spec
5.9). It writes nothing: no rows, no checkpoints, no counts. On resume it
loads the same checkpoint as process 0 (the run directory must be visible
to it). It stops when process 0 stops the learner or at the program's stop.
"""

from __future__ import annotations

import agent  # noqa: F401  (jax compat before anything imports acme)
from agent import parallel
from agent.builder import seed_keys
from agent.learner import StopRequested
from experiments.layouts.distributed.node_utils import (
    lp_hooks, record_error, wait_for_replay)
from experiments.layouts.distributed.spec import ProgramSpec
from experiments.run import rundir
from experiments.run.config import log
from reverb_tables import checkpoint as rckpt


class LearnerPeerNode:
  """Learner process ``process_id`` (>= 1) of ``spec.dist.learner_processes``."""

  def __init__(self, spec: ProgramSpec, process_id: int, replay):
    parallel.initialize_processes(spec.coordinator_address,
                                  spec.dist.learner_processes, process_id)
    self._spec, self._id = spec, int(process_id)
    self._stop_event, _ = lp_hooks()
    self._learner = None
    builder = spec.builder()
    wait_for_replay(replay, self._should_stop)
    self._dataset = builder.make_dataset_iterator(
        replay, should_stop=self._should_stop)
    self._learner = builder.make_learner(
        seed_keys(spec.config.seed)['learner'], builder.make_networks(),
        self._dataset, should_stop=self._should_stop)
    if spec.resume:
      rckpt.load_replay_state(spec.resume, None,
                              latent_store=self._dataset.latent_store)
      self._learner.restore(rundir.load_learner_state(spec.resume))
    log(f'[learner {self._id}] joined {spec.coordinator_address}: process '
        f'{self._id} of {spec.dist.learner_processes}, '
        f'{self._learner.num_steps} updates so far in this launch')

  def _should_stop(self) -> bool:
    return self._stop_event.is_set() or (
        self._learner is not None and self._learner.peers_stopped())

  def run(self) -> None:
    try:
      while not self._should_stop():
        self._learner.step()
    except StopRequested:
      pass
    except Exception:  # noqa: BLE001
      record_error(self._spec, f'learner-{self._id}')
      raise
    finally:
      self._dataset.close()
    log(f'[learner {self._id}] stopped after {self._learner.num_steps} updates')
    self._stop_event.wait()          # until the program stops
