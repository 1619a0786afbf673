r"""Sealing the program: its nodes listen where nothing outside the run reaches.

Launchpad's courier servers and Reverb bind every interface (``[::]:port``
in their C++; no parameter changes it), have no authentication, and courier
unpickles what it receives. A port that only the run's own processes can
reach is the only safe one, so a ``--distributed`` run (``--isolation=auto``,
the default) runs its Launchpad program in a private network namespace:

  launcher (host network)                 the program (private network)
  ----------------------                  -----------------------------
  prepare(): checks, --isolation          fork -> unshare(NEWUSER | NEWNET)
  the join listener, bound on --bind  ==> lo up; lp.launch(...): Reverb,
  and handed out over a Unix socket       courier nodes, coordinator, gloo
  in a folder of mode 0700 (SCM_RIGHTS)   on this namespace's loopback only;
  waits, passes SIGTERM on, returns       the join node accepts on the
  the summary                             listener it was handed

* **How.** The launcher forks a child that calls ``unshare(2)`` (through
  ctypes: Python 3.10 has no ``os.unshare``) with ``CLONE_NEWNET``, plus
  ``CLONE_NEWUSER`` when it is not root: an unprivileged user namespace
  maps the user's own uid and gid to themselves, so files and ids stay
  what they were, and gives the child ``CAP_NET_ADMIN`` over its new
  network to bring ``lo`` up (``SIOCSIFFLAGS``). Everything the child
  starts (Launchpad's node processes, restarts included) inherits the
  namespace; their listeners exist only on its ``lo``. The fork, not a new
  interpreter, keeps the launcher's imports: sealing costs a fork and an
  ``unshare``, nothing per step. Where jax has already made its threads in
  the launcher (a ``train(..., distributed=True)`` caller that computed
  before), a fork could deadlock on their locks, so the child (and the
  probe) is a new interpreter that enters the namespace before it imports
  anything, then unpickles its work (cloudpickle, as Launchpad ships
  nodes).
* **The join port.** A socket belongs to the namespace it was made in, so
  the launcher binds the join service's TCP listener in the host network
  before anything is sealed and hands the listening socket to the join node
  over a Unix socket in a folder of mode 0700 (Unix sockets are files: they
  cross network namespaces, and the folder's mode keeps other users out).
  The join node accepts on it as if it had bound it, and sees the real peer
  addresses; no relay copies the traffic.
* **Who is kept out.** Other hosts, and other users of this host (they can
  neither connect to the namespace's loopback nor enter the namespace,
  which takes ``CAP_SYS_ADMIN`` over the user namespace that owns it). The
  boundary is the user account: a process of the same user can enter the
  namespace (``nsenter``), as it could ptrace the nodes anyway.
* **Where the kernel refuses** (unprivileged user namespaces disabled,
  seccomp in a container): ``--isolation=auto`` runs unsealed, as before,
  and says so in one line naming the reason and the ports left open;
  ``--isolation=required`` refuses to start, before anything is written
  (``decide`` probes in a throw-away child); ``--isolation=off`` runs
  unsealed without a word (the behaviour before sealing).
* **Learner processes on other hosts** (``--remote_learner_processes``)
  need the replay server, the coordination service and learner process 0's
  gloo listener reachable from those hosts, and every node talks to the
  replay server, so all nodes stay in the host network: that mode assumes a
  trusted network (as jax.distributed does), says so in ``--help`` and in
  the log, and ``required`` refuses it. Sealing it would take a namespace
  per node group joined by veth pairs (root) and would still leave the
  replay server, the target of poisoned inserts, open to the cluster.

``DREAMER_SEAL_FAIL`` (tests): any non-empty value makes ``unshare`` fail
with EPERM, as a kernel that refuses does.
"""

from __future__ import annotations

import ctypes
import dataclasses
import errno
import fcntl
import json
import os
import shutil
import signal
import socket
import struct
import sys
import tempfile
import threading
import traceback
from typing import Any, Callable, Dict, Optional, Tuple

ISOLATION = ('auto', 'required', 'off')
FAIL_ENV = 'DREAMER_SEAL_FAIL'
# The Unix socket that hands the join node its listener, in a 0700 folder.
LISTENER_SOCKET = 'join-listener.sock'

