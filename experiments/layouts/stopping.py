"""How a run stops: who decides, who is told, in what order (both layouts,
remote actors included).

Who decides to stop
  * the step budget: ``budget_reached(env_steps, run.env_steps)``; in one
    process the loop's tick asks it (``local.Trainer._tick``); in the
    Launchpad program the ``StepLimiter`` node asks it of the counter;
  * a signal: Ctrl-C / SIGTERM. One process: ``SignalStop`` (the first one
    stops after a checkpoint, a second at once). Launchpad: the launcher's
    Ctrl-C makes Launchpad send SIGTERM to every node; each node sees it as
    its stop event (``lp_hooks``);
  * a failure: a node whose body raises (``run_guarded``: its traceback goes
    to ``<launch_dir>/errors/``, then it stops the program or, for the
    groups restarted in place, exits for the supervisor to restart it), a
    node process that dies (``distributed.supervisor``) or the
    persistent-skip rule (``experiments.run.health``); the launcher decides
    on a restart of the program (``distributed.launch``).

Who is told, in what order
  One process (``local.Trainer``): the loop returns; a final evaluation
  (unless one ran within half an eval interval) and a last row at the
  budget; then the final checkpoint. A signal skips the evaluation.

  Launchpad program, at the budget (``StepLimiter``):
    1. every actor pauses: acting stops, its adder and counts are flushed
       (``ActorNode.pause``);
    2. the learner finishes (``LearnerNode.finish``): it first tells the
       join service to stop its remote actors (their heartbeats answer
       'stop'; each leaves and the service flushes what it stored, at most
       ``join.slots.LEAVE_WAIT_S``; the learner keeps training meanwhile,
       as a remote actor's last inserts wait on the rate limiter, which
       only sampling frees), then writes the final checkpoint and the
       learner-done marker (``mark_learner_done``);
    3. the evaluator runs the final evaluation;
    4. ``summary.json`` is written and the program stopped (``lp.stop``).
  After a stop signal (or a failure) every node gets its stop event at
  once; the learner stops the remote actors and writes its final
  checkpoint; the replay server, counter, actors, evaluator and join service
  keep serving it until the learner-done marker exists
  (``serve_until_learner_done``, at most ``--stop_grace`` seconds), since the
  checkpoint reads their state. When the learner itself died, the launcher
  writes the marker (nobody waits for a checkpoint that will not come).
  Launchpad's termination notice (``--stop_grace`` + 30 s) kills what is
  left.

  A remote actor (``join.remote``) stops when its heartbeat answers 'stop',
  when the service refuses a message or goes away, or on its own Ctrl-C /
  SIGTERM; it then asks to leave and the service flushes its open chunks.
"""

from __future__ import annotations

import functools
import json
import os
import signal
import sys
import threading
import time
import traceback
from typing import Any, Callable, List, Optional

from agent.learner import StopRequested
from experiments.layouts.distributed.rpc import call_until
from experiments.run import rundir
from experiments.run.config import log

# <launch_dir>/learner_done: the learner's final checkpoint is written.
LEARNER_DONE_FILE = 'learner_done'
# <launch_dir>/summary.json: the StepLimiter's summary of a finished run.
SUMMARY_FILE = 'summary.json'
# <launch_dir>/errors/<node>: the traceback of a node that failed.
ERRORS_DIR = 'errors'


def budget_reached(env_steps: int, budget: int) -> bool:
  """The one stop rule of the step budget (``--env_steps``)."""
  return int(env_steps) >= int(budget)


# --- one process ------------------------------------------------------------------


class SignalStop:
  """Ctrl-C / SIGTERM of a process outside Launchpad (a one-process run, a
  remote actor): the first stops (``requested``; also sets ``event``, for a
  loop that waits on one, and calls ``on_first(signum)``), a second raises
  KeyboardInterrupt at once, or with ``exit_code`` ends the process at once
  (for a main thread that may sit in a blocking call). Installed for the
  duration of a ``with`` block (main thread only)."""

  def __init__(self, event: Optional[threading.Event] = None,
               exit_code: Optional[int] = None,
               on_first: Callable[[int], Any] = lambda signum: None):
    self.signum: Optional[int] = None
    self._event, self._exit_code, self._on_first = event, exit_code, on_first
    self._old = {}

  def __enter__(self) -> 'SignalStop':
    for sig in (signal.SIGINT, signal.SIGTERM):
      try:
        self._old[sig] = signal.signal(sig, self._on_signal)
      except ValueError:                  # not the main thread
        pass
    return self

  def __exit__(self, *exc) -> None:
    for sig, handler in self._old.items():
      signal.signal(sig, handler)

  def _on_signal(self, signum, frame) -> None:
    del frame
    if self.signum is not None:           # second signal: stop now
      if self._exit_code is not None:
        os._exit(self._exit_code)
      raise KeyboardInterrupt
    self.signum = signum
    self._on_first(signum)
    if self._event is not None:
      self._event.set()

  @property
  def requested(self) -> bool:
    return self.signum is not None


# --- Launchpad nodes ------------------------------------------------------------


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


class NodeStop:
  """A node's one view of the stop: the program's (``lp_hooks``), a finish
  request of its own (the learner's ``finish``) and any condition added by
  ``also`` (a learner peer's: process 0 stopped the learner).
  ``requested()`` is what the node's blocking waits poll."""

  def __init__(self):
    self.program, self.stop_program = lp_hooks()
    self.finish = threading.Event()
    self._also: List[Callable[[], bool]] = []

  def also(self, condition: Callable[[], bool]) -> None:
    """Stops too once ``condition()`` holds (for a condition whose owner is
    built after the stop it reads, as a learner built over ``requested``)."""
    self._also.append(condition)

  def requested(self) -> bool:
    return (self.program.is_set() or self.finish.is_set() or
            any(c() for c in self._also))


