"""Update scheduling: spec 6.1 Ratio and the spec 6.2 train_fill gate."""

import math

import pytest

from agent.config import make_config
from experiments.layouts.scheduled import Ratio, TrainSchedule


def test_ratio_exact_accrual():
  """spec 6.1: first call returns 1 and sets prev; then floor((step-prev)*r)
  with prev += repeats/r, so after N further steps exactly floor(N*r) for the
  dyadic ratios train_ratio/1024 of spec 6.1 (others are float-rounded, as in
  the reference, and may lag by one)."""
  for rr in (32, 64, 128, 256, 512, 1024, 2048):
    r = rr / 1024
    ratio = Ratio(r)
    assert ratio(100) == 1
    total = sum(ratio(100 + k) for k in range(1, 1001))
    assert total == math.floor(1000 * r), r
  for r in (1 / 3, 0.7):
    ratio = Ratio(r)
    ratio(0)
    total = sum(ratio(k) for k in range(1, 1001))
    assert math.floor(1000 * r) - 1 <= total <= math.floor(1000 * r)
  ratio = Ratio(0.5)
  assert [ratio(s) for s in range(10, 16)] == [1, 0, 1, 0, 1, 0]


def lockstep_loop(config, num_envs, total_steps, schedule):
  """Algorithm K: step += 1, replay.add, then trainfn, per transition."""
  length = config.seq_len
  counts = [0] * num_envs
  items = 0
  step = 0
  updates = []
  while step < total_steps:
    for w in range(num_envs):
      step += 1
      counts[w] += 1                        # replay.add: item once >= 65 steps
      if counts[w] >= length:
        items += 1
      updates.append((step, schedule(step, items)))
      if step >= total_steps:
        break
  return updates


def test_train_schedule_gate_first_update_and_counts():
  """spec 6.1, 6.2: 0 updates until train_fill = B*T = 1024 items; with 16
  lock-stepped envs the first update is at transition 2048 and returns exactly
  1; then floor((step - 2048) * 512/1024) more, no catch-up for the prefill."""
  config = make_config()                    # B 16, T 64, RR 512, fill 1024
  assert config.train_fill == config.batch_steps == 1024
  schedule = TrainSchedule(config)
  assert schedule.ratio == 0.5
  updates = lockstep_loop(config, 16, 5000, schedule)
  first = next(s for s, u in updates if u)
  assert first == 2048                      # s = 128 per env (spec 6.2)
  assert dict(updates)[first] == 1
  assert all(u == 0 for s, u in updates if s < first)
  for n in (2048, 2049, 2050, 3001, 5000):
    done = sum(u for s, u in updates if s <= n)
    assert done == 1 + math.floor((n - 2048) * 0.5), n
  assert schedule.num_updates == 1 + math.floor((5000 - 2048) * 0.5)


def test_train_schedule_rr32_and_state_roundtrip():
  """spec 6.1: RR 32 gives 1/32 updates per transition; the saved state
  resumes the identical sequence (checkpoint, spec 6.1 Ratio prev)."""
  config = make_config(train_ratio=32)
  a = TrainSchedule(config)
  assert a(10, 1023) == 0                   # gated (spec 6.2)
  assert a(11, 1024) == 1                   # first eligible call
  seq_a = [a(s, 2000) for s in range(12, 500)]
  assert sum(seq_a) == math.floor((499 - 11) / 32)
  b = TrainSchedule(config)
  b(11, 1024)
  for s in range(12, 300):
    b(s, 2000)
  state = b.get_state()
  c = TrainSchedule(config)
  c.set_state(state)
  assert [c(s, 2000) for s in range(300, 500)] == seq_a[300 - 12:]
  with pytest.raises(ValueError, match='ratio'):
    TrainSchedule(make_config(train_ratio=64)).set_state(state)
