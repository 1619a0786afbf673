"""Learning parity at length: the official DreamerV3 and ours, side by side.

Three commands:

  # one training run of one side, to --updates updates; writes <out>/<name>.json
  python bench/parity.py run --side=official --task=cartpole_swingup --seed=0 \
      --updates=3000 [--official_python=... --src=...]
  python bench/parity.py run --side=ours --variant=official_oq --task=... --seed=0 \
      --updates=3000

  # every missing run of a task, one at a time (resumable)
  python bench/parity.py suite --task=cheetah_run --seeds 0 1 2 --updates=3000

  # compare every run of a task found under --out: PNG, table, acceptance
  python bench/parity.py compare --task=cartpole_swingup [--length=3000]

Both sides train with the SAME settings (SETTINGS below: size1m, B 16 x T 32,
train ratio 128, 4 envs, action repeat 2, lr 1e-4 with 100 warm-up updates,
float32 on the CPU) and log by UPDATE COUNT: each writes, per 50 updates, the
means of its metrics over exactly those updates (ours: `--learner_log_every`,
rows of kind 'learner'; the official: bench/parity_official.py wrapping its
`Agent.train`, in its own venv). `compare` re-bins both into 250-update windows
(means weighted by updates), maps the metric names once (METRICS, plus one
`loss/rec_<key>` per observation key), and checks the acceptance rule at
every 500 updates: ours' seed mean inside the official seeds' [min, max]
widened by max(10 % of |official mean|, official spread). It also tests each
(metric, check) pair statistically: Welch's t-test of ours' seeds
against the official's (`scipy.stats.ttest_ind(equal_var=False)`), the
p-values Holm-corrected over every check of the comparison; a pair is
significant when its Holm-adjusted p is below ALPHA.

Variants of ours:
  official_oq  the official code's choices for OQ 6 / OQ 7
               (start_from_data=False, outscale_dec=1.0): configs equal.
  defaults     the project's defaults (2411f7d's OQ 6 / OQ 7).
  Extra `--override name=value` switch one more field (e.g. a documented
  deviation) for a diagnostic run, and `--flag=--name[=value]` passes one
  more flag to experiments/run_dmc.py (e.g. `--flag=--chunk_length=1`,
  `--flag=--nolearner_prefetch`); both become part of the run's name.
  `--probe` runs ours through bench/parity_probe.py, which adds
  position-resolved world-model losses (`pos/<loss>/<group>`, also written by
  bench/parity_official.py); `compare` leaves them out of its checks.

Pixels (`--pixels` on run, suite and compare): both sides train from one
64x64 RGB observation 'image' and no vector keys, the official dmc_vision
semantics, at the same SETTINGS otherwise (size1m, ratio 128, repeat 2, ...):

  python bench/parity.py suite --task=cartpole_swingup --pixels --seeds 0 1 2 \
      --updates=1500 --variants
  python bench/parity.py compare --task=cartpole_swingup --pixels --length=1500 \
      --table_at 500 1500

  ours      experiments/run_dmc.py --image --noproprio (frames from
            physics.render with MuJoCo EGL, camera 0 (quadruped 2), after the
            action repeat; experiments/envs/dmc.py).
  official  --configs dmc_vision size1m --env.dmc.proprio False
            --env.dmc.image True (its defaults: size 64x64, camera -1 -> 0),
            and bench/parity_official.py --pixels keeps dm_control's
            rendering (it zeroes Physics.render for proprio runs).
  Both subprocesses get MUJOCO_GL=egl. The image's reconstruction loss is
  `loss/rec_image` on both sides (ours' train/loss/rec_image, the official
  loss/image). A pixel run's name has `pixels` after the task
  (cartpole_swingup_pixels_official_s0), its JSON has "pixels": true, and it
  goes to bench/results/parity/pixels/ (the default --out with --pixels);
  `compare` loads pixel runs only with --pixels and proprio runs only
  without it, whatever the folder, so the two never mix.

--updates must be a multiple of ROW_EVERY (ours writes a row every 50
updates only). To smoke-test the pipeline on tiny runs, `compare --bin=50
--check_every=50 --length=50` checks 50-update windows instead of the
250 / 500 defaults (the acceptance rows are only meaningful at the defaults).

Each run's JSON (settings, wall time, rows, episode scores) goes to
bench/results/parity/ (figures, not code; the official source is never
committed, see bench/official.py for its set-up).
"""

