"""Authenticated, pickle-free messages over one TCP connection.

The join service (``service.py``) and a remote actor (``remote.py``) speak
this and nothing else. Everything is built from Python's ``hmac``,
``hashlib`` and ``secrets``; no cipher, hash or MAC of our own.

Handshake (both sides hold the run's secret K, ``secret.py``):

  server -> client   MAGIC | server nonce (32 random bytes)
  client -> server   client nonce (32) | HMAC-SHA256(K, 'client' | MAGIC | sn | cn)
  server -> client   'OK  ' | HMAC-SHA256(K, 'server' | MAGIC | sn | cn)
                     or 'DENY' | 32 zero bytes, and the server closes

The server reads exactly 64 bytes from the client and compares the tag
with ``hmac.compare_digest`` before it parses anything else the client
sends; the client checks the server's tag the same way, so neither side
talks to a peer that lacks the secret. The secret never crosses the wire.
``timeout`` is one deadline for the whole handshake, not a limit per read:
a peer that trickles its 64 bytes one at a time is cut off when the
deadline passes however often it sends.

Frames after the handshake, each way:

  u32 length N (big-endian, N <= max_bytes) | payload (N bytes) |
  HMAC-SHA256(session key of this direction, u64 sequence number | payload)

with the session keys HMAC-SHA256(K, 'c2s' | sn | cn) and
HMAC-SHA256(K, 's2c' | sn | cn), and a sequence number per direction from 0.
A frame is read whole (its declared length checked against the cap first)
and its tag checked before the payload is parsed, so a frame that was
altered, replayed, reordered or sent by a third party on the path is
refused. The traffic is authenticated, not encrypted: observations and
parameters are readable on the wire (README "Security").

Payload: u32 header length | header (a JSON object, UTF-8) | array bytes.
The header's 'arrays' lists each array as {'dtype', 'shape'} (dtype from
``DTYPES``); their raw C-order bytes follow in that order and must fill the
payload exactly. Arrays are rebuilt with ``np.frombuffer`` (never
``np.load``, never pickle). What a payload cannot be parsed into is a
``WireError`` naming why, never another exception: a header nested deeper
than the JSON decoder recurses, or whose numbers it cannot convert, and an
array whose declared size (the product of its shape, in Python integers:
numpy's int64 product wraps) exceeds what is left of the frame or whose
shape numpy could not make even empty (``MAX_ELEMENTS``).

Why our own framing rather than gRPC or TLS: gRPC with TLS needs
certificates a remote host must be given and trust; Python 3.10's ``ssl``
has no pre-shared-key mode; ``multiprocessing.connection`` authenticates
with HMAC-MD5 and only once per connection. This file is the smallest thing
that gives mutual authentication and per-frame integrity from a shared
secret with the standard library.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import secrets
import socket
import struct
import threading
import time
from typing import Any, Dict, List, Optional, Sequence, Tuple

import numpy as np

from experiments.layouts.distributed.addresses import format_address

MAGIC = b'dreamer-join/v1\n'          # 16 bytes: protocol and version
NONCE_BYTES = 32
TAG_BYTES = 32                        # HMAC-SHA256
OK, DENY = b'OK  ', b'DENY'
# Array dtypes a frame may carry (the step leaves, the policy parameters).
DTYPES = ('float32', 'float64', 'bfloat16', 'float16', 'uint8', 'uint16',
          'int32', 'int64', 'bool')
# The most array dimensions a frame may declare.
MAX_NDIM = 8
# The most elements a declared shape may have, its zero dimensions counted
# as 1: far above any frame, below numpy's limits for an empty array's shape.
MAX_ELEMENTS = 1 << 40
_LEN = struct.Struct('>I')
_SEQ = struct.Struct('>Q')


class WireError(Exception):
  """The peer sent something that is not a valid frame of this protocol."""


class AuthError(WireError):
  """The peer does not hold the run's secret (or speaks another protocol)."""


def _tag(key: bytes, *parts: bytes) -> bytes:
  return hmac.new(key, b''.join(parts), hashlib.sha256).digest()


def _dtype(name: str) -> np.dtype:
  if name == 'bfloat16':
    import ml_dtypes
    return np.dtype(ml_dtypes.bfloat16)
  return np.dtype(name)


def _recv_exact(sock: socket.socket, n: int,
                deadline: Optional[float] = None) -> memoryview:
  """``n`` bytes; with a ``deadline`` (``time.monotonic``) the socket
  timeout is what is left of it before each read, so the whole read ends by
  then (socket.timeout) however the peer paces its bytes."""
  buf = bytearray(n)
  view = memoryview(buf)
  got = 0
  while got < n:
    if deadline is not None:
      left = deadline - time.monotonic()
      if left <= 0:
        raise socket.timeout('the deadline passed')
      sock.settimeout(left)
    k = sock.recv_into(view[got:], n - got)
    if not k:
      raise ConnectionError('the peer closed the connection')
    got += k
  return view


# --- payloads -------------------------------------------------------------------


