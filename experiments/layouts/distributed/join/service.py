r"""The join service: the one way into a running program for remote actors.

  # the program (its run directory gets join.secret and join.json)
  python experiments/run_dmc.py --flagfile=... --distributed \
      --join_slots=8 --join_port=7070 --bind=0.0.0.0 --logdir=runs/x
  # any host that reaches it and holds the run secret (remote.py)
  python experiments/run_dmc.py --distributed --join=learner-host:7070 \
      --join_secret_file=join.secret --num_envs=4

A node of its own in the Launchpad program (group 'join', on the program's
host). It listens on ``--bind``:``--join_port`` ('' binds loopback only; in
a sealed program the launcher binds it in the host's network and hands it
to this node, ``seal.py``) for connections of ``wire.py``: a connection that does not prove it holds the
run secret (``secret.py``) is closed before anything else it sends is
parsed, and no message is ever unpickled. A remote actor never reaches the
Reverb server, the learner or the counter: this service stores its steps
through the program's own adder (``builder.make_adder``) on this host, so
they pass the rate limiter like any actor's, and serves it the learner's
acting parameters.

Slow and hostile peers: the whole handshake has one deadline
(``HANDSHAKE_S``, not a limit per read); at most ``MAX_UNAUTHENTICATED``
connections may be in their handshake at once (a silent or vanished peer
counts until its deadline; more are closed at accept, so a flood holds a
bounded number of threads); an authenticated connection must send its
claim within ``CLAIM_S``, so a secret holder cannot hold connections
without claiming, and at most ``join_slots + SPARE_CONNECTIONS`` are
authenticated at once. A frame the wire cannot parse (JSON nested past the
decoder's recursion, a shape whose size exceeds the frame) is a
``wire.WireError`` like any malformed frame: refused, counted, and logged
in one line; lines of one kind of refusal are logged at most once per
``DENIED_LOG_S``, the next one saying how many were not.

One connection holds at most one claim (``slots.JoinSlots``, a random
token that every later message must present). Messages, JSON headers with
raw arrays:

  claim {num_envs, who}        -> claimed {claim, token, offset, index_base,
                                  lease_s, heartbeat_s, settings (the
                                  program's, ``ProgramSettings.to_json``)}
  steps {claim, token, names} + one array per stored leaf, leading [n]
                               -> stored {steps: vector steps stored so far},
                                  or refused {reason}
  params {claim, token, have}  -> params {version, paths} + the acting
                                  parameters (or {version, same} when
                                  ``have`` is current)
  heartbeat {claim, token}     -> heartbeat {answer: 'ok' | 'stop', stats}
  leave {claim, token}         -> left {stats}, after its open chunks are
                                  flushed

Every step is checked before it is stored, against the run's step spec:
keys, shapes, dtypes, finite and plausible values, latent classes, step
ids equal to the claim's next ones (so inside its range and increasing; ``WindowAdder``,
``reverb_tables.step_checks``), the env protocol (``EpisodeTracker``) and
the claim's episode rate (``slots.EPISODE_RATE``). A refused message is
logged, counted (``join/refused``) and answered with its reason; its claim
ends and the connection closes. Nothing already stored changes, and the
run goes on with its replay ratio held (the limiter counts inserts).

The service, not the remote actor, counts the claim's env steps, episodes
and scores (from the steps it stored: an episode whose last step is
refused writes no score): they go into the program's counter
and budget, ``scores.jsonl`` and the train rows (``row()``, called by the
learner: ``join/*``, recent scores).

The rooms: ``gate.py`` (listening, the handshake, the caps on connections),
``claims.py`` (a connection's messages, checked against its claim),
``storage.py`` (the steps into replay, the parameters out). This node
puts them together and serves them until the program stops.

Courier methods (for the learner, on this host): ``row()``, ``state()``
(claim numbers, saved in checkpoints), ``stop_joiners()`` (the program is
stopping: heartbeats answer 'stop'; returns once every remote actor has
left, at most ``slots.LEAVE_WAIT_S``).
"""

from __future__ import annotations

import json
import os
import threading
from typing import Any, Dict

import agent  # noqa: F401  (jax compat before anything imports acme)
from experiments.layouts import stopping
from experiments.layouts.distributed import seal
from experiments.layouts.distributed.join import JOIN_FILE
from experiments.layouts.distributed.join.claims import CLAIM_S, Claims
from experiments.layouts.distributed.join.gate import (  # noqa: F401
    DENIED_LOG_S, HANDSHAKE_S, MAX_UNAUTHENTICATED, Gate, RefusalLog,
    format_address, join_address, listen_host, make_listener)
from experiments.layouts.distributed.join.slots import LEAVE_WAIT_S, JoinSlots
from experiments.layouts.distributed.join.storage import (  # noqa: F401
    PARAMS_REFRESH_S, ActingParams, Refused, StepStore)
from experiments.layouts.distributed.secret import secret_path
from experiments.run.config import log
from experiments.run.log_files import atomic_write

