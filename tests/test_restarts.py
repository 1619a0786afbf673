"""Dead nodes of a Launchpad run.

Default suite: the supervisor's worker manager with real processes killed by
SIGKILL (an 'actor' restarted in place with a new restart count, a 'learner'
death stopping the program, the bound), and the restart records. Slow: the
real local_mp program with an actor, the learner or the Reverb node killed
by SIGKILL; the run reaches its budget, nothing is left running and the log
files hold no duplicated or half-written line.
"""

import json
import os
import signal
import sys
import time

import pytest

from experiments.layouts.distributed import supervisor
from experiments.layouts.distributed.program import NODE_GROUP_ENV
from experiments.layouts.distributed.settings import DistributedConfig
from experiments.layouts.distributed.supervisor import RESTART_ENV
from experiments.run import rundir
from experiments.run import restarts as restart_log

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# A node that dies by SIGKILL until its restart count reaches `until`.
NODE = ('import os, signal, sys; k = int(os.environ.get("{env}", "0")); '
        'print("start", k, flush=True); '
        'os.kill(os.getpid(), signal.SIGKILL) if k < {until} else sys.exit(0)')


def _manager(max_restarts, restarts, fatal):
  from absl import flags
  if not flags.FLAGS.is_parsed():    # Launchpad reads its flags (as _launch)
    flags.FLAGS.mark_as_parsed()
  return supervisor.RestartingWorkerManager(
      max_restarts, on_restart=lambda e, k: restarts.append((e.node, k)),
      on_fatal=fatal.append)


def _start(manager, name, log_path, until):
  with open(log_path, 'w') as out:
    manager.process_worker(
        name, [sys.executable, '-c', NODE.format(env=RESTART_ENV, until=until)],
        env=dict(os.environ), stdout=out, stderr=out)


def test_dead_actor_is_restarted_in_place_with_its_count(tmp_path):
  restarts, fatal = [], []
  manager = _manager(3, restarts, fatal)
  try:
    log_path = str(tmp_path / 'actor_1.log')
    _start(manager, 'actor/1', log_path, until=2)
    manager.wait()                       # raises on a failure it did not fix
  finally:
    manager.close()
  assert restarts == [('actor/1', 1), ('actor/1', 2)]
  assert not fatal and manager.fatal is None
  # Ctrl-C is the launcher's again between two launches.
  assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
  text = open(log_path).read()
  # One log file across restarts, each restart announced in it.
  assert [line for line in text.splitlines() if line.startswith('start')] == [
      'start 0', 'start 1', 'start 2']
  assert 'actor/1 killed by SIGKILL (-9); restart 2 in place' in text


def test_restarts_are_bounded_and_other_nodes_are_fatal(tmp_path):
  restarts, fatal = [], []
  manager = _manager(1, restarts, fatal)
  try:
    _start(manager, 'evaluator/0', str(tmp_path / 'ev.log'), until=5)
    with pytest.raises(RuntimeError, match='exited with code -9'):
      manager.wait()
  finally:
    manager.close()
  assert restarts == [('evaluator/0', 1)]
  assert manager.fatal is not None and fatal == [manager.fatal]
  assert manager.fatal.node == 'evaluator/0'
  report = manager.fatal.report()
  assert 'evaluator/0 killed by SIGKILL (-9)' in report and 'start 1' in report

  restarts, fatal = [], []
  manager = _manager(3, restarts, fatal)
  try:
    _start(manager, 'learner/0', str(tmp_path / 'learner.log'), until=1)
    with pytest.raises(RuntimeError):
      manager.wait()
  finally:
    manager.close()
  assert restarts == [] and manager.fatal.group == 'learner'


def test_deaths_in_the_programs_stop_are_not_blamed(tmp_path):
  """Once the program is stopping, a node dead by SIGTERM (Launchpad's stop
  request) or SIGALRM (the alarm Launchpad's stop handler arms inside each
  node, which kills a node already shutting down) is not the culprit; a node
  killed by anything else is (a killed Reverb node whose death another node
  reported first)."""
  restarts, fatal = [], []
  manager = _manager(3, restarts, fatal)
  try:
    manager._stop_event.set()    # noqa: SLF001  (a node asked for the stop)
    procs = []
    for name, sig in (('actor/0', 'SIGALRM'), ('actor/1', 'SIGTERM')):
      with open(tmp_path / f'{name.replace("/", "_")}.log', 'w') as out:
        manager.process_worker(name, [sys.executable, '-c', (
            f'import os, signal; os.kill(os.getpid(), signal.{sig})')],
            env=dict(os.environ), stdout=out, stderr=out)
      procs.append(manager._active_workers[name][-1])  # noqa: SLF001
    for proc in procs:
      proc.wait(timeout=60)    # both dead before the manager looks
    manager.wait(raise_error=False)
    assert [p.returncode for p in procs] == [-signal.SIGALRM, -signal.SIGTERM]
    assert restarts == [] and manager.culprit() is None
    with open(tmp_path / 'replay.log', 'w') as out:
      manager.process_worker('replay/0', [sys.executable, '-c', (
          'import os, signal; os.kill(os.getpid(), signal.SIGKILL)')],
          env=dict(os.environ), stdout=out, stderr=out)
    manager._active_workers['replay/0'][-1].wait(timeout=60)  # noqa: SLF001
    manager.wait(raise_error=False)
    assert manager.culprit().describe() == 'replay/0 killed by SIGKILL (-9)'
  finally:
    manager.close()