_CLONE_NEWUSER = 0x10000000
_CLONE_NEWNET = 0x40000000
_SIOCGIFFLAGS, _SIOCSIFFLAGS, _IFF_UP = 0x8913, 0x8914, 0x1
_PR_SET_PDEATHSIG = 1

# Set in the sealed child: the program runs inside the namespace.
_inside = False


def inside() -> bool:
  """Whether this process runs in the sealed program's namespace."""
  return _inside


@dataclasses.dataclass(frozen=True)
class Decision:
  """What ``decide`` found: ``sealed``, or why not (``reason``)."""
  sealed: bool
  reason: str = ''


# --- the namespace ------------------------------------------------------------------


def _write(path: str, text: str) -> None:
  try:
    fd = os.open(path, os.O_WRONLY)
    try:
      os.write(fd, text.encode())
    finally:
      os.close(fd)
  except OSError as e:
    raise OSError(e.errno, f'writing {text!r} to {path}: {e.strerror}'
                  ) from None


def _loopback_up() -> None:
  with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
    req = struct.pack('16sH14x', b'lo', 0)
    flags = struct.unpack('16sH14x', fcntl.ioctl(s, _SIOCGIFFLAGS, req))[1]
    fcntl.ioctl(s, _SIOCSIFFLAGS, struct.pack('16sH14x', b'lo',
                                               flags | _IFF_UP))


def enter_private_network() -> None:
  """Moves this (single-threaded) process into a new network namespace with
  only ``lo``, up; an unprivileged user namespace first unless it is root
  (module doc). OSError naming the step that failed."""
  if os.environ.get(FAIL_ENV):
    raise OSError(errno.EPERM, f'unshare: {os.strerror(errno.EPERM)} '
                  f'(simulated: ${FAIL_ENV} is set)')
  libc = ctypes.CDLL(None, use_errno=True)
  uid, gid = os.geteuid(), os.getegid()
  tries = ([_CLONE_NEWNET] if uid == 0 else []) + [
      _CLONE_NEWUSER | _CLONE_NEWNET]
  for flags in tries:
    if libc.unshare(flags) == 0:
      break
    err = ctypes.get_errno()
  else:
    raise OSError(err, f'unshare(CLONE_NEWUSER|CLONE_NEWNET): '
                  f'{os.strerror(err)}')
  if flags & _CLONE_NEWUSER:
    _write('/proc/self/setgroups', 'deny')
    _write('/proc/self/uid_map', f'{uid} {uid} 1')
    _write('/proc/self/gid_map', f'{gid} {gid} 1')
  try:
    _loopback_up()
  except OSError as e:
    raise OSError(e.errno, f'bringing lo up: {e.strerror}') from None


def _fresh_env() -> Dict[str, str]:
  """The environment of a new interpreter that imports what this one does."""
  return {**os.environ, 'PYTHONPATH': os.pathsep.join(p for p in sys.path
                                                      if p)}


def _probe() -> str:
  """'' when this process may seal a child, else why not (a throw-away
  fork tries it; a new interpreter where jax's threads exist here)."""
  if _jax_running():
    import subprocess
    out = subprocess.run([sys.executable, '-m', __spec__.name, '--probe'],
                         capture_output=True, text=True, env=_fresh_env())
    return '' if out.returncode == 0 else (
        out.stderr.strip().splitlines() or [f'status {out.returncode}'])[-1]
  read, write = os.pipe()
  pid = os.fork()
  if pid == 0:                    # the probe: nothing but the syscalls
    code = 0
    try:
      os.close(read)
      enter_private_network()
    except BaseException as e:  # noqa: BLE001  (reported to the parent)
      os.write(write, str(e).encode()[:1000])
      code = 1
    os._exit(code)
  os.close(write)
  with os.fdopen(read, 'rb') as f:
    why = f.read().decode(errors='replace')
  _, status = os.waitpid(pid, 0)
  if status and not why:
    why = f'the probe process ended with status {status}'
  return why


