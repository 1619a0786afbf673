r"""A remote actor: acts for a running Launchpad program from another host.

  python experiments/run_dmc.py --distributed --join=learner-host:7070 \
      --join_secret_file=join.secret --num_envs=4
  python experiments/run_dmc.py --distributed --join=runs/x --num_envs=4

``--join`` is the program's join service (``service.py``): HOST:PORT, or
its run directory (a shared file system), whose ``join.json`` names the
address and whose ``join.secret`` is the run secret. Otherwise the secret
comes from ``--join_secret_file`` or ``$DREAMER_JOIN_SECRET``
(``secret.joiner_secret``). The process proves it holds the secret
(``wire.py``), claims ``--num_envs`` join slots and gets the program's
settings as JSON: a remote actor has no settings of its own.

It then runs the builder's actor (``builder.make_actor``) in an
``acme.EnvironmentLoop`` (``experiments.run.env_loop``) over its envs, as
the program's actor nodes do, with two pieces that talk to the service
instead of Reverb and the learner: ``RemoteAdder`` sends each vector step
(the stored leaves as raw arrays, step ids filled from the claim's base; at
most ``STEPS_IN_FLIGHT`` ahead of the service's acknowledgements) and
``RemoteParams`` is the variable source (the learner's acting parameters,
checked against the shapes this process's own networks have). It opens no
connection but the one to the service.

A heartbeat every ``heartbeat_s`` keeps the claim; the service answers
'stop' when the program stops. The actor leaves (the service flushes its
open chunks and frees its slots) then, on Ctrl-C / SIGTERM, or when the
service refuses a message (its reason is printed) or goes away.

Why not a Launchpad program: Launchpad's local launcher starts the nodes of
one program on one machine and hands out their addresses itself; a node of
a program started elsewhere has no launcher that knows it (launchpad #45).
"""

from __future__ import annotations

import os
import socket
import threading
import time
from typing import Any, Dict, List, Optional, Tuple

import numpy as np

import agent  # noqa: F401  (jax compat before anything imports acme)
from experiments.layouts import stopping
from experiments.layouts.distributed.addresses import parse_address
from experiments.layouts.distributed.join import JOIN_FILE, wire
from experiments.layouts.distributed.secret import joiner_secret
from experiments.layouts.distributed.settings import ProgramSettings
from experiments.run import env_loop, rundir
from experiments.run.config import log, segment_seed
from experiments.run.experiment import experiment_of

# How long a joining actor keeps trying to reach the service at the start.
CONNECT_S = 300.0
# Frames before the claim (the program's settings) are at most this big.
HELLO_BYTES = 4 * 1024 * 1024
# Policy-stream index of join claim c: JOIN_STREAM + c (actor ids stay below).
JOIN_STREAM = 1 << 16
# How long the remote actor waits for the service's answer to leave.
LEAVE_S = 60.0
# Vector steps a remote actor sends ahead of the service's acknowledgements
# (service.py "Flow control").
STEPS_IN_FLIGHT = 4


def service_address(target: str) -> str:
  """``--join``: HOST:PORT as given, or the address in a run directory's
  ``join.json`` (the directory or the file itself)."""
  target = str(target)
  path = os.path.join(target, JOIN_FILE) if os.path.isdir(target) else target
  if os.path.isfile(path):
    return rundir.read_json(path)['address']
  if os.path.isdir(target):
    raise ValueError(f'--join {target}: no {JOIN_FILE} there (the program '
                     'writes it when started with --join_slots)')
  parse_address(target)
  return target


