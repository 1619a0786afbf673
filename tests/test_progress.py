"""The live progress line of both layouts (experiments/run/metrics.py):
its ETA comes from the recent training rate, says "estimating" while the
replay fills, and the final line has none."""
import agent  # noqa: F401  (jax compat before acme)

import pytest

from experiments.layouts.distributed.launch import launcher_progress_line
from experiments.run import metrics


def test_eta_estimates_while_the_replay_fills():
  eta = metrics.Eta()
  for t in range(5):                       # fill: 1,000 env steps per second
    eta.mark(wall=t * 10.0, env_steps=t * 10_000, training=False)
  assert eta.seconds_left(40_000, 100_000) is None
  line = metrics.progress_line(40_000, 100_000, 0, 1000.0, 40.0, eta=None)
  assert line.endswith('| ETA estimating')
  eta.mark(wall=50.0, env_steps=41_000, training=True)   # one mark: no rate
  assert eta.seconds_left(41_000, 100_000) is None


def test_eta_comes_from_the_recent_rate_not_the_run_average():
  eta = metrics.Eta(window_s=300)
  eta.mark(0.0, 0, training=False)
  eta.mark(40.0, 40_000, training=False)   # fast fill
  for i in range(5):                       # then 10 env steps per second
    eta.mark(40.0 + 30 * i, 40_000 + 300 * i, training=True)
  left = eta.seconds_left(41_200, 100_000)
  assert left == pytest.approx((100_000 - 41_200) / 10.0)
  average = 41_200 / 160.0                 # whole-run: 257 env steps/s
  assert left > 20 * (100_000 - 41_200) / average
  line = metrics.progress_line(41_200, 100_000, 500, 10.0, 160.0, eta=left)
  assert line.endswith(f'| ETA {metrics.fmt_secs(left)}') and '1h38m' in line


def test_eta_window_follows_a_rate_change():
  eta = metrics.Eta(window_s=300)
  steps = 0
  for t in range(0, 601, 30):              # 10 env steps/s for 10 minutes
    eta.mark(float(t), steps, training=True)
    steps += 300
  for t in range(630, 1231, 30):           # then 20 env steps/s
    eta.mark(float(t), steps, training=True)
    steps += 600
  assert eta.rate() == pytest.approx(20.0)


def test_final_line_has_no_eta():
  line = metrics.progress_line(3000, 3000, 216, 43.7, 68.0, final=True,
                               eta=0.0)
  assert line.startswith('[done]') and 'ETA' not in line
  assert line.endswith('elapsed 1m08s')


def test_launcher_line_estimates_then_uses_the_rows_recent_rate():
  eta = metrics.Eta()

  def row(wall, step, updates):
    return {'env_step': step, 'updates': updates, 'wall_time': wall,
            'fps/env_steps_per_s': 1.0, 'replay/ratio_target': 32}

  assert launcher_progress_line(row(20.0, 8_000, 0), 100_000, 21.0,
                                eta).endswith('ETA estimating')
  assert launcher_progress_line(row(60.0, 9_000, 10), 100_000, 61.0,
                                eta).endswith('ETA estimating')
  line = launcher_progress_line(row(160.0, 10_000, 60), 100_000, 161.0, eta)
  assert line.endswith(f'ETA {metrics.fmt_secs(90_000 / 10.0)}'), line
  # The same newest row read again leaves the rate as it was.
  assert launcher_progress_line(row(160.0, 10_000, 60), 100_000, 191.0,
                                eta) == line.replace('2m41s', '3m11s')
