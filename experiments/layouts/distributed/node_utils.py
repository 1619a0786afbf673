"""Small pieces the Launchpad nodes share: stop hooks, markers, error
records, stoppable RPC waits, a flushable child Counter."""

from __future__ import annotations

import os
import sys
import threading
import time
import traceback
from typing import Any, Callable, Dict

import agent  # noqa: F401  (jax compat before anything imports acme)
from acme.utils import counting
from agent.learner import StopRequested
from experiments.layouts.distributed.spec import ERRORS_DIR, ProgramSpec
from experiments.run.config import log


def lp_hooks():
  """(stop event, program stopper) of this node; inert outside Launchpad."""
  try:
    import launchpad as lp
    from launchpad import context
    return lp.stop_event(), context.get_context().program_stopper
  except (RuntimeError, AssertionError, AttributeError):
    event = threading.Event()
    return event, event.set


def in_launchpad() -> bool:
  """True inside a Launchpad node process (its worker manager is running)."""
  try:
    from launchpad import context
    context.get_context().program_stopper  # noqa: B018
    return True
  except (RuntimeError, AssertionError, AttributeError):
    return False


def touch(path: str) -> None:
  os.makedirs(os.path.dirname(path), exist_ok=True)
  with open(path, 'a'):
    pass


def record_error(spec: ProgramSpec, node: str) -> None:
  """Writes the current exception's traceback to <launch_dir>/errors/<node>."""
  text = traceback.format_exc()
  log(f'[{node}] failed:\n{text}')
  try:
    path = os.path.join(spec.launch_dir, ERRORS_DIR, node.replace('/', '_'))
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, 'w') as f:
      f.write(text)
  except OSError:
    pass


def exit_now(code: int) -> None:
  """Leaves the node process at once (streams flushed): for a node with
  nothing left to save whose threads may be blocked in C++."""
  sys.stdout.flush()
  sys.stderr.flush()
  os._exit(code)


def run_guarded(spec: ProgramSpec, node: str, body: Callable[[], Any],
                on_failure: Callable[[], Any] = lambda: None,
                restartable: bool = False) -> None:
  """Runs a node's ``body``: a stop (``StopRequested``) ends it quietly; a
  failure while the program is not stopping is recorded
  (``record_error``) and ``on_failure()`` runs; then a ``restartable`` node
  exits with status 1 for the supervisor to restart it in place (when
  ``spec.dist.restarts_in_place``), any other stops the program and re-raises
  (the launcher then reports the node, or restarts the program)."""
  stop_event, stopper = lp_hooks()
  try:
    body()
  except StopRequested:
    pass
  except Exception:  # noqa: BLE001  (re-raised)
    if not stop_event.is_set():
      record_error(spec, node)
      on_failure()
      if restartable and spec.dist.restarts_in_place:
        exit_now(1)
      stopper()
      raise


def call_until(fn: Callable[[], Any], stop: Callable[[], bool],
                poll: float = 0.2):
  """Runs a (blocking RPC) ``fn`` in a thread; returns its result, or raises
  ``StopRequested`` once ``stop()`` is true first (signals stay deliverable)."""
  box: Dict[str, Any] = {}
  done = threading.Event()

  def target():
    try:
      box['value'] = fn()
    except BaseException as e:  # noqa: BLE001  (re-raised in the caller)
      box['error'] = e
    done.set()

  threading.Thread(target=target, daemon=True).start()
  while not done.wait(poll):
    if stop():
      raise StopRequested()
  if 'error' in box:
    raise box['error']
  return box['value']


def wait_for_replay(client, stop: Callable[[], bool], poll: float = 0.5):
  """Blocks until the Reverb server answers (it may start after us)."""
  while True:
    try:
      return client.server_info(timeout=5)
    except Exception:  # noqa: BLE001  (server not up yet)
      if stop():
        raise StopRequested()
      time.sleep(poll)


class SyncedCounter(counting.Counter):
  """``acme.utils.counting.Counter`` child with ``flush()``: sends the local
  counts to the parent now (before a checkpoint or a pause), so the counts the
  limiter and the checkpoints read are exact at those points."""

  def flush(self) -> Dict[str, float]:
    self._last_sync_time = 0.0
    return self.get_counts()
