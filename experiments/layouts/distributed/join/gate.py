"""The join service's door: listening, accepting and authenticating.

One job: turn TCP connections into authenticated ``wire.Connection``\\ s, or
refuse them (``service.py``'s module doc: slow and hostile peers). The
whole handshake has one deadline (``handshake_s``); at most
``max_unauthenticated`` connections are in their handshake at once (more
are closed at accept); at most ``max_connections`` are authenticated at
once. A refusal is counted (``count_refused``) and logged through a
``RefusalLog``, at most one line of a kind per ``DENIED_LOG_S``.

Written here rather than taken from ``socketserver``: its servers have no
cap on connections in their handshake nor one deadline per handshake, the
two limits a flood must meet.
"""

from __future__ import annotations

import socket
import threading
import time
from typing import Callable, Dict, Tuple

from experiments.layouts.distributed.addresses import (  # noqa: F401
    advertised_host, format_address, listen_host)
from experiments.layouts.distributed.join import wire
from experiments.run.config import log

# A client must finish the whole handshake within this long (one deadline,
# however it paces its bytes).
HANDSHAKE_S = 10.0
# Connections at once that have not finished the handshake, half-open ones
# (the peer went silent or vanished) included until their deadline: more
# are closed at once, so a flood holds at most this many threads.
MAX_UNAUTHENTICATED = 16
# Seconds between log lines of one kind of refusal (a scan or a flood must
# not flood the log; the next line says how many were not logged).
DENIED_LOG_S = 10.0


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
  return format_address(advertised_host(bind), port)


class RefusalLog:
  """Log lines of refusals, at most one of a kind per ``DENIED_LOG_S``; the
  next one logged says how many were not."""

  def __init__(self):
    self._lock = threading.Lock()
    self._logged: Dict[str, Tuple[float, int]] = {}  # kind: (when, unlogged)

  def __call__(self, kind: str, line: str) -> None:
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


class Gate:
  """Accepts and authenticates connections (module doc); hands each
  authenticated one to ``serve(conn)`` on a thread of its own."""

  def __init__(self, *, sock: socket.socket, secret: bytes, max_in: int,
               max_connections: int, serve: Callable[[wire.Connection], None],
               count_refused: Callable[[], None], log_refusal: RefusalLog):
    self._sock, self._secret, self._max_in = sock, secret, max_in
    self._max_connections = max_connections
    self._serve, self._count_refused = serve, count_refused
    self._log_refusal = log_refusal
    self._lock = threading.Lock()
    self._denied = 0
    # Caps and deadlines (module constants; a test may set them lower).
    self.handshake_s = HANDSHAKE_S
    self.max_unauthenticated = MAX_UNAUTHENTICATED
    self._unauthenticated = 0              # accepted, handshake not done
    self._connections: Dict[int, wire.Connection] = {}   # by id()

  def start(self) -> None:
    threading.Thread(target=self._accept, name='join-accept',
                     daemon=True).start()

  def close(self) -> None:
    """Stops accepting and closes every authenticated connection."""
    self._sock.close()
    with self._lock:
      conns = list(self._connections.values())
    for conn in conns:
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
      threading.Thread(target=self._authenticate, args=(sock,),
                       name='join-conn', daemon=True).start()

  def _deny(self, why: str) -> None:
    """A connection refused before it authenticated: counted, logged at
    most once per ``DENIED_LOG_S``."""
    self._count_refused()
    with self._lock:
      self._denied += 1
      n = self._denied
    self._log_refusal('denied', f'[join] refused a connection: {why} ({n} '
                      'refused so far)')

  def _authenticate(self, sock: socket.socket) -> None:
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
      full = len(self._connections) >= self._max_connections
      if not full:
        self._connections[id(conn)] = conn
    if full:
      conn.close()
      self._deny(f'{conn.peer}: too many authenticated connections')
      return
    try:
      self._serve(conn)
    finally:
      conn.close()
      with self._lock:
        self._connections.pop(id(conn), None)
