r"""Long-run health, measured: a soak run and its figures.

  python bench/soak.py run --layout=local --updates=30000
  python bench/soak.py run --layout=distributed --updates=10000
  python bench/soak.py unstable --layout=local      # lr 1e30: must stop
  python bench/soak.py plot --out=bench/results/soak/local  # redo PNG + JSON

``run`` starts ``experiments/run_dmc.py`` as a child process (the single
process layout, or ``--distributed`` with its Launchpad nodes) at the tiny
size with a small batch and a train ratio that keeps the learner busy, and
stops it after ``--updates`` updates (the env-step budget is computed from
the spec 6.1 schedule: updates per env step = ratio / (B·T) / repeat). A
train row is written every ``N`` updates (``--every``; ``--log_every`` in
env steps), and on each new row the parent samples the child's whole process
tree with psutil: RSS, open file descriptors and threads, per process and
summed. From the row it takes the Reverb table sizes (``replay/uniform_size``,
``replay/online_size``), the skipped-update counter
(``learner/skipped_updates``, ``experiments.run.health``), the loss and the
update time (``time/learner_update_frac`` / ``fps/updates_per_s``), and the
machine's load average. Writes ``<out>/soak.csv`` (one line per sample),
``processes.csv`` (one line per process per sample), ``soak.png`` and
``summary.json`` with the acceptance checks of a healthy long run:

  * after warm-up (the first ``--warmup_frac`` of the updates and the first
    evaluation, which builds the eval env and compiles its policy once;
    rows written at the budget, while the run ends, are left out), RSS grows by
    less than 5 % between the first and the last quarter of the samples (mean
    RSS of each quarter; the process tree's sum and every process alone);
  * open fds and threads are flat: the last quarter's median is at most the
    first quarter's median + ``--flat_tolerance`` (2), for the tree's sum and
    for every process (maxima are reported: a checkpoint or an evaluation
    holds a few more for a moment);
  * no non-finite loss (``train/loss/total`` of every row finite) and no
    skipped update (``learner/skipped_updates`` 0 in every row).

Update times measured beside other work are slower than on a quiet machine:
the load average (``os.getloadavg()``) of every sample is in the CSV and its
range in the summary.

``unstable`` runs the one-process (or ``--distributed``) tiny run with lr
1e30 and the default ``--max_skipped_updates``: it must report skipped
updates in its train rows and stop with exit code 3 and the persistent-skip
message, and every checkpoint left must hold finite learner state
(``experiments.run.rundir.check_finite_state``). Its stderr tail, the train
rows and a JSON verdict go to ``<out>``.
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import os
import platform
import shutil
import signal
import subprocess
import sys
import time
from typing import Any, Dict, List, Optional

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RUN_DMC = os.path.join(REPO, 'experiments', 'run_dmc.py')
RESULTS = os.path.join(REPO, 'bench', 'results', 'soak')
RSS_GROWTH_LIMIT = 0.05

# The soak settings: tiny model, B=4, T=8, ratio 128 -> 4 updates per agent
# step (2 per env step at repeat 2): the learner takes most of the wall time.
SOAK_FLAGS = {
    'task': 'cartpole_swingup', 'size': 'tiny', 'batch_size': 4,
    'batch_length': 8, 'train_ratio': 128, 'action_repeat': 2, 'num_envs': 2,
    'replay_capacity': 1_000_000, 'seed': 0, 'eval_episodes': 1,
    'eval_policy': 'sample', 'checkpoint_every': 60, 'progress_every': 30,
}
UNSTABLE_FLAGS = ['--config_overrides=lr=1e30', '--config_overrides=warmup=1']


def updates_per_env_step(flags: Dict[str, Any]) -> float:
  """The spec 6.1 schedule: ratio / (B·T) updates per agent step."""
  return (flags['train_ratio'] / (flags['batch_size'] * flags['batch_length'])
          / flags['action_repeat'])


def _cmd(logdir: str, flags: Dict[str, Any], extra: List[str]) -> List[str]:
  return ([sys.executable, RUN_DMC, f'--logdir={logdir}', '--noreport'] +
          [f'--{k}={v}' for k, v in flags.items()] + list(extra))


def _env() -> Dict[str, str]:
  # This checkout's packages first, in the child and in every Launchpad node.
  path = os.environ.get('PYTHONPATH')
  return {**os.environ, 'PYTHONUNBUFFERED': '1',
          'PYTHONPATH': REPO + (os.pathsep + path if path else '')}


def _git() -> Dict[str, Any]:
  try:
    head = subprocess.run(['git', 'rev-parse', 'HEAD'], cwd=REPO, text=True,
                          capture_output=True, check=True).stdout.strip()
    dirty = subprocess.run(['git', 'status', '--porcelain', '--untracked-files=no'],
                           cwd=REPO, text=True, capture_output=True,
                           check=True).stdout.split('\n')
    return {'commit': head, 'modified_files': [d[3:] for d in dirty if d]}
  except (OSError, subprocess.CalledProcessError):
    return {'commit': os.environ.get('SOAK_COMMIT'), 'modified_files': None}


# --- sampling -----------------------------------------------------------------------


def _tree(pid: int):
  import psutil
  try:
    root = psutil.Process(pid)
    return [root] + root.children(recursive=True)
  except psutil.NoSuchProcess:
    return []


def _proc_name(p) -> str:
  """'run_dmc' for the launcher / the one process; a Launchpad node by the
  log file its output goes to (``lp_logs/segment-<n>/<group>/<i>``), else
  the executable."""
  try:
    cmd = p.cmdline()
  except Exception:  # noqa: BLE001
    return '?'
  if any(part.endswith('run_dmc.py') for part in cmd):
    return 'run_dmc'
  try:
    for f in p.open_files():
      if '/lp_logs/' in f.path:
        return '/'.join(f.path.split('/lp_logs/', 1)[1].split('/')[1:])
  except Exception:  # noqa: BLE001
    pass
  return os.path.basename(cmd[0]) if cmd else p.name()


_NAMES: Dict[int, str] = {}


def sample_tree(pid: int) -> List[Dict[str, Any]]:
  """RSS (bytes), open fds and threads of every process of ``pid``'s tree."""
  import psutil
  out = []
  for p in _tree(pid):
    try:
      if p.pid not in _NAMES or _NAMES[p.pid] in ('python', 'python3'):
        _NAMES[p.pid] = _proc_name(p)
      with p.oneshot():
        out.append({'pid': p.pid, 'name': _NAMES[p.pid],
                    'rss': p.memory_info().rss, 'fds': p.num_fds(),
                    'threads': p.num_threads()})
    except (psutil.NoSuchProcess, psutil.ZombieProcess, psutil.AccessDenied):
      pass
  return out


