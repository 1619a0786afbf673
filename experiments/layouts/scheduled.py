"""The one-process agent: the spec 6.1 schedule and an acting + learning Actor.

Acme's ``acme.agents.agent.Agent`` couples an actor and a learner in one
process, but its ``update()`` runs learner steps per *loop step* from two
fields (``min_observations``, ``observations_per_step``). DreamerV3 asks for
the spec 6.1 schedule per *transition* instead (Algorithm K): after every
single env step added to the replay, ``Ratio(train_ratio / (B*T))`` with its
fractional accrual decides the number of updates, gated on ``train_fill``
replay items (spec 6.2). So the schedule runs inside the actor's add path:

* ``ScheduledUpdates`` is the actor's ``on_add`` (``builder.make_actor(...,
  on_add=updates)``): after each env's step is added it asks the builder's
  ``TrainSchedule`` how many updates are due and runs them. Before each
  update it asks the uniform table's rate limiter
  (``reverb_tables.tables.can_sample``, room for this batch and the
  prefetched next one): an update it would refuse is owed and run as soon as
  the limiter allows, so the synchronous loop never blocks inside Reverb.
  With the one-process band (``for_one_process``) nothing is ever owed
  while the schedule runs as the spec says; after a resume every worker
  needs seq_len - 1 steps before its first new item, and those updates
  wait for the inserts they need.
  This is where train_ratio bounds the learner in one process.
* ``DreamerAgent`` is what the environment loop drives: acme's Actor and
  VariableSource interfaces (what acme's Agent implements), delegating to the
  actor and the learner; ``update()`` refreshes the actor's parameters and
  waits for them, so every action uses the latest parameters (the
  synchronous order of spec 6.3a). It does not subclass acme's Agent, whose
  two schedule fields would be passed and never read.
"""

from __future__ import annotations

from typing import Any, Callable, Dict, List, Mapping

from acme import core


class ScheduledUpdates:
  """The actor's ``on_add``: runs the updates the schedule asks for (module doc).

  Args:
    learner: a ``DreamerLearner`` whose dataset samples this replay.
    schedule: ``builder.make_train_schedule()``.
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