class _Link:
  """The connection's reader: routes the service's answers (params replies
  to the waiting fetch; 'stop' sets ``stop``; a refusal or a lost
  connection sets ``stop`` and ``error``)."""

  def __init__(self, conn: wire.Connection, stop: threading.Event):
    self.conn, self._stop = conn, stop
    self.error: Optional[str] = None       # refused, or the service is gone
    self.program_stopped = False
    self.stored = 0                        # vector steps the service stored
    self.stats: Dict[str, float] = {}
    self._replies: Dict[str, Any] = {}
    self._arrived = threading.Condition()
    threading.Thread(target=self._read, name='join-reader',
                     daemon=True).start()

  def _read(self) -> None:
    try:
      while True:
        header, arrays = self.conn.recv()
        kind = header.get('type')
        if kind == 'stored':
          with self._arrived:
            self.stored = int(header.get('steps', 0))
            self._arrived.notify_all()
          continue
        if kind == 'refused':
          self._fail(f'the program refused a message: {header.get("reason")}')
        elif kind == 'heartbeat':
          self.stats = header.get('stats') or {}
          if header.get('answer') != 'ok':
            self.program_stopped = True
            self._stop.set()
        with self._arrived:
          self._replies[kind] = (header, arrays)
          self._arrived.notify_all()
        if kind == 'left':           # the service closes the connection now
          return
    except (wire.WireError, ConnectionError, OSError) as e:
      if not self.conn.closed:
        self._fail(f'the join service went away ({e})')
      with self._arrived:
        self._arrived.notify_all()

  def _fail(self, why: str) -> None:
    if self.error is None:
      self.error = why
    self._stop.set()

  def wait_stored(self, steps: int) -> None:
    """Blocks until the service has stored ``steps`` vector steps (the
    rate limiter may hold it); ConnectionError when the link failed."""
    with self._arrived:
      while self.stored < steps:
        if self.error or self.conn.closed:
          raise ConnectionError(self.error or 'the connection is closed')
        self._arrived.wait(0.5)

  def wait(self, kind: str, timeout: float):
    """The next reply of ``kind`` (header, arrays), or None."""
    deadline = time.monotonic() + timeout
    with self._arrived:
      while kind not in self._replies:
        left = deadline - time.monotonic()
        if left <= 0 or self.conn.closed or self.error:
          return None
        self._arrived.wait(min(left, 0.5))
      return self._replies.pop(kind)


class RemoteAdder:
  """The actor's adder: each vector step goes to the join service, which
  checks and stores it with the program's adder (``service.py``)."""

  def __init__(self, link: _Link, ticket: Dict[str, Any]):
    self._link, self._ticket = link, ticket
    self._names = list(ticket['names'])
    self.num_workers = int(ticket['num_envs'])
    self._ids = np.stack([
        np.arange(self.num_workers, dtype=np.int64) + int(ticket['offset']),
        np.full(self.num_workers, int(ticket['index_base']), np.int64)], -1)
    self.steps = 0

  def add_batch(self, steps: Dict[str, Any]) -> None:
    flat = []
    for name in self._names:
      node = self._ids if name == 'step_id' else steps
      for part in name.split('/') if name != 'step_id' else ():
        node = node[part]
      flat.append(np.asarray(node))
    self._link.wait_stored(self.steps + 1 - STEPS_IN_FLIGHT)
    self._link.conn.send({'type': 'steps', 'claim': self._ticket['claim'],
                          'token': self._ticket['token'],
                          'names': self._names}, flat)
    self._ids[:, 1] += 1
    self.steps += 1


class RemoteParams:
  """Variable source over the join service ('policy', 'num_updates'):
  ``get_variables`` asks for the acting parameters (the service answers
  'same' while they have not changed) and checks them against ``expected``
  (this process's own acting params: names, shapes, dtypes)."""

  def __init__(self, link: _Link, ticket: Dict[str, Any], expected):
    import jax
    self._link, self._ticket = link, ticket
    self._expected = {tuple(k.key for k in path): (tuple(x.shape), x.dtype)
                      for path, x in jax.tree_util.tree_flatten_with_path(
                          expected)[0]}
    self._version, self._params = None, None
    self._lock = threading.Lock()

  @property
  def nbytes(self) -> int:
    return sum(int(np.prod(s)) * np.dtype(d).itemsize
               for s, d in self._expected.values())

  def get_variables(self, names):
    with self._lock:
      self._link.conn.send({'type': 'params', 'claim': self._ticket['claim'],
                            'token': self._ticket['token'],
                            'have': self._version})
      reply = self._link.wait('params', 120.0)
      if reply is None and self._params is not None and not self._link.error:
        reply = ({'same': True}, [])        # leaving: keep the last ones
      if reply is None:
        raise ConnectionError(self._link.error or 'no parameters from the '
                              'join service within 120 s')
      header, arrays = reply
      if not header.get('same'):
        self._params = self._unflatten(header.get('paths'), arrays)
        self._version = int(header['version'])
    table = {'policy': self._params, 'num_updates': self._version}
    return [table[n] for n in names]

  def _unflatten(self, paths, arrays) -> Dict[str, Any]:
    if not isinstance(paths, list) or len(paths) != len(arrays):
      raise wire.WireError('parameters without their names')
    got = {}
    for path, x in zip(paths, arrays):
      key = tuple(path) if isinstance(path, list) else None
      if key not in self._expected or (x.shape, x.dtype) != self._expected[key]:
        raise wire.WireError(f'parameter {path} {x.dtype}{list(x.shape)} is '
                             'not one of this policy\'s')
      got[key] = x
    if len(got) != len(self._expected):
      missing = sorted(set(self._expected) - set(got))[:3]
      raise wire.WireError(f'parameters missing: {missing}...')
    out: Dict[str, Any] = {}
    for key, x in got.items():
      node = out
      for k in key[:-1]:
        node = node.setdefault(k, {})
      node[key[-1]] = x
    return out


