"""The join service's claims: one authenticated connection's conversation.

One job: the messages of ``service.py``'s module doc on a connection the
gate authenticated (claim, steps, params, heartbeat, leave), each checked
against its claim and token in the book (``slots.JoinSlots``), leases that
run out, and the end of a claim (its slots freed, its adder flushed). The
steps and parameters themselves: ``storage.py``.
"""

from __future__ import annotations

import json
import socket
import threading
import time
import traceback
from typing import Any, Callable, Dict, Optional

from experiments.layouts.distributed.join import wire
from experiments.layouts.distributed.join.gate import RefusalLog
from experiments.layouts.distributed.join.slots import (
    HEARTBEAT_S, LEAVE_WAIT_S, JoinSlots)
from experiments.layouts.distributed.join.storage import (
    ActingParams, Refused, Session, StepStore)
from experiments.run.config import log
from experiments.run.log_files import atomic_write

# An authenticated connection must send its whole claim within this long
# (a secret holder cannot hold connections without claiming).
CLAIM_S = 10.0


class Claims:
  """Serves authenticated connections (module doc)."""

  def __init__(self, *, book: JoinSlots, lock: threading.Lock,
               store: StepStore, params: ActingParams, claims_file: str,
               settings_json: Callable[[], Dict[str, Any]],
               stopping: Callable[[], bool], log_refusal: RefusalLog):
    """``lock`` guards ``book``; ``claims_file`` keeps the claim numbers
    for an in-place restart; ``settings_json()``: the program's settings a
    claim is answered with; ``stopping()``: the program is stopping (no
    new claims, heartbeats answer 'stop')."""
    self._book, self._lock, self._store = book, lock, store
    self._params, self._claims_file = params, claims_file
    self._settings_json, self._stopping = settings_json, stopping
    self._log_refusal = log_refusal
    self.claim_s = CLAIM_S        # a test may set it lower
    self._by_claim: Dict[int, wire.Connection] = {}

  def count_refused(self) -> None:
    with self._lock:
      self._book.refused += 1

  def row(self) -> Dict[str, Any]:
    """``join/*`` train-row metrics and the recent remote episode scores."""
    with self._lock:
      self._book.expire(time.monotonic())
      return {**self._book.row(), 'recent_scores': self._store.recent_scores()}

  def state(self) -> Dict[str, int]:
    with self._lock:
      return self._book.state()

  def wait_left(self) -> int:
    """Waits until no claim is held, at most ``LEAVE_WAIT_S``; returns how
    many were still held then."""
    deadline = time.monotonic() + LEAVE_WAIT_S
    while time.monotonic() < deadline:
      with self._lock:
        self._book.expire(time.monotonic())
        if not self._book.active:
          return 0
      time.sleep(0.2)
    with self._lock:
      return len(self._book.active)

  def reap(self) -> None:
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

  def serve(self, conn: wire.Connection) -> None:
    """One authenticated connection, until it leaves, fails or is refused."""
    session: Optional[Session] = None
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
          conn.send({'type': 'stored',
                     'steps': self._store.store(session, header, arrays)})
        elif kind == 'heartbeat':
          conn.send({'type': 'heartbeat',
                     'answer': 'stop' if self._stopping() else 'ok',
                     'stats': dict(session.claim.stats)})
        elif kind == 'params':
          conn.send(*self._params.message(header.get('have')))
        elif kind == 'leave':
          self._store.flush(session)
          conn.send({'type': 'left', 'stats': dict(session.claim.stats)})
          return
        else:
          raise Refused(f'unknown message type {kind!r}')
    except Refused as e:
      why = f'refused: {e}'
      self.count_refused()
      try:
        conn.send({'type': 'refused', 'reason': str(e)})
      except (OSError, ValueError):
        pass
    except wire.WireError as e:
      why = f'refused a malformed frame: {e}'
      self.count_refused()
    except socket.timeout:            # only the claim has a deadline
      why = f'refused: no claim within {self.claim_s:g}s of the handshake'
      self.count_refused()
    except (ConnectionError, OSError) as e:
      why = f'connection lost ({e})'
    except Exception as e:  # noqa: BLE001  (one connection's failure only)
      why = f'failed: {e!r}\n{traceback.format_exc()}'
    finally:
      self._end(conn, session, why)

  def _claim(self, conn: wire.Connection, header: Dict[str, Any]) -> Session:
    if self._stopping():
      raise Refused('the program is stopping; nothing to join')
    with self._lock:
      try:
        c = self._book.claim(header.get('num_envs'), header.get('who'),
                             time.monotonic())
      except ValueError as e:
        raise Refused(str(e)) from None
      atomic_write(self._claims_file, json.dumps(self._book.state()))
    session = self._store.open(c)
    base = self._book.index_base(c)
    log(f'[join] {c.who} ({conn.peer}) joined: claim {c.claim}, workers '
        f'[{c.offset}, {c.offset + c.num_envs}), step ids from {base}')
    conn.send({'type': 'claimed', 'claim': c.claim, 'token': c.token,
               'offset': c.offset, 'num_envs': c.num_envs, 'index_base': base,
               'lease_s': self._book.lease_s, 'heartbeat_s': HEARTBEAT_S,
               'names': self._store.names, 'settings': self._settings_json()})
    return session

  def _check(self, session: Session, header: Dict[str, Any]) -> None:
    """The message names this connection's claim with its token."""
    with self._lock:
      held = self._book.check(header.get('claim'), header.get('token'),
                              time.monotonic())
    if held is not session.claim:
      raise Refused('unknown claim or wrong token (the claim has ended, or '
                    'this message is forged)')

  def _end(self, conn: wire.Connection, s: Optional[Session],
           why: str) -> None:
    """Ends the connection's claim (its slots are free once the peer sees
    the connection close), then flushes what its adder holds."""
    if s is not None:
      with self._lock:
        self._book.end(s.claim.claim)
        self._by_claim.pop(s.claim.claim, None)
    conn.close()
    kind = why.split(':', 1)[0]   # refused, refused a malformed frame, ...
    why, _, trace = why.partition('\n')  # a failure's traceback goes last
    if s is None:
      if why != 'left':
        self._log_refusal(kind, f'[join] {conn.peer} (authenticated, no '
                          f'claim): {why}' + (f'\n{trace}' if trace else ''))
      return
    if why != 'left':
      self._store.flush(s)
    self._store.close(s)
    st = s.claim.stats
    line = (f'[join] claim {s.claim.claim} ended ({why}): '
            f'{st["env_steps"]:.0f} env steps, {st["episodes"]:.0f} episodes, '
            f'{st["items"]:.0f} items') + (f'\n{trace}' if trace else '')
    if why.startswith(('refused', 'failed')):
      self._log_refusal(kind, line)
    else:
      log(line)