def _read_rows(path: str, offset: int):
  """New complete train rows of metrics.jsonl from byte ``offset``."""
  if not os.path.exists(path):
    return [], offset
  with open(path, 'rb') as f:
    f.seek(offset)
    data = f.read()
  end = data.rfind(b'\n') + 1
  rows = [json.loads(line) for line in data[:end].splitlines() if line.strip()]
  return [r for r in rows if r.get('kind') == 'train'], offset + end


def _finite(x) -> bool:
  return x is not None and isinstance(x, (int, float)) and math.isfinite(x)


def _sample(row: Dict[str, Any], procs, t0: float) -> Dict[str, Any]:
  ups = row.get('fps/updates_per_s') or 0.0
  frac = row.get('time/learner_update_frac')
  return {
      'wall_s': round(time.time() - t0, 2), 'updates': row['updates'],
      'env_step': row['env_step'],
      'rss_mb': round(sum(p['rss'] for p in procs) / 2**20, 2),
      'fds': sum(p['fds'] for p in procs),
      'threads': sum(p['threads'] for p in procs), 'processes': len(procs),
      'uniform_size': row.get('replay/uniform_size'),
      'online_size': row.get('replay/online_size'),
      'latent_entries': row.get('replay/latent_store_entries'),
      'skipped_updates': row.get('learner/skipped_updates'),
      'skip_streak': row.get('learner/skip_streak'),
      'skipped_frac': row.get('train/skipped_update'),
      'loss_total': row.get('train/loss/total'),
      'updates_per_s': round(ups, 3),
      'update_ms': (round(1000 * frac / ups, 3) if frac is not None and ups > 0
                    else None),
      'learner_update_frac': frac,
      'load1': round(os.getloadavg()[0], 2),
  }


