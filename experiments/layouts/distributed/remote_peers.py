"""Learner processes on other hosts (``--remote_learner_processes=R``: the
last R of the ``--learner_processes``).

The launcher publishes this launch's settings
(``ProgramSettings.to_json``) and Reverb address in
``<logdir>/learner_peers.json`` (``publish``), signed with the run secret
(``secret.sign``: JSON, never pickle), and ``run_dmc.py --distributed
--learner_peer=K --logdir=<the same run directory> [--bind=HOST]`` on the
other host runs process K from it (``run_remote_peer``), after checking the
file is private (``private_files``) and its tag verifies. The run directory
must be shared at the same path (the peer reads the settings and, on resume,
the checkpoint); a restarted program needs its remote peers started again.
The learner processes talk over jax.distributed, gloo and Reverb, which
have no authentication: they assume a trusted cluster network
(docs/security.md).
"""

from __future__ import annotations

import os
import time
from typing import Optional

from experiments.layouts.distributed import program
from experiments.layouts.distributed.addresses import (
    advertised_host, format_address)
from experiments.layouts.distributed.secret import joiner_secret, sign, verify
from experiments.layouts.distributed.settings import ProgramSettings
from experiments.run import rundir
from experiments.run.config import log
from experiments.run.experiment import experiment_of
from experiments.run.private_files import check_private

PEERS_FILE = 'learner_peers.json'


def publish(settings: ProgramSettings, replay_port: int,
            secret: bytes) -> Optional[str]:
  """Writes ``<logdir>/learner_peers.json`` for the remote peers of this
  launch (settings and Reverb address, signed with ``secret``); None
  without remote peers."""
  dist = settings.dist
  if not dist.remote_learner_processes:
    return None
  path = os.path.join(settings.run.logdir, PEERS_FILE)
  replay = format_address(advertised_host(dist.bind), replay_port)
  rundir.atomic_write(path, sign(secret, {'settings': settings.to_json(),
                                          'replay': replay}))
  first = dist.learner_processes - dist.remote_learner_processes
  log(f'[run] start learner processes {first}..'
      f'{dist.learner_processes - 1} on their hosts (within 300 s): '
      f'python experiments/run_dmc.py --distributed --learner_peer=K '
      f'--logdir={settings.run.logdir} --bind=<that host>')
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
  settings = ProgramSettings.from_json(info['settings'], experiment_of)
  dist = settings.dist
  first = dist.learner_processes - dist.remote_learner_processes
  if not first <= process_id < dist.learner_processes:
    raise ValueError(f'--learner_peer {process_id}: the program at {logdir} '
                     f'waits for remote learner processes {first}..'
                     f'{dist.learner_processes - 1}')
  log(f'[learner {process_id}] joining {settings.coordinator_address} '
      f'(replay {info["replay"]}); assumes a trusted network: the '
      'coordination service, gloo and Reverb authenticate nobody, and this '
      'process is not sealed (docs/security.md)')
  program.make_learner_peer_node(
      settings, process_id, reverb.Client(info['replay']),
      gloo_host=advertised_host(bind)).run()
