"""The actors' variable source: the learner's acting parameters, published
after each update (``agent.acting.acting_params``, spec 6.3a)."""

from __future__ import annotations

from typing import Any, Callable, List, Sequence


class VariableSource:
  """``get_variables(['policy', 'num_updates'])`` of the last published
  update (acme's ``core.VariableSource``, over courier): ``publish()`` after
  each update copies the acting params to the host once, so actors read a
  consistent pair however often they ask."""

  def __init__(self, learner, updates: Callable[[], int]):
    self._learner, self._updates = learner, updates
    self._published = (0, None)
    self.publish()

  def publish(self) -> None:
    import jax
    params = self._learner.get_variables(['policy'])[0]
    self._published = (self._updates(), jax.device_get(params))

  def get_variables(self, names: Sequence[str]) -> List[Any]:
    version, policy = self._published
    table = {'policy': policy, 'num_updates': version}
    for name in names:
      if name not in table:
        raise ValueError(f"unknown variable {name!r}; valid: {sorted(table)}")
    return [table[name] for name in names]

  def get_num_updates(self) -> int:
    return self._published[0]
