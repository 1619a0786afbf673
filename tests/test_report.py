"""Tests of experiments/tools/report.py: score curves vs the official DreamerV3 anchors (spec 7.7)."""

import gzip
import json
import os
import subprocess
import sys

import numpy as np
import pytest

from experiments.run import rundir
from experiments.tools import report

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PNG_MAGIC = b'\x89PNG\r\n\x1a\n'


def _write_scores(logdir, rows):
  os.makedirs(logdir, exist_ok=True)
  with open(os.path.join(logdir, 'scores.jsonl'), 'w') as f:
    for row in rows:
      f.write(json.dumps(row) + '\n')


def _fake_run(logdir, seeds=(0, 1), task='walker_walk', last_step=100_000):
  rows = []
  for seed in seeds:
    for i, step in enumerate(range(16_032, last_step + 1, 8_016)):
      rows.append({'task': task, 'env_step': step, 'score': 100.0 + 10 * i + seed,
                   'seed': seed})
  _write_scores(logdir, rows)
  return rows


def test_anchor_file_matches_spec_7_7():
  """Spec 7.7: 18 tasks x 5 seeds, xs 10K..490K; task mean 757.8 / median 868.5 at 490K."""
  anchors = report.load_anchors()
  from experiments.envs.dmc import DMC_PROPRIO_TASKS
  assert sorted(anchors) == sorted(DMC_PROPRIO_TASKS)
  means = []
  for anchor in anchors.values():
    assert anchor.ys.shape == (5, 49)
    assert anchor.xs[0] == 10_000 and anchor.xs[-1] == 490_000
    means.append(anchor.at(490_000)[1])
  assert np.mean(means) == pytest.approx(757.8, abs=0.05)
  assert np.median(means) == pytest.approx(868.5, abs=0.05)
  assert np.mean([a.at(250_000)[1] for a in anchors.values()]) == pytest.approx(675.4, abs=0.05)
  with gzip.open(report.ANCHOR_FILE, 'rt') as f:
    assert json.load(f)[0]['task'].startswith('dmc_')  # mapped by normalize_task


def test_make_report_writes_png_and_table(tmp_path):
  """Spec 7.7: PNG written; table has our last-5 mean and the official mean at the nearest step."""
  rows = _fake_run(str(tmp_path / 'run'))
  out = tmp_path / 'plots' / 'report.png'
  table = report.make_report([str(tmp_path / 'run')], str(out))
  with open(out, 'rb') as f:
    assert f.read(8) == PNG_MAGIC
  assert out.stat().st_size > 10_000
  assert 'walker_walk' in table
  # Our last-5 mean: mean over the two seeds of each seed's last 5 episodes.
  ours = np.mean([np.mean([r['score'] for r in rows if r['seed'] == s][-5:]) for s in (0, 1)])
  assert f'{ours:.1f}' in table
  # Official mean at the anchor step nearest our last env step (96_192 -> 100K).
  anchor = report.load_anchors()['walker_walk']
  step, mean, lo, hi = anchor.at(96_192)
  assert step == 100_000
  assert f'{mean:.1f} @ 100K' in table and f'{lo:.1f}-{hi:.1f}' in table
  assert '| walker_walk | 2 |' in table


def test_several_logdirs_and_tasks(tmp_path):
  """Spec 7.7: runs are (logdir, seed); several logdirs and tasks in one report."""
  _fake_run(str(tmp_path / 'a'), seeds=(0,))
  _fake_run(str(tmp_path / 'b'), seeds=(0,), last_step=60_000)
  _write_scores(str(tmp_path / 'c'), [
      {'task': 'dmc_cartpole_swingup', 'env_step': 20_000, 'score': 50.0, 'seed': 3},
      {'task': 'point_mass_easy', 'env_step': 20_000, 'score': 5.0, 'seed': 3}])
  runs = report.load_scores([tmp_path / 'a', tmp_path / 'b', tmp_path / 'c'])
  assert sorted(runs) == ['cartpole_swingup', 'point_mass_easy', 'walker_walk']
  assert len(runs['walker_walk']) == 2
  table = report.make_report([tmp_path / 'a', tmp_path / 'b', tmp_path / 'c'],
                             tmp_path / 'out.png')
  assert '| walker_walk | 2 |' in table and '| cartpole_swingup | 1 |' in table
  assert 'n/a (no anchor)' in table  # point_mass_easy has no official curve
  assert 'mean (2 tasks)' in table
  assert os.path.getsize(tmp_path / 'out.png') > 10_000


