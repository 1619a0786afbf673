"""The join service's book of remote actors (claims of join slots).

A program started with ``--join_slots=K`` reserves K env workers after its
own ``num_envs`` (worker ids ``num_envs .. num_envs + K - 1``: one latent
store ring each, spec 5.9). A remote actor claims a contiguous range of free
slots for its envs (at most ``max_envs`` per claim); the claim holds while
its connection lives and ends when it leaves, when its connection ends, or
when nothing came from it for ``lease_s`` while it was not waiting on the
replay (``expire``). A freed range can be claimed again.

Claims are capabilities: each carries a random token (``secrets``) that
every later message of its actor must present (``check``, constant-time
comparison); its id alone grants nothing.

Step ids (spec 5.1 'stepid') stay unique however often a slot changes hands:
claim number c (counted over the whole run and saved in every checkpoint)
starts its workers' step-id counters at ``(c + 1) * id_jump`` (the
program's ``restart_index_jump``: more steps than any worker can take in
one launch, a multiple of seq_len and of the latent store's ring).

What leaving does to the run (docs/deviations.md "Remote actors"): the
rate limiter counts inserts, not actors, so with fewer actors the learner
waits for fewer items at the same train ratio; a remote actor's env steps
count toward ``--env_steps`` like any actor's. A clean leave flushes its
open chunks first; a killed one loses its unsent open chunks (at most
``chunk_length - 1`` steps per env).

Pure bookkeeping (no I/O, no clock of its own): the service calls it under
its lock with ``time.monotonic()``.
"""

from __future__ import annotations

import dataclasses
import hmac
import re
import secrets
from typing import Any, Dict, List, Optional

# Seconds between a remote actor's heartbeats; the answer 'stop' reaches it
# within this long of the program's stop (``LEAVE_WAIT_S``).
HEARTBEAT_S = 2.0
# How long the learner's final checkpoint waits for the remote actors to
# leave (their open chunks flushed into the Reverb checkpoint).
LEAVE_WAIT_S = 15.0
# Episodes a claim may end per env: a bucket of EPISODE_BURST per env,
# refilled at EPISODE_RATE per env and second (a real env's episodes take
# many steps; a flood of one-step episodes is refused).
EPISODE_RATE = 20.0
EPISODE_BURST = 40.0
# ``who`` as logged: at most this many characters of [A-Za-z0-9._:@-].
WHO_CHARS = 64
_WHO = re.compile(r'[^A-Za-z0-9._:@-]')


def clean_who(who: Any) -> str:
  """A remote actor's self-description, safe to log (module doc)."""
  return _WHO.sub('_', str(who))[:WHO_CHARS] or '?'


@dataclasses.dataclass
class Claim:
  """One joined remote actor: its workers [offset, offset + num_envs)."""
  claim: int
  token: str
  offset: int
  num_envs: int
  who: str
  last_seen: float
  busy: bool = False       # its steps are being stored (the replay may block)
  episode_allowance: float = 0.0
  stats: Dict[str, float] = dataclasses.field(default_factory=lambda: {
      'env_steps': 0.0, 'episodes': 0.0, 'items': 0.0})


