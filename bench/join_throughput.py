"""Env steps per second per env: a remote actor through the join service
against the program's local actor, in one run.

  python bench/join_throughput.py [--env_steps=20000] [--envs=2] [--size=tiny]

Starts a ``--distributed`` program (experiments/flags/smoke.flags, one
local actor of ``--envs`` envs, ``--join_slots=--envs``) and one remote
actor with ``--envs`` envs (``run_dmc.py --join=<run directory>``: the
secret from the run directory, the service on loopback). Both act under the
same rate limiter for the same task and model, so each gets the share of
inserts its path can take. From the train rows between the remote actor's
first stored steps and the end: env steps per second per env of the local
actor (``env_step`` minus ``join/env_steps``) and of the remote one
(``join/env_steps``), their ratio, and the load. Writes
``bench/results/security/join_throughput.json``.
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
RUN_DMC = os.path.join(ROOT, 'experiments', 'run_dmc.py')
SMOKE = os.path.join(ROOT, 'experiments', 'flags', 'smoke.flags')


def rows(logdir):
  path = os.path.join(logdir, 'metrics.jsonl')
  if not os.path.exists(path):
    return []
  with open(path) as f:
    return [r for r in map(json.loads, f) if r.get('kind') == 'train']


def main():
  p = argparse.ArgumentParser()
  p.add_argument('--env_steps', type=int, default=20000)
  p.add_argument('--envs', type=int, default=2)
  p.add_argument('--size', default='tiny')
  p.add_argument('--out', default=os.path.join(HERE, 'results', 'security',
                                               'join_throughput.json'))
  args = p.parse_args()
  work = tempfile.mkdtemp(prefix='join-bench-')
  logdir = os.path.join(work, 'run')
  env = {**os.environ, 'PYTHONUNBUFFERED': '1'}
  program = subprocess.Popen(
      [sys.executable, RUN_DMC, f'--flagfile={SMOKE}', f'--logdir={logdir}',
       '--distributed', '--num_actors=1', f'--num_envs={args.envs}',
       f'--join_slots={args.envs}', f'--env_steps={args.env_steps}',
       f'--size={args.size}', '--eval_episodes=0', '--noreport',
       '--log_every=500', '--checkpoint_every=600'],
      stdout=open(os.path.join(work, 'program.log'), 'w'),
      stderr=subprocess.STDOUT, env=env)
  while not os.path.exists(os.path.join(logdir, 'join.json')):
    assert program.poll() is None, open(os.path.join(work, 'program.log')).read()
    time.sleep(1)
  joiner = subprocess.Popen(
      [sys.executable, RUN_DMC, '--distributed', f'--join={logdir}',
       f'--num_envs={args.envs}'],
      stdout=open(os.path.join(work, 'joiner.log'), 'w'),
      stderr=subprocess.STDOUT, env=env)
  loads = []
  while program.poll() is None:
    loads.append(os.getloadavg()[0])
    time.sleep(5)
  joiner.wait(120)
  got = [r for r in rows(logdir) if r.get('join/env_steps', 0) > 0]
  first, last = got[0], got[-1]
  dt = last['wall_time'] - first['wall_time']
  d_remote = last['join/env_steps'] - first['join/env_steps']
  d_local = (last['env_step'] - first['env_step']) - d_remote
  local = d_local / dt / args.envs
  remote = d_remote / dt / args.envs
  result = {
      'size': args.size, 'envs_each': args.envs, 'env_steps': args.env_steps,
      'window_s': round(dt, 1),
      'local_env_steps_per_s_per_env': round(local, 2),
      'remote_env_steps_per_s_per_env': round(remote, 2),
      'remote_over_local': round(remote / local, 3),
      'join_refused': last.get('join/refused'),
      'replay_ratio_after_fill': last.get('replay/ratio_after_fill'),
      'load_1m_mean': round(sum(loads) / max(len(loads), 1), 2),
      'cores': os.cpu_count(), 'workdir': work}
  print(json.dumps(result, indent=1))
  os.makedirs(os.path.dirname(args.out), exist_ok=True)
  with open(args.out, 'w') as f:
    json.dump(result, f, indent=1)


if __name__ == '__main__':
  main()