from __future__ import annotations

import argparse
import glob
import json
import math
import os
import shutil
import subprocess
import sys
import time
from typing import Dict, List

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
OUT = os.path.join(HERE, 'results', 'parity')
PIXELS_OUT = os.path.join(OUT, 'pixels')     # pixel runs (--pixels)

# The shared settings: one place for both sides.
SETTINGS = dict(size='size1m', batch_size=16, batch_length=32, train_ratio=128,
                num_envs=4, action_repeat=2, lr=1e-4, warmup=100)
ROW_EVERY = 50        # updates per logged row (both sides)
BIN = 250             # updates per compared window
CHECK_EVERY = 500     # acceptance rows
ALPHA = 0.05          # family-wise error rate of the Holm-corrected Welch tests

VARIANTS = {
    'official_oq': {'start_from_data': 'False', 'outscale_dec': '1.0'},
    'defaults': {},
}

# canonical name -> (ours' key in 'learner' rows, the official key).
# Reconstruction keys are added per observation key (rec_<key>).
METRICS = {
    'loss/dyn': ('train/loss/dyn', 'loss/dyn'),
    'loss/rep': ('train/loss/rep', 'loss/rep'),
    'loss/rew': ('train/loss/rew', 'loss/rew'),
    'loss/con': ('train/loss/con', 'loss/con'),
    'loss/value': ('train/loss/value', 'loss/value'),
    'loss/repval': ('train/loss/repval', 'loss/repval'),
    'loss/policy': ('train/loss/policy', 'loss/policy'),
    'policy_entropy': ('train/policy_entropy', 'ent/action'),
    'adv_mag': ('train/adv_mag', 'adv_mag'),
    'ret_scale': ('train/ret_scale', 'retnorm/scale'),
    'imag_return': ('train/ret_mean', 'ret_raw'),
    'imag_value': ('train/value_mean', 'val'),
    'grad_norm': ('train/grad_norm', 'opt/grad_norm'),
    'prior_entropy': ('train/dyn_ent', 'dyn_ent'),
    'post_entropy': ('train/rep_ent', 'rep_ent'),
}


# --- running -------------------------------------------------------------------

def run_name(side, task, seed, variant='', overrides=(), flags=(), probe=False,
             pixels=False):
  parts = [task] + (['pixels'] if pixels else []) + [side]
  parts += [variant] if side == 'ours' else []
  parts += [o.replace('=', '-') for o in overrides]
  parts += [flag_tag(f) for f in flags] + (['probe'] if probe else [])
  return '_'.join(parts + [f's{seed}'])


def flag_tag(flag: str) -> str:
  """'--chunk_length=1' -> 'chunk_length-1' (a run-name part)."""
  return flag.lstrip('-').replace('=', '-')


