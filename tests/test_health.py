"""Long-run health: the persistent-skip rule
(``experiments.run.health.SkipGuard``, ``--max_skipped_updates``) and the
checkpoint writer's refusal of non-finite learner state
(``experiments.run.rundir.check_finite_state``). Spec 4.9 is the reference's
fp16-only counterpart; the skip itself is Algorithm J (agent/learning.py).

The real runs diverge on purpose: lr 1e30 with a one-update warm-up. The
first update with a non-zero lr makes the params huge but finite; every
later loss is non-finite, so every later update is skipped (the policy stays
finite: its norms absorb the scale, so the run does not stop on NaN actions
first)."""

import json
import os
import subprocess
import sys

import numpy as np
import pytest
from absl import flags

from experiments import options
from experiments.run import health, rundir
from experiments.run import restarts as restart_log
from experiments.run.config import RunConfig

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RUN_DMC = os.path.join(REPO, 'experiments', 'run_dmc.py')
SMOKE = os.path.join(REPO, 'experiments', 'flags', 'smoke.flags')
UNSTABLE = ('--config_overrides=lr=1e30', '--config_overrides=warmup=1')


# --- the rule (unit) ----------------------------------------------------------------


def _ckpt(logdir, steps, updates):
  """A complete-looking ckpt-* (what ``latest_run_checkpoint`` lists)."""
  path = os.path.join(rundir.checkpoint_root(str(logdir)),
                      f'{rundir.CKPT_PREFIX}{steps:012d}')
  os.makedirs(path)
  state = rundir.make_run_state(
      mode='single_process', segment=0, counts={}, counter={},
      learner={k: 0 for k in rundir.LEARNER_KEYS +
                 rundir.ONE_PROCESS_LEARNER_KEYS} | {'updates': updates},
      actors=[], evaluator=None, recent_scores=[])
  with open(os.path.join(path, rundir.RUN_STATE_FILE), 'w') as f:
    json.dump(state, f)
  return path


def test_skip_guard_stops_after_n_consecutive_and_names_the_checkpoint(tmp_path):
  ok, skip = {'skipped_update': 0.0}, {'skipped_update': 1.0,
                                       'nonfinite_batch': 0.0}
  bad_batch = {'skipped_update': 1.0, 'nonfinite_batch': 1.0}
  ckpt = _ckpt(tmp_path, 48, updates=7)
  rows = []
  guard = health.SkipGuard(3, str(tmp_path), on_stop=lambda: rows.append(1))
  for m in (ok, skip, skip, ok, skip, ok):       # streaks of 2 and 1: no stop
    guard.observe(m)
  assert guard.row() == {'learner/skipped_updates': 3,
                         'learner/skip_streak': 0, 'learner/bad_batches': 0}
  guard.observe(skip)
  # Bad data is not divergence: skips for a non-finite batch, however many,
  # neither extend nor end the streak.
  for _ in range(10):
    guard.observe(bad_batch)
  guard.observe(skip)
  assert guard.row()['learner/skip_streak'] == 2 and not rows
  with pytest.raises(health.PersistentSkipError) as e:
    guard.observe(skip)
  msg = str(e.value)
  assert 'the last 3 updates in a row were skipped' in msg, msg
  assert '--max_skipped_updates=3' in msg
  assert '10 more updates were skipped for a non-finite batch' in msg
  assert f'{ckpt} (update 7, finite params)' in msg
  assert rows == [1]                             # the last row, before raising
  assert guard.row() == {'learner/skipped_updates': 16,
                         'learner/skip_streak': 3, 'learner/bad_batches': 10}


def test_skip_guard_zero_never_stops_and_without_checkpoint(tmp_path):
  guard = health.SkipGuard(0, str(tmp_path))
  for _ in range(1000):
    guard.observe({'skipped_update': 1.0})
  assert guard.streak == 1000
  guard = health.SkipGuard(1, str(tmp_path))
  with pytest.raises(health.PersistentSkipError, match='none was written yet'):
    guard.observe({'skipped_update': 1.0})


def test_watch_feeds_every_step_and_proxies_the_rest(tmp_path):
  class Learner:
    num_steps = 0
    def step(self):
      self.num_steps += 1
      return {'skipped_update': 1.0}

  learner = Learner()
  guard = health.SkipGuard(2, str(tmp_path))
  watched = guard.watch(learner)
  watched.step()
  assert watched.num_steps == 1 and guard.streak == 1
  with pytest.raises(health.PersistentSkipError):
    watched.step()


@pytest.mark.parametrize('bad', [-1, 1.5, True, '3'])
def test_max_skipped_updates_is_validated(bad, tmp_path):
  with pytest.raises(ValueError, match='--max_skipped_updates'):
    RunConfig(task='cartpole_swingup', logdir=str(tmp_path), env_steps=10,
              max_skipped_updates=bad)
  with pytest.raises(ValueError, match='--max_skipped_updates'):
    health.SkipGuard(bad, str(tmp_path))


def test_max_skipped_updates_flag(tmp_path):
  fv = flags.FlagValues()
  options.define_flags(fv)
  with pytest.raises(flags.IllegalFlagValueError, match='max_skipped_updates'):
    fv(['x', f'--flagfile={SMOKE}', f'--logdir={tmp_path}/run',
        '--max_skipped_updates=-1'])
  fv = flags.FlagValues()
  options.define_flags(fv)
  fv(['x', f'--flagfile={SMOKE}', f'--logdir={tmp_path}/run',
      '--max_skipped_updates=7'])
  run, _, _ = options.configs_from_flags(fv)
  assert run.max_skipped_updates == 7
  assert '--max_skipped_updates=7' in run.flags_text
  assert not os.path.exists(tmp_path / 'run')


