"""The run directory, shared by the single-process and Launchpad layouts.

One module owns what both layouts write and read (docs/metrics.md):

  flags.txt          the flags of the latest start (usable as --flagfile)
  metrics.jsonl      one JSON row per log interval ('kind': 'train') or eval
                     ('kind': 'eval'); appended with O_APPEND, one write a row,
                     so several processes may write it
  scores.jsonl       one row per finished training episode (report input)
  eval/scores.jsonl  one row per evaluation episode
  tensorboard/       TensorBoard event files (same scalars as metrics.jsonl)
  checkpoints/       ckpt-<agent steps>/ (learner.pkl, replay_state.json,
                     latents.npz, config.json, run_state.json) and
                     reverb/<timestamp>/ (the Reverb checkpoint it references)
  report.png         experiments/report.py output at the end of the run

Checkpoints are atomic (``write_checkpoint``): everything goes into
``checkpoints/.tmp-*`` which is renamed to ``ckpt-*``; a Reverb checkpoint is
only deleted once a newer ``ckpt-*`` references another one, and before the
server starts every Reverb checkpoint not referenced by the newest ``ckpt-*``
is deleted (``clean_checkpoints``), so a kill mid-save falls back to the
previous checkpoint and replay data is never held twice.

Resume (``prepare``): a start whose logdir holds a complete checkpoint
continues from it. Everything is validated before anything is written: the
logdir is writable, the checkpoint was written by the same layout ('mode') and
with the same settings (every DreamerConfig field and ``RESUME_FIXED``). Log
lines written after the checkpoint are then moved to ``<file>.discarded`` so
the curves stay consistent.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import pickle
import shutil
import sys
import time
from typing import Any, Callable, Dict, List, Mapping, Optional

import numpy as np

import agent  # noqa: F401  (jax compat before acme)
from acme.utils.loggers import base as loggers_base

CKPT_PREFIX = 'ckpt-'
TMP_PREFIX = '.tmp-'
REVERB_DIR = 'reverb'
LEARNER_FILE = 'learner.pkl'
RUN_STATE_FILE = 'run_state.json'
CONFIG_FILE = 'config.json'
REPLAY_STATE_FILE = 'replay_state.json'
METRICS_FILE = 'metrics.jsonl'
SCORES_FILE = 'scores.jsonl'
EVAL_DIR = 'eval'
TB_DIR = 'tensorboard'
REPORT_FILE = 'report.png'
FLAGS_FILE = 'flags.txt'
LOG_FILES = {'metrics_bytes': METRICS_FILE, 'scores_bytes': SCORES_FILE,
             'eval_scores_bytes': os.path.join(EVAL_DIR, SCORES_FILE)}
# Segment r of a run seeds its training envs with seed + SEGMENT_SEED_STRIDE*r
# (VectorEnv then uses that * 1000 + i); eval envs add EVAL_SEED_OFFSET.
SEGMENT_SEED_STRIDE = 7919
EVAL_SEED_OFFSET = 1_000_003
# Run settings that must not change on resume (besides every DreamerConfig field).
RESUME_FIXED = ('suite', 'task', 'num_envs', 'action_repeat', 'time_limit',
                'chunk_length')
MODES = ('single_process', 'distributed')


@dataclasses.dataclass
class RunConfig:
  """Loop settings of either layout (the DreamerConfig holds the agent's).

  checkpoint_every is in seconds of wall time (a restart loses at most that
  much work); eval_every and log_every are in env steps (agent steps x
  action_repeat, the spec 7.5 x-axis); progress_every in seconds.
  prefetch: the learner samples its next batch during the current update
  (spec 6.3b, docs/deviations.md "Training loop"); False keeps the strict
  synchronous order (sample after the previous write-back).
  """
  task: str
  logdir: str
  env_steps: int
  suite: str = 'dmc'                      # experiments.suites: dmc, gym, custom
  num_envs: int = 16
  action_repeat: int = 2
  eval_every: int = 0
  eval_episodes: int = 0
  eval_policy: str = 'sample'
  checkpoint_every: float = 600.0
  log_every: int = 10_000
  learner_log_every: int = 0              # updates; 0 = no 'learner' rows
  progress_every: float = 10.0
  time_limit: Optional[float] = None
  chunk_length: Optional[int] = None      # None: the WindowAdder default
  prefetch: bool = True
  report: bool = True
  flags_text: str = ''
  verbose: bool = True
  # suite 'custom': seed -> dm_env.Environment (not saved; give it again to
  # resume, README "Your own environment").
  env_factory: Optional[Callable] = dataclasses.field(default=None, repr=False,
                                                      compare=False)

  def __post_init__(self):
    if self.env_steps <= 0:
      raise ValueError(f'--env_steps must be positive, got {self.env_steps}')
    if self.num_envs < 1:
      raise ValueError(f'--num_envs must be >= 1, got {self.num_envs}')
    from experiments import suites
    if self.suite == 'custom' and self.env_factory is None:
      raise ValueError("suite 'custom' needs env_factory (seed -> dm_env.Environment)")
    if self.suite != 'custom':
      suites.check_task(self.suite, self.task)
    if self.suite != 'dmc' and self.time_limit is not None:
      raise ValueError('--time_limit (simulated seconds) is a dm_control '
                       f'setting; --suite={self.suite} envs end by their own limits')
    if self.eval_policy not in ('sample', 'mode'):
      raise ValueError(f"--eval_policy must be 'sample' or 'mode', got "
                       f'{self.eval_policy!r}')

  def make_env(self, num_envs: int, seed: int, first_index: int = 0):
    """``env_loop.VectorEnvironment`` over ``num_envs`` envs of this run's task
    (env i seeded ``seed * 1000 + first_index + i``)."""
    from experiments import env_loop
    from experiments.envs import VectorEnv
    return env_loop.VectorEnvironment(VectorEnv(
        self.task, num_envs, self.action_repeat, seed=seed,
        time_limit=self.time_limit, first_index=first_index, suite=self.suite,
        env_factory=self.env_factory))

  def env_seed(self, seed: int, segment: int, evaluation: bool = False) -> int:
    """Seed of a segment's training (or eval) envs (module constants)."""
    return (seed + SEGMENT_SEED_STRIDE * segment +
            (EVAL_SEED_OFFSET if evaluation else 0))


def log(msg: str) -> None:
  print(msg, file=sys.stderr, flush=True)


# --- files ----------------------------------------------------------------------


def read_json(path: str) -> Any:
  with open(path) as f:
    return json.load(f)


def atomic_write(path: str, data) -> None:
  from reverb_tables.checkpoint import atomic_write as write
  write(path, data)


def _fsync_dir(path: str) -> None:
  try:
    fd = os.open(path, os.O_RDONLY)
  except OSError:
    return
  try:
    os.fsync(fd)
  except OSError:
    pass
  finally:
    os.close(fd)


def file_sizes(logdir: str) -> Dict[str, int]:
  """Sizes of the log files (saved with a checkpoint, cut back on resume)."""
  out = {}
  for key, name in LOG_FILES.items():
    path = os.path.join(logdir, name)
    out[key] = os.path.getsize(path) if os.path.exists(path) else 0
  return out


def cut_file(path: str, size: int) -> int:
  """Moves bytes past ``size`` of ``path`` to ``path.discarded``; returns them."""
  if not os.path.exists(path):
    return 0
  total = os.path.getsize(path)
  if total <= size:
    return 0
  with open(path, 'rb') as f:
    f.seek(size)
    tail = f.read()
  with open(path + '.discarded', 'ab') as f:
    f.write(tail)
  with open(path, 'r+b') as f:
    f.truncate(size)
  return total - size


def jsonable(v):
  if isinstance(v, (np.floating, np.integer, np.bool_)):
    v = v.item()
  if isinstance(v, np.ndarray):
    return v.tolist()
  if isinstance(v, float) and not math.isfinite(v):
    return None
  return v


def _json_default(x):
  out = jsonable(x)
  if out is x:
    raise TypeError(f'not JSON serialisable: {type(x).__name__}')
  return out


# --- checkpoints ------------------------------------------------------------------


def checkpoint_root(logdir: str) -> str:
  return os.path.join(logdir, 'checkpoints')


def reverb_dir(logdir: str) -> str:
  return os.path.join(checkpoint_root(logdir), REVERB_DIR)


def list_run_checkpoints(logdir: str) -> List[str]:
  """Complete ckpt-* directories, oldest first."""
  root = checkpoint_root(logdir)
  if not os.path.isdir(root):
    return []
  names = sorted(n for n in os.listdir(root) if n.startswith(CKPT_PREFIX))
  return [os.path.join(root, n) for n in names
          if os.path.isfile(os.path.join(root, n, RUN_STATE_FILE))]


def latest_run_checkpoint(logdir: str) -> Optional[str]:
  paths = list_run_checkpoints(logdir)
  return paths[-1] if paths else None


def clean_checkpoints(logdir: str) -> Optional[str]:
  """Makes the checkpoint folder consistent before the Reverb server starts.

  Keeps the newest complete ckpt-* and the Reverb checkpoint it references;
  deletes unfinished saves (.tmp-*), older ckpt-* and every other Reverb
  checkpoint (e.g. one written by a save that was killed before its rename).
  Returns the kept ckpt-* path or None (then no Reverb checkpoint is left).
  Raises ValueError if the newest ckpt-* references a missing Reverb checkpoint.
  """
  root = checkpoint_root(logdir)
  if not os.path.isdir(root):
    return None
  latest = latest_run_checkpoint(logdir)
  keep_reverb = None
  if latest is not None:
    keep_reverb = read_json(os.path.join(latest, REPLAY_STATE_FILE))[
        'reverb_checkpoint']
    ref = os.path.join(root, REVERB_DIR, keep_reverb or '')
    if not keep_reverb or not os.path.isfile(os.path.join(ref, 'DONE')):
      raise ValueError(
          f'checkpoint {latest} references Reverb checkpoint {ref}, which is '
          'missing or incomplete; the run directory is corrupted')
  for name in os.listdir(root):
    path = os.path.join(root, name)
    if name.startswith(TMP_PREFIX) or (
        name.startswith(CKPT_PREFIX) and path != latest):
      shutil.rmtree(path, ignore_errors=True)
  reverb_root = os.path.join(root, REVERB_DIR)
  if os.path.isdir(reverb_root):
    for name in os.listdir(reverb_root):
      if name != keep_reverb:
        p = os.path.join(reverb_root, name)
        if os.path.isdir(p):
          shutil.rmtree(p, ignore_errors=True)
        else:
          os.remove(p)
  return latest


def write_checkpoint(logdir: str, agent_steps: int, *, reverb_path: str,
                     learner_state, config, spaces, run: RunConfig, mode: str,
                     run_state: Mapping[str, Any], adder=None, schedule=None,
                     latent_store=None) -> str:
  """Writes ``ckpt-<agent_steps>`` atomically (module doc); returns its path.

  ``reverb_path`` is the Reverb checkpoint just written (``client.checkpoint()``
  after the adders were flushed); ``adder`` is anything with ``get_state()``
  (the adder counters = step ids), saved with the schedule and the latent
  store by ``reverb_tables.checkpoint.save_replay_state``. ``run_state`` gets
  'mode', 'files' (log sizes) and 'time' added.
  """
  from reverb_tables import checkpoint as rckpt
  root = checkpoint_root(logdir)
  os.makedirs(root, exist_ok=True)
  tmp = os.path.join(root, f'{TMP_PREFIX}{os.getpid()}-{time.time_ns()}')
  os.makedirs(tmp)
  rckpt.save_replay_state(tmp, reverb_path, adder=adder, schedule=schedule,
                          latent_store=latent_store)
  atomic_write(os.path.join(tmp, LEARNER_FILE),
               pickle.dumps(learner_state, protocol=pickle.HIGHEST_PROTOCOL))
  atomic_write(os.path.join(tmp, CONFIG_FILE), json.dumps({
      'config': dataclasses.asdict(config),
      'spaces': {'obs': {k: list(v) for k, v in spaces.obs.items()},
                 'act_dim': spaces.act_dim, 'discrete': spaces.discrete},
      'run': {k: getattr(run, k) for k in RESUME_FIXED},
      'mode': mode,
  }, indent=1))
  state = {'mode': mode, **run_state, 'files': file_sizes(logdir),
           'time': time.time()}
  atomic_write(os.path.join(tmp, RUN_STATE_FILE),
               json.dumps(state, indent=1, default=_json_default))
  _fsync_dir(tmp)
  final = os.path.join(root, f'{CKPT_PREFIX}{int(agent_steps):012d}')
  if os.path.exists(final):            # same step saved twice (e.g. at the end)
    shutil.rmtree(final)
  os.rename(tmp, final)
  _fsync_dir(root)
  clean_checkpoints(logdir)            # older ckpt-* and unreferenced Reverb dirs
  return final


def load_learner_state(ckpt: str):
  with open(os.path.join(ckpt, LEARNER_FILE), 'rb') as f:
    return pickle.load(f)


# --- validation before anything is written ----------------------------------------


def check_logdir_writable(logdir: str) -> None:
  """ValueError naming --logdir when it cannot be created or written."""
  try:
    os.makedirs(logdir, exist_ok=True)
  except OSError as e:
    raise ValueError(f'--logdir {logdir!r} cannot be created: {e}') from e
  if not os.path.isdir(logdir):
    raise ValueError(f'--logdir {logdir!r} is not a directory')
  probe = os.path.join(logdir, f'.write-test-{os.getpid()}')
  try:
    with open(probe, 'w') as f:
      f.write('ok')
    os.remove(probe)
  except OSError as e:
    raise ValueError(f'--logdir {logdir!r} is not writable: {e}') from e
  for sub in ('checkpoints', EVAL_DIR, TB_DIR):
    path = os.path.join(logdir, sub)
    if os.path.exists(path) and not os.access(path, os.W_OK | os.X_OK):
      raise ValueError(f'--logdir {logdir!r}: {path} is not writable')


# run_state.json keys each layout needs to resume (older layouts lack some).
_STATE_KEYS = {'single_process': ('segment', 'agent', 'evaluator', 'counter',
                                  'counters'),
               'distributed': ('segment', 'learner', 'actors', 'counter',
                               'counts')}


def check_mode(ckpt: str, logdir: str, mode: str) -> None:
  """ValueError if ``ckpt`` was written by the other layout."""
  path = os.path.join(ckpt, RUN_STATE_FILE)
  state = read_json(path) if os.path.exists(path) else {}
  saved = state.get('mode') or 'single_process'
  if saved != mode:
    how = ('with --distributed' if saved == 'distributed'
           else 'without --distributed')
    raise ValueError(
        f'--logdir {logdir!r} holds a {saved} run (checkpoint {ckpt}); resume '
        f'it {how}, or use a new --logdir for a {mode} run.')


def check_state(ckpt: str, logdir: str, mode: str) -> None:
  """ValueError if ``ckpt``'s run state lacks what this layout resumes."""
  path = os.path.join(ckpt, RUN_STATE_FILE)
  state = read_json(path) if os.path.exists(path) else {}
  missing = [k for k in _STATE_KEYS[mode] if k not in state]
  if missing:
    raise ValueError(
        f'--logdir {logdir!r}: checkpoint {ckpt} was written by another '
        f'version of the run layer (its run state lacks {missing}); resume it '
        'with that version or use a new --logdir.')


def check_resume_compatible(ckpt: str, run: RunConfig, config) -> None:
  """ValueError listing every flag that differs from the checkpointed run."""
  saved = read_json(os.path.join(ckpt, CONFIG_FILE))
  diffs = []
  for k, v in dataclasses.asdict(config).items():
    if k in saved['config'] and saved['config'][k] != v:
      diffs.append(f'{k}: saved {saved["config"][k]!r}, given {v!r}')
  for k in RESUME_FIXED:
    was = saved['run'].get(k, 'dmc' if k == 'suite' else None)  # older runs: dmc
    if was != getattr(run, k):
      diffs.append(f'--{k}: saved {was!r}, given {getattr(run, k)!r}')
  if diffs:
    raise ValueError(
        f'--logdir {run.logdir!r} holds a run with other settings; resume with '
        'the same flags (see its flags.txt) or use a new --logdir. Differences: '
        + '; '.join(diffs))


def validate(run: RunConfig, config, mode: str) -> Optional[str]:
  """Checks the logdir and the checkpoint to resume; writes nothing.

  Returns that checkpoint's path (None for a new run). The env is built
  once and closed first, so an env the agent cannot take (image or
  non-numeric observations, unsupported action spec,
  ``experiments.protocol_env``) fails before the logdir is even created."""
  assert mode in MODES, mode
  run.make_env(1, run.env_seed(0, 0)).close()
  check_logdir_writable(run.logdir)
  latest = latest_run_checkpoint(run.logdir)
  if latest is not None:
    check_mode(latest, run.logdir, mode)
    check_resume_compatible(latest, run, config)
    check_state(latest, run.logdir, mode)
  return latest


def prepare(run: RunConfig, resume: Optional[str]) -> Optional[Dict[str, Any]]:
  """After ``validate``, before the Reverb server starts: cleans the
  checkpoint folder (``clean_checkpoints``); returns the run_state to resume."""
  kept = clean_checkpoints(run.logdir)
  assert kept == resume, (kept, resume)
  return read_json(os.path.join(resume, RUN_STATE_FILE)) if resume else None


def start_segment(run: RunConfig, state: Optional[Mapping[str, Any]]) -> None:
  """Once everything is restored and checked: cuts the log files back to the
  checkpoint (the tails move to ``*.discarded``) and writes flags.txt."""
  for key, name in LOG_FILES.items():
    cut = cut_file(os.path.join(run.logdir, name),
                   state['files'][key] if state else 0)
    if cut and run.verbose:
      log(f'[run] moved {cut} bytes of {name} written after the last '
          f'checkpoint to {name}.discarded')
  if run.flags_text:
    atomic_write(os.path.join(run.logdir, FLAGS_FILE), run.flags_text)


# --- metrics ------------------------------------------------------------------------


class RunLogger(loggers_base.Logger):
  """metrics.jsonl + TensorBoard scalars, an ``acme.utils.loggers.Logger``.

  Rows are dicts with 'kind' ('train' / 'eval') and 'env_step' (the
  TensorBoard step); each row is one O_APPEND write, so the learner and the
  evaluator processes of a distributed run can share the file.
  """

  def __init__(self, logdir: str, tensorboard: bool = True):
    self._path = os.path.join(logdir, METRICS_FILE)
    self._tb = None
    if tensorboard:
      import tensorflow as tf
      self._tf = tf
      self._tb = tf.summary.create_file_writer(os.path.join(logdir, TB_DIR))

  def write(self, row: Mapping[str, Any]) -> None:
    clean = {k: jsonable(v) for k, v in row.items()}
    line = (json.dumps(clean) + '\n').encode()
    fd = os.open(self._path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
      os.write(fd, line)
    finally:
      os.close(fd)
    if self._tb is not None:
      step = int(row.get('env_step', 0))
      prefix = {'eval': 'eval/', 'learner': 'learner/'}.get(row.get('kind'), '')
      with self._tb.as_default():
        for k, v in clean.items():
          if k in ('env_step', 'kind') or isinstance(v, bool) or not isinstance(
              v, (int, float)):
            continue
          name = k if (k.startswith('eval/') or not prefix) else prefix + k
          self._tf.summary.scalar(name, v, step=step)
      self._tb.flush()

  def close(self) -> None:
    if self._tb is not None:
      self._tb.close()
      self._tb = None


class LearnerRows(loggers_base.Logger):
  """The learner's acme Logger in both layouts: ``kind: 'learner'`` rows.

  ``agent.learner.DreamerLearner`` writes, every ``--learner_log_every``
  updates, the means of its metrics over those updates (``updates_in_mean``
  of them) and the global ``learner_steps``; this adds the run's env step and
  appends the row to metrics.jsonl with the metric names of the train rows
  (``train/<name>``). Rows keyed by update count are what
  ``bench/parity.py`` compares against the official code (issue 19).
  """

  def __init__(self, logger_fn: Callable[[], Any],
               env_step_fn: Callable[[], Optional[int]]):
    self._logger_fn, self._env_step_fn = logger_fn, env_step_fn

  def write(self, data: Mapping[str, Any]) -> None:
    data = dict(data)
    row = {'kind': 'learner', 'updates': int(data.pop('learner_steps')),
           'updates_in_mean': int(data.pop('updates_in_mean')),
           'env_step': self._env_step_fn()}
    row.update({f'train/{k}': v for k, v in data.items()})
    self._logger_fn().write(row)

  def close(self) -> None:
    pass


def eval_row(env_step: int, scores, lengths, mode: str, seconds: float,
             **extra) -> Dict[str, Any]:
  """The eval metrics row of docs/metrics.md."""
  return {'kind': 'eval', 'env_step': int(env_step), **extra,
          'eval/policy': mode, 'eval/episodes': len(scores),
          'eval/score_mean': float(np.mean(scores)),
          'eval/score_std': float(np.std(scores)),
          'eval/score_min': float(np.min(scores)),
          'eval/score_max': float(np.max(scores)),
          'eval/length_mean': float(np.mean(lengths)),
          'eval/seconds': seconds}


def fmt_steps(x: float) -> str:
  if x >= 1e6:
    return f'{x / 1e6:.2f}M'
  if x >= 1e3:
    return f'{x / 1e3:.1f}K'
  return f'{int(x)}'


def fmt_secs(s: float) -> str:
  if not math.isfinite(s):
    return '?'
  s = int(s)
  if s >= 3600:
    return f'{s // 3600}h{(s % 3600) // 60:02d}m'
  if s >= 60:
    return f'{s // 60}m{s % 60:02d}s'
  return f'{s}s'


def progress_line(env_steps: int, target: int, updates: int, fps: float,
                  wall: float, scores=(), extra: str = '', final=False) -> str:
  """The live progress line of both layouts."""
  eta = max(0, target - env_steps) / fps if fps > 0 else float('inf')
  scores = ', '.join(f'{s:.0f}' for s in scores) or '-'
  return (f'[{"done" if final else "run"}] {fmt_steps(env_steps)}/'
          f'{fmt_steps(target)} env steps | {updates} updates | '
          f'{fps:.1f} env steps/s | last scores: {scores}{extra} | '
          f'elapsed {fmt_secs(wall)} | ETA {fmt_secs(eta)}')


def enable_compilation_cache(path: str) -> None:
  """Persistent XLA compilation cache at ``path`` (JAX's own, keyed by jax
  version, backend and flags): a resumed or repeated run skips recompiling
  the update (~40 s for size1m on 2 CPU cores; ~7 s with the cache)."""
  import jax
  os.makedirs(path, exist_ok=True)
  jax.config.update('jax_compilation_cache_dir', path)
  jax.config.update('jax_persistent_cache_min_compile_time_secs', 1.0)