def env_steps_for(updates: int) -> int:
  """Env steps that give `updates` updates: the B*T-item fill (an env's
  first item needs T + 1 steps) plus updates x (B*T / ratio) agent steps,
  x repeat, with one vector step of margin per 100 updates (spec 6.1, 6.2)."""
  s = SETTINGS
  bt = s['batch_size'] * s['batch_length']
  fill = bt + s['num_envs'] * s['batch_length']
  agent = fill + updates * bt / s['train_ratio'] + s['num_envs'] * (2 + updates // 100)
  return int(math.ceil(agent)) * s['action_repeat']


def official_argv(task, seed, logdir, pixels=False):
  """The official flags. Proprio: its dmc_proprio config (size1m, no image).
  Pixels: its dmc_vision semantics (env.dmc.proprio False, env.dmc.image True;
  64x64, camera -1 -> 0 from its defaults) with size1m, the rest equal."""
  s = SETTINGS
  if pixels:
    configs = ['--configs', 'dmc_vision', 'size1m',
               '--env.dmc.proprio', 'False', '--env.dmc.image', 'True']
  else:
    configs = ['--configs', 'dmc_proprio']
  return configs + [
      '--task', f'dmc_{task}',
      '--env.dmc.repeat', str(s['action_repeat']), '--run.envs', str(s['num_envs']),
      '--run.train_ratio', str(s['train_ratio']),
      '--batch_size', str(s['batch_size']), '--batch_length', str(s['batch_length']),
      '--agent.opt.lr', str(s['lr']), '--agent.opt.warmup', str(s['warmup']),
      '--jax.platform', 'cpu', '--jax.compute_dtype', 'float32',
      '--jax.prealloc', 'False', '--logger.outputs', 'jsonl',
      '--run.log_every', '60', '--run.report_every', '0', '--run.save_every', '0',
      '--run.steps', '1e9', '--seed', str(seed), '--logdir', logdir]


def ours_argv(task, seed, logdir, updates, variant, overrides, flags=(),
              pixels=False):
  s = SETTINGS
  argv = [
      f'--task={task}', f'--size={s["size"]}', f'--train_ratio={s["train_ratio"]}',
      f'--action_repeat={s["action_repeat"]}', f'--num_envs={s["num_envs"]}',
      f'--env_steps={env_steps_for(updates)}', f'--batch_size={s["batch_size"]}',
      f'--batch_length={s["batch_length"]}', f'--seed={seed}',
      f'--config_overrides=lr={s["lr"]}', f'--config_overrides=warmup={s["warmup"]}',
      '--eval_every=0', '--eval_episodes=0', '--checkpoint_every=1e9',
      '--log_every=100000000', f'--learner_log_every={ROW_EVERY}',
      '--progress_every=120', '--noreport', f'--logdir={logdir}']
  fields = dict(VARIANTS[variant])
  for o in overrides:
    name, value = o.split('=', 1)
    fields[name] = value
  argv += [f'--config_overrides={k}={v}' for k, v in fields.items()]
  if pixels:   # one 64x64 RGB 'image' key and no vector keys (spec 2.10)
    argv += ['--image', '--noproprio']
  return argv + list(flags)


def _read_jsonl(path):
  if not os.path.exists(path):
    return []
  with open(path) as f:
    return [json.loads(line) for line in f if line.strip()]


def run(args) -> str:
  flags = list(getattr(args, 'flag', []))
  probe = bool(getattr(args, 'probe', False))
  pixels = bool(getattr(args, 'pixels', False))
  name = run_name(args.side, args.task, args.seed, args.variant, args.override, flags,
                  probe, pixels)
  logdir = os.path.join(args.workdir, name)
  if os.path.exists(logdir):
    shutil.rmtree(logdir)
  os.makedirs(logdir)
  t0 = time.time()
  if args.side == 'official':
    rows_path = os.path.join(logdir, 'updates.jsonl')
    cmd = [args.official_python, os.path.join(HERE, 'parity_official.py'),
           f'--src={args.src}', f'--updates={args.updates}', f'--every={ROW_EVERY}',
           f'--out={rows_path}', f'--repeat={SETTINGS["action_repeat"]}',
           *(['--pixels'] if pixels else []), '--',
           *official_argv(args.task, args.seed, os.path.join(logdir, 'run'), pixels)]
  else:
    script = (os.path.join(HERE, 'parity_probe.py') if probe
              else os.path.join(ROOT, 'experiments', 'run_dmc.py'))
    cmd = [sys.executable, script,
           *ours_argv(args.task, args.seed, os.path.join(logdir, 'run'),
                      args.updates, args.variant, args.override, flags, pixels)]
  env = dict(os.environ)
  if pixels:   # both sides render with MuJoCo EGL
    env['MUJOCO_GL'] = 'egl'
  with open(os.path.join(logdir, 'console.txt'), 'w') as console:
    proc = subprocess.run(cmd, stdout=console, stderr=subprocess.STDOUT, env=env)
  wall = time.time() - t0
  if proc.returncode != 0:
    raise SystemExit(f'{name}: exit {proc.returncode}; see {logdir}/console.txt')

  if args.side == 'official':
    raw = _read_jsonl(rows_path)
    rows = [{'updates': r['updates'], 'n': r['updates_in_mean'],
             'env_step': r['env_step'],
             **{k: v for k, v in r.items()
                if k not in ('updates', 'updates_in_mean', 'env_step')}}
            for r in raw]
    scores = [{'env_step': int(r['step']), 'score': float(r['episode/score'])}
              for r in _read_jsonl(os.path.join(logdir, 'run', 'scores.jsonl'))]
  else:
    raw = [r for r in _read_jsonl(os.path.join(logdir, 'run', 'metrics.jsonl'))
           if r.get('kind') == 'learner' and r['updates'] <= args.updates]
    rows = [{'updates': r['updates'], 'n': r['updates_in_mean'],
             'env_step': r['env_step'],
             **{k: v for k, v in r.items()
                if k.startswith('train/') and isinstance(v, (int, float))}}
            for r in raw]
    scores = [{'env_step': int(r['env_step']), 'score': float(r['score'])}
              for r in _read_jsonl(os.path.join(logdir, 'run', 'scores.jsonl'))]
  last = rows[-1]['updates'] if rows else 0
  if last < args.updates:
    raise SystemExit(f'{name}: only {last} of {args.updates} updates logged')
  result = {
      'side': args.side, 'task': args.task, 'seed': args.seed,
      'variant': args.variant if args.side == 'ours' else 'official',
      'overrides': list(args.override), 'flags': flags, 'probe': probe,
      'pixels': pixels, 'updates': args.updates,
      'settings': SETTINGS, 'row_every': ROW_EVERY, 'wall_s': round(wall, 1),
      'host_load_1m_at_end': os.getloadavg()[0],
      'command': ' '.join(cmd), 'rows': rows, 'scores': scores,
  }
  os.makedirs(args.out, exist_ok=True)
  path = os.path.join(args.out, name + '.json')
  with open(path, 'w') as f:
    json.dump(result, f)
  print(f'{name}: {last} updates in {wall / 60:.1f} min -> {path}', flush=True)
  return path


# --- comparing -------------------------------------------------------------------

def canonical_rows(result) -> List[Dict[str, float]]:
  """The run's rows with canonical metric names (METRICS + rec_<key>)."""
  ours = result['side'] == 'ours'
  out = []
  for r in result['rows']:
    row = {'updates': r['updates'], 'n': r['n']}
    for name, (ok, fk) in METRICS.items():
      key = ok if ours else fk
      if key in r:
        row[name] = r[key]
    for k, v in r.items():
      if ours and k.startswith('train/loss/rec_'):
        row['loss/rec_' + k[len('train/loss/rec_'):]] = v
      if not ours and k.startswith('loss/') and k[5:] not in (
          'dyn', 'rep', 'rew', 'con', 'value', 'repval', 'policy'):
        row['loss/rec_' + k[5:]] = v
      if ours and k.startswith(('train/pos/', 'train/data/')):   # parity_probe.py
        row[k[len('train/'):]] = v
      if not ours and k.startswith('data/'):                # parity_official.py
        row[k] = v
      if not ours and k.startswith('pos/'):                 # parity_official.py
        _, key, group = k.split('/')
        if key not in ('dyn', 'rew', 'con'):
          key = 'rec_' + key
        row[f'pos/{key}/{group}'] = v
    out.append(row)
  return out


def binned(result, length: int, bin_: int = BIN) -> Dict[str, np.ndarray]:
  """Means per BIN-update window (weighted by each row's update count):
  {metric: [length // BIN]} with NaN where the window has no rows."""
  nbins = length // bin_
  sums, weights = {}, {}
  for row in canonical_rows(result):
    b = (row['updates'] - 1) // bin_
    if b >= nbins:
      continue
    for k, v in row.items():
      if k in ('updates', 'n') or v is None:
        continue
      sums.setdefault(k, np.zeros(nbins))[b] += v * row['n']
      weights.setdefault(k, np.zeros(nbins))[b] += row['n']
  return {k: np.where(weights[k] > 0, sums[k] / np.maximum(weights[k], 1), np.nan)
          for k in sums}


def score_bins(result, length: int, bin_: int = BIN,
               check_every: int = CHECK_EVERY) -> np.ndarray:
  """Mean training-episode score per BIN-update row, over the episodes that
  ended in the CHECK_EVERY updates up to the row's end (a 1000-step episode
  ends every ~500 updates per env at these settings, so a BIN-wide window
  would be empty every other row). Episodes are placed by the update count
  at their env step (the same schedule on both sides, spec 6.1)."""
  s = SETTINGS
  bt = s['batch_size'] * s['batch_length']
  fill = bt + s['num_envs'] * s['batch_length']
  nbins = length // bin_
  upd = np.array([max(0.0, (ep['env_step'] / s['action_repeat'] - fill)
                      * s['train_ratio'] / bt) for ep in result['scores']])
  score = np.array([ep['score'] for ep in result['scores']])
  out = np.full(nbins, np.nan)
  for i in range(nbins):
    end = (i + 1) * bin_
    sel = (upd > end - check_every) & (upd <= end)
    if sel.any():
      out[i] = score[sel].mean()
  return out


def load(out, task, length, pixels=False):
  """{variant key: [run, ...]} of the runs of `task` that reach `length`,
  pixel runs only where `pixels`, else proprio runs only (never mixed; a
  JSON without the field is a proprio run).

  A `--probe` run (bench/parity_probe.py) trains with the same functions of
  the same inputs and only logs more, so it counts as a seed of its variant;
  where a seed has both a plain and a probe run, the plain one is kept (one
  run per seed: a seed counted twice would shrink the Welch variance)."""
  chosen = {}
  for path in sorted(glob.glob(os.path.join(out, f'{task}_*.json'))):
    with open(path) as f:
      r = json.load(f)
    if r['updates'] < length or bool(r.get('pixels', False)) != pixels:
      continue
    key = 'official' if r['side'] == 'official' else '_'.join(
        [r['variant']] + [o.replace('=', '-') for o in r['overrides']]
        + [flag_tag(f) for f in r.get('flags', [])])
    slot = (key, r['seed'])
    if slot not in chosen or (chosen[slot].get('probe') and not r.get('probe')):
      chosen[slot] = r
  runs = {}
  for (key, _), r in sorted(chosen.items(), key=lambda kv: (kv[0][0], kv[0][1])):
    runs.setdefault(key, []).append(r)
  return runs


def band(official: np.ndarray):
  """Official seeds [S, bins] -> (mean, lo, hi) of the acceptance band."""
  mean = np.nanmean(official, 0)
  mn, mx = np.nanmin(official, 0), np.nanmax(official, 0)
  widen = np.maximum(0.10 * np.abs(mean), mx - mn)
  return mean, mn - widen, mx + widen


def welch(ours: np.ndarray, official: np.ndarray):
  """Welch's unequal-variance t-test of two seed samples: (t, two-sided p).

  Non-finite values (a seed without rows in the window) are dropped. NaN
  where the test is undefined: fewer than 2 seeds on a side, or no variance
  on either side (e.g. a metric pinned at a constant, like ret_scale = 1).
  """
  from scipy import stats
  a = np.asarray(ours, float)
  b = np.asarray(official, float)
  a, b = a[np.isfinite(a)], b[np.isfinite(b)]
  if len(a) < 2 or len(b) < 2 or (np.ptp(a) == 0 and np.ptp(b) == 0):
    return math.nan, math.nan
  r = stats.ttest_ind(a, b, equal_var=False)
  return float(r.statistic), float(r.pvalue)


def holm(pvalues) -> np.ndarray:
  """Holm's step-down adjusted p-values, in the input's order.

  With the m finite p-values sorted ascending, p_(1) <= ... <= p_(m), the
  adjusted p_(k) is max over j <= k of min(1, (m - j + 1) p_(j)); rejecting
  where it is below alpha holds the family-wise error rate at alpha. NaN
  entries (tests not performed) stay NaN and do not count in m.
  """
  p = np.asarray(pvalues, float)
  out = np.full(p.shape, np.nan)
  finite = np.flatnonzero(np.isfinite(p))
  m = len(finite)
  running = 0.0
  for k, i in enumerate(finite[np.argsort(p[finite], kind='stable')]):
    running = max(running, min(1.0, (m - k) * p[i]))
    out[i] = running
  return out


def compare(args):
  pixels = bool(getattr(args, 'pixels', False))
  runs = load(args.out, args.task, args.length, pixels)
  kind = 'pixel' if pixels else 'proprio'
  if 'official' not in runs:
    raise SystemExit(f'no official {kind} runs of {args.task} to {args.length} '
                     f'updates in {args.out}')
  if args.ours not in runs:
    raise SystemExit(f'no {kind} runs of ours ({args.ours}) of {args.task} to '
                     f'{args.length} updates in {args.out}')
  bin_, every = getattr(args, 'bin', BIN), getattr(args, 'check_every', CHECK_EVERY)
  if bin_ <= 0 or every % bin_ or args.length < every:
    raise SystemExit(f'--bin {bin_} must divide --check_every {every}, and '
                     f'--length {args.length} reach it')
  nb = args.length // bin_
  centers = (np.arange(nb) + 1) * bin_         # window end (updates)
  data = {}
  for key, rs in runs.items():
    per_seed = [binned(r, args.length, bin_) for r in rs]
    names = sorted(set.intersection(*[set(p) for p in per_seed]))
    data[key] = {n: np.stack([p[n] for p in per_seed]) for n in names}
    data[key]['score'] = np.stack([score_bins(r, args.length, bin_, every)
                                   for r in rs])
  off = data['official']
  # Probes (pos/..., data/...) are diagnostics, not checks.
  names = [n for n in off if n in data.get(args.ours, {})
           and not n.startswith(('pos/', 'data/'))]
  checks = [i for i in range(nb) if centers[i] % every == 0]
  report = {'task': args.task, 'pixels': pixels, 'length': args.length,
            'ours': args.ours, 'bin': bin_, 'check_every': every,
            'seeds': {k: len(v) for k, v in runs.items()},
            'wall_s': {k: [r['wall_s'] for r in v] for k, v in runs.items()},
            'metrics': {}}
  outside = []
  for n in names:
    mean, lo, hi = band(off[n])
    ours = np.nanmean(data[args.ours][n], 0)
    entry = {'updates': [int(centers[i]) for i in checks],
             'ours_mean': [float(ours[i]) for i in checks],
             'official_mean': [float(mean[i]) for i in checks],
             'official_min': [float(np.nanmin(off[n][:, i])) for i in checks],
             'official_max': [float(np.nanmax(off[n][:, i])) for i in checks],
             'band_lo': [float(lo[i]) for i in checks],
             'band_hi': [float(hi[i]) for i in checks]}
    entry['inside'] = [bool(lo[i] <= ours[i] <= hi[i]) for i in checks]
    tests = [welch(data[args.ours][n][:, i], off[n][:, i]) for i in checks]
    entry['welch_t'] = [t for t, _ in tests]
    entry['welch_p'] = [p for _, p in tests]
    report['metrics'][n] = entry
    outside += [(n, int(centers[i]), float(ours[i]), float(lo[i]), float(hi[i]))
                for i in checks if not lo[i] <= ours[i] <= hi[i]]
  report['outside'] = outside
  report['stats'] = holm_family(report['metrics'])
  tag = f'{args.task}{"_pixels" if pixels else ""}_{args.ours}_{args.length}'
  with open(os.path.join(args.out, f'compare_{tag}.json'), 'w') as f:
    json.dump(report, f, indent=1)
  print(table(report, args.table_at))
  print(f'\n{len(outside)} (metric, update) checks outside the band:')
  for n, u, v, lo, hi in outside:
    print(f'  {n} @ {u}: ours {v:.4g}, band [{lo:.4g}, {hi:.4g}]')
  st = report['stats']
  print(f"\nWelch t-tests: {st['tests']} (metric, update) checks with a p-value "
        f"({st['untested']} untested); smallest raw p {st['min_p']:.3g} "
        f"({st['min_p_at'][0]} @ {st['min_p_at'][1]}); smallest Holm-adjusted p "
        f"{st['min_holm_p']:.3g}; {len(st['significant'])} significant after Holm "
        f"at alpha {st['alpha']}")
  for n, u, p, ph in st['significant']:
    print(f'  {n} @ {u}: p {p:.3g}, Holm {ph:.3g}')
  plot(data, names, centers, bin_, args.ours,
       os.path.join(args.out, f'compare_{tag}.png'),
       args.task + (' (pixels)' if pixels else ''))


def holm_family(metrics: dict) -> dict:
  """Holm-corrects every (metric, check) Welch p-value of one comparison
  together (adds 'holm_p' to each metric entry) and summarises the family."""
  where = [(n, i) for n, e in metrics.items() for i in range(len(e['welch_p']))]
  adjusted = holm([metrics[n]['welch_p'][i] for n, i in where])
  for n, e in metrics.items():
    e['holm_p'] = [math.nan] * len(e['welch_p'])
  for (n, i), ph in zip(where, adjusted):
    metrics[n]['holm_p'][i] = float(ph)
  tested = [(metrics[n]['welch_p'][i], n, metrics[n]['updates'][i], ph)
            for (n, i), ph in zip(where, adjusted) if np.isfinite(ph)]
  best = min(tested) if tested else (math.nan, '-', 0, math.nan)
  return {
      'alpha': ALPHA, 'tests': len(tested), 'untested': len(where) - len(tested),
      'min_p': best[0], 'min_p_at': [best[1], best[2]],
      'min_holm_p': min((t[3] for t in tested), default=math.nan),
      'significant': [[n, u, p, ph] for p, n, u, ph in sorted(tested, key=lambda t: t[0])
                      if ph < ALPHA],
  }


def _p(p) -> str:
  return '-' if not np.isfinite(p) else f'{p:.2g}' if p >= 0.001 else f'{p:.1e}'


def table(report, at) -> str:
  lines = [f"### {report['task']}{' (pixels)' if report.get('pixels') else ''}: ours ({report['ours']}, "
           f"{report['seeds'].get(report['ours'], 0)} seeds) against the official "
           f"({report['seeds']['official']} seeds)", '',
           '| metric | ' + ' | '.join(f'{u} updates: ours / official [min, max] | '
                                      f'Welch p | Holm p' for u in at) + ' |',
           '|---|' + '---|---:|---:|' * len(at)]
  for n, e in report['metrics'].items():
    cells = []
    for u in at:
      if u not in e['updates']:
        cells += ['-', '-', '-']
        continue
      i = e['updates'].index(u)
      mark = '' if e['inside'][i] else ' **out**'
      cells.append(f"{e['ours_mean'][i]:.4g} / [{e['official_min'][i]:.4g}, "
                   f"{e['official_max'][i]:.4g}]{mark}")
      holm_p = e.get('holm_p', [math.nan] * len(e['updates']))[i]
      sig = ' **sig**' if np.isfinite(holm_p) and holm_p < ALPHA else ''
      cells += [_p(e.get('welch_p', [math.nan] * len(e['updates']))[i]),
                _p(holm_p) + sig]
    lines.append(f'| {n} | ' + ' | '.join(cells) + ' |')
  return '\n'.join(lines)


def plot(data, names, centers, bin_, ours_key, path, task):
  import matplotlib
  matplotlib.use('Agg')
  import matplotlib.pyplot as plt
  cols = 4
  rows = int(math.ceil(len(names) / cols))
  fig, axes = plt.subplots(rows, cols, figsize=(4 * cols, 2.6 * rows), squeeze=False)
  x = centers - bin_ / 2
  others = [k for k in data if k not in ('official', ours_key)]
  for ax, n in zip(axes.flat, names):
    off = data['official'].get(n)
    if off is not None:
      mean, lo, hi = band(off)
      ax.fill_between(x, np.nanmin(off, 0), np.nanmax(off, 0), color='C0', alpha=0.3,
                      label=f'official [min, max] ({len(off)})')
      ax.plot(x, lo, 'C0:', lw=0.8)
      ax.plot(x, hi, 'C0:', lw=0.8)
    ours = data[ours_key].get(n)
    if ours is not None:
      for s in ours:
        ax.plot(x, s, color='C3', alpha=0.35, lw=0.8)
      ax.plot(x, np.nanmean(ours, 0), color='C3', lw=1.8, marker='.', ms=3,
              label=f'ours {ours_key} ({len(ours)})')
    for j, k in enumerate(others):
      if n in data[k]:
        ax.plot(x, np.nanmean(data[k][n], 0), color=f'C{j + 4}', lw=1.2,
                label=f'ours {k} ({len(data[k][n])})')
    ax.set_title(n, fontsize=9)
    ax.tick_params(labelsize=7)
  for ax in list(axes.flat)[len(names):]:
    ax.axis('off')
  axes.flat[0].legend(fontsize=6)
  fig.suptitle(f'{task}: per-{bin_}-update means against updates '
               f'(dotted: acceptance band)', fontsize=10)
  fig.tight_layout()
  fig.savefig(path, dpi=90)
  plt.close(fig)
  print(f'wrote {path}')


def suite(args) -> None:
  """Every missing run of a task, one at a time (never two on 2 cores):
  official and ours alternating per seed, then the extra variants. A run
  whose JSON is already in --out is skipped, so an interrupted suite resumes.
  Ours runs this checkout's code: start it from a pinned `git worktree` if
  you keep editing while it runs."""
  plan = []
  for seed in args.seeds:
    plan.append(('official', 'official_oq', seed))
    plan.append(('ours', 'official_oq', seed))
  for variant in args.variants:
    for seed in args.seeds[:args.variant_seeds]:
      plan.append(('ours', variant, seed))
  for side, variant, seed in plan:
    name = run_name(side, args.task, seed, variant, pixels=args.pixels)
    path = os.path.join(args.out, name + '.json')
    if os.path.exists(path):
      with open(path) as f:
        if json.load(f)['updates'] >= args.updates:
          print(f'{name}: done, skipped', flush=True)
          continue
    run(argparse.Namespace(
        side=side, variant=variant, override=[], flag=[], task=args.task, seed=seed,
        updates=args.updates, official_python=args.official_python,
        src=args.src, workdir=args.workdir, out=args.out, pixels=args.pixels))


def main(argv=None):
  p = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  sub = p.add_subparsers(dest='cmd', required=True)

  def training_args(parser):
    """The arguments `run` and `suite` share: where and how long to train."""
    parser.add_argument('--task', default='cartpole_swingup')
    parser.add_argument('--updates', type=int, default=3000)
    parser.add_argument('--official_python', default='/tmp/official/venv/bin/python')
    parser.add_argument('--src', default='/tmp/official/src')
    parser.add_argument('--workdir', default='/tmp/parity')
    parser.add_argument('--out', default=None,
                        help=f'default {OUT}, or {PIXELS_OUT} with --pixels')
    pixels_arg(parser)

  def pixels_arg(parser):
    parser.add_argument('--pixels', action='store_true',
                        help='train and compare from 64x64 RGB frames only '
                             '(the official dmc_vision semantics)')

  r = sub.add_parser('run')
  training_args(r)
  r.add_argument('--side', choices=['official', 'ours'], required=True)
  r.add_argument('--variant', choices=sorted(VARIANTS), default='official_oq')
  r.add_argument('--override', action='append', default=[],
                 help='ours: one more DreamerConfig field, name=value')
  r.add_argument('--flag', action='append', default=[],
                 help='ours: one more experiments/run_dmc.py flag, --name[=value]')
  r.add_argument('--probe', action='store_true',
                 help='ours: run through bench/parity_probe.py (position-resolved '
                      'world-model losses)')
  r.add_argument('--seed', type=int, default=0)
  q = sub.add_parser('suite')
  training_args(q)
  q.add_argument('--seeds', type=int, nargs='+', default=[0, 1, 2])
  q.add_argument('--variants', nargs='*', default=['defaults'],
                 help='extra variants of ours, after the official_oq pairs')
  q.add_argument('--variant_seeds', type=int, default=1)
  c = sub.add_parser('compare')
  c.add_argument('--task', default='cartpole_swingup')
  c.add_argument('--length', type=int, default=3000)
  c.add_argument('--ours', default='official_oq', help='variant key of ours')
  c.add_argument('--table_at', type=int, nargs='+', default=[1000, 3000])
  c.add_argument('--bin', type=int, default=BIN,
                 help='updates per window (smaller only to smoke-test tiny runs)')
  c.add_argument('--check_every', type=int, default=CHECK_EVERY,
                 help='updates per acceptance check (a multiple of --bin)')
  c.add_argument('--out', default=None,
                 help=f'default {OUT}, or {PIXELS_OUT} with --pixels')
  pixels_arg(c)
  args = p.parse_args(argv)
  if args.out is None:
    args.out = PIXELS_OUT if args.pixels else OUT
  if args.cmd in ('run', 'suite') and (args.updates <= 0 or args.updates % ROW_EVERY):
    # ours logs a row every ROW_EVERY updates only: any other count ends short
    p.error(f'--updates {args.updates}: expected a positive multiple of {ROW_EVERY}')
  if args.cmd == 'run':
    if args.side == 'official' and (args.variant != 'official_oq' or args.override
                                    or args.flag or args.probe):
      p.error('--variant / --override / --flag / --probe apply to ours only '
              '(the official side always writes the pos/ probes)')
    for f in args.flag:
      if not f.startswith('--'):
        p.error(f'--flag {f!r}: expected --name[=value]')
    for o in args.override:
      if '=' not in o:
        p.error(f'--override {o!r}: expected name=value')
    run(args)
  elif args.cmd == 'suite':
    suite(args)
  else:
    compare(args)


if __name__ == '__main__':
  main()