def encode(header: Dict[str, Any], arrays: Sequence[np.ndarray] = ()) -> List:
  """The payload of ``header`` and ``arrays`` as a list of buffers."""
  arrays = [np.ascontiguousarray(a) for a in arrays]
  meta = []
  for a in arrays:
    name = 'bfloat16' if a.dtype.name == 'bfloat16' else a.dtype.name
    if name not in DTYPES:
      raise ValueError(f'dtype {a.dtype} cannot be sent (allowed: {DTYPES})')
    meta.append({'dtype': name, 'shape': list(a.shape)})
  text = json.dumps({**header, 'arrays': meta}).encode()
  return [_LEN.pack(len(text)), text] + [
      memoryview(a.reshape(-1).view(np.uint8)) for a in arrays]


def decode(payload: memoryview) -> Tuple[Dict[str, Any], List[np.ndarray]]:
  """Header and arrays of a payload; WireError naming what is malformed."""
  if len(payload) < _LEN.size:
    raise WireError('frame shorter than its header length')
  (n,) = _LEN.unpack(payload[:_LEN.size])
  start = _LEN.size + n
  if start > len(payload):
    raise WireError(f'header length {n} exceeds the frame')
  try:
    header = json.loads(bytes(payload[_LEN.size:start]).decode())
  except (UnicodeDecodeError, ValueError) as e:
    raise WireError(f'header is not JSON: {e}') from None
  except RecursionError:
    raise WireError('header is nested deeper than the JSON decoder '
                    'recurses') from None
  if not isinstance(header, dict):
    raise WireError('header is not a JSON object')
  meta = header.pop('arrays', [])
  if not isinstance(meta, list):
    raise WireError("header 'arrays' is not a list")
  arrays, at = [], start
  for i, m in enumerate(meta):
    if not (isinstance(m, dict) and m.get('dtype') in DTYPES and
            isinstance(m.get('shape'), list) and len(m['shape']) <= MAX_NDIM and
            all(isinstance(d, int) and not isinstance(d, bool) and d >= 0
                for d in m['shape'])):
      raise WireError(f'array {i}: bad dtype or shape {m!r} (dtypes: '
                      f'{DTYPES})')
    dtype = _dtype(m['dtype'])
    size, bound = dtype.itemsize, 1
    for d in m['shape']:             # Python ints: no wrap-around
      size, bound = size * d, bound * max(d, 1)
      if bound > MAX_ELEMENTS:
        raise WireError(f'array {i}: shape {m["shape"]} is too large (more '
                        f'than {MAX_ELEMENTS} elements with its zero '
                        'dimensions counted as 1)')
    if at + size > len(payload):
      raise WireError(f'array {i} ({m["dtype"]}{m["shape"]}) exceeds the frame')
    arrays.append(np.frombuffer(payload[at:at + size], dtype).reshape(
        m['shape']))
    at += size
  if at != len(payload):
    raise WireError(f'{len(payload) - at} bytes after the last array')
  return header, arrays


# --- a connection -------------------------------------------------------------------


class Connection:
  """A socket after the handshake: ``send`` (any thread) and ``recv`` (one
  reader thread) of authenticated frames; ``recv`` refuses a frame over
  ``max_bytes`` (each side caps what it receives)."""

  def __init__(self, sock: socket.socket, send_key: bytes, recv_key: bytes,
               max_bytes: int, peer: str):
    self.sock, self.peer, self.max_bytes = sock, peer, int(max_bytes)
    self._send_key, self._recv_key = send_key, recv_key
    self._send_seq = self._recv_seq = 0
    self._lock = threading.Lock()
    self.closed = False

  def send(self, header: Dict[str, Any],
           arrays: Sequence[np.ndarray] = ()) -> None:
    parts = encode(header, arrays)
    n = sum(len(p) for p in parts)
    with self._lock:
      mac = hmac.new(self._send_key, _SEQ.pack(self._send_seq), hashlib.sha256)
      for p in parts:
        mac.update(p)
      self._send_seq += 1
      self.sock.sendall(_LEN.pack(n))
      for p in parts:
        self.sock.sendall(p)
      self.sock.sendall(mac.digest())

  def recv(self, deadline: Optional[float] = None
           ) -> Tuple[Dict[str, Any], List[np.ndarray]]:
    """The next frame; WireError when it is oversized, altered or malformed
    (the connection is then unusable), ConnectionError when it closed;
    socket.timeout when it has not arrived whole by ``deadline``
    (``time.monotonic``; None: wait as long as the socket's timeout says)."""
    try:
      (n,) = _LEN.unpack(_recv_exact(self.sock, _LEN.size, deadline))
      if n > self.max_bytes:
        raise WireError(f'frame of {n} bytes exceeds the cap of '
                        f'{self.max_bytes}')
      body = _recv_exact(self.sock, n + TAG_BYTES, deadline)
    finally:
      if deadline is not None:
        self.sock.settimeout(None)
    payload, tag = body[:n], body[n:]
    mac = hmac.new(self._recv_key, _SEQ.pack(self._recv_seq), hashlib.sha256)
    mac.update(payload)
    if not hmac.compare_digest(mac.digest(), bytes(tag)):
      raise WireError('frame tag does not verify (altered, replayed or not '
                      'from the authenticated peer)')
    self._recv_seq += 1
    return decode(payload)

  def close(self) -> None:
    self.closed = True
    for how in (lambda: self.sock.shutdown(socket.SHUT_RDWR), self.sock.close):
      try:
        how()
      except OSError:
        pass