class JoinSlots:
  """Free / claimed join slots, claim numbers and the joined actors' tallies.

  Args:
    first_worker: the first reserved worker id (the program's ``num_envs``).
    num_slots: reserved workers (``--join_slots``).
    id_jump: step-id distance between successive claims (module doc).
    lease_s: seconds without a message after which an idle claim is dropped.
    max_envs: envs one claim may take (default: every slot).
  """

  def __init__(self, first_worker: int, num_slots: int, id_jump: int,
               lease_s: float = 60.0, max_envs: Optional[int] = None):
    if num_slots < 0:
      raise ValueError(f'num_slots must be >= 0, got {num_slots}')
    if id_jump < 1 or lease_s <= 0:
      raise ValueError('id_jump must be >= 1 and lease_s > 0')
    self.first_worker, self.num_slots = int(first_worker), int(num_slots)
    self.id_jump, self.lease_s = int(id_jump), float(lease_s)
    self.max_envs = int(max_envs or num_slots)
    self.num_claims = 0           # claims ever made (saved in checkpoints)
    self.active: Dict[int, Claim] = {}
    # Tallies of every claim since this launch: env steps, episodes, items.
    self.totals: Dict[str, float] = {'env_steps': 0.0, 'episodes': 0.0,
                                     'items': 0.0}
    self.left = 0                 # claims ended (left, lost or expired)
    self.refused = 0              # messages and steps refused (join/refused)

  # -- claims ----------------------------------------------------------------
  def claim(self, num_envs: Any, who: Any, now: float) -> Claim:
    """Reserves ``num_envs`` contiguous free workers; returns the Claim.
    ValueError when the request does not fit (the message says what does)."""
    self.expire(now)
    if isinstance(num_envs, bool) or not isinstance(num_envs, int):
      raise ValueError(f'num_envs must be an integer, got {num_envs!r}')
    if num_envs < 1:
      raise ValueError(f'a joining actor needs >= 1 envs, asked for {num_envs}')
    if not self.num_slots:
      raise ValueError('this program reserved no join slots: start it with '
                       '--join_slots=K (K env workers for remote actors)')
    if num_envs > self.max_envs:
      raise ValueError(f'{num_envs} envs asked; one remote actor may have at '
                       f'most {self.max_envs} (--join_max_envs)')
    taken = [False] * self.num_slots
    for c in self.active.values():
      for w in range(c.offset, c.offset + c.num_envs):
        taken[w - self.first_worker] = True
    run = 0
    for i, busy in enumerate(taken):
      run = 0 if busy else run + 1
      if run == num_envs:
        offset = self.first_worker + i - num_envs + 1
        break
    else:
      free = taken.count(False)
      raise ValueError(
          f'no {num_envs} free join slots in a row ({free} of '
          f'{self.num_slots} free, {len(self.active)} actors joined): join '
          'with fewer --num_envs, or start the program with more --join_slots')
    c = Claim(self.num_claims, secrets.token_hex(16), offset, num_envs,
              clean_who(who), now,
              episode_allowance=EPISODE_BURST * num_envs)
    self.num_claims += 1
    self.active[c.claim] = c
    return c

  def index_base(self, c: Claim) -> int:
    """The first step index of the claim's workers (module doc)."""
    return (c.claim + 1) * self.id_jump

  def check(self, claim: Any, token: Any, now: float) -> Optional[Claim]:
    """The held Claim if ``token`` is its token (renewing its lease);
    None for an unknown, expired or forged one."""
    self.expire(now)
    c = (self.active.get(claim) if isinstance(claim, int)
         and not isinstance(claim, bool) else None)
    if c is None or not isinstance(token, str) or not hmac.compare_digest(
        token.encode(), c.token.encode()):
      return None
    c.last_seen = now
    return c

  def end(self, claim: int) -> Optional[Claim]:
    """Ends a claim (left, or its connection ended); None if not held."""
    c = self.active.pop(int(claim), None)
    if c is not None:
      self.left += 1
    return c

  def expire(self, now: float) -> List[Claim]:
    """Drops the idle claims whose last message is older than the lease (a
    claim whose steps wait on the replay is not idle)."""
    dead = [c for c in self.active.values()
            if not c.busy and now - c.last_seen > self.lease_s]
    for c in dead:
      self.end(c.claim)
    return dead

  def allow_episodes(self, c: Claim, n: int, dt: float) -> bool:
    """Whether claim ``c`` may end ``n`` more episodes ``dt`` seconds after
    its last steps (the token bucket of ``EPISODE_RATE``); takes them."""
    c.episode_allowance = min(EPISODE_BURST * c.num_envs, c.episode_allowance
                              + EPISODE_RATE * c.num_envs * max(dt, 0.0))
    if n > c.episode_allowance:
      return False
    c.episode_allowance -= n
    return True

  def record(self, c: Claim, env_steps: float = 0.0, episodes: float = 0.0,
             items: float = 0.0) -> None:
    """Adds what the service stored for claim ``c`` to the tallies."""
    for k, v in (('env_steps', env_steps), ('episodes', episodes),
                 ('items', items)):
      c.stats[k] += v
      self.totals[k] += v

  # -- rows and checkpoints --------------------------------------------------------
  def row(self) -> Dict[str, float]:
    """Train-row metrics (docs/metrics.md ``join/*``)."""
    return {'join/actors': len(self.active),
            'join/envs': sum(c.num_envs for c in self.active.values()),
            'join/left': self.left,
            'join/refused': self.refused,
            'join/env_steps': self.totals['env_steps'],
            'join/episodes': self.totals['episodes'],
            'join/items': self.totals['items']}

  def state(self) -> Dict[str, int]:
    return {'num_slots': self.num_slots, 'num_claims': self.num_claims}

  def restore(self, state: Optional[Dict[str, int]]) -> None:
    """Claim numbers continue past the checkpoint's (no active claims: the
    remote actors of the old launch re-join)."""
    if state:
      self.num_claims = max(self.num_claims, int(state['num_claims']))
