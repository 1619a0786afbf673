"""Node restarts of the Launchpad program.

A dead actor or evaluator node is restarted in place (``RestartingWorkerManager``);
any other dead node -- learner, replay, counter, step limiter -- ends the
launch, and ``launch.run`` restarts the program from the last
complete checkpoint. Both are bounded by ``--max_restarts``; past the bound
the run stops with a ``NodeExit.report()``: the node, its exit status and the
last lines of its log.

Why a piece of our own: Launchpad's ``local_mp`` ``WorkerManager`` stops the
whole program at the first worker that exits with a non-zero status
(``_check_workers`` -> ``_stop``), and neither it nor acme
(``acme.utils.lp_utils``) restarts a worker. ``RestartingWorkerManager`` is
that manager with one change: before its own check, a dead process of a
restartable group is started again with the same command and environment
(plus ``RESTART_ENV`` = its restart count, from which the node takes a
new env seed segment and fresh step ids) and its output appended to the same
log file. Everything else -- stop signals, the termination notice, killing --
stays Launchpad's. ``installed()`` makes ``launch_local_output_to_files``
build this manager for one ``lp.launch`` call.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import signal
import subprocess
import threading
import types
from typing import Callable, Dict, List, Optional

from launchpad.launch import worker_manager
from launchpad.launch.run_locally import launch_local_output_to_files

from experiments.run.log_files import tail_lines

TAIL_LINES = 20
# Set by the supervisor in the environment of a node it restarts in place:
# the restart count k >= 1.
RESTART_ENV = 'DREAMER_NODE_RESTART'
# Node groups restarted in place; any other dead node restarts the program.
RESTARTABLE_GROUPS = ('actor', 'evaluator', 'join')
# Deaths by these signals belong to a program's stop, never its cause:
# SIGTERM is Launchpad's stop request to each node, and SIGALRM the 1 s alarm
# Launchpad's stop handler then arms inside every node
# (worker_manager._stop_or_kill); a node whose interpreter is already
# shutting down when that alarm fires dies by it.
STOP_SIGNALS = (signal.SIGTERM, signal.SIGALRM)


def node_restart() -> int:
  """This node process's in-place restart count (0: its first start)."""
  return int(os.environ.get(RESTART_ENV, '0') or 0)


def exit_status(returncode: int) -> str:
  """'exit code 1' / 'killed by SIGKILL (-9)'."""
  if returncode < 0:
    try:
      return f'killed by {signal.Signals(-returncode).name} ({returncode})'
    except ValueError:
      pass
  return f'exit code {returncode}'


def log_tail(path: Optional[str], lines: int = TAIL_LINES) -> str:
  """The last ``lines`` lines of a node's log file ('' without one)."""
  return '\n'.join(tail_lines(path)[-lines:]) if path else ''


@dataclasses.dataclass
class NodeExit:
  """One node process that died: ``node`` is '<group>/<index>'."""
  node: str
  group: str
  returncode: int
  log_path: Optional[str] = None

  def describe(self) -> str:
    return f'{self.node} {exit_status(self.returncode)}'

  def report(self) -> str:
    """The stop message: node, exit status, the last lines of its log."""
    where = f' (log {self.log_path})' if self.log_path else ''
    tail = log_tail(self.log_path)
    return (f'node {self.describe()}{where}'
            + (f'; its last log lines:\n{tail}' if tail else ''))

  def record(self, **fields) -> Dict[str, object]:
    """The restarts.jsonl row of this exit (``experiments.run.restarts.append_restart``):
    ``fields`` (kind, restart, ...) with this node and its exit status."""
    return {**fields, 'node': self.node, 'returncode': self.returncode,
            'status': exit_status(self.returncode)}


@dataclasses.dataclass
class _Node:
  name: str
  group: str
  command: List[str]
  env: Dict[str, str]
  log_path: Optional[str]
  restarts: int = 0