def _connect(address: str, secret: bytes, stop: threading.Event):
  """An authenticated connection, retrying while the service is not up yet
  or closes before its hello (at its cap of connections in their handshake:
  a flood of others must not make this actor give up), at most
  ``CONNECT_S``; ValueError at once when the secret is refused."""
  host, port = parse_address(address)
  deadline = time.monotonic() + CONNECT_S
  while True:
    try:
      return wire.connect(host, port, secret, HELLO_BYTES)
    except wire.AuthError as e:
      raise ValueError(f'could not join {address}: {e}') from None
    except OSError as e:
      if stop.is_set() or time.monotonic() > deadline:
        raise RuntimeError(f'could not reach the join service at {address} '
                           f'for {CONNECT_S:.0f}s: {e}') from None
      log(f'[join] waiting for the join service at {address}: {e}')
      stop.wait(5.0)


def _heartbeat(link: _Link, ticket: Dict[str, Any], every: float,
               stop: threading.Event) -> None:
  while not stop.wait(every):
    try:
      link.conn.send({'type': 'heartbeat', 'claim': ticket['claim'],
                      'token': ticket['token']})
    except (OSError, ValueError):
      return


def _claim(address: str, secret: bytes, num_envs: int,
           stop: threading.Event) -> Tuple[wire.Connection, Dict[str, Any]]:
  """(connection, ticket) of a claim of ``num_envs`` envs at ``address``;
  ValueError when the program refuses it."""
  conn = _connect(address, secret, stop)
  conn.send({'type': 'claim', 'num_envs': int(num_envs),
             'who': f'{socket.gethostname()}:{os.getpid()}'})
  header, _ = conn.recv()
  if header.get('type') != 'claimed':
    conn.close()
    raise ValueError(f'the program at {address} refused the join: '
                     f'{header.get("reason", header)}')
  return conn, header


def _leave(conn: wire.Connection, link: '_Link',
           ticket: Dict[str, Any]) -> Dict[str, float]:
  """Asks to leave (unless the link failed), closes the connection;
  returns the claim's stats as the service counted them."""
  stats: Dict[str, float] = dict(link.stats)
  if link.error is None:
    try:
      conn.send({'type': 'leave', 'claim': int(ticket['claim']),
                 'token': ticket['token']})
      left = link.wait('left', LEAVE_S)
      if left is not None:
        stats = left[0].get('stats') or stats
    except (OSError, ValueError) as e:
      log(f'[join] could not say goodbye to the program: {e}')
  conn.close()
  return stats


def _why_left(link: _Link, error: Optional[BaseException]) -> str:
  """Why a remote actor left, for its log line and summary. A lost link is
  the cause of the acting failure it brings (a fetch or a store on a closed
  connection), so the link's error is named first."""
  if link.error:
    return link.error
  if link.program_stopped:
    return 'the program stopped'
  return f'acting failed: {error!r}' if error is not None else 'a stop signal'


