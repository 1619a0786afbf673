r"""Remote actors: act for a running Launchpad program from another host.

  # on the learner's host: reserve 8 env workers for remote actors
  python experiments/run_dmc.py --flagfile=... --distributed \
      --join_slots=8 --join_port=7070 --bind=0.0.0.0 --logdir=runs/x
  # on any host that reaches it (the address is also in runs/x/join.json)
  python experiments/run_dmc.py --distributed --join=learner-host:7070 \
      --num_envs=4

The joining process asks the program's learner (its courier server at
``--join``: HOST:PORT, or a run directory whose ``join.json`` names it) for ``--num_envs`` join slots (``join_slots.JoinSlots``). The
answer carries the program's settings (task, agent config, action repeat:
a remote actor has no settings of its own) and the ports of the Reverb server
and the counter on the same host. It then runs the program's own actor
(``actor.ActorNode``, an ``acme.EnvironmentLoop`` over ``--num_envs`` envs)
against those: its steps go into the program's replay through the same
rate limiter, its env steps into the program's counter and budget, its
finished episodes to the learner (``scores.jsonl``, the train rows'
``episode/recent_score_mean`` and ``join/*``), and it fetches parameters from
the learner like the program's actors.

A heartbeat thread renews the claim every ``HEARTBEAT_S``. The remote actor
leaves (flushes its open chunks and counts, frees its slots) when the program
stops (the learner's final checkpoint waits for that, at most
``LEAVE_WAIT_S``) or drops its claim, on Ctrl-C / SIGTERM, or after
``lease_s`` (``--join_lease``) without reaching the learner. Joining and
leaving never stops the program; what the rate limiter and the step counter
do when an actor leaves is in ``join_slots.py`` and docs/deviations.md
"Remote actors".

Why not a Launchpad program: Launchpad's local launcher starts the nodes of
one program on one machine and hands out their addresses itself; a node of a
program started elsewhere has no launcher that knows it (launchpad #45).
So this is one plain process with the program's actor in it.
"""

from __future__ import annotations

import json
import os
import pickle
import signal
import socket
import threading
import time
from typing import Any, Dict, Optional

import agent  # noqa: F401  (jax compat before anything imports acme)
from experiments.layouts.distributed.actor import ActorNode
from experiments.layouts.distributed.join_slots import HEARTBEAT_S
from experiments.layouts.distributed.spec import JOIN_FILE
from experiments.run.config import log

# How long a joining actor keeps trying to reach the learner at the start.
CONNECT_S = 300.0


def learner_address(target: str) -> str:
  """``--join``: HOST:PORT as given, or the address in a run directory's
  ``join.json`` (the directory or the file itself, e.g. on a shared file
  system)."""
  target = str(target)
  path = os.path.join(target, JOIN_FILE) if os.path.isdir(target) else target
  if os.path.isfile(path):
    with open(path) as f:
      return json.load(f)['address']
  if os.path.isdir(target):
    raise ValueError(f'--join {target}: no {JOIN_FILE} there (the program '
                     'writes it when started with --join_slots)')
  return target


def parse_address(address: str):
  """'HOST:PORT' -> (host, port); ValueError naming the flag otherwise."""
  host, sep, port = str(address).rpartition(':')
  if not (sep and host and port.isdigit() and 1 <= int(port) <= 65535):
    raise ValueError(f'--join must be HOST:PORT or a run directory with a '
                     f'{JOIN_FILE}, got {address!r}')
  return host, int(port)


class JoinedActor(ActorNode):
  """The program's actor on its join slots; episodes go to the learner."""

  def __init__(self, spec, replay, learner, counter, ticket: Dict[str, Any]):
    self._claim = int(ticket['claim'])
    self._episodes = 0
    super().__init__(spec, -1, replay, learner, counter, ticket=ticket)
    self._base = int(ticket['index_base'])

  def _on_episode(self, ep) -> None:
    self._episodes += 1
    self._recent_scores = (self._recent_scores + [ep.score])[-5:]
    try:
      self._learner.join_episodes(self._claim,
                                  [(int(ep.env_step), float(ep.score))])
    except Exception as e:  # noqa: BLE001  (the heartbeat decides on leaving)
      log(f'[{self._name}] episode score not delivered: {e}')

  def join_stats(self) -> Dict[str, float]:
    """Cumulative env steps, episodes and items of this remote actor."""
    steps = int(sum(self.adder.lengths) - self._base * self._n)
    return {'env_steps': float(steps * self._spec.run.action_repeat),
            'episodes': float(self._episodes),
            'items': float(self.adder.num_items_created)}

  def act_until(self, stop: threading.Event,
                pause_s: float = 30.0) -> Optional[str]:
    """Acts in a daemon thread until ``stop``; then pauses (open chunks and
    counts flushed, at most ``pause_s``). Returns why acting ended early
    when the program went away under it (its servers stop before the
    heartbeat notices); raises if acting failed while the program runs."""
    thread = threading.Thread(target=self._act, name='acting', daemon=True)
    thread.start()
    while thread.is_alive() and not stop.wait(0.2):
      pass
    if thread.is_alive():
      self._pause.set()
      if not self._paused.wait(pause_s):
        log(f'[{self._name}] still blocked after {pause_s:.0f}s (Reverb rate '
            'limiter or a lost server): leaving without a flush')
      self._halt.set()
    if self._error is None:
      return None
    if not self._program_running():
      return f'the program stopped ({self._error!r} while acting)'
    raise RuntimeError(f'{self._name} failed: {self._error!r}')

  def _program_running(self) -> bool:
    try:
      return self._learner.join_heartbeat(self._claim, None) == 'ok'
    except Exception:  # noqa: BLE001  (gone)
      return False