def test_append_score_round_trip(tmp_path):
  """append_score writes the lines the report reads."""
  rundir.append_score(tmp_path, 'walker_walk', 2004, 12.5, seed=1)
  rundir.append_score(tmp_path, 'walker_walk', 1002, 10.0, seed=1)
  (run,) = report.load_scores(tmp_path)['walker_walk']
  assert run.seed == 1 and run.steps.tolist() == [1002, 2004]
  assert run.scores.tolist() == [10.0, 12.5]
  with pytest.raises(ValueError, match='finite'):
    rundir.append_score(tmp_path, 'walker_walk', 3006, float('nan'), seed=1)


def test_bad_inputs_fail_clearly(tmp_path):
  """A missing run directory, a run with no episode yet and malformed lines
  each say what they are (the last naming the file and line)."""
  with pytest.raises(FileNotFoundError, match='no run directory at .*missing'):
    report.load_scores(tmp_path / 'missing')
  (tmp_path / 'empty_run' / 'eval').mkdir(parents=True)
  with pytest.raises(report.NoEpisodeYet,
                     match='no episode has ended yet in .*empty_run'):
    report.load_scores(tmp_path / 'empty_run')
  path = tmp_path / 'scores.jsonl'
  path.write_text('{"task": "walker_walk", "env_step": 1, "score": 1.0, "seed": 0}\n'
                  '{"task": "walker_walk", "score": 1.0, "seed": 0}\n')
  with pytest.raises(ValueError, match=r'scores.jsonl:2: missing field\(s\) \[.env_step.\]'):
    report.load_scores(tmp_path)
  path.write_text('not json\n')
  with pytest.raises(ValueError, match='scores.jsonl:1: not valid JSON'):
    report.load_scores(tmp_path)
  path.write_text('\n')
  with pytest.raises(report.NoEpisodeYet, match='no episode has ended yet'):
    report.load_scores(tmp_path)
  with pytest.raises(report.NoEpisodeYet, match='none has ended yet'):
    report.load_scores(path)


def test_cli(tmp_path):
  """`python experiments/tools/report.py --logdir DIR --out PNG` prints the table."""
  _fake_run(str(tmp_path / 'run'))
  out = tmp_path / 'cli.png'
  proc = subprocess.run(
      [sys.executable, os.path.join(ROOT, 'experiments', 'tools', 'report.py'),
       '--logdir', str(tmp_path / 'run'), '--out', str(out)],
      capture_output=True, text=True, timeout=120, cwd=str(tmp_path))
  assert proc.returncode == 0, proc.stderr
  assert '| walker_walk |' in proc.stdout and 'official mean' in proc.stdout
  assert out.exists()
  proc = subprocess.run(
      [sys.executable, os.path.join(ROOT, 'experiments', 'tools', 'report.py'),
       '--logdir', str(tmp_path / 'nope')], capture_output=True, text=True, timeout=120)
  assert proc.returncode == 2 and 'error:' in proc.stderr
  # The default PNG is the run's own report.png; a run with no episode yet
  # is told so, not as a malformed file.
  proc = subprocess.run(
      [sys.executable, os.path.join(ROOT, 'experiments', 'tools', 'report.py'),
       '--logdir', str(tmp_path / 'run')], capture_output=True, text=True,
      timeout=120)
  assert proc.returncode == 0 and (tmp_path / 'run' / 'report.png').exists()
  (tmp_path / 'young').mkdir()
  proc = subprocess.run(
      [sys.executable, os.path.join(ROOT, 'experiments', 'tools', 'report.py'),
       '--logdir', str(tmp_path / 'young')], capture_output=True,
      text=True, timeout=120)
  assert proc.returncode == 2, proc.stderr
  assert 'no episode has ended yet' in proc.stderr, proc.stderr
  assert 'expected a JSONL' not in proc.stderr


