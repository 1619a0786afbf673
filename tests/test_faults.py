"""Storage faults: a checkpoint write that fails keeps the
previous complete checkpoint and stops the run with a clear message; the same
command then resumes from it. Real runs of experiments/run_dmc.py, the fault
injected in the run directory's writer (``rundir.FAULT_ENV``)."""

import os
import subprocess
import sys

import pytest

from experiments.run import rundir

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SMOKE = os.path.join(REPO, 'experiments', 'flags', 'smoke.flags')


def _run(logdir, *extra, fault=None, timeout=420):
  env = {**os.environ, 'PYTHONUNBUFFERED': '1'}
  env.pop(rundir.FAULT_ENV, None)
  if fault:
    env[rundir.FAULT_ENV] = fault
  return subprocess.run(
      [sys.executable, os.path.join(REPO, 'experiments', 'run_dmc.py'),
       f'--flagfile={SMOKE}', f'--logdir={logdir}', '--eval_episodes=0',
       '--noreport', '--checkpoint_every=1', '--env_steps=400', *extra],
      cwd=REPO, env=env, capture_output=True, text=True, timeout=timeout)


def _check_failed_save_and_resume(logdir, first, *extra):
  assert first.returncode == 3, first.stderr[-3000:]
  assert 'No space left on device' in first.stderr, first.stderr[-3000:]
  assert 'is kept' in first.stderr
  kept = rundir.list_run_checkpoints(str(logdir))
  assert len(kept) == 1, kept                           # the complete one
  root = rundir.checkpoint_root(str(logdir))
  assert not [n for n in os.listdir(root) if n.startswith(rundir.TMP_PREFIX)]
  state = rundir.load_run_state(kept[0])
  again = _run(logdir, *extra)
  assert again.returncode == 0, again.stderr[-3000:]
  assert 'resum' in again.stderr and kept[0] in again.stderr
  final = rundir.load_run_state(rundir.latest_run_checkpoint(str(logdir)))
  assert final['counts']['env_steps'] >= 400
  assert final['learner']['updates'] > state['learner']['updates']


@pytest.mark.slow
def test_full_disk_at_a_checkpoint_keeps_the_last_one_and_resumes(
    tmp_path, smoke_flags):
  """One process: the second checkpoint's writes fail with ENOSPC (each
  checkpoint makes 3 writes through the writer: learner, config, run state)."""
  logdir = tmp_path / 'run'
  first = _run(logdir, *smoke_flags, fault='ENOSPC@5')
  _check_failed_save_and_resume(logdir, first, *smoke_flags)


@pytest.mark.slow
def test_full_disk_in_the_launchpad_learner_keeps_the_last_one(tmp_path):
  """--distributed: the learner node's second checkpoint fails; the program
  stops, naming the learner and the error; the same command resumes."""
  logdir = tmp_path / 'mp'
  extra = ('--distributed', '--num_actors=2', '--stop_grace=20')
  first = _run(logdir, *extra, fault='ENOSPC@5', timeout=600)
  assert 'learner' in first.stderr
  _check_failed_save_and_resume(logdir, first, *extra)
