"""Crafter's report: success rates, the Crafter score (Hafner 2021) and the bars."""

import json
import os

import numpy as np
import pytest

from experiments.envs import crafter
from experiments.run import rundir
from experiments.tools import crafter_report, report

NAMES = crafter.achievement_names()


def episode(*unlocked, twice=()):
  """Counts of one episode: 1 for ``unlocked``, 2 for ``twice``, else 0."""
  return {n: (2 if n in twice else 1 if n in unlocked else 0) for n in NAMES}


def test_the_package_has_the_papers_22_achievements():
  assert len(NAMES) == 22 == crafter_report.NUM_ACHIEVEMENTS
  assert 'collect_diamond' in NAMES and 'wake_up' in NAMES


def test_success_rate_is_the_percent_of_episodes_that_unlocked_it():
  eps = [episode('collect_wood', twice=('place_table',)),
         episode('collect_wood'),
         episode(),
         episode('collect_wood', 'eat_cow')]
  rates = crafter_report.success_rates(eps)
  assert rates['collect_wood'] == 75.0      # 3 of 4 episodes
  assert rates['place_table'] == 25.0       # done twice in one episode: 1 of 4
  assert rates['eat_cow'] == 25.0
  assert rates['collect_diamond'] == 0.0
  assert len(rates) == 22


def test_crafter_score_against_hand_computed_values():
  # S = exp(mean(ln(1 + s_i))) - 1 over the 22 rates in percent (Hafner
  # 2021, the geometric mean with an offset of 1 %). s = 100 and 50 for two,
  # 0 for twenty:
  # (ln 101 + ln 51) / 22 = (4.615121 + 3.931826) / 22 = 0.388498;
  # e^0.388498 - 1 = 0.474763.
  rates = {n: 0.0 for n in NAMES}
  rates['collect_wood'], rates['place_table'] = 100.0, 50.0
  assert crafter_report.crafter_score(rates) == pytest.approx(0.474763, abs=1e-6)
  # Equal rates: the geometric mean is the rate itself.
  assert crafter_report.crafter_score({n: 10.0 for n in NAMES}) == pytest.approx(10.0)
  assert crafter_report.crafter_score({n: 0.0 for n in NAMES}) == 0.0
  assert crafter_report.crafter_score({n: 100.0 for n in NAMES}) == pytest.approx(100.0)


def test_bad_rates_and_episodes_are_refused():
  with pytest.raises(ValueError, match='22 success rates'):
    crafter_report.crafter_score({'collect_wood': 10.0})
  with pytest.raises(ValueError, match=r'\[0, 100\]'):
    crafter_report.crafter_score({n: 0.5 if i else 101.0 for i, n in enumerate(NAMES)})
  with pytest.raises(ValueError, match='at least one'):
    crafter_report.success_rates([])
  short = episode()
  short.pop('wake_up')
  with pytest.raises(ValueError, match='names 21'):
    crafter_report.success_rates([short])


def test_report_adds_the_crafter_table_and_bars(tmp_path):
  logdir = str(tmp_path / 'run')
  eps = [episode('collect_wood', 'wake_up'), episode('collect_wood')]
  for i, ep in enumerate(eps):
    rundir.append_score(logdir, 'reward', 1000 * (i + 1), 1.0 + i, 3,
                        {'achievements': ep})
  with open(os.path.join(logdir, rundir.SCORES_FILE)) as f:
    assert json.loads(f.readline())['achievements']['collect_wood'] == 1
  out = str(tmp_path / 'report.png')
  table = report.make_report(logdir, out)
  # collect_wood 100 %, wake_up 50 %, 20 at 0: (ln 101 + ln 51) / 22 -> 0.47.
  assert f'| {logdir} seed 3 | 2 | 0.47 |' in table
  assert '| collect_wood | 100.0 |' in table
  assert '| wake_up | 50.0 |' in table
  assert os.path.getsize(tmp_path / crafter_report.BARS_FILE) > 0


def test_a_run_without_achievements_has_no_crafter_part(tmp_path):
  logdir = str(tmp_path / 'run')
  rundir.append_score(logdir, 'walker_walk', 1000, 5.0, 0)
  assert crafter_report.section(logdir, str(tmp_path / 'report.png')) == ''
  assert not os.path.exists(tmp_path / crafter_report.BARS_FILE)


def test_watch_renders_crafter_frames_larger_than_the_observation():
  """watch.py's videos: crafter draws the same view at 256x256."""
  from experiments.envs import suites
  from experiments.tools import watch
  env = suites.make_env('crafter', 'reward', 1, 0)
  obs = env.reset()
  frame = watch.render_frame(env)
  assert frame.shape == (256, 256, 3) and frame.dtype == np.uint8
  assert obs['image'].shape == (64, 64, 3)
  # The same scene: the frame shrunk to 64x64 is close to the observation.
  small = frame.reshape(64, 4, 64, 4, 3).mean(axis=(1, 3))
  assert np.abs(small - obs['image']).mean() < 20
