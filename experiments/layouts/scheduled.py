"""The one-process agent: the spec 6.1 schedule and an acting + learning Actor.

This is where train_ratio bounds the learner in one process: ``Ratio`` and
``TrainSchedule`` turn ``DreamerConfig.train_ratio`` into updates per
transition, and ``ScheduledUpdates`` runs them.

Acme's ``acme.agents.agent.Agent`` couples an actor and a learner in one
process, but its ``update()`` runs learner steps per *loop step* from two
fields (``min_observations``, ``observations_per_step``). DreamerV3 asks for
the spec 6.1 schedule per *transition* instead (Algorithm K): after every
single env step added to the replay, ``Ratio(train_ratio / (B*T))`` with its
fractional accrual decides the number of updates, gated on ``train_fill``
replay items (spec 6.2). So the schedule runs inside the actor's add path:

* ``TrainSchedule(config)`` is that schedule (below); it lives with the
  layout that runs it, since the Launchpad layout has none (its learner is
  bounded by the builder's rate limiter alone).
* ``ScheduledUpdates`` is the actor's ``on_add`` (``builder.make_actor(...,
  on_add=updates)``): after each env's step is added it asks its
  ``TrainSchedule`` how many updates are due and runs them. Before each
  update it asks the uniform table's rate limiter
  (``reverb_tables.tables.can_sample``, room for this batch and the
  prefetched next one): an update it would refuse is owed and run as soon as
  the limiter allows, so the synchronous loop never blocks inside Reverb.
  With the one-process band (``for_one_process``) nothing is ever owed
  while the schedule runs as the spec says; after a resume every worker
  needs seq_len - 1 steps before its first new item, and those updates
  wait for the inserts they need.
* ``DreamerAgent`` is what the environment loop drives: acme's Actor and
  VariableSource interfaces (what acme's Agent implements), delegating to the
  actor and the learner; ``update()`` refreshes the actor's parameters and
  waits for them, so every action uses the latest parameters (the
  synchronous order of spec 6.3a). It does not subclass acme's Agent, whose
  two schedule fields would be passed and never read.
"""

from __future__ import annotations

import math
from typing import Any, Callable, Dict, List, Mapping, Optional

from acme import core


class Ratio:
  """Spec 6.1 ``Ratio(r)(step)``; r = updates per step.

  The reference's ``when.Ratio`` (2411f7d embodied/core/when.py): on the
  first call it remembers the step and returns 1; afterwards it returns
  floor((step - prev) * r) and advances prev by repeats / r, so updates
  accrue at r per step with no drift. The arithmetic is float, as in the
  reference: exact for the dyadic ratios train_ratio / 1024 of spec 6.1 (RR
  32 ... 1024); a non-dyadic r can lose one update to rounding.
  """

  def __init__(self, ratio: float):
    if ratio < 0:
      raise ValueError(f'ratio must be non-negative, got {ratio}')
    self._ratio = float(ratio)
    self._prev: Optional[float] = None

  @property
  def ratio(self) -> float:
    return self._ratio

  def __call__(self, step: int) -> int:
    step = int(step)
    if self._ratio == 0:
      return 0
    if self._prev is None:
      self._prev = step
      return 1
    repeats = int(math.floor((step - self._prev) * self._ratio))
    self._prev += repeats / self._ratio
    return repeats

  def get_state(self) -> Dict[str, Any]:
    return {'ratio': self._ratio, 'prev': self._prev}

  def set_state(self, state: Mapping[str, Any]) -> None:
    if float(state['ratio']) != self._ratio:
      raise ValueError(f'saved ratio {state["ratio"]} != {self._ratio}')
    prev = state['prev']
    self._prev = None if prev is None else float(prev)