class RestartingWorkerManager(worker_manager.WorkerManager):
  """Launchpad's ``WorkerManager`` that restarts dead nodes of
  ``RESTARTABLE_GROUPS`` in place, each at most ``max_restarts`` times.

  ``on_restart(exit, k)`` runs after the k-th restart of a node;
  ``on_fatal(exit)`` once, for the first death that is not restarted (the
  manager then stops the program as Launchpad's does). ``fatal`` holds that
  exit, ``culprit()`` the node to blame in the launcher's report. A node
  that exits with status 0, and any exit once the program is stopping, are
  left to Launchpad.
  """

  def __init__(self, max_restarts: int,
               on_restart: Callable[[NodeExit, int], None] = lambda *_: None,
               on_fatal: Callable[[NodeExit], None] = lambda _: None,
               **kwargs):
    # Launchpad lets only the first manager of a process handle Ctrl-C and
    # the termination notice; the launcher makes one manager per launch.
    worker_manager._HAS_MAIN_MANAGER = False  # noqa: SLF001
    super().__init__(**kwargs)
    self._max_restarts = int(max_restarts)
    self._on_restart, self._on_fatal = on_restart, on_fatal
    self._nodes: Dict[subprocess.Popen, _Node] = {}
    self._started: Dict[str, int] = {}
    self._seen = set()
    self._exits: List[tuple] = []       # (NodeExit, seen while killing)
    self._killing = False
    self.fatal: Optional[NodeExit] = None

  def process_worker(self, name, command, env=None, **kwargs):
    """Launchpad's, remembering how to start the process again. ``name`` is
    the node's title, '<group>/<task id>' (e.g. 'actor/1')."""
    super().process_worker(name, command, env=env, **kwargs)
    proc = self._active_workers[name][-1]
    group = name.rsplit('/', 1)[0]
    if '/' not in name:
      name = f'{name}/{self._started.get(name, 0)}'
      self._started[group] = self._started.get(group, 0) + 1
    self._nodes[proc] = _Node(
        name, group, list(command), dict(env or {}),
        getattr(kwargs.get('stdout'), 'name', None))

  def close(self) -> None:
    """Gives the launcher its signals back once the program is over:
    Launchpad's dispatcher (installed at the first launch) would otherwise
    swallow a Ctrl-C between two launches of a program restart."""
    self._disable_signals()
    handlers = worker_manager._SIGNAL_HANDLERS  # noqa: SLF001
    if not handlers or threading.current_thread() is not threading.main_thread():
      return
    for sig in (signal.SIGTERM, signal.SIGQUIT, signal.SIGINT, signal.SIGALRM):
      rest = list(handlers.get(sig, ()))   # the handler from before Launchpad
      default = (signal.default_int_handler if sig == signal.SIGINT
                 else signal.SIG_DFL)
      signal.signal(sig, rest[0] if len(rest) == 1 else default)
    worker_manager._SIGNAL_HANDLERS = None  # noqa: SLF001

  def culprit(self) -> Optional[NodeExit]:
    """The node that ended the program: ``fatal``, else the first node
    seen dead by a signal that the manager did not send (SIGKILL, SIGSEGV...
    before the termination notice ran out) and that no stop sends
    (``STOP_SIGNALS``) -- e.g. a killed Reverb node whose death another node
    reported first, stopping the program."""
    if self.fatal is not None:
      return self.fatal
    for exit_, killing in self._exits:
      if (not killing and exit_.returncode < 0 and
          -exit_.returncode not in STOP_SIGNALS):
        return exit_
    return None

  def _kill(self):
    self._killing = True       # SIGKILLs from here on are Launchpad's own
    super()._kill()

  def _check_workers(self):
    """Restarts what it may, then Launchpad's check (holds ``_mutex``)."""
    stopping = bool(self._stop_counter) or self._stop_event.is_set()
    for workers in self._active_workers.values():
      for i, proc in enumerate(workers):
        node = self._nodes.get(proc)
        if node is None or proc.poll() in (None, 0) or proc in self._seen:
          continue
        exit_ = NodeExit(node.name, node.group, proc.returncode,
                         node.log_path)
        if (not stopping and node.group in RESTARTABLE_GROUPS and
            node.restarts < self._max_restarts):
          node.restarts += 1
          workers[i] = self._respawn(proc, node, exit_)
          self._on_restart(exit_, node.restarts)
          continue
        self._seen.add(proc)
        self._exits.append((exit_, self._killing))
        if not stopping and self.fatal is None:
          self.fatal = exit_
          self._on_fatal(exit_)
    super()._check_workers()

  def _respawn(self, dead: subprocess.Popen, node: _Node,
               exit_: NodeExit) -> subprocess.Popen:
    env = {**node.env, RESTART_ENV: str(node.restarts)}
    out = open(node.log_path, 'a') if node.log_path else None  # noqa: SIM115
    try:
      if out is not None:
        out.write(f'\n--- {exit_.describe()}; restart {node.restarts} '
                  f'in place ---\n')
        out.flush()
      proc = subprocess.Popen(node.command, env=env, stdout=out, stderr=out)
    finally:
      if out is not None:
        out.close()
    del self._nodes[dead]
    self._nodes[proc] = node
    return proc


@contextlib.contextmanager
def installed(factory: Callable[[], RestartingWorkerManager]):
  """Makes Launchpad's ``output_to_files`` launcher build ``factory()`` as
  its worker manager inside the block (it looks the class up in its
  ``worker_manager`` module global at each launch)."""
  original = launch_local_output_to_files.worker_manager
  launch_local_output_to_files.worker_manager = types.SimpleNamespace(
      WorkerManager=factory)
  try:
    yield
  finally:
    launch_local_output_to_files.worker_manager = original