def join_program(target: str, num_envs: int, secret_file: str = '',
                 stop: Optional[threading.Event] = None) -> Dict[str, Any]:
  """Acts for the program at ``target`` with ``num_envs`` envs until it
  stops (or ``stop`` is set); returns a summary. ValueError when the address
  or the secret is wrong or the program refuses the join."""
  import jax
  from acme.utils import counting

  from agent import acting
  from agent.builder import seed_keys

  if num_envs < 1:
    raise ValueError(f'--num_envs must be >= 1, got {num_envs}')
  address = service_address(target)
  secret = joiner_secret(target, secret_file)
  stop = stop or threading.Event()
  conn, ticket = _claim(address, secret, num_envs, stop)
  settings = ProgramSettings.from_json(ticket['settings'], experiment_of)
  c, claim = settings.config, int(ticket['claim'])
  log(f'[join] claim {claim}: {num_envs} envs of {settings.run.task} as workers '
      f'[{ticket["offset"]}, {ticket["offset"] + num_envs}) of the program '
      f'at {address} (logdir {settings.run.logdir} there)')
  link = _Link(conn, stop)
  builder = settings.builder
  networks = builder.make_networks()
  expected = jax.eval_shape(lambda k: acting.acting_params(networks.init(k)),
                            jax.random.PRNGKey(0))
  source = RemoteParams(link, ticket, expected)
  conn.max_bytes = source.nbytes + wire.TAG_BYTES + HELLO_BYTES
  seed = segment_seed(c.seed, settings.segment, restart=1 + claim)
  env = settings.run.make_env(num_envs, seed, int(ticket['offset']))
  adder = RemoteAdder(link, ticket)
  key = jax.random.fold_in(jax.random.fold_in(
      seed_keys(c.seed)['actor'], JOIN_STREAM + claim), settings.segment)
  actor = builder.make_actor(key, builder.make_policy(networks), adder,
                             source, num_envs=num_envs,
                             update_period=settings.dist.update_period,
                             versioned=True)
  scores: List[float] = []
  observer = env_loop.EpisodeObserver(
      num_envs, on_episode=lambda ep: scores.append(ep.score))
  loop = env_loop.VectorEnvironmentLoop(env, actor, counting.Counter(),
                                        observers=[observer],
                                        should_stop=stop.is_set)
  threading.Thread(target=_heartbeat, name='heartbeat', daemon=True,
                   args=(link, ticket, float(ticket['heartbeat_s']),
                         stop)).start()
  failure: Dict[str, BaseException] = {}

  def act():
    try:
      actor.variable_client.update_and_wait()
      loop.run()
    except BaseException as e:  # noqa: BLE001  (reported below)
      failure['error'] = e
    finally:
      env.close()     # here: a renderer's GL context is this thread's
    stop.set()

  t0 = time.time()
  acting_thread = threading.Thread(target=act, name='acting', daemon=True)
  acting_thread.start()
  while not stop.wait(0.2):
    pass
  acting_thread.join(LEAVE_S)
  why = _why_left(link, failure.get('error'))
  stats = _leave(conn, link, ticket)
  wall = time.time() - t0
  log(f'[join] left ({why}): {stats.get("env_steps", 0):.0f} env steps, '
      f'{stats.get("episodes", 0):.0f} episodes, {stats.get("items", 0):.0f} '
      f'items stored in {wall:.0f}s')
  if link.error and link.error.startswith('the program refused'):
    raise ValueError(link.error)
  if 'error' in failure and link.error is None and not link.program_stopped:
    raise RuntimeError(f'remote actor failed: {failure["error"]!r}')
  return {'claim': claim, 'stopped_by': why, 'wall_s': wall,
          'steps': adder.steps, 'scores': list(scores), **stats}


def main(target: str, num_envs: int, secret_file: str = '') -> Dict[str, Any]:
  """``run_dmc.py --join``: ``join_program`` with Ctrl-C / SIGTERM leaving
  cleanly (a second Ctrl-C kills at once)."""
  import jax
  jax.config.update('jax_platforms', 'cpu')   # acting needs no accelerator
  stop = threading.Event()
  with stopping.SignalStop(
      event=stop, exit_code=130,
      on_first=lambda signum: log(f'[join] signal {signum}: leaving (again '
                                  'to kill at once)')):
    return join_program(target, num_envs, secret_file, stop)
