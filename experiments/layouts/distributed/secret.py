"""The run secret: who may join a program, and who wrote its shared files.

A program with join slots or remote learner processes makes a per-run secret
(``secrets.token_hex``, 256 bits) in ``<logdir>/join.secret`` (or the file
``--join_secret_file`` names): created with mode 0600, never overwritten,
reused by every launch of the run. Remote actors prove they hold it to the
join service (``join/wire.py``); the remote learner processes' settings file
is authenticated with it (``remote_peers.py``).

Handing it to another host: with a shared file system, ``--join=<run
directory>`` reads it there; else copy the file (``scp``, mode 0600) and
pass ``--join_secret_file=PATH``, or put its text in ``$DREAMER_JOIN_SECRET``.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import secrets
from typing import Any, Mapping, Optional

from experiments.run.private_files import check_private

SECRET_FILE = 'join.secret'
SECRET_ENV = 'DREAMER_JOIN_SECRET'
SECRET_BYTES = 32
MIN_SECRET_BYTES = 16


def secret_path(logdir: str, secret_file: str = '') -> str:
  """Where the run's secret lives: ``secret_file``, else in the logdir."""
  return secret_file or os.path.join(logdir, SECRET_FILE)


def _parse(text: str, where: str) -> bytes:
  try:
    key = bytes.fromhex(text.strip())
  except ValueError:
    raise ValueError(f'{where}: the secret must be hex text (as the program '
                     'writes it)') from None
  if len(key) < MIN_SECRET_BYTES:
    raise ValueError(f'{where}: the secret has {len(key)} bytes, at least '
                     f'{MIN_SECRET_BYTES} are needed')
  return key


def ensure_secret(path: str) -> bytes:
  """The secret in ``path``, made there first if it does not exist
  (``O_EXCL``, mode 0600: never overwritten, never readable by others)."""
  os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
  try:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
  except FileExistsError:
    return read_secret(path)
  with os.fdopen(fd, 'w') as f:
    f.write(secrets.token_hex(SECRET_BYTES) + '\n')
    f.flush()
    os.fsync(f.fileno())
  return read_secret(path)


def read_secret(path: str) -> bytes:
  """The secret in ``path``; ValueError when it is missing, not private
  (``check_private``) or malformed."""
  if not os.path.isfile(path):
    raise ValueError(f'no run secret at {path}: the program writes it when '
                     'started with --join_slots or --remote_learner_processes')
  check_private(path, secret=True)
  with open(path) as f:
    return _parse(f.read(), path)


def joiner_secret(target: str, secret_file: str = '',
                  environ: Optional[Mapping[str, str]] = None,
                  flag: str = '--join') -> bytes:
  """Another host's copy of the secret (a remote actor's, ``flag`` --join,
  or a remote learner process's, --learner_peer): ``--join_secret_file``,
  else ``$DREAMER_JOIN_SECRET``, else ``<run directory>/join.secret`` when
  ``target`` is one. ValueError saying how to pass it otherwise."""
  environ = os.environ if environ is None else environ
  if secret_file:
    return read_secret(secret_file)
  if environ.get(SECRET_ENV):
    return _parse(environ[SECRET_ENV], f'${SECRET_ENV}')
  if os.path.isdir(target):
    return read_secret(os.path.join(target, SECRET_FILE))
  raise ValueError(
      f'{flag}: {target} needs the run secret (the program\'s '
      f'<logdir>/{SECRET_FILE}): pass --join_secret_file=PATH to a copy of '
      f'it (mode 0600) or set ${SECRET_ENV} to its text')


# --- files authenticated with the secret ---------------------------------------


def _mac(key: bytes, body: Mapping[str, Any]) -> str:
  text = json.dumps(body, sort_keys=True, separators=(',', ':')).encode()
  return hmac.new(key, text, hashlib.sha256).hexdigest()


def sign(key: bytes, body: Mapping[str, Any]) -> str:
  """``body`` as JSON with an HMAC-SHA256 tag of its canonical form."""
  return json.dumps({'body': dict(body), 'hmac': _mac(key, body)})


def verify(key: bytes, text: str, where: str) -> dict:
  """The body of a ``sign``ed text; ValueError unless its tag verifies."""
  try:
    doc = json.loads(text)
    body, tag = doc['body'], doc['hmac']
  except (ValueError, KeyError, TypeError):
    raise ValueError(f'{where} is not a signed settings file') from None
  if not (isinstance(tag, str) and isinstance(body, dict) and
          hmac.compare_digest(tag, _mac(key, body))):
    raise ValueError(f'{where}: its tag does not verify with the run secret '
                     '(written by someone without it, or altered)')
  return body