def run_soak(args) -> int:
  flags = dict(SOAK_FLAGS)
  ups = updates_per_env_step(flags)
  if args.layout == 'distributed':
    flags.update(num_actors=2, stop_grace=60)
  step = flags['action_repeat'] * flags['num_envs']     # env steps per vector step
  log_every = max(step, int(round(args.every / ups / step)) * step)
  # + the fill (B·T items before the first update, spec 6.2) and a margin.
  need = args.updates / ups * 1.02 + 4 * flags['batch_size'] * flags[
      'batch_length'] * flags['action_repeat']
  env_steps = int(math.ceil(need / step)) * step
  flags.update(env_steps=env_steps, log_every=log_every,
               eval_every=max(log_every, args.eval_every // log_every * log_every))
  out = os.path.abspath(args.out or os.path.join(RESULTS, args.layout))
  logdir = os.path.abspath(args.logdir or os.path.join('/tmp', f'soak_{args.layout}'))
  if os.path.exists(logdir):
    shutil.rmtree(logdir)
  os.makedirs(out, exist_ok=True)
  extra = ['--distributed'] if args.layout == 'distributed' else []
  cmd = _cmd(logdir, flags, extra + list(args.extra))
  print('[soak]', ' '.join(cmd), file=sys.stderr, flush=True)
  load_start = os.getloadavg()
  t0 = time.time()
  stderr_path = os.path.join(out, 'run.log')
  samples, per_proc = [], []
  metrics_path = os.path.join(logdir, 'metrics.jsonl')
  offset = 0
  with open(stderr_path, 'w') as log:
    proc = subprocess.Popen(cmd, cwd=REPO, env=_env(), stdout=log,
                            stderr=subprocess.STDOUT, start_new_session=True)
    try:
      while True:
        done = proc.poll() is not None
        rows, offset = _read_rows(metrics_path, offset)
        if rows:
          procs = sample_tree(proc.pid)
          for row in rows[:-1]:          # rows that piled up: no process sample
            samples.append({**_sample(row, [], t0), 'rss_mb': None,
                            'fds': None, 'threads': None, 'processes': None})
          s = _sample(rows[-1], procs, t0)
          samples.append(s)
          per_proc += [{'updates': s['updates'], **p} for p in procs]
          if len(samples) % 10 == 0:
            print(f"[soak] {s['updates']} updates, rss {s['rss_mb']} MB, fds "
                  f"{s['fds']}, threads {s['threads']}, {s['updates_per_s']} "
                  f"updates/s, load {s['load1']}", file=sys.stderr, flush=True)
        if done:
          break
        if time.time() - t0 > args.timeout:
          os.killpg(proc.pid, signal.SIGINT)
          proc.wait(timeout=120)
          break
        time.sleep(args.poll)
    finally:
      if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGKILL)
  wall = time.time() - t0
  _write_csv(os.path.join(out, 'soak.csv'), samples)
  _write_csv(os.path.join(out, 'processes.csv'), per_proc)
  meta = {
      'layout': args.layout, 'command': cmd, 'flags': flags,
      'updates_per_env_step': ups, 'sample_every_updates': log_every * ups,
      'returncode': proc.returncode, 'wall_s': round(wall, 1),
      'loadavg_start': load_start, 'loadavg_end': os.getloadavg(),
      'cpus': os.cpu_count(), 'host': platform.node(),
      'python': platform.python_version(), **_git(),
      'final_checkpoint': _latest_checkpoint(logdir),
      'note': args.note,
  }
  with open(os.path.join(out, 'meta.json'), 'w') as f:
    json.dump(meta, f, indent=1)
  summary = summarize(out, args.warmup_frac, args.flat_tolerance)
  print(json.dumps(summary['checks'], indent=1), file=sys.stderr)
  return 0 if summary['passed'] else 1


def _latest_checkpoint(logdir: str) -> Optional[str]:
  root = os.path.join(logdir, 'checkpoints')
  if not os.path.isdir(root):
    return None
  names = sorted(n for n in os.listdir(root) if n.startswith('ckpt-'))
  return os.path.join(root, names[-1]) if names else None


def _write_csv(path: str, rows: List[Dict[str, Any]]) -> None:
  keys = list(rows[0]) if rows else []
  with open(path, 'w', newline='') as f:
    w = csv.DictWriter(f, fieldnames=keys)
    w.writeheader()
    w.writerows(rows)


def _read_csv(path: str) -> List[Dict[str, Any]]:
  def conv(v):
    if v in ('', 'None'):
      return None
    try:
      return int(v)
    except ValueError:
      try:
        return float(v)
      except ValueError:
        return v
  with open(path) as f:
    return [{k: conv(v) for k, v in r.items()} for r in csv.DictReader(f)]


# --- acceptance -------------------------------------------------------------------------


def _quarters(rows, total_updates, warmup_frac):
  """Samples after warm-up, split into 4 equal update ranges."""
  start = warmup_frac * total_updates
  after = [r for r in rows if r['updates'] >= start]
  if not after:
    return start, [[], [], [], []]
  lo, hi = after[0]['updates'], after[-1]['updates']
  width = max(hi - lo, 1) / 4
  qs = [[], [], [], []]
  for r in after:
    qs[min(3, int((r['updates'] - lo) / width))].append(r)
  return start, qs


def _median(xs):
  xs = sorted(x for x in xs if x is not None)
  return xs[len(xs) // 2] if xs else None


def _mean(xs):
  xs = [x for x in xs if x is not None]
  return sum(xs) / len(xs) if xs else None


def summarize(out: str, warmup_frac: float = 0.1,
              flat_tolerance: int = 2) -> Dict[str, Any]:
  """The acceptance checks from ``out``'s CSVs -> summary.json (+ soak.png)."""
  with open(os.path.join(out, 'meta.json')) as f:
    meta = json.load(f)
  all_rows = _read_csv(os.path.join(out, 'soak.csv'))
  procs = _read_csv(os.path.join(out, 'processes.csv'))
  # Rows at the budget are written while the run ends (final evaluation,
  # final checkpoint, nodes stopping): reported, not part of the checks.
  budget = meta['flags']['env_steps']
  rows = [r for r in all_rows if r['env_step'] < budget]
  final = [r for r in all_rows if r['env_step'] >= budget]
  sampled = [r for r in rows if r['rss_mb'] is not None]
  total = all_rows[-1]['updates'] if all_rows else 0
  # Warm-up: the first warmup_frac of the updates and the first evaluation
  # (it builds the eval env and compiles the eval policy, once).
  eval_every = meta['flags'].get('eval_every') or 0
  first_eval = [r['updates'] for r in rows if eval_every and
                r['env_step'] >= eval_every + meta['flags']['log_every']]
  warm = max(warmup_frac * total, first_eval[0] if first_eval else 0)
  start, qs = _quarters(sampled, total, warm / max(total, 1))
  first, last = qs[0], qs[3]
  rss_first, rss_last = _mean(r['rss_mb'] for r in first), _mean(
      r['rss_mb'] for r in last)
  growth = (rss_last - rss_first) / rss_first if rss_first else None
  # Per process (pid), over the same update ranges.
  per_pid = {}
  first_u = {r['updates'] for r in first}
  last_u = {r['updates'] for r in last}
  for p in procs:
    d = per_pid.setdefault(p['pid'], {'name': p['name'], 'first': [],
                                      'last': []})
    if p['updates'] in first_u:
      d['first'].append(p)
    elif p['updates'] in last_u:
      d['last'].append(p)
  processes = {}
  for pid, d in per_pid.items():
    if not d['first'] or not d['last']:
      continue
    f_rss, l_rss = _mean(p['rss'] for p in d['first']), _mean(
        p['rss'] for p in d['last'])
    processes[str(pid)] = {
        'name': d['name'], 'rss_mb_first_quarter': round(f_rss / 2**20, 1),
        'rss_mb_last_quarter': round(l_rss / 2**20, 1),
        'rss_growth': round((l_rss - f_rss) / f_rss, 4),
        **{f'{k}_{q}_quarter_median_max': [_median(p[k] for p in d[q]),
                                           max(p[k] for p in d[q])]
           for k in ('fds', 'threads') for q in ('first', 'last')}}

  def flat(key):
    a = [r[key] for r in first]
    b = [r[key] for r in last]
    ok = bool(a and b and _median(b) <= _median(a) + flat_tolerance)
    ok = ok and all(p[f'{key}_last_quarter_median_max'][0] <=
                    p[f'{key}_first_quarter_median_max'][0] + flat_tolerance
                    for p in processes.values())
    return {'first_quarter_median_min_max': [_median(a), min(a), max(a)]
            if a else None,
            'last_quarter_median_min_max': [_median(b), min(b), max(b)]
            if b else None,
            'whole_run_after_warmup_min_max': [
                min(r[key] for r in sampled if r['updates'] >= start),
                max(r[key] for r in sampled if r['updates'] >= start)]
            if sampled else None,
            'flat': ok}

  losses = [r['loss_total'] for r in rows if r['updates'] > 0 and
            r.get('skipped_frac') is not None]
  nonfinite = [r['updates'] for r in rows if r['updates'] > 0 and
               r.get('skipped_frac') is not None and not _finite(
                   r['loss_total'])]
  skipped = max((r['skipped_updates'] or 0) for r in rows) if rows else None
  ups = [r['updates_per_s'] for r in rows if r['updates_per_s']]
  ums = [r['update_ms'] for r in rows if r.get('update_ms')]
  loads = [r['load1'] for r in rows]

  def by_quarter(key):
    return [round(_mean(r[key] for r in q) or float('nan'), 3) for q in qs]

  rss_ok = growth is not None and growth < RSS_GROWTH_LIMIT and all(
      p['rss_growth'] < RSS_GROWTH_LIMIT for p in processes.values())
  checks = {
      'updates': total, 'target_reached': total >= 10_000,
      'returncode': meta['returncode'],
      'warmup_updates': int(start),
      'samples': len(rows), 'samples_with_process_stats': len(sampled),
      'rss_mb_first_quarter_mean': round(rss_first, 1) if rss_first else None,
      'rss_mb_last_quarter_mean': round(rss_last, 1) if rss_last else None,
      'rss_growth': round(growth, 4) if growth is not None else None,
      'rss_growth_limit': RSS_GROWTH_LIMIT, 'rss_ok': rss_ok,
      'fds': flat('fds'), 'threads': flat('threads'),
      'nonfinite_loss_rows': nonfinite, 'loss_rows': len(losses),
      'skipped_updates': skipped,
      'no_nonfinite_no_skip': not nonfinite and skipped == 0,
      'updates_per_s_by_quarter': by_quarter('updates_per_s'),
      'update_ms_by_quarter': by_quarter('update_ms'),
      'update_ms_median': sorted(ums)[len(ums) // 2] if ums else None,
      'updates_per_s_median': sorted(ups)[len(ups) // 2] if ups else None,
      'learner_update_frac_by_quarter': by_quarter('learner_update_frac'),
      'final_rows_excluded': [{k: r[k] for k in ('updates', 'rss_mb', 'fds',
                                                  'threads')} for r in final],
      'uniform_size_first_last': [rows[0]['uniform_size'],
                                  rows[-1]['uniform_size']] if rows else None,
      'online_size_max': max((r['online_size'] or 0) for r in rows)
                         if rows else None,
      'load1_min_max': [min(loads), max(loads)] if loads else None,
      'per_process': processes,
  }
  passed = bool(checks['target_reached'] and meta['returncode'] == 0 and
                rss_ok and checks['fds']['flat'] and
                checks['threads']['flat'] and checks['no_nonfinite_no_skip'])
  summary = {'passed': passed, 'checks': checks, 'meta': meta,
             'under_load': 'update times were measured beside other work on '
                           'the same 2 cores; see load1_min_max'}
  with open(os.path.join(out, 'summary.json'), 'w') as f:
    json.dump(summary, f, indent=1)
  plot(out, all_rows, qs, start, checks)
  return summary


def plot(out, rows, qs, start, checks) -> None:
  import matplotlib
  matplotlib.use('Agg')
  import matplotlib.pyplot as plt
  u = [r['updates'] for r in rows]
  fig, axes = plt.subplots(2, 3, figsize=(15, 8))
  panels = [
      ('RSS (MB, process tree)', ['rss_mb'], None),
      ('open fds / threads (process tree)', ['fds', 'threads'], None),
      ('Reverb tables (items)', ['uniform_size', 'online_size'], None),
      ('update time (ms, log; first = compile)', ['update_ms'], None),
      ('updates / s and load avg (1 min)', ['updates_per_s', 'load1'], None),
      ('skipped updates (total); train/loss/total (right)',
       ['skipped_updates'], 'loss_total'),
  ]
  for ax, (title, keys, right) in zip(axes.flat, panels):
    for key in keys:
      pts = [(x, r[key]) for x, r in zip(u, rows) if r.get(key) is not None]
      if pts:
        ax.plot(*zip(*pts), label=key, lw=1)
    if right:
      pts = [(x, r[right]) for x, r in zip(u, rows) if r.get(right) is not None]
      if pts:
        ax2 = ax.twinx()
        ax2.plot(*zip(*pts), color='C1', lw=1, label=right)
        ax2.legend(fontsize=8, loc='upper right')
    if keys == ['update_ms']:
      ax.set_yscale('log')
    ax.axvline(start, color='gray', ls=':', lw=1)
    for q in qs:
      if q:
        ax.axvspan(q[0]['updates'], q[-1]['updates'], alpha=0.04,
                   color='C0' if q in (qs[0], qs[3]) else 'white')
    ax.set_title(title, fontsize=10)
    ax.set_xlabel('updates')
    ax.legend(fontsize=8, loc='upper left' if right else 'best')
  g = checks['rss_growth']
  fig.suptitle(
      f"soak: {checks['updates']} updates; RSS first->last quarter "
      f"{checks['rss_mb_first_quarter_mean']} -> "
      f"{checks['rss_mb_last_quarter_mean']} MB "
      f"({'n/a' if g is None else f'{100 * g:+.2f} %'}); fds flat "
      f"{checks['fds']['flat']}, threads flat {checks['threads']['flat']}; "
      f"skipped {checks['skipped_updates']}; load1 {checks['load1_min_max']}",
      fontsize=10)
  fig.tight_layout()
  fig.savefig(os.path.join(out, 'soak.png'), dpi=90)
  plt.close(fig)


# --- the unstable run --------------------------------------------------------------------


def run_unstable(args) -> int:
  """lr 1e30 (module doc): skipped updates in the rows, the stop, finite
  checkpoints."""
  flags = {'task': 'cartpole_swingup', 'size': 'tiny', 'batch_size': 4,
           'batch_length': 8, 'train_ratio': 128, 'action_repeat': 2,
           'num_envs': 2, 'replay_capacity': 100_000, 'env_steps': 4000,
           'time_limit': 1.0, 'eval_episodes': 0, 'log_every': 20,
           'checkpoint_every': 2, 'progress_every': 5}
  extra = list(UNSTABLE_FLAGS)
  if args.layout == 'distributed':
    flags.update(num_actors=2, stop_grace=20)
    extra.append('--distributed')
  out = os.path.abspath(args.out or os.path.join(RESULTS, f'unstable_{args.layout}'))
  logdir = os.path.abspath(args.logdir or os.path.join(
      '/tmp', f'soak_unstable_{args.layout}'))
  if os.path.exists(logdir):
    shutil.rmtree(logdir)
  os.makedirs(out, exist_ok=True)
  cmd = _cmd(logdir, flags, extra + list(args.extra))
  t0 = time.time()
  res = subprocess.run(cmd, cwd=REPO, env=_env(), capture_output=True,
                       text=True, timeout=args.timeout)
  wall = time.time() - t0
  with open(os.path.join(out, 'stderr_tail.txt'), 'w') as f:
    f.write(' '.join(cmd) + '\n\n' + res.stderr[-8000:])
  rows, _ = _read_rows(os.path.join(logdir, 'metrics.jsonl'), 0)
  keep = ('env_step', 'updates', 'train/skipped_update',
          'train/nonfinite_batch', 'train/loss/total', 'train/lr',
          'learner/skipped_updates', 'learner/skip_streak')
  with open(os.path.join(out, 'train_rows.jsonl'), 'w') as f:
    for r in rows:
      f.write(json.dumps({k: r.get(k) for k in keep}) + '\n')
  sys.path.insert(0, REPO)
  from experiments.run import rundir  # noqa: E402  (after the child ran)
  finite = {}
  for ckpt in rundir.list_run_checkpoints(logdir):
    state = rundir.read_learner_state(ckpt)
    try:
      rundir.check_finite_state(state, ckpt, logdir)
      finite[ckpt] = True
    except rundir.CheckpointError as e:
      finite[ckpt] = str(e)
  stop = [line for line in res.stderr.splitlines()
          if 'updates in a row were skipped' in line]
  verdict = {
      'layout': args.layout, 'command': cmd, 'returncode': res.returncode,
      'wall_s': round(wall, 1), 'loadavg_end': os.getloadavg(),
      'rows_with_skips': sum(1 for r in rows
                             if (r.get('train/skipped_update') or 0) > 0),
      'last_row': {k: rows[-1].get(k) for k in keep} if rows else None,
      'stop_message': stop[-1].strip() if stop else None,
      'checkpoints_finite': finite, **_git(),
  }
  verdict['passed'] = bool(res.returncode == 3 and stop and
                           verdict['rows_with_skips'] and
                           all(v is True for v in finite.values()))
  with open(os.path.join(out, 'verdict.json'), 'w') as f:
    json.dump(verdict, f, indent=1)
  print(json.dumps(verdict, indent=1), file=sys.stderr)
  return 0 if verdict['passed'] else 1


def main(argv=None) -> int:
  p = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
  sub = p.add_subparsers(dest='what', required=True)
  r = sub.add_parser('run', help='the soak run')
  r.add_argument('--layout', choices=['local', 'distributed'], default='local')
  r.add_argument('--updates', type=int, default=30_000)
  r.add_argument('--every', type=int, default=200,
                 help='updates between samples (train rows)')
  r.add_argument('--eval_every', type=int, default=2000,
                 help='env steps between evaluations (1 episode each)')
  r.add_argument('--warmup_frac', type=float, default=0.1)
  r.add_argument('--flat_tolerance', type=int, default=2)
  r.add_argument('--poll', type=float, default=0.5)
  r.add_argument('--timeout', type=float, default=3 * 3600)
  r.add_argument('--out')
  r.add_argument('--logdir')
  r.add_argument('--note', default='')
  r.add_argument('extra', nargs='*', help='more run_dmc.py flags (after --)')
  u = sub.add_parser('unstable', help='the lr 1e30 run that must stop')
  u.add_argument('--layout', choices=['local', 'distributed'], default='local')
  u.add_argument('--timeout', type=float, default=900)
  u.add_argument('--out')
  u.add_argument('--logdir')
  u.add_argument('extra', nargs='*')
  s = sub.add_parser('plot', help='recompute summary.json and soak.png')
  s.add_argument('--out', required=True)
  s.add_argument('--warmup_frac', type=float, default=0.1)
  s.add_argument('--flat_tolerance', type=int, default=2)
  args = p.parse_args(argv)
  if args.what == 'run':
    return run_soak(args)
  if args.what == 'unstable':
    return run_unstable(args)
  summary = summarize(os.path.abspath(args.out), args.warmup_frac,
                      args.flat_tolerance)
  print(json.dumps(summary['checks'], indent=1))
  return 0 if summary['passed'] else 1


if __name__ == '__main__':
  sys.exit(main())