# --- the checkpoint writer's guard (unit) ---------------------------------------------


def test_checkpoint_writer_refuses_non_finite_state_and_keeps_the_last(tmp_path):
  kept = _ckpt(tmp_path, 48, updates=7)
  state = {'params': {'enc/w': np.ones((3, 2), np.float32),
                      'dec/b': np.array([1.0, np.inf, np.nan], np.float32)},
           'key': np.array([1, 2], np.uint32)}
  before = sorted(os.listdir(rundir.checkpoint_root(str(tmp_path))))
  run_state = rundir.make_run_state(
      mode='single_process', segment=0, counts={}, counter={},
      learner={k: 0 for k in rundir.LEARNER_KEYS +
               rundir.ONE_PROCESS_LEARNER_KEYS}, actors=[], evaluator=None,
      recent_scores=[])
  with pytest.raises(rundir.CheckpointError) as e:
    rundir.write_checkpoint(str(tmp_path), 96, reverb_path='unused',
                            learner_state=state, config=None, spaces=None,
                            run=None, mode='single_process',
                            run_state=run_state)
  msg = str(e.value)
  assert 'ckpt-000000000096 was not written' in msg, msg
  assert "2 of 3 in ['params']['dec/b']" in msg, msg
  assert f'({kept}) is kept' in msg
  assert sorted(os.listdir(rundir.checkpoint_root(str(tmp_path)))) == before
  # Finite state (integer leaves such as the rng key are not checked) passes.
  state['params']['dec/b'] = np.zeros(3, np.float32)
  rundir.check_finite_state(state, 'x', str(tmp_path))


# --- a real unstable run (one process, slow) ------------------------------------------


def _rows(logdir, kind='train'):
  with open(os.path.join(logdir, rundir.METRICS_FILE)) as f:
    return [r for r in map(json.loads, f) if r.get('kind') == kind]


@pytest.mark.slow
def test_unstable_run_reports_skips_and_stops_without_bad_checkpoint(
    tmp_path, smoke_flags):
  """lr 1e30: the updates after the first applied one are all skipped; the
  train rows show them, and after 5 in a row the run stops (exit 3) naming
  the count and the last checkpoint, whose params are finite.

  The shared smoke model (batch 2, horizon 4) and the session's cache: the
  update still compiles once for its own lr, most of this run's time."""
  logdir = str(tmp_path / 'run')
  out = subprocess.run(
      [sys.executable, RUN_DMC, f'--flagfile={SMOKE}', f'--logdir={logdir}',
       '--eval_episodes=0', '--noreport', '--log_every=20',
       '--checkpoint_every=1', '--max_skipped_updates=5', *UNSTABLE,
       *smoke_flags],
      cwd=REPO, capture_output=True, text=True, timeout=300,
      env={**os.environ, 'PYTHONUNBUFFERED': '1'})
  assert out.returncode == 3, out.stderr[-3000:]
  assert 'the last 5 updates in a row were skipped' in out.stderr, (
      out.stderr[-3000:])
  assert '--max_skipped_updates=5' in out.stderr
  kept = rundir.list_run_checkpoints(logdir)       # checkpoint_every=1 s
  assert len(kept) == 1, kept
  assert f'The last good checkpoint: {kept[0]} (update' in out.stderr
  rows = _rows(logdir)
  # The row at the stop: its window holds the applied update and the 5
  # skipped ones after it.
  assert rows[-1]['train/skipped_update'] > 0, rows[-1]
  assert rows[-1]['learner/skip_streak'] == 5, rows[-1]
  assert rows[-1]['learner/skipped_updates'] >= 5
  state = rundir.read_learner_state(kept[0])
  rundir.check_finite_state(state, kept[0], logdir)      # finite params
  assert not [n for n in os.listdir(rundir.checkpoint_root(logdir))
              if n.startswith(rundir.TMP_PREFIX)]


# --- the Launchpad layout (slow) --------------------------------------------------------


@pytest.mark.slow
def test_unstable_distributed_run_stops_in_the_learner(tmp_path):
  """--distributed: the learner node's guard stops the program (exit 3), the
  error names the count, and the train rows show the skips."""
  logdir = str(tmp_path / 'mp')
  out = subprocess.run(
      [sys.executable, RUN_DMC, '--distributed', f'--flagfile={SMOKE}',
       f'--logdir={logdir}', '--num_actors=2', '--eval_every=0',
       '--eval_episodes=0', '--noreport', '--stop_grace=20',
       '--log_every=20', '--checkpoint_every=2', '--env_steps=2000',
       '--max_skipped_updates=5', *UNSTABLE],
      cwd=REPO, capture_output=True, text=True, timeout=600,
      env={**os.environ, 'PYTHONUNBUFFERED': '1'})
  assert out.returncode == 3, out.stderr[-4000:]
  assert 'PersistentSkipError' in out.stderr, out.stderr[-4000:]
  assert 'the last 5 updates in a row were skipped' in out.stderr
  # No program restart: a restart cannot cure divergence.
  assert 'a restart cannot cure this error' in out.stderr, out.stderr[-4000:]
  assert restart_log.count_restarts(logdir) == 0
  rows = _rows(logdir)
  assert rows[-1]['learner/skip_streak'] == 5, rows[-1]
  for ckpt in rundir.list_run_checkpoints(logdir):
    rundir.check_finite_state(rundir.read_learner_state(ckpt), ckpt, logdir)
