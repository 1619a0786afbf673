"""Both learners on the SAME fixed batches: the update alone, no acting.

bench/parity.py compares whole training runs, where each side's policy
collects its own data. This tool takes the data out of the comparison: one
fixed set of walker (or any DMC task) trajectories, collected once with the
initial policy's action noise, and one fixed sequence of [B, T + 1] windows
drawn from it; each side's learner trains on exactly those windows. If the
two learners are the same algorithm, their loss curves on the same windows
differ only by seed noise (parameter init, latent and policy sampling); if a
gap seen in whole runs stays here, it is in the update, and if it goes, it
is in what the data is (acting, replay, the policy's own progress).

  # our venv: trajectories (DMCEnv, the protocol of experiments/envs) and
  # the window sequence, as one .npz
  python bench/parity_fixed.py data --task=walker_walk --out=/tmp/fixed/walker.npz
  # our learner (this checkout), and the official one in its own venv
  python bench/parity_fixed.py ours --data=/tmp/fixed/walker.npz --seed=0 \
      --out=/tmp/fixed/ours_s0.jsonl
  /tmp/official/venv/bin/python bench/parity_fixed.py official --src=/tmp/official/src \
      --data=/tmp/fixed/walker.npz --seed=0 --out=/tmp/fixed/official_s0.jsonl
  # per-window means side by side
  python bench/parity_fixed.py table --rows /tmp/fixed/*.jsonl

Settings are bench/parity.py's (size1m, B 16 x T 32, lr 1e-4 with 100
warm-up updates, f32 CPU; ours with the official choices for OQ 6 / OQ 7).
Windows are annotated as the replay does (spec 5.3). The replay-context
latent of every window is the same constant on both sides (deter zeros,
stoch the one-hot of class 0) and nothing is written back: spec 5.8 / 5.9
are left out on both sides alike, so this isolates Algorithms E-J. Each
side logs, per 50 updates, the means of its metrics (the official's are
returned one update late and keyed by its own update count, as in
bench/parity_official.py), including the position-resolved `pos/` losses
(bench/parity_probe.py, bench/parity_official.py).

The `official` subcommand runs in the official venv and imports nothing of
this project but bench/parity_official.py and bench/official.py (which
import only the official code).
"""

from __future__ import annotations

import argparse
import json
import os
import sys

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)

SETTINGS = dict(size='size1m', batch_size=16, batch_length=32, lr=1e-4, warmup=100)
ROW_EVERY = 50
INIT_STD = 0.9 / (1 + np.exp(-2.0)) + 0.1   # the initial policy's std (spec 3.13)


# --- data ---------------------------------------------------------------------

def collect(args) -> None:
  """Trajectories of `--workers` envs (one stream each, episodes concatenated
  as the replay stores them, spec 5.1) with Normal(0, INIT_STD) actions, and
  `--updates` x B window starts drawn uniformly over all items."""
  sys.path.insert(0, ROOT)
  from experiments.envs.dmc import DMCEnv
  rng = np.random.default_rng(args.data_seed)
  streams = []
  for w in range(args.workers):
    env = DMCEnv(args.task, action_repeat=2, seed=10_000 + w)
    steps = []
    obs = env.reset()
    for _ in range(args.steps_per_worker):
      act = (INIT_STD * rng.standard_normal(env.act_dim)).astype(np.float32)
      stored = np.zeros_like(act) if obs['is_last'] else act   # spec 7.2
      steps.append({**obs, 'action': stored})
      obs = env.step(act)
    streams.append(steps)
  keys = list(streams[0][0].keys())
  data = {k: np.stack([np.stack([s[k] for s in st]) for st in streams]) for k in keys}
  L = SETTINGS['batch_length'] + 1
  items = args.steps_per_worker - L + 1
  starts = np.stack([rng.integers(0, args.workers, (args.updates, SETTINGS['batch_size'])),
                     rng.integers(0, items, (args.updates, SETTINGS['batch_size']))], -1)
  os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
  np.savez(args.out, starts=starts.astype(np.int64), task=np.asarray(args.task),
           obs_keys=np.asarray([k for k in keys if k not in (
               'reward', 'is_first', 'is_last', 'is_terminal', 'action')]),
           **{f'data/{k}': v for k, v in data.items()})
  print(f'{args.out}: {args.workers} x {args.steps_per_worker} steps, '
        f'{args.updates} x {SETTINGS["batch_size"]} windows', flush=True)


