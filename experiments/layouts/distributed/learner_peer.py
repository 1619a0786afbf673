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

Peers on other hosts (``--remote_learner_processes=R``: the last R of the
processes): the launcher publishes this launch's settings
(``ProgramSpec.to_json``) and Reverb address in
``<logdir>/learner_peers.json`` (``publish``), signed with the run secret
(``secret.sign``: JSON, never pickle), and ``run_dmc.py --distributed
--learner_peer=K --logdir=<the same run directory> [--bind=HOST]`` on the
other host runs process K from it (``run_remote_peer``), after checking the
file is private (``private_files``) and its tag verifies. The run directory
must be shared at the same path (the peer reads the settings and, on resume,
the checkpoint); a restarted program needs its remote peers started again.
The learner processes talk over jax.distributed, gloo and Reverb, which
have no authentication: they assume a trusted cluster network (README
"Security").
"""

from __future__ import annotations

import os
import time
from typing import Optional

import agent  # noqa: F401  (jax compat before anything imports acme)
from agent import parallel
from agent.builder import seed_keys
from agent.learner import StopRequested
from experiments.layouts.distributed.addresses import advertised_host
from experiments.layouts.distributed.node_utils import (
    in_launchpad, lp_hooks, record_error, wait_for_replay)
from experiments.layouts.distributed.secret import (
    joiner_secret, sign, verify)
from experiments.layouts.distributed.spec import ProgramSpec
from experiments.run import rundir
from experiments.run.private_files import check_private
from experiments.run.config import log
from reverb_tables import checkpoint as rckpt


class LearnerPeerNode:
  """Learner process ``process_id`` (>= 1) of ``spec.dist.learner_processes``."""

  def __init__(self, spec: ProgramSpec, process_id: int, replay,
               gloo_host: Optional[str] = None):
    parallel.initialize_processes(
        spec.coordinator_address, spec.dist.learner_processes, process_id,
        gloo_host=spec.dist.gloo_host if gloo_host is None else gloo_host)
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
      self._learner.restore(rundir.load_learner_state(
          spec.resume, self._learner.state))
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
    if in_launchpad():
      self._stop_event.wait()        # until the program stops


# --- peers on other hosts -----------------------------------------------------------

PEERS_FILE = 'learner_peers.json'


def publish(spec: ProgramSpec, replay_port: int,
            secret: bytes) -> Optional[str]:
  """Writes ``<logdir>/learner_peers.json`` for the remote peers of this
  launch (settings and Reverb address, signed with ``secret``); None
  without remote peers."""
  if not spec.dist.remote_learner_processes:
    return None
  path = os.path.join(spec.run.logdir, PEERS_FILE)
  replay = f'{advertised_host(spec.dist.bind)}:{int(replay_port)}'
  rundir.atomic_write(path, sign(secret, {'spec': spec.to_json(),
                                          'replay': replay}))
  first = spec.dist.learner_processes - spec.dist.remote_learner_processes
  log(f'[run] start learner processes {first}..'
      f'{spec.dist.learner_processes - 1} on their hosts (within 300 s): '
      f'python experiments/run_dmc.py --distributed --learner_peer=K '
      f'--logdir={spec.run.logdir} --bind=<that host>')
  return path


def run_remote_peer(logdir: str, process_id: int, bind: str = '',
                    secret_file: str = '', wait_s: float = 300.0) -> None:
  """Runs learner process ``process_id`` of the program whose run directory
  is ``logdir`` (``publish``); returns when that launch's learner stops.
  ValueError when the id is not one of the program's remote processes, or
  the settings file is not private or not signed with the run secret
  (``secret_file``, else ``$DREAMER_JOIN_SECRET``, else the logdir's)."""
  import reverb
  logdir = os.path.abspath(logdir)
  path = os.path.join(logdir, PEERS_FILE)
  deadline = time.monotonic() + wait_s
  while not os.path.exists(path):
    if time.monotonic() > deadline:
      raise RuntimeError(f'no {path} after {wait_s:.0f}s: start the program '
                         '(with --remote_learner_processes) first')
    time.sleep(1.0)
  # The program writes its secret before this file: read it now.
  key = joiner_secret(logdir, secret_file, flag='--learner_peer')
  check_private(path)
  with open(path) as f:
    info = verify(key, f.read(), path)
  spec = ProgramSpec.from_json(info['spec'])
  dist = spec.dist
  first = dist.learner_processes - dist.remote_learner_processes
  if not first <= process_id < dist.learner_processes:
    raise ValueError(f'--learner_peer {process_id}: the program at {logdir} '
                     f'waits for remote learner processes {first}..'
                     f'{dist.learner_processes - 1}')
  log(f'[learner {process_id}] joining {spec.coordinator_address} '
      f'(replay {info["replay"]})')
  node = LearnerPeerNode(spec, process_id, reverb.Client(info['replay']),
                         gloo_host=advertised_host(bind) if bind else '')
  node.run()