def _connect(address: str, num_envs: int, who: str, stop: threading.Event):
  """(learner client, ticket): claims the slots, retrying until the learner
  answers (it may still be starting) for at most ``CONNECT_S``."""
  import courier
  learner = courier.Client(address, call_timeout=30)
  deadline = time.monotonic() + CONNECT_S
  while True:
    try:
      return learner, learner.join(num_envs, who)
    except Exception as e:  # noqa: BLE001
      text = str(e)
      if 'raised on the server' in text:      # the learner said no
        raise ValueError(f'the program at {address} refused the join: '
                         f'{text.strip().splitlines()[-1]}') from None
      if stop.is_set() or time.monotonic() > deadline:
        raise RuntimeError(f'could not reach the learner at {address} for '
                           f'{CONNECT_S:.0f}s: {e}') from None
      log(f'[join] waiting for the learner at {address}: {text[:120]}')
      stop.wait(5.0)


def _heartbeat(actor: JoinedActor, learner, claim: int, lease_s: float,
               stop: threading.Event, why: Dict[str, str]) -> None:
  """Renews the claim until ``stop``; sets it when the program says stop or
  has not answered for ``lease_s``."""
  last_ok = time.monotonic()
  while not stop.wait(min(HEARTBEAT_S, lease_s / 4)):
    try:
      answer = learner.join_heartbeat(claim, actor.join_stats())
      last_ok = time.monotonic()
      if answer != 'ok':
        why['stop'] = 'the program stopped or dropped this claim'
        stop.set()
    except Exception as e:  # noqa: BLE001
      if time.monotonic() - last_ok > lease_s:
        why['stop'] = f'no answer from the learner for {lease_s:.0f}s ({e})'
        stop.set()


def join_program(address: str, num_envs: int,
                 stop: Optional[threading.Event] = None) -> Dict[str, Any]:
  """Acts for the program whose learner is at ``address`` with ``num_envs``
  envs until it stops (or ``stop`` is set); returns a summary. ValueError
  when the address is malformed or the program refuses the join."""
  import courier
  import reverb

  address = learner_address(address)
  host, _ = parse_address(address)
  if num_envs < 1:
    raise ValueError(f'--num_envs must be >= 1, got {num_envs}')
  stop = stop or threading.Event()
  who = f'{socket.gethostname()}:{os.getpid()}'
  learner, ticket = _connect(address, num_envs, who, stop)
  claim, lease_s = int(ticket['claim']), float(ticket['lease_s'])
  spec = pickle.loads(ticket['spec'])
  log(f'[join] claim {claim}: {num_envs} envs of {spec.run.task} as workers '
      f'[{ticket["offset"]}, {ticket["offset"] + num_envs}) of the program '
      f'at {address} (logdir {spec.run.logdir} there)')
  replay = reverb.Client(f'{host}:{ticket["replay_port"]}')
  counter = courier.Client(f'{host}:{ticket["counter_port"]}',
                           call_timeout=spec.dist.rpc_timeout_s)
  actor = JoinedActor(spec, replay, learner, counter, ticket)
  why = {'stop': 'a stop signal'}
  beat = threading.Thread(target=_heartbeat, name='heartbeat', daemon=True,
                          args=(actor, learner, claim, lease_s, stop, why))
  beat.start()
  t0 = time.time()
  try:
    ended = actor.act_until(stop)
    if ended:
      why['stop'] = ended
  finally:
    stop.set()
    stats = actor.join_stats()
    try:
      learner.join_leave(claim, stats)
    except Exception as e:  # noqa: BLE001  (the lease frees the slots)
      log(f'[join] could not say goodbye to the learner: {e}')
    actor.env.close()
  log(f'[join] left ({why["stop"]}): {stats["env_steps"]:.0f} env steps, '
      f'{stats["episodes"]:.0f} episodes, {stats["items"]:.0f} items in '
      f'{time.time() - t0:.0f}s')
  return {'claim': claim, 'stopped_by': why['stop'],
          'wall_s': time.time() - t0, **stats}


def main(address: str, num_envs: int) -> Dict[str, Any]:
  """``run_dmc.py --join``: ``join_program`` with Ctrl-C / SIGTERM leaving
  cleanly (a second Ctrl-C kills at once)."""
  import jax
  jax.config.update('jax_platforms', 'cpu')   # acting needs no accelerator
  stop = threading.Event()

  def on_signal(signum, frame):
    del frame
    if stop.is_set():
      os._exit(130)
    log(f'[join] signal {signum}: leaving (again to kill at once)')
    stop.set()

  for sig in (signal.SIGINT, signal.SIGTERM):
    signal.signal(sig, on_signal)
  return join_program(address, num_envs, stop)