def mark_learner_done(launch_dir: str) -> None:
  """The learner's final checkpoint is written (or never will be)."""
  os.makedirs(launch_dir, exist_ok=True)
  with open(os.path.join(launch_dir, LEARNER_DONE_FILE), 'a'):
    pass


def wait_for_learner(launch_dir: str, grace_s: float) -> bool:
  """Blocks until ``mark_learner_done`` (or ``grace_s``); whether it came."""
  path = os.path.join(launch_dir, LEARNER_DONE_FILE)
  deadline = time.monotonic() + grace_s
  while not os.path.exists(path):
    if time.monotonic() >= deadline:
      return False
    time.sleep(0.1)
  return True


def serve_until_learner_done(settings,
                             program: Optional[threading.Event] = None) -> bool:
  """The one rule of the nodes whose state the final checkpoint reads:
  after ``program`` (the stop event, when the node has not seen it yet)
  keep serving until the learner's final checkpoint is written, at most
  ``--stop_grace`` seconds; whether it came."""
  if program is not None:
    program.wait()
  return wait_for_learner(settings.launch_dir, settings.dist.stop_grace_s)


def record_error(launch_dir: str, node: str) -> None:
  """Writes the current exception's traceback to <launch_dir>/errors/<node>."""
  text = traceback.format_exc()
  log(f'[{node}] failed:\n{text}')
  try:
    path = os.path.join(launch_dir, ERRORS_DIR, node.replace('/', '_'))
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


def run_guarded(settings, node: str, body: Callable[[], Any], *,
                on_failure: Callable[[], Any] = lambda: None,
                cleanup: Callable[[], Any] = lambda: None,
                restartable: bool = False, stops_program: bool = True,
                record_while_stopping: bool = False,
                stop: Optional[NodeStop] = None) -> None:
  """The one guard every node's body runs in: a stop (``StopRequested``)
  ends it quietly. A failure is recorded (``record_error``; one while the
  program is stopping only with ``record_while_stopping``, else it ends
  the body quietly) and ``on_failure()`` runs; then a ``restartable`` node
  exits with status 1 for the supervisor to restart it in place (when
  ``settings.dist.restarts_in_place``); else the node stops the program
  (``stops_program``) and re-raises (the launcher then reports the node, or
  restarts the program). ``cleanup()`` runs last in every case but the
  exit. ``stop``: the node's own, when it has one (else ``lp_hooks``)."""
  stop_event, stopper = ((stop.program, stop.stop_program) if stop else
                         lp_hooks())
  try:
    body()
  except StopRequested:
    pass
  except Exception:  # noqa: BLE001  (re-raised)
    if record_while_stopping or not stop_event.is_set():
      record_error(settings.launch_dir, node)
      on_failure()
      if restartable and settings.dist.restarts_in_place:
        exit_now(1)
      if stops_program:
        stopper()
      raise
  finally:
    cleanup()


class StepLimiter:
  """Stops the program at ``--env_steps`` (module doc, steps 1-4):
  ``acme.utils.lp_utils.StepsLimiter`` polls the counter and calls
  ``lp.stop()``; this one pauses the actors, finishes the learner and
  evaluates once more first.

  Args: ``settings`` (``ProgramSettings``), the counter, the learner (an
  untimed handle: ``finish`` takes as long as the checkpoint), the actors'
  and the evaluator's (or None) handles."""

  def __init__(self, settings, counter, learner, actors=(), evaluator=None):
    self._settings, self._counter, self._learner = settings, counter, learner
    self._actors, self._evaluator = list(actors), evaluator
    self._stop = NodeStop()

  def run(self) -> None:
    run_guarded(self._settings, 'limiter', self._run)

  def _run(self) -> None:
    settings, stop = self._settings, self._stop.program
    budget, wait = settings.run.env_steps, call_until
    last_print = 0.0
    while not stop.wait(settings.dist.poll_s):
      counts = wait(self._counter.get_counts, stop.is_set)
      env_steps = int(counts.get('env_steps', 0))
      if time.monotonic() - last_print >= settings.run.progress_every:
        log(f'[limiter] {env_steps}/{budget} env steps, '
            f'{int(counts.get("learner_steps", 0))} learner steps')
        last_print = time.monotonic()
      if budget_reached(env_steps, budget):
        break
    else:
      return
    log(f'[limiter] step budget {budget} reached: pausing the actors')
    futures = [actor.futures.pause() for actor in self._actors]    # 1
    paused = [wait(f.result, stop.is_set) for f in futures]
    log(f'[limiter] actors paused ({sum(map(bool, paused))}/{len(paused)}); '
        'final checkpoint')
    summary = wait(self._learner.finish, stop.is_set)                # 2
    if self._evaluator is not None:                                  # 3
      summary['eval'] = wait(functools.partial(
          self._evaluator.evaluate_final, summary['env_steps']), stop.is_set)
    summary['stopped_by'] = 'step_limiter'                          # 4
    rundir.atomic_write(os.path.join(settings.launch_dir, SUMMARY_FILE),
                        json.dumps(summary, default=rundir.jsonable))
    log('[limiter] stopping the program')
    self._stop.stop_program()