def test_restart_records_and_config(tmp_path):
  logdir = str(tmp_path)
  assert restart_log.count_restarts(logdir) == 0
  exit_ = supervisor.NodeExit('actor/0', 'actor', -9)
  assert restart_log.append_restart(logdir, exit_.record(kind='in_place',
                                                    restart=1)) == 1
  assert restart_log.append_restart(logdir, {'kind': 'program', 'restart': 1}) == 2
  rows = [json.loads(x) for x in open(tmp_path / restart_log.RESTARTS_FILE)]
  assert rows[0]['node'] == 'actor/0' and rows[0]['status'].startswith(
      'killed by SIGKILL')
  with pytest.raises(ValueError, match='max_restarts'):
    DistributedConfig(max_restarts=-1)
  assert not DistributedConfig(terminal='current_terminal').restarts_in_place
  assert not DistributedConfig(max_restarts=0).restarts_in_place
  assert DistributedConfig().restarts_in_place


# --- the real program (slow) ------------------------------------------------------


def _node_pids(launcher_pid, group):
  import psutil
  out = []
  for child in psutil.Process(launcher_pid).children(recursive=True):
    try:
      if child.environ().get(NODE_GROUP_ENV) == group:
        out.append(child.pid)
    except (psutil.NoSuchProcess, psutil.AccessDenied):
      pass
  return out


def _check_files(logdir):
  """Every log line complete and JSON; no train row or score line twice."""
  seen = set()
  for name in (rundir.METRICS_FILE, rundir.SCORES_FILE, restart_log.RESTARTS_FILE):
    with open(os.path.join(logdir, name), 'rb') as f:
      data = f.read()
    assert data.endswith(b'\n'), name
    for line in data.decode().splitlines():
      row = json.loads(line)
      if name == rundir.METRICS_FILE and row.get('kind') == 'train':
        key = ('train', row['env_step'], row['updates'])
        assert key not in seen, f'duplicated train row {key}'
        seen.add(key)
      if name == rundir.SCORES_FILE:
        assert ('score', line) not in seen, f'duplicated score {line}'
        seen.add(('score', line))


def _kill_run(tmp_path, group, *extra):
  """Runs the program; once it has written a checkpoint and a later train
  row, SIGKILLs one process of ``group``. Returns (code, output, logdir,
  checkpoint state at the kill)."""
  from tests.test_distributed import _alive, _rows, _run_launcher
  logdir = str(tmp_path / 'run')
  killed = {}

  def kill(proc):
    if killed:
      return
    ckpt = rundir.latest_run_checkpoint(logdir)
    if ckpt is None or not os.path.exists(os.path.join(logdir,
                                                       rundir.METRICS_FILE)):
      return
    state = rundir.load_run_state(ckpt)
    if not [r for r in _rows(logdir)
            if r['env_step'] > state['counts']['env_steps']]:
      return
    pids = _node_pids(proc.pid, group)
    if pids:
      os.kill(pids[0], signal.SIGKILL)
      killed.update(pid=pids[0], state=state, t=time.monotonic())

  code, out, pids = _run_launcher(
      logdir, '--env_steps=2400', '--checkpoint_every=5', '--max_restarts=2',
      *extra, timeout=600, on_poll=kill)
  assert killed, out[-4000:]
  time.sleep(0.5)
  assert not [p for p, c in pids.items() if _alive(p, c)], 'orphans'
  final = rundir.load_run_state(rundir.latest_run_checkpoint(logdir))
  restart_lines = [x for x in out.splitlines() if 'restart' in x]
  print(f'\n[fault] SIGKILL {group} pid {killed["pid"]} with the newest '
        f'checkpoint at {killed["state"]["counts"]["env_steps"]} env steps; '
        f'{restart_lines}; finished at {final["counts"]["env_steps"]} env '
        f'steps, {final["learner"]["updates"]} updates, exit {code}')
  return code, out, logdir, killed['state']


def _check_finished(code, out, logdir, kind, node):
  assert code == 0, out[-4000:]
  assert '[done]' in out, out[-4000:]
  final = rundir.load_run_state(rundir.latest_run_checkpoint(logdir))
  assert final['counts']['env_steps'] >= 2400
  rows = [json.loads(x) for x in open(os.path.join(logdir,
                                                   restart_log.RESTARTS_FILE))]
  assert [(r['kind'], r['node'], r['returncode']) for r in rows] == [
      (kind, node, -9)], rows
  _check_files(logdir)
  from tests.test_distributed import _rows
  assert _rows(logdir)[-1]['run/restarts'] == 1


@pytest.mark.slow
def test_killed_actor_restarts_in_place_and_the_run_finishes(tmp_path):
  code, out, logdir, _ = _kill_run(tmp_path, 'actor')
  assert 'restart 1/2 in place' in out, out[-4000:]
  _check_finished(code, out, logdir, 'in_place', 'actor/0')
  assert 'restart 1 in place: env seeds of restart 1' in open(
      os.path.join(logdir, 'lp_logs', 'segment-0', 'actor', '0')).read()


@pytest.mark.slow
@pytest.mark.parametrize('group', ['learner', 'replay'])
def test_killed_learner_or_replay_restarts_the_program(tmp_path, group):
  code, out, logdir, state = _kill_run(tmp_path, group)
  assert 'restart 1/2 of the program' in out, out[-4000:]
  assert 'resuming from' in out
  _check_finished(code, out, logdir, 'program', f'{group}/0')
  # Lost at most one checkpoint interval: the resumed segment started from
  # the checkpoint that existed at the kill (or a newer one).
  from tests.test_distributed import _rows
  seg1 = [r for r in _rows(logdir) if r['segment'] >= 1]
  assert seg1 and min(r['env_step'] for r in seg1) >= state['counts']['env_steps']
