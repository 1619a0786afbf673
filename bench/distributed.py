r"""Distributed (Launchpad local_mp) vs single-process throughput.

Runs the single-process loop (experiments/run_dmc.py) and the Launchpad
program (experiments/run_dmc.py --distributed) with 1, 2, 4 ... actors on the same
settings, each as a fresh subprocess with its own logdir, and reads their
metrics.jsonl. Printed per run:

  env/s, upd/s   steady-state env steps and learner updates per second: from
                 the first metrics row with updates after the replay fill and
                 compilation to the last row before the stop
  ratio          replayed steps per inserted step over that window (the
                 distributed runs: uniform samples x T / inserts, what the
                 rate limiter controls; single process: updates x B x T /
                 agent steps)
  idle           learner time blocked waiting for a batch / wall time
  act-blocked    actor time inside the adder (blocked by the rate limiter)
  lag            mean parameter staleness of the actors, in learner updates
  wall           whole run including start-up (imports, jit, replay fill)

  python bench/distributed.py --size=tiny --actors=1,2,4 --env_steps=4000
  python bench/distributed.py --size=size1m --actors=1,2,4 --env_steps=4000
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from typing import Any, Dict, List

from absl import app, flags

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

FLAGS = flags.FLAGS
flags.DEFINE_string('task', 'cartpole_swingup', 'dm_control task.')
flags.DEFINE_string('size', 'tiny', 'Model size preset.')
flags.DEFINE_list('actors', ['1', '2', '4'], 'Actor counts to launch.')
flags.DEFINE_bool('single', True, 'Also run the single-process loop.')
flags.DEFINE_integer('num_envs', 4, 'Total training envs (split over actors).')
flags.DEFINE_integer('env_steps', 4000, 'Budget per run (env steps).')
flags.DEFINE_float('train_ratio', 64, 'Replay ratio.')
flags.DEFINE_integer('batch_size', 16, 'B.')
flags.DEFINE_integer('batch_length', 64, 'T.')
flags.DEFINE_integer('action_repeat', 2, 'Action repeat.')
flags.DEFINE_integer('rows', 20, 'Metrics rows per run (sets --log_every).')
flags.DEFINE_string('json_out', None, 'Write the results here as JSON.')
flags.DEFINE_string('workdir', None, 'Keep run directories here (default: a '
                    'temporary folder, deleted).')


def _common_flags(logdir: str) -> List[str]:
  return [f'--task={FLAGS.task}', f'--size={FLAGS.size}',
          f'--num_envs={FLAGS.num_envs}', f'--env_steps={FLAGS.env_steps}',
          f'--train_ratio={FLAGS.train_ratio}',
          f'--batch_size={FLAGS.batch_size}',
          f'--batch_length={FLAGS.batch_length}',
          f'--action_repeat={FLAGS.action_repeat}',
          f'--log_every={max(1, FLAGS.env_steps // FLAGS.rows)}',
          '--eval_episodes=0', '--eval_every=0', '--report=false',
          '--checkpoint_every=100000', '--progress_every=30',
          '--replay_capacity=1000000', f'--logdir={logdir}']


def _rows(logdir: str) -> List[Dict[str, Any]]:
  path = os.path.join(logdir, 'metrics.jsonl')
  if not os.path.exists(path):
    return []
  with open(path) as f:
    rows = [json.loads(line) for line in f if line.strip()]
  return [r for r in rows if r.get('kind') == 'train']


def _steady(rows: List[Dict[str, Any]], distributed: bool) -> Dict[str, Any]:
  """Rates between the first trained row (after fill/compile) and the last
  row before the stop (the distributed final row includes the pause)."""
  trained = [r for r in rows if r.get('updates', 0) > 0]
  if distributed and len(trained) > 2:
    trained = trained[:-1]
  if len(trained) < 2:
    return {}
  a, b = trained[0], trained[-1]
  dt = b['wall_time'] - a['wall_time']
  out = {
      'env_steps_per_s': (b['env_step'] - a['env_step']) / dt,
      'updates_per_s': (b['updates'] - a['updates']) / dt,
      'window_s': dt,
  }
  T, B = FLAGS.batch_length, FLAGS.batch_size
  if distributed:
    d_ins = b['replay/inserts'] - a['replay/inserts']
    out['ratio'] = ((b['replay/samples'] - a['replay/samples']) * T / d_ins
                    if d_ins else None)
    out['ratio_after_fill'] = b.get('replay/ratio_after_fill')
    window = [r for r in trained[1:]]

    def mean(key):
      vals = [r[key] for r in window if r.get(key) is not None]
      return sum(vals) / len(vals) if vals else None

    out['learner_idle_frac'] = mean('learner/idle_frac')
    out['actor_blocked_frac'] = mean('time/replay_add_frac')
    out['param_lag_updates'] = mean('actor/param_lag_updates_mean')
    lags = [r['actor/param_lag_updates_max'] for r in window
            if r.get('actor/param_lag_updates_max') is not None]
    out['param_lag_max'] = max(lags) if lags else None
  else:
    d_agent = b['agent_step'] - a['agent_step']
    out['ratio'] = ((b['updates'] - a['updates']) * B * T / d_agent
                    if d_agent else None)
    out['learner_idle_frac'] = None
    out['actor_blocked_frac'] = None
    out['param_lag_updates'] = 0.0
  return out


def run_one(name: str, cmd: List[str], logdir: str,
            distributed: bool) -> Dict[str, Any]:
  t0 = time.time()
  load0 = os.getloadavg()[0]
  log = logdir + '.out'
  with open(log, 'w') as f:
    proc = subprocess.run(cmd, cwd=REPO, stdout=f, stderr=subprocess.STDOUT,
                          env={**os.environ, 'PYTHONUNBUFFERED': '1'})
  wall = time.time() - t0
  result = {'name': name, 'returncode': proc.returncode, 'wall_s': wall,
            'load_avg_start': load0, 'load_avg_end': os.getloadavg()[0]}
  result.update(_steady(_rows(logdir), distributed))
  if proc.returncode:
    with open(log) as f:
      result['error_tail'] = f.read()[-2000:]
  return result


def _fmt(x, spec):
  return '-' if x is None else format(x, spec)


def main(argv):
  del argv
  sys.path.insert(0, REPO)
  work = FLAGS.workdir or tempfile.mkdtemp(prefix='bench-dist-')
  os.makedirs(work, exist_ok=True)
  py = sys.executable
  results = []
  if FLAGS.single:
    logdir = os.path.join(work, 'single')
    shutil.rmtree(logdir, ignore_errors=True)
    cmd = [py, os.path.join(REPO, 'experiments', 'run_dmc.py')] + _common_flags(
        logdir)
    results.append(run_one('single process', cmd, logdir, False))
    print(json.dumps(results[-1]), flush=True)
  for k in [int(a) for a in FLAGS.actors]:
    logdir = os.path.join(work, f'actors{k}')
    shutil.rmtree(logdir, ignore_errors=True)
    cmd = ([py, os.path.join(REPO, 'experiments', 'run_dmc.py'),
            '--distributed'] + _common_flags(logdir) +
           [f'--num_actors={k}', '--stop_grace=30'])
    results.append(run_one(f'local_mp, {k} actor(s)', cmd, logdir, True))
    print(json.dumps(results[-1]), flush=True)
  print(f'\n{FLAGS.task} size={FLAGS.size} envs={FLAGS.num_envs} '
        f'RR={FLAGS.train_ratio:g} B={FLAGS.batch_size} T={FLAGS.batch_length} '
        f'budget={FLAGS.env_steps} env steps, {os.cpu_count()} cores')
  print('| run | env steps/s | updates/s | replay ratio | learner idle | '
        'actors blocked | param lag (mean/max upd) | wall s | load |')
  print('|---|---:|---:|---:|---:|---:|---:|---:|---:|')
  for r in results:
    print(f"| {r['name']} | {_fmt(r.get('env_steps_per_s'), '.1f')} | "
          f"{_fmt(r.get('updates_per_s'), '.2f')} | "
          f"{_fmt(r.get('ratio'), '.1f')} | "
          f"{_fmt(r.get('learner_idle_frac'), '.0%')} | "
          f"{_fmt(r.get('actor_blocked_frac'), '.0%')} | "
          f"{_fmt(r.get('param_lag_updates'), '.1f')}/"
          f"{_fmt(r.get('param_lag_max'), 'd')} | {r['wall_s']:.0f} | "
          f"{r['load_avg_start']:.1f} |")
  if FLAGS.json_out:
    with open(FLAGS.json_out, 'w') as f:
      json.dump(results, f, indent=1)
  if not FLAGS.workdir:
    shutil.rmtree(work, ignore_errors=True)
  return 1 if any(r['returncode'] for r in results) else 0


if __name__ == '__main__':
  app.run(main)
