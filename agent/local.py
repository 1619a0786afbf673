"""The one-process agent: actor + learner as an ``acme.agents.agent.Agent``.

Acme's ``Agent`` couples an actor and a learner in one process: it counts
observations and runs learner steps in ``update()`` after
``min_observations``, one every ``observations_per_step``. DreamerV3 asks
for the spec 6.1 schedule instead (Algorithm K): after every single
transition (one env's step of a vector step, added to the replay) the Ratio
``train_ratio / (B*T)`` with its fractional accrual decides the number of
updates, gated on ``train_fill`` replay items (spec 6.2). So
``DreamerAgent``:

* hooks the actor's ``on_add`` (called after each env's step is added) to
  ``TrainSchedule(step, num_items)`` and runs that many learner steps there;
  ``min_observations`` / ``observations_per_step`` hold the same gate and
  ratio for readers of Acme's interface;
* asks the uniform table's rate limiter before each update
  (``reverb_tables.tables.can_sample``, room for this batch and the
  prefetched next one): an update it would refuse is owed and run as soon as
  the limiter allows, so the synchronous loop never blocks inside Reverb.
  With the 'ratio_sync' band nothing is ever owed while the schedule runs as
  the spec says; after a resume every worker needs seq_len - 1 steps before
  its first new item, and those updates wait for the inserts they need (the
  limiter keeping rows per inserted item at the ratio);
* ``update()`` refreshes the actor's parameters and waits for them, so every
  action uses the latest parameters (the synchronous order of spec 6.3a).
"""

from __future__ import annotations

from typing import Callable

from acme.agents import agent as acme_agent


class DreamerAgent(acme_agent.Agent):
  """Synchronous DreamerV3 (module doc).

  Args:
    actor: a ``DreamerActor`` with an adder.
    learner: a ``DreamerLearner`` whose dataset samples this replay.
    schedule: ``reverb_tables.ratio.TrainSchedule``.
    num_items: returns len(replay) in items (the adder's count, spec 6.2).
    can_sample: ``can_sample(num_rows)``, the rate limiter's answer.
    batch_rows: uniform rows one update may take from the limiter (B, or 2B
      with prefetch).
  """

  def __init__(self, actor, learner, schedule, num_items: Callable[[], int],
               can_sample: Callable[[int], bool], batch_rows: int):
    super().__init__(actor, learner, min_observations=schedule.fill,
                     observations_per_step=1.0 / max(schedule.ratio, 1e-12))
    self._schedule = schedule
    self._num_items = num_items
    self._can_sample = can_sample
    self._rows = int(batch_rows)
    self.num_transitions = 0
    self.num_updates = 0
    self.owed_updates = 0           # due, waiting for the rate limiter
    actor.on_add = self._on_add

  def _on_add(self, worker: int) -> None:
    """After env ``worker``'s step was added: step += 1, then train (Alg. K)."""
    del worker
    self.num_transitions += 1
    due = self._schedule(self.num_transitions, self._num_items())
    self.owed_updates += due
    while self.owed_updates:
      if not self._can_sample(self._rows):
        return
      self._learner.step()
      self.num_updates += 1
      self.owed_updates -= 1

  def observe_first(self, timestep) -> None:
    # The actor stores the previous loop episode's is_last steps here (and
    # trains on them through on_add): act on the new episode with fresh params.
    self._actor.observe_first(timestep)
    self.update()

  def update(self) -> None:
    self._actor.update(wait=True)

  def get_state(self):
    return {'num_transitions': self.num_transitions,
            'num_updates': self.num_updates, 'owed_updates': self.owed_updates}

  def set_state(self, state) -> None:
    self.num_transitions = int(state['num_transitions'])
    self.num_updates = int(state['num_updates'])
    self.owed_updates = int(state.get('owed_updates', 0))