# Authenticated connections at once beyond the join slots.
SPARE_CONNECTIONS = 8
# Header bytes a message may add to its arrays.
HEADER_BYTES = 64 * 1024
# <launch_dir>/join_claims.json: claim numbers, for a service restarted in
# place (program.make_join_node).
CLAIMS_FILE = 'join_claims.json'


class JoinService:
  """The join service node (module doc)."""

  def __init__(self, *, settings, book: JoinSlots, make_adder, layout,
               counter, learner, secret: bytes, claims_file: str):
    """``program.make_join_node`` builds the pieces: the book of claims
    (restored), ``make_adder(num_workers, worker_offset)`` (the builder's
    adder on the program's Reverb server), the step layout, the synced
    counter, the learner's handle (parameters) and the run secret;
    ``claims_file`` keeps the claim numbers for an in-place restart."""
    self._settings = settings
    run, dist = settings.run, settings.dist
    self._stop = stopping.NodeStop()
    self._stopping = threading.Event()      # heartbeats answer 'stop'
    lock = threading.Lock()                 # guards the book
    # One refusal log for the gate and the claims (one line per kind of
    # refusal per DENIED_LOG_S, whichever room refused).
    self.refusal_log = log_refusal = RefusalLog()
    self._claims = Claims(
        book=book, lock=lock, claims_file=claims_file,
        store=StepStore(settings=settings, book=book, lock=lock,
                        make_adder=make_adder, counter=counter,
                        names=[f.name for f in layout.fields]),
        params=ActingParams(learner), settings_json=settings.to_json,
        stopping=self._is_stopping, log_refusal=log_refusal)
    if settings.join_listener:     # sealed: bound by the launcher (seal.py)
      sock, self.address = seal.receive_listener(settings.join_listener)
    else:
      sock = make_listener(dist.bind, dist.join_port)
      self.address = join_address(dist.bind, sock.getsockname()[1])
    self.port = sock.getsockname()[1]
    self._gate = Gate(
        sock=sock, secret=secret,
        max_in=HEADER_BYTES + book.max_envs * layout.width,
        max_connections=dist.join_slots + SPARE_CONNECTIONS,
        serve=self._claims.serve, count_refused=self._claims.count_refused,
        log_refusal=log_refusal)
    atomic_write(os.path.join(run.logdir, JOIN_FILE), json.dumps(
        {'address': self.address, 'join_slots': dist.join_slots,
         'segment': settings.segment}))
    where = (f'{self.address} (bound by the launcher outside the sealed '
             'program)' if settings.join_listener else
             f'{format_address(listen_host(dist.bind), self.port)}')
    log(f'[join] listening on {where}; remote '
        f'actors join with: python experiments/run_dmc.py --distributed '
        f'--join={self.address} --join_secret_file=<a copy of '
        f'{secret_path(run.logdir, dist.join_secret_file)}> --num_envs=N '
        f'(N <= {book.max_envs})')

  # Caps and deadlines (``HANDSHAKE_S``, ``MAX_UNAUTHENTICATED``,
  # ``CLAIM_S``); a test may set them lower.
  handshake_s = property(lambda self: self._gate.handshake_s,
                         lambda self, v: setattr(self._gate, 'handshake_s', v))
  max_unauthenticated = property(
      lambda self: self._gate.max_unauthenticated,
      lambda self, v: setattr(self._gate, 'max_unauthenticated', v))
  claim_s = property(lambda self: self._claims.claim_s,
                     lambda self, v: setattr(self._claims, 'claim_s', v))

  # -- courier methods (the learner) --------------------------------------------
  def row(self) -> Dict[str, Any]:
    """``join/*`` train-row metrics and the recent remote episode scores."""
    return self._claims.row()

  def state(self) -> Dict[str, int]:
    return self._claims.state()

  def stop_joiners(self) -> int:
    """The program is stopping: heartbeats answer 'stop'; returns once the
    remote actors have left (flushed), at most ``LEAVE_WAIT_S``; returns how
    many were still joined then."""
    self._stopping.set()
    left = self._claims.wait_left()
    if left:
      log(f'[join] {left} remote actors did not leave within '
          f'{LEAVE_WAIT_S:.0f}s; the final checkpoint goes without their '
          'last steps')
    return left

  # -- main thread -----------------------------------------------------------------
  def stop(self) -> None:
    """Stops serving (as a program stop does; outside Launchpad, tests)."""
    self._stop.program.set()

  def run(self) -> None:
    stopping.run_guarded(self._settings, 'join', self._run, restartable=True)

  def _is_stopping(self) -> bool:
    return self._stopping.is_set() or self._stop.program.is_set()

  def _run(self) -> None:
    self._gate.start()
    while not self._stop.program.wait(1.0):
      self._claims.reap()
    self._stopping.set()
    # The learner's final calls (stop_joiners, state) come first.
    stopping.serve_until_learner_done(self._settings)
    self._gate.close()
