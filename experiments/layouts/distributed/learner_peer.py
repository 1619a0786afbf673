"""The other processes of a multi-process learner (``--learner_processes``).

Process 0 is the ``LearnerNode`` (variable source, metric rows,
checkpoints). Each process k >= 1 joins it through ``jax.distributed``
(``agent.parallel.initialize_processes``), builds the same learner over its
own dataset on the one Reverb server (``program.make_learner_peer_node``),
and runs every update together with process 0
(``agent.parallel.UpdateGate``): it samples its share of the batch
(``batch_size / learner_processes`` rows), the update runs data-parallel over
every process's devices, and the write-back latents of all rows reach every
process's latent store, so each store holds what one learner's would (spec
5.9). It writes nothing: no rows, no checkpoints, no counts. On resume it
loads the same checkpoint as process 0 (the run directory must be visible
to it). It stops when process 0 stops the learner or at the program's stop.
Processes on other hosts: ``remote_peers.py``.
"""

from __future__ import annotations

import agent  # noqa: F401  (jax compat before anything imports acme)
from experiments.layouts import stopping
from experiments.run.config import log


class LearnerPeerNode:
  """Learner process ``process_id`` (>= 1) of ``dist.learner_processes``."""

  def __init__(self, *, settings, process_id: int, learner, dataset,
               stop: stopping.NodeStop):
    """``stop``: the program's, and process 0 stopping the learner
    (``program.make_learner_peer_node``)."""
    self._settings, self._id = settings, int(process_id)
    self._learner, self._dataset, self._stop = learner, dataset, stop
    log(f'[learner {self._id}] joined {settings.coordinator_address}: '
        f'process {self._id} of {settings.dist.learner_processes}, '
        f'{learner.num_steps} updates so far in this launch')

  def run(self) -> None:
    # Process 0 decides on the program; a peer's failure is recorded and
    # re-raised, even during the stop.
    stopping.run_guarded(self._settings, f'learner-{self._id}', self._train,
                         cleanup=self._dataset.close, stops_program=False,
                         record_while_stopping=True)
    log(f'[learner {self._id}] stopped after {self._learner.num_steps} updates')
    if stopping.in_launchpad():
      self._stop.program.wait()        # until the program stops

  def _train(self) -> None:
    while not self._stop.requested():
      self._learner.step()
