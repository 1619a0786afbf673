"""The join service's storage: a claim's steps into the program's replay,
and the learner's acting parameters out to remote actors.

``StepStore`` checks one vector step of a claim (``service.py``'s module
doc: keys, shapes, the env protocol, the episode rate; the adder's own
checks, ``reverb_tables.step_checks``) and stores it through the program's
adder, then counts its env steps, episodes and scores. ``ActingParams``
asks the learner for its acting parameters at most every
``PARAMS_REFRESH_S``. A step that fails a check raises ``Refused``.
"""

from __future__ import annotations

import threading
import time
from typing import Any, Callable, Dict, List, Optional, Tuple

import numpy as np

from experiments.envs.vector import EpisodeTracker
from experiments.layouts.distributed.join.slots import (
    LEAVE_WAIT_S, Claim, JoinSlots)
from experiments.run.config import log
from experiments.run.log_files import append_score

# The service asks the learner for new acting parameters at most this often.
PARAMS_REFRESH_S = 1.0


class Refused(Exception):
  """A message the service does not take; its text goes back to the peer."""


class Session:
  """A connection's claim: its adder, episode tracker and episode clock."""

  def __init__(self, claim: Claim, adder, tracker: EpisodeTracker):
    self.claim, self.adder, self.tracker = claim, adder, tracker
    self.last_steps = time.monotonic()
    self.stored = 0                  # vector steps stored (acknowledged)


class StepStore:
  """Checks and stores the steps of claims (module doc)."""

  def __init__(self, *, settings, book: JoinSlots, lock: threading.Lock,
               make_adder: Callable[..., Any], names: List[str], counter):
    """``book`` and ``lock``: the claims' book and the lock that guards it
    (``claims.Claims``); ``make_adder(num_workers, worker_offset)``: the
    builder's adder on the program's Reverb server; ``names``: the step
    layout's leaf names; ``counter``: the program's synced counter."""
    self._settings, self._book, self._lock = settings, book, lock
    self._make_adder, self.names, self._counter = make_adder, names, counter
    self._recent: List[float] = []

  def recent_scores(self) -> List[float]:
    """The last 5 remote episode scores (call under the book's lock)."""
    return list(self._recent)

  def open(self, c: Claim) -> Session:
    """A session for a new claim, its adder's step ids from the claim's
    index base."""
    base = self._book.index_base(c)
    adder = self._make_adder(num_workers=c.num_envs, worker_offset=c.offset)
    adder.set_state({**adder.get_state(), 'lengths': [base] * c.num_envs})
    return Session(c, adder, EpisodeTracker(c.num_envs))

  def flush(self, s: Session) -> None:
    try:
      s.adder.flush(timeout_ms=int(LEAVE_WAIT_S * 1000))
    except Exception as e:  # noqa: BLE001  (those items are not stored)
      log(f'[join] claim {s.claim.claim}: flush failed ({e})')

  def close(self, s: Session) -> None:
    try:
      s.adder.close()
    except Exception:  # noqa: BLE001  (the server may be stopping)
      pass

  def store(self, s: Session, header: Dict[str, Any],
            arrays: List[np.ndarray]) -> int:
    """Checks one vector step of the claim and stores it (module doc);
    returns the vector steps stored so far."""
    n = s.claim.num_envs
    if header.get('names') != self.names or len(arrays) != len(self.names):
      raise Refused(f'steps must carry the keys {self.names} in this order')
    flat = dict(zip(self.names, arrays))
    flags = {}
    for k in ('reward', 'is_first', 'is_last'):
      x = flat[k]
      if x.shape != (n,):
        raise Refused(f'step key {k!r}: shape {list(x.shape)}, expected [{n}]')
      flags[k] = x
    try:
      episodes = s.tracker.update(flags)
    except ValueError as e:
      raise Refused(f'env protocol: {e}') from None
    now = time.monotonic()
    with self._lock:
      ok = self._book.allow_episodes(s.claim, int(np.sum(flags['is_last'])),
                                     now - s.last_steps)
    s.last_steps = now
    if not ok:
      raise Refused('more episodes ended than any env can end (the cap of '
                    'slots.EPISODE_RATE per env and second)')
    items = self._add(s, _nest(flat))
    self._count(s, n, int(np.sum(flags['is_last'])), episodes, items)
    s.stored += 1
    return s.stored

  def _add(self, s: Session, steps: Dict[str, Any]) -> int:
    """Adds the step through the claim's adder; returns the items made."""
    c = s.claim
    items = s.adder.num_items_created
    c.busy = True                 # the rate limiter may hold the insert
    try:
      s.adder.add_batch(steps)
    except ValueError as e:
      raise Refused(str(e)) from None
    finally:
      c.busy = False
      c.last_seen = time.monotonic()
    return s.adder.num_items_created - items

  def _count(self, s: Session, n: int, ended: int, episodes, items: int):
    """The program's counter, scores.jsonl and the book's tallies."""
    run = self._settings.run
    repeat = run.action_repeat
    counts = self._counter.increment(actor_steps=n, env_steps=n * repeat,
                                     episodes=ended)
    for ep in episodes:
      append_score(run.logdir, run.task, int(counts.get('env_steps', 0)),
                   ep.score, self._settings.config.seed)
    with self._lock:
      self._book.record(s.claim, env_steps=n * repeat, episodes=len(episodes),
                        items=items)
      self._recent = (self._recent + [ep.score for ep in episodes])[-5:]


def _nest(flat: Dict[str, Any]) -> Dict[str, Any]:
  """{'a/b': x} -> {'a': {'b': x}}: the step as the adder takes it."""
  steps: Dict[str, Any] = {}
  for name, x in flat.items():
    node = steps
    *parents, leaf = name.split('/')
    for p in parents:
      node = node.setdefault(p, {})
    node[leaf] = x
  return steps


class ActingParams:
  """The learner's acting parameters, as remote actors are sent them."""

  def __init__(self, learner):
    self._learner = learner
    self._params: Optional[Tuple[int, list, list]] = None
    self._params_at = -1e9
    self._lock = threading.Lock()

  def message(self, have: Any) -> Tuple[Dict[str, Any], list]:
    """(header, arrays) of the answer to a params message."""
    version, paths, leaves = self._get()
    if have == version:
      return {'type': 'params', 'version': version, 'same': True}, []
    return {'type': 'params', 'version': version, 'paths': paths}, leaves

  def _get(self) -> Tuple[int, list, list]:
    """(version, key paths, arrays) of the learner's acting params, asked
    at most every ``PARAMS_REFRESH_S``."""
    import jax
    with self._lock:
      now = time.monotonic()
      if self._params is None or now - self._params_at >= PARAMS_REFRESH_S:
        self._params_at = now
        version = int(self._learner.get_num_updates())
        if self._params is None or version != self._params[0]:
          params, version = self._learner.get_variables(
              ['policy', 'num_updates'])
          leaves = jax.tree_util.tree_flatten_with_path(params)[0]
          self._params = (int(version),
                          [[k.key for k in path] for path, _ in leaves],
                          [np.asarray(x) for _, x in leaves])
      return self._params
