"""Does the replay ratio hold when the learner is spread out? (spec 6.1)

Runs the same short training (smoke.flags, tiny model, B 4 x T 8, train
ratio 16) four ways, one at a time, and reads each run's last train row:

  local/1dev      one process, one learner device
  local/2dev      one process, --learner_devices=2 (two forced CPU devices)
  lp/1proc        --distributed, one learner process
  lp/2proc        --distributed, --learner_processes=2 (jax.distributed,
                  gloo on 127.0.0.1), one device each

The spec 6.1 ratio is replayed steps trained per agent step
(`replay/ratio`, warm-up included) and, for the limiter, uniform samples x
T per insert after the fill (`replay/ratio_after_fill`). In one process the
schedule is exact, so 1 and 2 devices must do the same number of updates at
the same env step; with Launchpad the limiter holds the ratio inside its
error buffer, whatever the number of learner processes.

  python bench/ratio_holds.py [--env_steps=1200] [--out=bench/results/scale]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
SMOKE = os.path.join(ROOT, 'experiments', 'flags', 'smoke.flags')

VARIANTS = {
    'local/1dev': ['--learner_devices=1'],
    'local/2dev': ['--learner_devices=2'],
    'lp/1proc': ['--distributed', '--num_actors=1', '--learner_devices=1'],
    'lp/2proc': ['--distributed', '--num_actors=1', '--learner_processes=2',
                 '--learner_devices=2'],
}
KEYS = ('env_step', 'agent_step', 'updates', 'replay/ratio',
        'replay/ratio_after_fill', 'replay/ratio_target')


def run_variant(name, extra, env_steps, workdir):
  logdir = os.path.join(workdir, name.replace('/', '_'))
  env = {**os.environ, 'JAX_PLATFORMS': 'cpu', 'PYTHONUNBUFFERED': '1'}
  if name == 'local/2dev':
    env['XLA_FLAGS'] = '--xla_force_host_platform_device_count=2'
  else:
    env.pop('XLA_FLAGS', None)
  cmd = [sys.executable, os.path.join(ROOT, 'experiments', 'run_dmc.py'),
         f'--flagfile={SMOKE}', f'--logdir={logdir}', f'--env_steps={env_steps}',
         '--eval_episodes=0', '--noreport', '--jax_cache_dir=off',
         '--stop_grace=20', '--log_every=100'] + extra
  t0 = time.time()
  proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True)
  if proc.returncode != 0:
    raise SystemExit(f'{name} failed:\n{proc.stderr[-3000:]}')
  rows = [json.loads(line) for line in open(os.path.join(logdir, 'metrics.jsonl'))]
  last = [r for r in rows if r['kind'] == 'train'][-1]
  out = {k: last.get(k) for k in KEYS}
  out['updates_per_agent_step'] = last['updates'] / max(1, last['agent_step'])
  out['wall_s'] = round(time.time() - t0, 1)
  out['command'] = ' '.join(cmd)
  return out


def main():
  p = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  p.add_argument('--env_steps', type=int, default=1200)
  p.add_argument('--out', default=os.path.join(HERE, 'results', 'scale'))
  p.add_argument('--variants', nargs='*', default=list(VARIANTS))
  args = p.parse_args()
  workdir = tempfile.mkdtemp(prefix='ratio-holds-')
  results = {}
  try:
    for name in args.variants:
      results[name] = run_variant(name, VARIANTS[name], args.env_steps, workdir)
      r = results[name]
      print(f'{name:11s} env_steps {r["env_step"]:6d} agent_step '
            f'{r["agent_step"]:6d} updates {r["updates"]:5d} '
            f'updates/agent step {r["updates_per_agent_step"]:.4f} '
            f'ratio {r["replay/ratio"]:.2f} after fill '
            f'{r["replay/ratio_after_fill"]} (target '
            f'{r["replay/ratio_target"]}) wall {r["wall_s"]} s', flush=True)
  finally:
    shutil.rmtree(workdir, ignore_errors=True)
  os.makedirs(args.out, exist_ok=True)
  path = os.path.join(args.out, 'ratio_holds.json')
  with open(path, 'w') as f:
    json.dump({'env_steps': args.env_steps, 'load_1m_at_end': os.getloadavg()[0],
               'results': results}, f, indent=1)
  print(f'wrote {path}')


if __name__ == '__main__':
  main()