class TrainSchedule:
  """Updates to run after each transition (spec 6.1, 6.2, Algorithm K).

  Applies ``Ratio(train_ratio / (B*T))`` the way the reference loop does:
  called after every single transition (step += 1, replay.add, then
  trainfn), it returns 0 while the replay holds fewer than
  ``config.train_fill`` = B*T = 1024 items (spec 6.2 gate); the first
  eligible call returns exactly 1, and afterwards updates accrue at
  train_ratio / (B*T) per transition with no catch-up for the prefill
  period (the Ratio's prev starts at that step).

  ``schedule(step, num_items)``: ``step`` is the agent-transition count summed
  over workers (including the transition just added), ``num_items`` the
  replay size in items (e.g. ``WindowAdder.num_items``). ``config`` is the
  ``DreamerConfig`` (or a ``ReplayConfig``): train_fill, train_ratio and
  batch_steps (B*T).
  """

  def __init__(self, config):
    self._fill = int(config.train_fill)
    self._ratio = Ratio(config.train_ratio / config.batch_steps)
    self.num_updates = 0

  @property
  def fill(self) -> int:
    """Replay items before the first update (spec 6.2)."""
    return self._fill

  @property
  def ratio(self) -> float:
    """Updates per agent transition, train_ratio / (B*T) (spec 6.1)."""
    return self._ratio.ratio

  def __call__(self, step: int, num_items: int) -> int:
    if num_items < self._fill:             # spec 6.2 gate
      return 0
    repeats = self._ratio(step)
    self.num_updates += repeats
    return repeats

  def get_state(self) -> Dict[str, Any]:
    return {'ratio': self._ratio.get_state(), 'num_updates': self.num_updates,
            'train_fill': self._fill}

  def set_state(self, state: Mapping[str, Any]) -> None:
    self._ratio.set_state(state['ratio'])
    self.num_updates = int(state.get('num_updates', 0))


class ScheduledUpdates:
  """The actor's ``on_add``: runs the updates the schedule asks for (module doc).

  Args:
    learner: a ``DreamerLearner`` whose dataset samples this replay.
    schedule: the run's ``TrainSchedule(config)``.
    num_items: returns len(replay) in items (the adder's count, spec 6.2).
    can_sample: ``can_sample(num_rows)``, the rate limiter's answer.
    batch_rows: uniform rows one update may take from the limiter (B, or 2B
      with prefetch).
  """

  def __init__(self, learner, schedule, num_items: Callable[[], int],
               can_sample: Callable[[int], bool], batch_rows: int):
    self._learner = learner
    self._schedule = schedule
    self._num_items = num_items
    self._can_sample = can_sample
    self._rows = int(batch_rows)
    self.num_transitions = 0
    self.num_updates = 0
    self.owed_updates = 0           # due, waiting for the rate limiter

  def __call__(self, worker: int) -> None:
    """After env ``worker``'s step was added: step += 1, then train (Alg. K)."""
    del worker
    self.num_transitions += 1
    self.owed_updates += self._schedule(self.num_transitions, self._num_items())
    while self.owed_updates:
      if not self._can_sample(self._rows):
        return
      self._learner.step()
      self.num_updates += 1
      self.owed_updates -= 1

  def get_state(self) -> Dict[str, int]:
    return {'transitions': self.num_transitions, 'updates': self.num_updates,
            'owed_updates': self.owed_updates}

  def set_state(self, state: Mapping[str, Any]) -> None:
    self.num_transitions = int(state['transitions'])
    self.num_updates = int(state['updates'])
    self.owed_updates = int(state.get('owed_updates') or 0)


class DreamerAgent(core.Actor, core.VariableSource):
  """Synchronous DreamerV3 (module doc): the actor acts and, through its
  ``on_add`` (a ``ScheduledUpdates``), trains; the learner serves variables."""

  def __init__(self, actor, learner, updates: ScheduledUpdates):
    self._actor = actor
    self._learner = learner
    self.updates = updates

  def select_action(self, observation):
    return self._actor.select_action(observation)

  def observe_first(self, timestep) -> None:
    # The actor stores the previous loop episode's is_last steps here (and
    # trains on them through on_add): act on the new episode with fresh params.
    self._actor.observe_first(timestep)
    self.update()

  def observe(self, action, next_timestep) -> None:
    self._actor.observe(action, next_timestep)

  def update(self, wait: bool = True) -> None:
    del wait                         # always: the synchronous order (6.3a)
    self._actor.update(wait=True)

  def get_variables(self, names: List[str]) -> List[Any]:
    return self._learner.get_variables(names)

  @property
  def num_transitions(self) -> int:
    return self.updates.num_transitions

  @property
  def num_updates(self) -> int:
    return self.updates.num_updates

  @property
  def owed_updates(self) -> int:
    return self.updates.owed_updates