def load(path):
  with np.load(path) as f:
    data = {k[5:]: f[k] for k in f.files if k.startswith('data/')}
    return data, f['starts'], [str(k) for k in f['obs_keys']]


def window_batch(data, starts):
  """[B, T + 1] windows at (worker, start) with the spec 5.3 annotation."""
  L = SETTINGS['batch_length'] + 1
  idx = starts[:, 1:2] + np.arange(L)[None]
  batch = {k: v[starts[:, 0:1], idx] for k, v in data.items()}
  batch['is_first'] = batch['is_first'].copy()
  batch['is_first'][:, 0] = True
  nxt = np.zeros_like(batch['is_first'])
  nxt[:, :-1] = batch['is_first'][:, 1:]
  batch['is_last'] = batch['is_last'] | nxt
  return batch


class Rows:
  """Per-update scalar metrics -> one JSON row of means per ROW_EVERY updates."""

  def __init__(self, path):
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    self.file = open(path, 'w')
    self.sums, self.count = {}, 0

  def add(self, update, mets):
    for k, v in mets.items():
      self.sums[k] = self.sums.get(k, 0.0) + float(v)
    self.count += 1
    if update % ROW_EVERY == 0:
      row = {k: v / self.count for k, v in self.sums.items()}
      row.update(updates=update, n=self.count)
      self.file.write(json.dumps(row) + '\n')
      self.file.flush()
      self.sums, self.count = {}, 0


# --- ours ---------------------------------------------------------------------

def _field(override: str):
  """'name=value' -> (name, Python literal or string)."""
  import ast
  name, value = override.split('=', 1)
  try:
    return name, ast.literal_eval(value)
  except (ValueError, SyntaxError):
    return name, value


def train_ours(args) -> None:
  sys.path.insert(0, ROOT)
  sys.path.insert(0, HERE)
  import parity_probe
  parity_probe.install()
  import agent  # noqa: F401  (jax compat first)
  import jax
  from agent import learning, networks
  from agent.config import make_config
  from agent.types import EnvSpaces
  data, starts, obs_keys = load(args.data)
  s = SETTINGS
  config = make_config(size=s['size'], batch_size=s['batch_size'],
                       batch_length=s['batch_length'], lr=s['lr'], warmup=s['warmup'],
                       start_from_data=False, outscale_dec=1.0,
                       latent_store_dtype='float32', seed=args.seed,
                       **dict(_field(o) for o in args.override))
  spaces = EnvSpaces(obs={k: data[k].shape[2:] for k in obs_keys},
                     act_dim=data['action'].shape[-1])
  nets = networks.make_networks(spaces, config)
  step = learning.make_train_step(nets)
  state = step.init(jax.random.PRNGKey(args.seed))
  B, L = s['batch_size'], s['batch_length'] + 1
  latent = {'deter': np.zeros((B, L, config.deter), np.float32),
            'stoch': np.zeros((B, L, config.stoch), np.uint8)}   # class 0
  rows = Rows(args.out)
  for k in range(args.updates):
    w = window_batch(data, starts[k])
    batch = {'observation': {o: w[o] for o in obs_keys}, 'action': w['action'],
             'reward': w['reward'], 'is_first': w['is_first'], 'is_last': w['is_last'],
             'is_terminal': w['is_terminal'], 'latent': latent}
    state, mets, _ = step.update(state, batch)
    rows.add(k + 1, {m: v for m, v in jax.device_get(mets).items() if np.ndim(v) == 0})
  print(f'ours seed {args.seed}: {args.updates} updates -> {args.out}', flush=True)


# --- official -----------------------------------------------------------------