def decide(dist) -> Decision:
  """Whether this launch is sealed (``dist.isolation``; module doc);
  ValueError for ``required`` when it cannot be, before anything is
  written."""
  if dist.isolation == 'off':
    return Decision(False, '--isolation=off')
  if dist.remote_learner_processes:
    reason = ('--remote_learner_processes: learner processes on other hosts '
              'reach the replay server, the coordination service and gloo, '
              'so the program runs in the host network and assumes a trusted '
              'one')
    if dist.isolation == 'required':
      raise ValueError(f'--isolation=required: cannot seal this program: '
                       f'{reason}')
    return Decision(False, reason)
  why = _probe()
  if why:
    if dist.isolation == 'required':
      raise ValueError(f'--isolation=required: cannot seal the program in a '
                       f'private network namespace: {why} (nothing was '
                       'written; --isolation=auto runs it unsealed)')
    return Decision(False, f'no private network namespace: {why}')
  return Decision(True)


def open_ports_line(reason: str, ports: Dict[str, list]) -> str:
  """The one log line of an unsealed run: why, and what listens where."""
  listed = ', '.join(f'{group} {",".join(str(p) for p in ps)}'
                     for group, ps in ports.items() if ps)
  return (f'[run] not sealed ({reason}): these ports listen on every '
          f'interface, reachable by other hosts and users without '
          f'authentication: {listed or "none"}')


# --- the join listener: bound here, accepted on there ----------------------------------


class ListenerBroker:
  """Binds the join service's TCP listener in this (host) network and hands
  it, with the address remote actors are told, to whoever connects to
  ``path`` (a Unix socket in a fresh folder of mode 0700)."""

  def __init__(self, listener: socket.socket, address: str):
    self.listener, self.address = listener, address
    self._dir = tempfile.mkdtemp(prefix='dreamer-seal-')   # mode 0700
    self.path = os.path.join(self._dir, LISTENER_SOCKET)
    self._server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    self._server.bind(self.path)
    self._server.listen(8)
    threading.Thread(target=self._serve, name='seal-broker',
                     daemon=True).start()

  def _serve(self) -> None:
    while True:
      try:
        conn, _ = self._server.accept()
      except OSError:
        return                       # closed
      with conn:
        try:
          socket.send_fds(conn, [json.dumps({'address': self.address})
                                 .encode()], [self.listener.fileno()])
        except OSError:
          pass

  def drop_in_child(self) -> None:
    """In the forked child: closes its copies of the two sockets (detached
    first, so no socket object closes the numbers again later)."""
    for s in (self._server, self.listener):
      try:
        os.close(s.detach())
      except OSError:
        pass

  def close(self) -> None:
    for s in (self._server, self.listener):
      try:
        s.close()
      except OSError:
        pass
    shutil.rmtree(self._dir, ignore_errors=True)


def receive_listener(path: str) -> Tuple[socket.socket, str]:
  """(listening socket, address to advertise) from a ``ListenerBroker``."""
  with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as c:
    c.settimeout(30)
    c.connect(path)
    data, fds, _, _ = socket.recv_fds(c, 4096, 1)
  if len(fds) != 1:
    raise OSError(f'{path}: no listening socket came')
  sock = socket.socket(fileno=fds[0])
  return sock, json.loads(data.decode())['address']


# --- the sealed child ------------------------------------------------------------------


def _child(body: Callable[[], Dict[str, Any]], result: str) -> int:
  """The sealed child's work: into the namespace, ``body()``, its summary
  or error as JSON in ``result``; returns the exit code."""
  global _inside
  code = 1
  try:
    ctypes.CDLL(None).prctl(_PR_SET_PDEATHSIG, int(signal.SIGTERM), 0, 0, 0)
    enter_private_network()
    _inside = True
    out = {'summary': body()}
    code = 0
  except BaseException as e:  # noqa: BLE001  (sent to the launcher)
    out = {'error': type(e).__name__, 'message': str(e),
           'traceback': traceback.format_exc()}
  with open(result, 'w') as f:
    json.dump(out, f, default=str)
  for stream in (sys.stdout, sys.stderr):   # os._exit does not flush
    try:
      stream.flush()
    except (OSError, ValueError):
      pass
  return code


