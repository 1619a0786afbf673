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

Courier methods (for the learner, on this host): ``row()``, ``state()``
(claim numbers, saved in checkpoints), ``stop_joiners()`` (the program is
stopping: heartbeats answer 'stop'; returns once every remote actor has
left, at most ``slots.LEAVE_WAIT_S``).
"""

from __future__ import annotations

import json
import os
import socket
import threading
import time
import traceback
from typing import Any, Dict, List, Optional, Tuple

import numpy as np

import agent  # noqa: F401  (jax compat before anything imports acme)
from experiments.envs.vector import EpisodeTracker
from experiments.layouts.distributed import seal
from experiments.layouts.distributed.addresses import advertised_host
from experiments.layouts.distributed.join import wire
from experiments.layouts.distributed.join.slots import (
    HEARTBEAT_S, LEAVE_WAIT_S, Claim, JoinSlots)
from experiments.layouts import stopping
from experiments.layouts.distributed.join import JOIN_FILE
from experiments.layouts.distributed.secret import secret_path
from experiments.run import rundir
from experiments.run.config import log

# A client must finish the whole handshake within this long (one deadline,
# however it paces its bytes).
HANDSHAKE_S = 10.0
# Connections at once that have not finished the handshake, half-open ones
# (the peer went silent or vanished) included until their deadline: more
# are closed at once, so a flood holds at most this many threads.
MAX_UNAUTHENTICATED = 16
# An authenticated connection must send its whole claim within this long
# (a secret holder cannot hold connections without claiming).
CLAIM_S = 10.0
# Authenticated connections at once beyond the join slots.
SPARE_CONNECTIONS = 8
# The service asks the learner for new acting parameters at most this often.
PARAMS_REFRESH_S = 1.0
# Header bytes a message may add to its arrays.
HEADER_BYTES = 64 * 1024
# Seconds between log lines of one kind of refusal (a scan or a flood must
# not flood the log; the next line says how many were not logged).
DENIED_LOG_S = 10.0
# <launch_dir>/join_claims.json: claim numbers, for a service restarted in
# place (program.make_join_node).
CLAIMS_FILE = 'join_claims.json'


class Refused(Exception):
  """A message the service does not take; its text goes back to the peer."""


def listen_host(bind: str) -> str:
  """Where the service listens: '' -> loopback only; else as given
  ('0.0.0.0': every IPv4 interface)."""
  return bind or '127.0.0.1'


def make_listener(bind: str, port: int) -> socket.socket:
  """The service's listening TCP socket on ``bind``:``port`` (0: a free
  port); made by the join node, or by the launcher of a sealed program in
  the host's network (``seal.py``)."""
  host = listen_host(bind)
  sock = socket.socket(socket.AF_INET6 if ':' in host else socket.AF_INET,
                       socket.SOCK_STREAM)
  sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
  sock.bind((host, port))
  sock.listen(16)
  return sock


def join_address(bind: str, port: int) -> str:
  """The address remote actors are told (``join.json``, the log)."""
  return f'{advertised_host(bind) if bind else "127.0.0.1"}:{int(port)}'


class _Session:
  """A connection's claim: its adder, episode tracker and episode clock."""

  def __init__(self, claim: Claim, adder, tracker: EpisodeTracker):
    self.claim, self.adder, self.tracker = claim, adder, tracker
    self.last_steps = time.monotonic()
    self.stored = 0                  # vector steps stored (acknowledged)


