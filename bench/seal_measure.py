"""What sealing changes and costs: the same distributed smoke run with
``--isolation=off`` and sealed (the default), one after the other.

  python bench/seal_measure.py [--env_steps=3000] [--out_dir=bench/results/security]
  # a second round, the other order, the same compile cache:
  python bench/seal_measure.py --variants=auto,off --cache=DIR --append

Writes ``ss_sealed.txt``: the run's TCP listeners seen from the host's
network (``ss -ltnp``, the run's processes only) for each variant, and for
the sealed one also from inside its namespace (``nsenter -n``); and
``seal_timing.json``: wall time, updates and updates per second of each
(from the launcher's ``[done]`` line), with the load (``uptime``) before
each run.
"""

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time

import psutil

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
RUN_DMC = os.path.join(ROOT, 'experiments', 'run_dmc.py')
SMOKE = os.path.join(ROOT, 'experiments', 'flags', 'smoke.flags')


def _ss(pids, netns_of=None):
  cmd = ['ss', '-ltnp']
  if netns_of is not None:
    cmd = ['nsenter', '-t', str(netns_of), '-n'] + cmd
  out = subprocess.run(cmd, capture_output=True, text=True).stdout
  lines = out.splitlines()
  keep = [lines[0]] + [
      line for line in lines[1:]
      if any(f'pid={p},' in line for p in pids)]
  return '\n'.join(keep)


def _tree(pid):
  procs = [psutil.Process(pid)] + psutil.Process(pid).children(recursive=True)
  out = {}
  for p in procs:
    try:
      out[p.pid] = p.environ().get('DREAMER_NODE_GROUP', p.name())
    except psutil.Error:
      pass
  return out


def run(variant, env_steps, work, cache):
  logdir = os.path.join(work, variant)
  load = subprocess.run(['uptime'], capture_output=True, text=True).stdout
  cmd = [sys.executable, RUN_DMC, f'--flagfile={SMOKE}', f'--logdir={logdir}',
         '--distributed', '--num_actors=2', f'--env_steps={env_steps}',
         '--eval_episodes=0', '--noreport', '--join_slots=2',
         '--stop_grace=20', f'--jax_cache_dir={cache}', '--batch_size=2',
         '--config_overrides=imag_horizon=4', f'--isolation={variant}']
  t0 = time.monotonic()
  proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, text=True,
                          env={**os.environ, 'PYTHONUNBUFFERED': '1'})
  ss = None
  text = []
  for line in proc.stdout:
    text.append(line)
    if ss is None and line.startswith('[run]') and ' updates |' in line:
      tree = _tree(proc.pid)         # every node is up once updates run
      ss = f'# --isolation={variant}: from the host network\n' + _ss(tree)
      inner = [p for p, g in tree.items() if g == 'replay']
      if variant != 'off' and inner:
        ss += (f'\n# --isolation={variant}: inside the program\'s network '
               f'namespace (nsenter -t {inner[0]} -n ss -ltnp)\n'
               + _ss(tree, inner[0]))
      ss += '\n# processes: ' + ', '.join(f'{p} {g}'
                                          for p, g in sorted(tree.items()))
  proc.wait()
  wall = time.monotonic() - t0
  done = [line for line in text if line.startswith('[done]')]
  m = re.search(r'(\d+) env steps, (\d+) updates in (\d+)s', done[-1])
  steps, updates, run_s = (int(x) for x in m.groups())
  return ss, {'isolation': variant, 'returncode': proc.returncode,
              'load_before': load.strip(), 'process_wall_s': round(wall, 1),
              'program_wall_s': run_s, 'env_steps': steps,
              'updates': updates,
              'updates_per_s': round(updates / run_s, 2),
              'sealed_line': next((line.strip() for line in text
                                   if line.startswith('[run] sealed') or
                                   line.startswith('[run] not sealed')), '')}


def main():
  p = argparse.ArgumentParser()
  p.add_argument('--env_steps', type=int, default=3000)
  p.add_argument('--out_dir', default=os.path.join(HERE, 'results',
                                                   'security'))
  p.add_argument('--variants', default='off,auto')
  p.add_argument('--cache', default='', help='a warm compile cache (else a '
                 'new one, filled by a short run first)')
  p.add_argument('--append', action='store_true', help='add the timings to '
                 'seal_timing.json; leave ss_sealed.txt as it is')
  args = p.parse_args()
  work = tempfile.mkdtemp(prefix='seal-measure-')
  cache = args.cache or os.path.join(work, 'jax_cache')
  if not args.cache:
    run('off', 600, work + '/warm', cache)      # fills the compile cache
  texts, rows = [], []
  for variant in args.variants.split(','):
    ss, row = run(variant, args.env_steps, work, cache)
    texts.append(ss)
    rows.append(row)
    print(json.dumps(row))
  os.makedirs(args.out_dir, exist_ok=True)
  timing = os.path.join(args.out_dir, 'seal_timing.json')
  if args.append:
    with open(timing) as f:
      rows = json.load(f) + rows
  else:
    with open(os.path.join(args.out_dir, 'ss_sealed.txt'), 'w') as f:
      f.write('\n\n'.join(texts) + '\n')
  with open(timing, 'w') as f:
    json.dump(rows, f, indent=1)


if __name__ == '__main__':
  main()