def _jax_running() -> bool:
  """Whether jax has made its backends in this process (its threads exist:
  a fork of it could deadlock on their locks)."""
  bridge = sys.modules.get('jax._src.xla_bridge')
  return bool(getattr(bridge, '_backends', None))


def run_sealed(body: Callable[[], Dict[str, Any]],
               broker: Optional[ListenerBroker] = None,
               fresh: Optional[bool] = None) -> Dict[str, Any]:
  """Runs ``body()`` (the program's launch and restarts) in a child inside
  a private network namespace; returns its summary. The child's error comes
  back as the same class for ValueError and RuntimeError (what callers of
  ``launch.run`` catch), else as RuntimeError.

  The child is a fork of this process (its imports kept), or, when jax has
  already made its threads here (``fresh`` None: ``_jax_running``; a
  Python API caller that trained before), a new interpreter that unpickles
  ``body`` (cloudpickle, as Launchpad ships its nodes).

  Signals: the child shares this process group, so Ctrl-C (and a SIGINT to
  the group) reaches it and its nodes directly, as it did before sealing;
  this process only passes a SIGTERM sent to it on to the child."""
  result_fd, tmp = tempfile.mkstemp(prefix='dreamer-sealed-', suffix='.json')
  os.close(result_fd)
  if fresh is None:
    fresh = _jax_running()
  proc = None
  if fresh:
    import cloudpickle
    import subprocess
    folder = tempfile.mkdtemp(prefix='dreamer-sealed-')    # mode 0700
    job = os.path.join(folder, 'body.pkl')
    with os.fdopen(os.open(job, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600),
                   'wb') as f:
      cloudpickle.dump(body, f)
    proc = subprocess.Popen([sys.executable, '-m', __spec__.name, job, tmp],
                            env=_fresh_env())
    pid = proc.pid
  else:
    pid = os.fork()
    if pid == 0:
      code = 1
      try:
        if broker is not None:
          broker.drop_in_child()
        code = _child(body, tmp)
      finally:
        os._exit(code)
  old = {}
  if threading.current_thread() is threading.main_thread():
    old = {signal.SIGINT: signal.signal(signal.SIGINT, lambda *_: None),
           signal.SIGTERM: signal.signal(
               signal.SIGTERM, lambda *_: os.kill(pid, signal.SIGTERM))}
  try:
    status = proc.wait() if proc is not None else os.waitpid(pid, 0)[1]
  finally:
    for sig, handler in old.items():
      signal.signal(sig, handler)
    if broker is not None:
      broker.close()
    if proc is not None:
      shutil.rmtree(folder, ignore_errors=True)
  try:
    with open(tmp) as f:
      out = json.load(f)
  except (OSError, ValueError):
    out = {'error': 'RuntimeError',
           'message': f'the sealed program ended with status {status} and '
                      'no result'}
  finally:
    os.remove(tmp)
  if 'summary' in out:
    return out['summary']
  kind = {'ValueError': ValueError}.get(out['error'], RuntimeError)
  message = out['message']
  if out['error'] not in ('ValueError', 'RuntimeError'):
    message = f'{out["error"]}: {message}\n{out.get("traceback", "")}'
  raise kind(message)


def _main(argv) -> int:
  """``python -m experiments.layouts.distributed.seal BODY.pkl RESULT.json``:
  the fresh-interpreter child of ``run_sealed`` (``--probe``: ``_probe``'s). It enters the namespace
  before it unpickles (and so imports) anything: an unprivileged
  ``unshare(CLONE_NEWUSER)`` needs a single-threaded process."""
  import importlib
  module = importlib.import_module(  # this file as itself, not __main__
      'experiments.layouts.distributed.seal')
  if argv[1:] == ['--probe']:
    try:
      module.enter_private_network()
    except OSError as e:
      print(e, file=sys.stderr)
      return 1
    return 0

  def body():
    import cloudpickle
    from experiments.run.private_files import check_private
    # The launcher wrote it into a 0700 folder of its own: refuse a file (or
    # folder) another user could have written before anything is unpickled.
    check_private(argv[1], secret=True)
    with open(argv[1], 'rb') as f:
      return cloudpickle.load(f)()
  return module._child(body, argv[2])  # noqa: SLF001


if __name__ == '__main__':
  sys.exit(_main(sys.argv))