def test_tasks_without_official_curves_get_a_fitted_axis_and_short_bins(tmp_path):
  """A 12K-step gym run whose scores sit near -500: the y-axis fits them and
  the bins show the run as a curve; DMC tasks keep the benchmark's 0..1,000
  axis and the anchors' 10K bins."""
  steps = np.arange(200, 12_001, 200)
  rows = [{'task': 'Pendulum-v1', 'env_step': int(s), 'score': -520.0 + s / 1000,
           'seed': 0} for s in steps]
  _write_scores(tmp_path / 'gym', rows)
  (run,) = report.load_scores(tmp_path / 'gym')['pendulum-v1']
  bins, (_, right), (lo, hi) = report.panel_scale([run], None)
  assert bins == 12_000 / 25 and right > 12_000
  assert -521 < lo < -520 and -508 < hi < -507
  xs, _ = report.mean_curve([run], bins)
  assert len(xs) >= 20
  _fake_run(tmp_path / 'dmc', last_step=490_000)
  dmc = report.load_scores(tmp_path / 'dmc')['walker_walk']
  anchor = report.load_anchors()['walker_walk']
  bins, _, (lo, hi) = report.panel_scale(dmc, anchor)
  assert bins == report.BINSIZE and lo <= 0 and hi >= 1000
  report.make_report([tmp_path / 'gym', tmp_path / 'dmc'], tmp_path / 'r.png')


def test_bins_fit_a_short_dmc_run(tmp_path):
  """A 15K-step quickstart-like run (4 envs, an episode every 1K env steps)
  is a curve of more than two points, also on a task with official curves."""
  rows = [{'task': 'cartpole_swingup', 'env_step': step, 'score': step / 100,
           'seed': 0} for step in range(1000, 15_001, 1000) for _ in range(4)]
  _write_scores(tmp_path / 'q', rows)
  runs = report.load_scores(tmp_path / 'q')['cartpole_swingup']
  anchor = report.load_anchors()['cartpole_swingup']
  bins, _, _ = report.panel_scale(runs, anchor)
  assert bins == 15_000 / 25
  xs, _ = report.mean_curve(runs, bins)
  assert len(xs) == 15


def test_run_without_a_training_episode_is_reported_from_its_evals(tmp_path):
  """--env_steps=3000 ends before any training episode; the run's report
  comes from eval/scores.jsonl and says so."""
  logdir = tmp_path / 'short'
  (logdir / 'eval').mkdir(parents=True)
  with open(logdir / 'eval' / 'scores.jsonl', 'w') as f:
    for score in (25.5, 69.2, 60.8, 25.0):
      f.write(json.dumps({'task': 'cartpole_swingup', 'env_step': 3000,
                          'score': score, 'seed': 0}) + '\n')
  (run,) = report.load_scores(logdir)['cartpole_swingup']
  assert run.source == 'eval' and len(run.scores) == 4
  table = report.write_run_report(logdir)
  assert table is not None and '| cartpole_swingup | 1 | 4 |' in table
  assert 'No training episode has ended yet' in table
  assert 'eval/scores.jsonl' in table
  assert (logdir / rundir.REPORT_FILE).stat().st_size > 10_000
  # Training episodes, once there, are what the report plots.
  _write_scores(logdir, [{'task': 'cartpole_swingup', 'env_step': 4000,
                          'score': 80.0, 'seed': 0}])
  (run,) = report.load_scores(logdir)['cartpole_swingup']
  assert run.source == 'train' and run.scores.tolist() == [80.0]


def test_step_labels_are_distinct_at_every_budget():
  assert report.step_labels([0, 500, 1000, 1500, 2000]) == [
      '0', '500', '1,000', '1,500', '2,000']
  assert report.step_labels([0, 5000, 10_000, 15_000]) == [
      '0', '5K', '10K', '15K']
  assert report.step_labels([0, 2500, 5000, 7500, 10_000]) == [
      '0', '2.5K', '5.0K', '7.5K', '10.0K']
  assert report.step_labels([0, 250_000, 500_000, 1_000_000]) == [
      '0', '0.25M', '0.50M', '1.00M']
  assert len(set(report.step_labels([1e6, 1.25e6, 1.5e6]))) == 3


@pytest.mark.parametrize('budget', [300, 1_500, 3_000, 15_000, 28_100,
                                    100_000, 490_000, 2_000_000])
def test_plotted_x_axis_labels_are_readable_at_every_budget(budget):
  """The ticks matplotlib draws for a run of ``budget`` env steps, with and
  without official curves: no label repeats (a 3K run read 0, 1K, 1K, 2K)."""
  import matplotlib.pyplot as plt
  steps = np.linspace(budget / 10, budget, 10)
  runs = {task: [report.Run(task, 'run', 0, steps, steps / budget * 500)]
          for task in ('cartpole_swingup', 'my_task')}
  fig = report.figure(runs, report.load_anchors())
  fig.canvas.draw()
  for ax in fig.axes:
    if not ax.axison:
      continue
    labels = [t.get_text() for t in ax.get_xticklabels() if t.get_text()]
    assert len(labels) >= 3 and len(set(labels)) == len(labels), labels
  plt.close(fig)
