"""Train-ratio scheduling of gradient updates (spec 6.1, 6.2, Algorithm K).

``Ratio(r)`` is the reference's ``when.Ratio`` (2411f7d embodied/core/when.py,
spec 6.1): on the first call it remembers the step and returns 1; afterwards it
returns floor((step - prev) * r) and advances prev by repeats / r, so updates
accrue at r per step with no drift. The arithmetic is float, as in the
reference: exact for the dyadic ratios train_ratio / 1024 of spec 6.1 (RR 32
... 1024); a non-dyadic r can lose one update to rounding.

``TrainSchedule`` applies it the way the reference loop does (Algorithm K):
called after every single transition (step += 1, replay.add, then trainfn),
it returns 0 while the replay holds fewer than ``config.train_fill`` = B*T =
1024 items (spec 6.2 gate); the first eligible call returns exactly 1, and
afterwards updates accrue at train_ratio / (B*T) per transition with no
catch-up for the prefill period (the Ratio's prev starts at that step).
"""

from __future__ import annotations

import math
from typing import Any, Dict, Mapping, Optional

from reverb_tables.config import ReplayConfig


class Ratio:
  """Spec 6.1 ``Ratio(r)(step)``; r = updates per step."""

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
  """Updates to run after each transition (spec 6.1, 6.2).

  ``schedule(step, num_items)``: ``step`` is the agent-transition count summed
  over workers (including the transition just added), ``num_items`` the
  replay size in items (e.g. ``WindowAdder.num_items``). ``config`` is a
  ReplayConfig (or any object with its fields, e.g. DreamerConfig); it reads
  train_fill, train_ratio and batch_steps.
  """

  def __init__(self, config: ReplayConfig):
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