class JoinService:
  """The join service node (module doc)."""

  def __init__(self, settings, book: JoinSlots, make_adder, layout, counter,
               learner, secret: bytes, claims_file: str):
    """``program.make_join_node`` builds the pieces: the book of claims
    (restored), ``make_adder(num_workers, worker_offset)`` (the builder's
    adder on the program's Reverb server), the step layout, the synced
    counter, the learner's handle (parameters) and the run secret;
    ``claims_file`` keeps the claim numbers for an in-place restart."""
    self._settings, self._learner = settings, learner
    run, dist = settings.run, settings.dist
    self._stop = stopping.NodeStop()
    self._secret, self._book, self._make_adder = secret, book, make_adder
    self._counter, self._claims_file = counter, claims_file
    self._lock = threading.Lock()
    self._names = [f.name for f in layout.fields]
    self._max_in = HEADER_BYTES + book.max_envs * layout.width
    self._recent: List[float] = []
    self._stopping = threading.Event()      # heartbeats answer 'stop'
    self._params: Optional[Tuple[int, list, list]] = None
    self._params_at = -1e9
    self._params_lock = threading.Lock()
    self._denied = 0
    self._logged: Dict[str, Tuple[float, int]] = {}  # kind: (when, unlogged)
    # Caps and deadlines (module constants; a test may set them lower).
    self.handshake_s, self.claim_s = HANDSHAKE_S, CLAIM_S
    self.max_unauthenticated = MAX_UNAUTHENTICATED
    self._unauthenticated = 0              # accepted, handshake not done
    self._connections: Dict[int, wire.Connection] = {}   # by id()
    self._by_claim: Dict[int, wire.Connection] = {}
    if settings.join_listener:     # sealed: bound by the launcher (seal.py)
      self._sock, self.address = seal.receive_listener(settings.join_listener)
    else:
      self._sock = make_listener(dist.bind, dist.join_port)
      self.address = join_address(dist.bind, self._sock.getsockname()[1])
    self.port = self._sock.getsockname()[1]
    rundir.atomic_write(os.path.join(run.logdir, JOIN_FILE), json.dumps(
        {'address': self.address, 'join_slots': dist.join_slots,
         'segment': settings.segment}))
    where = (f'{self.address} (bound by the launcher outside the sealed '
             'program)' if settings.join_listener else
             f'{listen_host(dist.bind)}:{self.port}')
    log(f'[join] listening on {where}; remote '
        f'actors join with: python experiments/run_dmc.py --distributed '
        f'--join={self.address} --join_secret_file=<a copy of '
        f'{secret_path(run.logdir, dist.join_secret_file)}> --num_envs=N '
        f'(N <= {book.max_envs})')

  # -- courier methods (the learner) --------------------------------------------
  def row(self) -> Dict[str, Any]:
    """``join/*`` train-row metrics and the recent remote episode scores."""
    with self._lock:
      self._book.expire(time.monotonic())
      return {**self._book.row(), 'recent_scores': list(self._recent)}

  def state(self) -> Dict[str, int]:
    with self._lock:
      return self._book.state()

  def stop_joiners(self) -> int:
    """The program is stopping: heartbeats answer 'stop'; returns once the
    remote actors have left (flushed), at most ``LEAVE_WAIT_S``; returns how
    many were still joined then."""
    self._stopping.set()
    deadline = time.monotonic() + LEAVE_WAIT_S
    while time.monotonic() < deadline:
      with self._lock:
        self._book.expire(time.monotonic())
        if not self._book.active:
          return 0
      time.sleep(0.2)
    with self._lock:
      left = len(self._book.active)
    log(f'[join] {left} remote actors did not leave within '
        f'{LEAVE_WAIT_S:.0f}s; the final checkpoint goes without their last '
        'steps')
    return left

  # -- main thread -----------------------------------------------------------------
  def stop(self) -> None:
    """Stops serving (as a program stop does; outside Launchpad, tests)."""
    self._stop.program.set()

  def run(self) -> None:
    stopping.run_guarded(self._settings, 'join', self._run, restartable=True)

  def _run(self) -> None:
    threading.Thread(target=self._accept, name='join-accept',
                     daemon=True).start()
    while not self._stop.program.wait(1.0):
      self._reap()
    self._stopping.set()
    stopping.wait_for_learner(          # the learner's final calls come first
        self._settings.launch_dir, self._settings.dist.stop_grace_s)
    self._sock.close()
    for conn in list(self._connections.values()):
      conn.close()

  def _reap(self) -> None:
    """Closes the connections of claims whose lease ran out (a remote actor
    that hangs): their threads then end the claims."""
    with self._lock:
      dead = self._book.expire(time.monotonic())
      conns = [self._by_claim.get(c.claim) for c in dead]
    for c, conn in zip(dead, conns):
      log(f'[join] claim {c.claim} ({c.who}): nothing for '
          f'{self._book.lease_s:.0f}s; its lease ended')
      if conn is not None:
        conn.close()

  def _accept(self) -> None:
    while True:
      try:
        sock, _ = self._sock.accept()
      except OSError:
        return                        # closed
      with self._lock:
        full = self._unauthenticated >= self.max_unauthenticated
        if not full:
          self._unauthenticated += 1
      if full:
        self._deny(f'{wire.peer_name(sock)}: {self.max_unauthenticated} '
                   'connections are already in their handshake')
        sock.close()
        continue
      wire.keepalive(sock)
      threading.Thread(target=self._serve, args=(sock,), name='join-conn',
                       daemon=True).start()

  def _log_limited(self, kind: str, line: str) -> None:
    """Logs ``line`` unless a line of this ``kind`` was logged in the last
    ``DENIED_LOG_S``; the next one logged says how many were not."""
    with self._lock:
      now = time.monotonic()
      last, unlogged = self._logged.get(kind, (-1e9, 0))
      if now - last < DENIED_LOG_S:
        self._logged[kind] = (last, unlogged + 1)
        return
      self._logged[kind] = (now, 0)
    if unlogged:
      line += f' ({unlogged} more like it in {now - last:.0f}s not logged)'
    log(line)

  def _deny(self, why: str) -> None:
    """A connection refused before it authenticated: counted, logged at
    most once per ``DENIED_LOG_S``."""
    with self._lock:
      self._denied += 1
      self._book.refused += 1
      n = self._denied
    self._log_limited('denied', f'[join] refused a connection: {why} ({n} '
                      'refused so far)')

  # -- one connection -----------------------------------------------------------
  def _serve(self, sock: socket.socket) -> None:
    try:
      conn = wire.server_handshake(sock, self._secret, self._max_in,
                                   self.handshake_s)
    except wire.AuthError as e:
      self._deny(str(e))
      return
    finally:
      with self._lock:
        self._unauthenticated -= 1
    with self._lock:
      full = len(self._connections) >= self._settings.dist.join_slots + \
          SPARE_CONNECTIONS
      if not full:
        self._connections[id(conn)] = conn
    if full:
      conn.close()
      self._deny(f'{conn.peer}: too many authenticated connections')
      return
    session: Optional[_Session] = None
    why = 'left'
    try:
      while True:
        header, arrays = conn.recv(
            time.monotonic() + self.claim_s if session is None else None)
        kind = header.get('type')
        if session is None:
          if kind != 'claim':
            raise Refused(f"the first message must be a claim, got {kind!r}")
          session = self._claim(conn, header)
          self._by_claim[session.claim.claim] = conn
          continue
        self._check(session, header)
        if kind == 'steps':
          self._store(conn, session, header, arrays)
        elif kind == 'heartbeat':
          stop = self._stopping.is_set() or self._stop.program.is_set()
          conn.send({'type': 'heartbeat', 'answer': 'stop' if stop else 'ok',
                     'stats': dict(session.claim.stats)})
        elif kind == 'params':
          self._send_params(conn, header.get('have'))
        elif kind == 'leave':
          self._flush(session)
          conn.send({'type': 'left', 'stats': dict(session.claim.stats)})
          return
        else:
          raise Refused(f'unknown message type {kind!r}')
    except Refused as e:
      why = f'refused: {e}'
      with self._lock:
        self._book.refused += 1
      try:
        conn.send({'type': 'refused', 'reason': str(e)})
      except (OSError, ValueError):
        pass
    except wire.WireError as e:
      why = f'refused a malformed frame: {e}'
      with self._lock:
        self._book.refused += 1
    except socket.timeout:            # only the claim has a deadline
      why = f'refused: no claim within {self.claim_s:g}s of the handshake'
      with self._lock:
        self._book.refused += 1
    except (ConnectionError, OSError) as e:
      why = f'connection lost ({e})'
    except Exception as e:  # noqa: BLE001  (one connection's failure only)
      why = f'failed: {e!r}\n{traceback.format_exc()}'
    finally:
      self._end(conn, session, why)

  def _claim(self, conn: wire.Connection, header: Dict[str, Any]) -> _Session:
    if self._stopping.is_set() or self._stop.program.is_set():
      raise Refused('the program is stopping; nothing to join')
    with self._lock:
      try:
        c = self._book.claim(header.get('num_envs'), header.get('who'),
                             time.monotonic())
      except ValueError as e:
        raise Refused(str(e)) from None
      rundir.atomic_write(self._claims_file, json.dumps(self._book.state()))
    base = self._book.index_base(c)
    adder = self._make_adder(num_workers=c.num_envs, worker_offset=c.offset)
    adder.set_state({**adder.get_state(), 'lengths': [base] * c.num_envs})
    session = _Session(c, adder, EpisodeTracker(c.num_envs))
    log(f'[join] {c.who} ({conn.peer}) joined: claim {c.claim}, workers '
        f'[{c.offset}, {c.offset + c.num_envs}), step ids from {base}')
    conn.send({'type': 'claimed', 'claim': c.claim, 'token': c.token,
               'offset': c.offset, 'num_envs': c.num_envs, 'index_base': base,
               'lease_s': self._book.lease_s, 'heartbeat_s': HEARTBEAT_S,
               'names': self._names, 'settings': self._settings.to_json()})
    return session

  def _check(self, session: _Session, header: Dict[str, Any]) -> None:
    """The message names this connection's claim with its token."""
    with self._lock:
      held = self._book.check(header.get('claim'), header.get('token'),
                              time.monotonic())
    if held is not session.claim:
      raise Refused('unknown claim or wrong token (the claim has ended, or '
                    'this message is forged)')

  def _store(self, conn: wire.Connection, s: _Session,
             header: Dict[str, Any], arrays: List[np.ndarray]) -> None:
    """Checks one vector step of the claim and stores it (module doc)."""
    c, n = s.claim, s.claim.num_envs
    if header.get('names') != self._names or len(arrays) != len(self._names):
      raise Refused(f'steps must carry the keys {self._names} in this order')
    flat = dict(zip(self._names, arrays))
    flags = {}
    for k in ('reward', 'is_first', 'is_last'):
      x = flat[k]
      if x.shape != (n,):
        raise Refused(f'step key {k!r}: shape {list(x.shape)}, expected [{n}]')
      flags[k] = x
    try:
      episodes = s.tracker.update(flags)
    except ValueError as e:
      raise Refused(f'env protocol: {e}') from None
    now = time.monotonic()
    with self._lock:
      ok = self._book.allow_episodes(c, int(np.sum(flags['is_last'])),
                                     now - s.last_steps)
    s.last_steps = now
    if not ok:
      raise Refused('more episodes ended than any env can end (the cap of '
                    'slots.EPISODE_RATE per env and second)')
    steps: Dict[str, Any] = {}
    for name, x in flat.items():
      node = steps
      *parents, leaf = name.split('/')
      for p in parents:
        node = node.setdefault(p, {})
      node[leaf] = x
    items = s.adder.num_items_created
    c.busy = True                 # the rate limiter may hold the insert
    try:
      s.adder.add_batch(steps)
    except ValueError as e:
      raise Refused(str(e)) from None
    finally:
      c.busy = False
      c.last_seen = time.monotonic()
    repeat = self._settings.run.action_repeat
    ended = int(np.sum(flags['is_last']))
    counts = self._counter.increment(actor_steps=n, env_steps=n * repeat,
                                     episodes=ended)
    run = self._settings.run
    for ep in episodes:
      rundir.append_score(run.logdir, run.task, int(counts.get('env_steps', 0)),
                          ep.score, self._settings.config.seed)
    with self._lock:
      self._book.record(c, env_steps=n * repeat, episodes=len(episodes),
                        items=s.adder.num_items_created - items)
      self._recent = (self._recent + [ep.score for ep in episodes])[-5:]
    s.stored += 1
    conn.send({'type': 'stored', 'steps': s.stored})

  def _send_params(self, conn: wire.Connection, have: Any) -> None:
    version, paths, leaves = self._acting_params()
    if have == version:
      conn.send({'type': 'params', 'version': version, 'same': True})
    else:
      conn.send({'type': 'params', 'version': version, 'paths': paths}, leaves)

  def _acting_params(self) -> Tuple[int, list, list]:
    """(version, key paths, arrays) of the learner's acting params, asked
    at most every ``PARAMS_REFRESH_S``."""
    import jax
    with self._params_lock:
      now = time.monotonic()
      if self._params is None or now - self._params_at >= PARAMS_REFRESH_S:
        self._params_at = now
        version = int(self._learner.get_num_updates())
        if self._params is None or version != self._params[0]:
          params, version = self._learner.get_variables(
              ['policy', 'num_updates'])
          leaves = jax.tree_util.tree_flatten_with_path(params)[0]
          self._params = (int(version),
                          [[k.key for k in path] for path, _ in leaves],
                          [np.asarray(x) for _, x in leaves])
      return self._params

  def _flush(self, s: _Session) -> None:
    try:
      s.adder.flush(timeout_ms=int(LEAVE_WAIT_S * 1000))
    except Exception as e:  # noqa: BLE001  (those items are not stored)
      log(f'[join] claim {s.claim.claim}: flush failed ({e})')

  def _end(self, conn: wire.Connection, s: Optional[_Session],
           why: str) -> None:
    """Ends the connection's claim (its slots are free once the peer sees
    the connection close), then flushes what its adder holds."""
    if s is not None:
      with self._lock:
        self._book.end(s.claim.claim)
        self._by_claim.pop(s.claim.claim, None)
    conn.close()
    with self._lock:
      self._connections.pop(id(conn), None)
    kind = why.split(':', 1)[0]   # refused, refused a malformed frame, ...
    why, _, trace = why.partition('\n')  # a failure's traceback goes last
    if s is None:
      if why != 'left':
        self._log_limited(kind, f'[join] {conn.peer} (authenticated, no '
                          f'claim): {why}' + (f'\n{trace}' if trace else ''))
      return
    if why != 'left':
      self._flush(s)
    try:
      s.adder.close()
    except Exception:  # noqa: BLE001  (the server may be stopping)
      pass
    st = s.claim.stats
    line = (f'[join] claim {s.claim.claim} ended ({why}): '
            f'{st["env_steps"]:.0f} env steps, {st["episodes"]:.0f} episodes, '
            f'{st["items"]:.0f} items') + (f'\n{trace}' if trace else '')
    if why.startswith(('refused', 'failed')):
      self._log_limited(kind, line)
    else:
      log(line)