def _keys(secret: bytes, sn: bytes, cn: bytes) -> Tuple[bytes, bytes]:
  return _tag(secret, b'c2s', sn, cn), _tag(secret, b's2c', sn, cn)


def server_handshake(sock: socket.socket, secret: bytes, max_bytes: int,
                     timeout: float = 10.0) -> Connection:
  """Authenticates the client on ``sock`` (module doc) within ``timeout``
  seconds in all; AuthError (the socket is closed) when it does not prove
  it holds ``secret`` by then."""
  peer = peer_name(sock)
  deadline = time.monotonic() + timeout
  sock.settimeout(timeout)
  try:
    sn = secrets.token_bytes(NONCE_BYTES)
    sock.sendall(MAGIC + sn)
    answer = bytes(_recv_exact(sock, NONCE_BYTES + TAG_BYTES, deadline))
    cn, tag = answer[:NONCE_BYTES], answer[NONCE_BYTES:]
    if not hmac.compare_digest(tag, _tag(secret, b'client', MAGIC, sn, cn)):
      try:
        sock.sendall(DENY + bytes(TAG_BYTES))
      except OSError:
        pass
      raise AuthError(f'{peer} did not prove it holds the run secret')
    sock.settimeout(max(deadline - time.monotonic(), 1e-3))
    sock.sendall(OK + _tag(secret, b'server', MAGIC, sn, cn))
  except socket.timeout:
    sock.close()
    raise AuthError(f'{peer}: no handshake within {timeout:g}s') from None
  except (OSError, ConnectionError) as e:
    sock.close()
    raise AuthError(f'{peer}: handshake failed ({e})') from None
  except AuthError:
    sock.close()
    raise
  sock.settimeout(None)
  c2s, s2c = _keys(secret, sn, cn)
  return Connection(sock, s2c, c2s, max_bytes, peer)


def client_handshake(sock: socket.socket, secret: bytes, max_bytes: int,
                     timeout: float = 30.0) -> Connection:
  """Proves to the server that this side holds ``secret`` and checks that
  the server does too; AuthError naming which side failed. A server that
  closes before its hello (it is at its cap of connections, or restarting)
  raises ConnectionError instead: worth trying again."""
  peer = peer_name(sock)
  deadline = time.monotonic() + timeout
  try:
    hello = bytes(_recv_exact(sock, len(MAGIC) + NONCE_BYTES, deadline))
  except OSError:
    sock.close()
    raise
  try:
    if hello[:len(MAGIC)] != MAGIC:
      raise AuthError(f'{peer} is not a join service of this version '
                      f'(it sent {hello[:len(MAGIC)]!r})')
    sn = hello[len(MAGIC):]
    cn = secrets.token_bytes(NONCE_BYTES)
    sock.sendall(cn + _tag(secret, b'client', MAGIC, sn, cn))
    status = bytes(_recv_exact(sock, len(OK) + TAG_BYTES, deadline))
  except (OSError, ConnectionError) as e:
    sock.close()
    raise AuthError(f'{peer}: handshake failed ({e})') from None
  if status[:len(OK)] != OK:
    sock.close()
    raise AuthError(f'{peer} refused the run secret: this is not the secret '
                    'of the run there (its <logdir>/join.secret)')
  if not hmac.compare_digest(status[len(OK):],
                             _tag(secret, b'server', MAGIC, sn, cn)):
    sock.close()
    raise AuthError(f'{peer} does not hold the run secret (not the program '
                    'you meant to join?)')
  sock.settimeout(None)
  c2s, s2c = _keys(secret, sn, cn)
  return Connection(sock, c2s, s2c, max_bytes, peer)


def connect(host: str, port: int, secret: bytes, max_bytes: int,
            timeout: float = 30.0) -> Connection:
  """An authenticated connection to the service at ``host:port``."""
  sock = socket.create_connection((host, port), timeout=timeout)
  keepalive(sock)
  return client_handshake(sock, secret, max_bytes, timeout)


def keepalive(sock: socket.socket, idle_s: int = 10, interval_s: int = 5,
              count: int = 3) -> None:
  """TCP keepalive: a peer that vanished (host down, cable pulled) is
  noticed within idle + interval * count seconds."""
  sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
  for name, value in (('TCP_KEEPIDLE', idle_s), ('TCP_KEEPINTVL', interval_s),
                      ('TCP_KEEPCNT', count)):
    if hasattr(socket, name):
      sock.setsockopt(socket.IPPROTO_TCP, getattr(socket, name), value)


def peer_name(sock: socket.socket) -> str:
  """'host:port' of the peer of ``sock`` ('?' once it is gone)."""
  try:
    return format_address(*sock.getpeername()[:2])
  except OSError:
    return '?'
