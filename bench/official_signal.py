"""The official DreamerV3 at the settings of one of our reduced Atari or
Crafter flagfiles, to tell the port from the budget when a reduced run shows
no learning signal (docs/atari.md, docs/crafter.md "Learning signal").

bench/parity.py runs both sides on DMC; this is its Atari / Crafter
counterpart for the official side only. It reads our flagfile, maps its
settings onto the official config (the suite's own config, `atari100k` or
`crafter`, then size, train ratio, B, T, learning rate and warm-up, envs and
seed) and runs bench/parity_official.py in the official venv (set-up:
bench/official.py, plus `pip install crafter==1.8.3` or `ale-py==0.12.1`
there), which logs the official learner's metrics per 50 updates:

  python bench/official_signal.py run \
      --flagfile=experiments/flags/crafter_signal.flags --seed=0 --updates=1850 \
      --workdir=/tmp/crafter_official
  python bench/official_signal.py table --workdir=/tmp/crafter_official/crafter_reward_s0 \
      --at 150 600 1250 1550 1700 1850

`run` prints the official command and leaves `updates.jsonl` (the learner
rows) and `run/scores.jsonl` (episode scores) in the work directory; `table`
prints the rows nearest the given update counts (policy entropy, image and
reward loss, advantage magnitude, the return normaliser's 5 / 95 %
percentiles) and the mean episode score per window of env steps.

Stdlib only: runs under either venv.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))

# Our flag -> the official flag that takes the same value.
SAME = {'train_ratio': '--run.train_ratio', 'batch_size': '--batch_size',
        'batch_length': '--batch_length', 'num_envs': '--run.envs'}
# config_overrides fields -> official flags.
OVERRIDES = {'lr': '--agent.opt.lr', 'warmup': '--agent.opt.warmup'}


def read_flagfile(path):
  """{flag: value} of a flagfile (repeated --config_overrides as a list)."""
  out = {'config_overrides': []}
  with open(path) as f:
    for line in f:
      line = line.strip()
      if not line.startswith('--'):
        continue
      name, _, value = line[2:].partition('=')
      if name == 'config_overrides':
        out[name].append(value)
      else:
        out[name] = value
  return out


def official_argv(flags, seed, logdir):
  """The official flags for our flagfile's settings."""
  suite, task = flags['suite'], flags['task']
  if suite == 'crafter':
    configs, official_task = ['crafter'], f'crafter_{task}'
  elif suite == 'atari':
    configs, official_task = ['atari100k'], f'atari100k_{task}'
  else:
    raise SystemExit(f'--suite={suite}: bench/parity.py runs the official side on DMC')
  argv = ['--configs', *configs, flags['size'], '--task', official_task]
  for ours, theirs in SAME.items():
    argv += [theirs, flags[ours]]
  for item in flags['config_overrides']:
    name, _, value = item.partition('=')
    if name not in OVERRIDES:
      raise SystemExit(f'--config_overrides={item}: no official counterpart here')
    argv += [OVERRIDES[name], value]
  if suite == 'atari':
    argv += ['--env.atari100k.repeat', flags['action_repeat']]
  return argv + [
      '--jax.platform', 'cpu', '--jax.compute_dtype', 'float32',
      '--jax.prealloc', 'False', '--logger.outputs', 'jsonl',
      '--run.log_every', '60', '--run.report_every', '0', '--run.save_every', '0',
      '--run.steps', '1e9', '--seed', str(seed), '--logdir', logdir]


def run(args):
  flags = read_flagfile(args.flagfile)
  name = f'{flags["suite"]}_{flags["task"]}_s{args.seed}'
  workdir = os.path.join(args.workdir, name)
  if os.path.exists(os.path.join(workdir, 'updates.jsonl')):
    raise SystemExit(f'{workdir} holds a run: give a new --workdir')
  os.makedirs(workdir, exist_ok=True)
  cmd = [args.official_python, os.path.join(HERE, 'parity_official.py'),
         f'--src={args.src}', f'--updates={args.updates}', '--every=50',
         f'--out={os.path.join(workdir, "updates.jsonl")}',
         f'--repeat={flags["action_repeat"]}', '--pixels', '--',
         *official_argv(flags, args.seed, os.path.join(workdir, 'run'))]
  print(' '.join(cmd), flush=True)
  env = dict(os.environ, MUJOCO_GL='egl')
  with open(os.path.join(workdir, 'console.txt'), 'w') as console:
    code = subprocess.run(cmd, stdout=console, stderr=subprocess.STDOUT,
                          env=env).returncode
  if code:
    raise SystemExit(f'exit {code}: see {workdir}/console.txt')


def _jsonl(path):
  with open(path) as f:
    return [json.loads(line) for line in f if line.strip()]


def table(args):
  rows = _jsonl(os.path.join(args.workdir, 'updates.jsonl'))
  print('| updates | env steps | policy entropy | image loss | reward loss '
        '| adv_mag | ret [lo, hi] |')
  print('|---:|---:|---:|---:|---:|---:|---|')
  for at in args.at:
    r = min(rows, key=lambda r: abs(r['updates'] - at))
    print(f'| {r["updates"]:,} | {r["env_step"]:,} | {r["ent/action"]:.3f} '
          f'| {r["loss/image"]:.0f} | {r["loss/rew"]:.2f} | {r["adv_mag"]:.3f} '
          f'| [{r["retnorm/lo"]:.2f}, {r["retnorm/hi"]:.2f}] |')
  scores = _jsonl(os.path.join(args.workdir, 'run', 'scores.jsonl'))
  print('\n| env steps | episodes | mean score |\n|---|---:|---:|')
  last = max(s['step'] for s in scores) if scores else 0
  for lo in range(0, last + 1, args.window):
    got = [s['episode/score'] for s in scores if lo <= s['step'] < lo + args.window]
    if got:
      print(f'| {lo // 1000}K-{(lo + args.window) // 1000}K | {len(got)} '
            f'| {sum(got) / len(got):.2f} |')


def main(argv=None):
  p = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  sub = p.add_subparsers(dest='cmd', required=True)
  r = sub.add_parser('run')
  r.add_argument('--flagfile', required=True)
  r.add_argument('--seed', type=int, default=0)
  r.add_argument('--updates', type=int, required=True)
  r.add_argument('--workdir', required=True)
  r.add_argument('--src', default='/tmp/official/src')
  r.add_argument('--official_python', default='/tmp/official/venv/bin/python')
  t = sub.add_parser('table')
  t.add_argument('--workdir', required=True)
  t.add_argument('--at', type=int, nargs='+', required=True)
  t.add_argument('--window', type=int, default=20000)
  args = p.parse_args(argv)
  run(args) if args.cmd == 'run' else table(args)


if __name__ == '__main__':
  sys.exit(main())
