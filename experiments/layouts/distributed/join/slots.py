"""The learner's book of remote actors that join a running program.

A program started with ``--join_slots=K`` reserves K env workers after its
own ``num_envs`` (worker ids ``num_envs .. num_envs + K - 1``: one latent
store ring each, spec 5.9). A remote actor (``join.py``) claims a contiguous
range of free slots for its envs; the claim holds while its heartbeats
arrive (every ``HEARTBEAT_S``) and ends when it leaves, or when no heartbeat
came for ``lease_s`` (it died or lost the network). A freed range can be
claimed again.

Step ids (spec 5.1 'stepid') stay unique however often a slot changes hands:
claim number c (counted over the whole run and saved in every checkpoint)
starts its workers' step-id counters at ``c * id_jump`` (the program's
``restart_index_jump``: more steps than any worker can take in one launch, a
multiple of seq_len and of the latent store's ring). A process that was
declared dead but still writes (a network split) uses ids below every later
claim's, so the latent store never mixes its steps with the new claimant's.

What leaving does to the run (docs/deviations.md "Remote actors"): the
rate limiter counts inserts, not actors, so with fewer actors the learner
waits for fewer items at the same train ratio; a remote actor's env steps
count toward ``--env_steps`` like any actor's. A clean leave flushes its
open chunks and counts first; a killed one loses its unsent open chunks (at
most ``chunk_length - 1`` steps per env) and at most one counter sync of
counts (``counter_sync_s``).

Pure bookkeeping (no RPC, no clock of its own): the learner node calls it
under its lock with ``time.monotonic()``.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Dict, List, Optional

# Seconds between a remote actor's heartbeats; the answer 'stop' reaches it
# within this long of the program's stop (``LEAVE_WAIT_S``).
HEARTBEAT_S = 2.0
# How long the learner's final checkpoint waits for the remote actors to
# leave (their open chunks flushed into the Reverb checkpoint).
LEAVE_WAIT_S = 15.0


@dataclasses.dataclass
class Claim:
  """One joined remote actor: its workers [offset, offset + num_envs)."""
  claim: int
  offset: int
  num_envs: int
  who: str
  last_seen: float
  stats: Dict[str, float] = dataclasses.field(default_factory=dict)


class JoinSlots:
  """Free / claimed join slots, claim numbers and the joined actors' tallies.

  Args:
    first_worker: the first reserved worker id (the program's ``num_envs``).
    num_slots: reserved workers (``--join_slots``).
    id_jump: step-id distance between successive claims (module doc).
    lease_s: seconds without a heartbeat after which a claim is dropped.
  """

  def __init__(self, first_worker: int, num_slots: int, id_jump: int,
               lease_s: float = 60.0):
    if num_slots < 0:
      raise ValueError(f'num_slots must be >= 0, got {num_slots}')
    if id_jump < 1 or lease_s <= 0:
      raise ValueError('id_jump must be >= 1 and lease_s > 0')
    self.first_worker, self.num_slots = int(first_worker), int(num_slots)
    self.id_jump, self.lease_s = int(id_jump), float(lease_s)
    self.num_claims = 0           # claims ever made (saved in checkpoints)
    self.active: Dict[int, Claim] = {}
    # Tallies of every claim since this launch: env steps, episodes, items.
    self.totals: Dict[str, float] = {'env_steps': 0.0, 'episodes': 0.0,
                                     'items': 0.0}
    self.left = 0                 # claims ended by leave() or by the lease

  # -- claims ----------------------------------------------------------------
  def claim(self, num_envs: int, who: str, now: float) -> Dict[str, Any]:
    """Reserves ``num_envs`` contiguous free workers; returns the ticket
    ``{'claim', 'offset', 'num_envs', 'index_base'}``. ValueError when the
    request does not fit (the message says what does)."""
    self.expire(now)
    num_envs = int(num_envs)
    if num_envs < 1:
      raise ValueError(f'a joining actor needs >= 1 envs, asked for {num_envs}')
    if not self.num_slots:
      raise ValueError('this program reserved no join slots: start it with '
                       '--join_slots=K (K env workers for remote actors)')
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
    c = Claim(self.num_claims, offset, num_envs, str(who), now)
    self.num_claims += 1
    self.active[c.claim] = c
    return {'claim': c.claim, 'offset': offset, 'num_envs': num_envs,
            'index_base': (c.claim + 1) * self.id_jump}

  def heartbeat(self, claim: int, stats: Optional[Dict[str, float]],
                now: float) -> bool:
    """Renews a claim and records its cumulative stats; False when the
    claim is not (any longer) held: its actor must stop."""
    self.expire(now)
    c = self.active.get(int(claim))
    if c is None:
      return False
    c.last_seen = now
    if stats:
      self._tally(c, stats)
    return True

  def leave(self, claim: int, stats: Optional[Dict[str, float]]) -> bool:
    """Ends a claim (its actor flushed and stops); False if not held."""
    c = self.active.pop(int(claim), None)
    if c is None:
      return False
    if stats:
      self._tally(c, stats)
    self.left += 1
    return True

  def expire(self, now: float) -> List[Claim]:
    """Drops the claims whose last heartbeat is older than the lease."""
    dead = [c for c in self.active.values()
            if now - c.last_seen > self.lease_s]
    for c in dead:
      del self.active[c.claim]
      self.left += 1
    return dead

  def _tally(self, c: Claim, stats: Dict[str, float]) -> None:
    for k in self.totals:
      new = float(stats.get(k, 0.0))
      self.totals[k] += max(0.0, new - c.stats.get(k, 0.0))
      c.stats[k] = new

  # -- rows and checkpoints --------------------------------------------------------
  def row(self) -> Dict[str, float]:
    """Train-row metrics (docs/metrics.md ``join/*``)."""
    return {'join/actors': len(self.active),
            'join/envs': sum(c.num_envs for c in self.active.values()),
            'join/left': self.left,
            'join/env_steps': self.totals['env_steps'],
            'join/episodes': self.totals['episodes'],
            'join/items': self.totals['items']}

  def state(self) -> Dict[str, int]:
    return {'num_slots': self.num_slots, 'num_claims': self.num_claims}

  def restore(self, state: Optional[Dict[str, int]]) -> None:
    """Claim numbers continue past the checkpoint's (no active claims: the
    remote actors of the old launch re-join)."""
    if state:
      self.num_claims = int(state['num_claims'])
