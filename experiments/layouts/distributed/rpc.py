"""Talking to the other nodes of the program: a stoppable wait for an RPC,
the wait for the Reverb server, and a child Counter that can be flushed."""

from __future__ import annotations

import threading
import time
from typing import Any, Callable, Dict

import agent  # noqa: F401  (jax compat before anything imports acme)
from acme.utils import counting
from agent.learner import StopRequested


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