def train_official(args) -> None:
  import pathlib
  sys.path.insert(0, HERE)
  import official as bench_official
  import parity_official
  bench_official.SRC = pathlib.Path(args.src)
  sys.path.insert(0, args.src)
  parity_official.install_probe()
  import elements
  import jax
  from dreamerv3.agent import Agent
  from embodied.jax import internal
  data, starts, obs_keys = load(args.data)
  s = SETTINGS
  config = bench_official.build_config(s['size'], [
      '--batch_size', str(s['batch_size']), '--batch_length', str(s['batch_length']),
      '--agent.opt.lr', str(s['lr']), '--agent.opt.warmup', str(s['warmup']),
      '--seed', str(args.seed)])
  shape = lambda k: data[k].shape[2:] if data[k].shape[2:] != (1,) else ()
  obs_space = {k: elements.Space(np.float32, shape(k)) for k in obs_keys}
  obs_space.update(reward=elements.Space(np.float32), is_first=elements.Space(bool),
                   is_last=elements.Space(bool), is_terminal=elements.Space(bool))
  act_space = {'action': elements.Space(np.float32, data['action'].shape[2:], -1.0, 1.0)}
  jaxcfg = dict(config.jax)
  jaxcfg['profiler'] = False
  jaxcfg['precompile'] = False
  agent = Agent(obs_space, act_space, elements.Config(
      **config.agent, logdir=config.logdir, seed=args.seed, jax=jaxcfg,
      batch_size=config.batch_size, batch_length=config.batch_length,
      replay_context=config.replay_context, report_length=config.report_length,
      replica=config.replica, replicas=config.replicas))
  B, L = s['batch_size'], s['batch_length'] + 1
  rssm = config.agent.dyn.rssm
  deter = np.zeros((B, L, rssm.deter), np.float32)
  stoch = np.zeros((B, L, rssm.stoch, rssm.classes), np.float32)
  stoch[..., 0] = 1.0                                   # class 0, as ours
  const = {'dyn/deter': deter, 'dyn/stoch': stoch,
           'consec': np.zeros((B, L), np.int32),
           'stepid': np.zeros((B, L, 20), np.uint8)}
  carry = agent.init_train(B)
  rows = Rows(args.out)
  norm = {}
  pending = None

  def record(mets):
    mets = {k: float(np.asarray(v)) for k, v in mets.items() if np.ndim(v) == 0}
    n = int(mets['opt/updates'])
    lo, hi = norm.pop(n)
    mets['retnorm/lo'], mets['retnorm/hi'] = lo, hi
    mets['retnorm/scale'] = max(1.0, hi - lo)
    mets['ret_raw'] = mets['ret'] * mets['retnorm/scale'] + lo
    rows.add(n, mets)

  for k in range(args.updates + 1):
    if k < args.updates:
      w = window_batch(data, starts[k])
      host = {**{o: w[o].reshape(w[o].shape[:2] + obs_space[o].shape) for o in obs_keys},
              'action': w['action'], 'reward': w['reward'], 'is_first': w['is_first'],
              'is_last': w['is_last'], 'is_terminal': w['is_terminal'], **const}
      batch = internal.device_put(host, agent.train_sharded)
      seed = agent._seeds(k, agent.train_mirrored)
      carry, _, mets = agent.train(carry, {**batch, 'seed': seed})
      norm[int(agent.n_updates)] = tuple(
          float(np.asarray(agent.params[f'retnorm/{x}/value'])) for x in ('lo', 'hi'))
    else:                       # the last update's metrics come one call late
      mets = agent._take_outs(agent.pending_mets)
    if mets:
      record(mets)
  print(f'official seed {args.seed}: {args.updates} updates -> {args.out}', flush=True)


# --- table --------------------------------------------------------------------

PAIRS = {  # canonical: (ours, official)
    'loss/dyn': ('loss/dyn', 'loss/dyn'), 'loss/rew': ('loss/rew', 'loss/rew'),
    'loss/con': ('loss/con', 'loss/con'), 'loss/value': ('loss/value', 'loss/value'),
    'loss/repval': ('loss/repval', 'loss/repval'),
    'loss/policy': ('loss/policy', 'loss/policy'),
    'policy_entropy': ('policy_entropy', 'ent/action'),
    'imag_return': ('ret_mean', 'ret_raw'), 'imag_value': ('value_mean', 'val'),
    'adv_mag': ('adv_mag', 'adv_mag'), 'grad_norm': ('grad_norm', 'opt/grad_norm'),
    'post_entropy': ('rep_ent', 'rep_ent'), 'prior_entropy': ('dyn_ent', 'dyn_ent'),
}


def canonical(row, side):
  out = {}
  for name, (o, f) in PAIRS.items():
    key = o if side == 'ours' else f
    if key in row:
      out[name] = row[key]
  for k, v in row.items():
    if side == 'ours' and k.startswith('loss/rec_'):
      out[k] = v
    if side == 'official' and k.startswith('loss/') and k[5:] not in (
        'dyn', 'rep', 'rew', 'con', 'value', 'repval', 'policy'):
      out['loss/rec_' + k[5:]] = v
    if k.startswith('data/'):
      out[k] = v
    if k.startswith('pos/'):
      _, key, group = k.split('/')
      if side == 'official' and key not in ('dyn', 'rew', 'con'):
        key = 'rec_' + key
      out[f'pos/{key}/{group}'] = v
  return out


def table(args) -> None:
  sides = {'ours': [], 'official': []}
  for path in args.rows:
    side = 'official' if 'official' in os.path.basename(path) else 'ours'
    with open(path) as f:
      sides[side].append([canonical(json.loads(l), side) | {'updates': json.loads(l)['updates']}
                          for l in f if l.strip()])
  every = args.every
  names = args.metrics or sorted(set.intersection(*[
      set(r[0]) for rs in sides.values() for r in rs]) - {'updates'})
  for name in names:
    print(f'== {name}  (means of the {every} updates ending at each column)')
    ends = sorted({r['updates'] for rs in sides.values() for run in rs for r in run
                   if r['updates'] % every == 0})
    print('  updates      ' + ' '.join(f'{u:>9d}' for u in ends))
    for side, runs in sides.items():
      vals = []
      for run in runs:
        by = {r['updates']: r.get(name, np.nan) for r in run}
        vals.append([np.mean([by.get(u - j * ROW_EVERY, np.nan)
                              for j in range(every // ROW_EVERY)]) for u in ends])
      if not vals:
        continue
      vals = np.array(vals)
      print(f'  {side:9s} mean ' + ' '.join(f'{x:9.4g}' for x in np.nanmean(vals, 0)))
      for i, v in enumerate(vals):
        print(f'    run {i}     ' + ' '.join(f'{x:9.4g}' for x in v))


def main(argv=None):
  p = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  sub = p.add_subparsers(dest='cmd', required=True)
  d = sub.add_parser('data')
  d.add_argument('--task', default='walker_walk')
  d.add_argument('--workers', type=int, default=4)
  d.add_argument('--steps_per_worker', type=int, default=2505)
  d.add_argument('--updates', type=int, default=2000)
  d.add_argument('--data_seed', type=int, default=0)
  d.add_argument('--out', required=True)
  for name in ('ours', 'official'):
    q = sub.add_parser(name)
    q.add_argument('--data', required=True)
    q.add_argument('--seed', type=int, default=0)
    q.add_argument('--updates', type=int, default=2000)
    q.add_argument('--out', required=True)
    if name == 'ours':
      q.add_argument('--override', action='append', default=[],
                     help='one more DreamerConfig field, name=value')
    else:
      q.add_argument('--src', default='/tmp/official/src')
  t = sub.add_parser('table')
  t.add_argument('--rows', nargs='+', required=True)
  t.add_argument('--metrics', nargs='*')
  t.add_argument('--every', type=int, default=250)
  args = p.parse_args(argv)
  {'data': collect, 'ours': train_ours, 'official': train_official,
   'table': table}[args.cmd](args)


if __name__ == '__main__':
  main()
