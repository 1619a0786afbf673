"""The synchronous, resumable DreamerV3 training run (Algorithm K, spec 6.1-6.5, 7.1-7.5).

`Trainer(run, config).run()` wires one process: N lock-stepped dm_control
envs (experiments.envs.VectorEnv), an in-process Reverb server, and the Acme
components of ``agent.builder.DreamerBuilder`` (WindowAdder, ReplaySampler +
LatentStore, DreamerLearner, DreamerActor). Per vector step:

  action = actor.select_action(obs)            # one jitted policy call (7.1)
  next_obs = envs.step(action, reset=obs.is_last)
  actor.observe(action, next_obs)              # for w in 0..N-1:
                                               #   step += 1; replay.add(w, step_t[w])
                                               #   for _ in range(schedule(step, items)):
                                               #     learner.step()   # Algorithm J + write-back
  actor.update(wait=True)                      # current params for the next call

i.e. Algorithm K with the train schedule asked after every single transition
(spec 6.1) and the synchronous simplification of spec 6.3 (act with current
params, sample after the write-back): docs/deviations.md "Training loop".

Run directory (``run.logdir``; names documented in docs/metrics.md):
  flags.txt          the flags of the latest start (usable as --flagfile)
  metrics.jsonl      one JSON row per log interval ('kind': 'train') or eval
                     ('kind': 'eval')
  scores.jsonl       one row per finished training episode (report input)
  eval/scores.jsonl  one row per evaluation episode
  tensorboard/       TensorBoard event files (same scalars as metrics.jsonl)
  checkpoints/       ckpt-<agent steps>/ (learner, replay state, counters) and
                     reverb/<timestamp>/ (the Reverb checkpoint it references)
  report.png         experiments/report.py output at the end of the run

Resume: a start whose logdir holds a complete checkpoint continues from it
(learner TrainingState, latent store, Reverb tables, adder counters, train
schedule, counters, policy rng, eval schedule). Envs restart their episodes
(open episodes at the checkpoint are dropped; env seeds move to a new segment
so episodes are not replayed). Log lines written after the checkpoint are
moved to ``<file>.discarded`` so the curves stay consistent.

Checkpoints are atomic: everything is written into ``checkpoints/.tmp-*`` and
renamed to ``ckpt-*``; a Reverb checkpoint is only deleted after a newer
``ckpt-*`` referencing another one exists, and at start-up any Reverb
checkpoint not referenced by the newest ``ckpt-*`` is deleted before the
server loads (so a kill mid-save falls back to the previous checkpoint).
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import pickle
import shutil
import signal
import sys
import time
from typing import Any, Dict, List, Optional, Tuple

import numpy as np

import agent  # noqa: F401  (jax compat before acme)
from agent.config import DreamerConfig

CKPT_PREFIX = 'ckpt-'
TMP_PREFIX = '.tmp-'
REVERB_DIR = 'reverb'
LEARNER_FILE = 'learner.pkl'
RUN_STATE_FILE = 'run_state.json'
CONFIG_FILE = 'config.json'
METRICS_FILE = 'metrics.jsonl'
SCORES_FILE = 'scores.jsonl'
EVAL_DIR = 'eval'
TB_DIR = 'tensorboard'
REPORT_FILE = 'report.png'
# Segment r of a run seeds its training envs with seed + SEGMENT_SEED_STRIDE*r
# (VectorEnv then uses that * 1000 + i); eval envs add EVAL_SEED_OFFSET.
SEGMENT_SEED_STRIDE = 7919
EVAL_SEED_OFFSET = 1_000_003
# Run settings that must not change on resume (besides every DreamerConfig field).
RESUME_FIXED = ('task', 'num_envs', 'action_repeat', 'time_limit', 'chunk_length')


@dataclasses.dataclass
class RunConfig:
  """Loop settings (the DreamerConfig holds the agent's).

  checkpoint_every is in seconds of wall time (a restart loses at most that
  much work); eval_every and log_every are in env steps (agent steps x
  action_repeat, the spec 7.5 x-axis); progress_every in seconds.
  """
  task: str
  logdir: str
  env_steps: int
  num_envs: int = 16
  action_repeat: int = 2
  eval_every: int = 0
  eval_episodes: int = 0
  eval_policy: str = 'sample'
  checkpoint_every: float = 600.0
  log_every: int = 10_000
  progress_every: float = 10.0
  time_limit: Optional[float] = None
  chunk_length: Optional[int] = None      # None: the WindowAdder default
  report: bool = True
  flags_text: str = ''
  verbose: bool = True


# --- checkpoint directory helpers ------------------------------------------------


def checkpoint_root(logdir: str) -> str:
  return os.path.join(logdir, 'checkpoints')


def list_run_checkpoints(logdir: str) -> List[str]:
  """Complete ckpt-* directories, oldest first."""
  root = checkpoint_root(logdir)
  if not os.path.isdir(root):
    return []
  names = sorted(n for n in os.listdir(root) if n.startswith(CKPT_PREFIX))
  out = []
  for n in names:
    path = os.path.join(root, n)
    if os.path.isfile(os.path.join(path, RUN_STATE_FILE)):
      out.append(path)
  return out


def latest_run_checkpoint(logdir: str) -> Optional[str]:
  paths = list_run_checkpoints(logdir)
  return paths[-1] if paths else None


def _read_json(path: str) -> Any:
  with open(path) as f:
    return json.load(f)


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


def _write_file(path: str, data: bytes) -> None:
  with open(path, 'wb') as f:
    f.write(data)
    f.flush()
    os.fsync(f.fileno())


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
    state = _read_json(os.path.join(latest, 'replay_state.json'))
    keep_reverb = state['reverb_checkpoint']
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


def saved_run_settings(ckpt: str) -> Dict[str, Any]:
  return _read_json(os.path.join(ckpt, CONFIG_FILE))


def check_single_process_checkpoint(ckpt: str, logdir: str) -> None:
  """ValueError if `ckpt` was written by a distributed (Launchpad) run."""
  state_path = os.path.join(ckpt, RUN_STATE_FILE)
  mode = _read_json(state_path).get('mode') if os.path.exists(state_path) else None
  if mode not in (None, 'single_process'):
    raise ValueError(
        f'--logdir {logdir!r} holds a {mode} run (checkpoint {ckpt}); resume it '
        'with --distributed, or use a new --logdir for a single-process run.')


def check_resume_compatible(ckpt: str, run: RunConfig,
                            config: DreamerConfig) -> None:
  """ValueError listing every flag that differs from the checkpointed run."""
  saved = saved_run_settings(ckpt)
  diffs = []
  for k, v in dataclasses.asdict(config).items():
    if k in saved['config'] and saved['config'][k] != v:
      diffs.append(f'{k}: saved {saved["config"][k]!r}, given {v!r}')
  for k in RESUME_FIXED:
    if saved['run'].get(k) != getattr(run, k):
      diffs.append(f'--{k}: saved {saved["run"].get(k)!r}, given {getattr(run, k)!r}')
  if diffs:
    raise ValueError(
        f'--logdir {run.logdir!r} holds a run with other settings; resume with '
        'the same flags (see its flags.txt) or use a new --logdir. Differences: '
        + '; '.join(diffs))


def run_eval_episodes(actor, envs, n: int, envs_lib, should_stop=None):
  """One episode per eval env with `actor` (spec 7.3); returns (scores, lengths).

  `should_stop()` is polled every vector step (distributed runs); the
  exception it raises, if any, propagates.
  """
  obs = envs.reset()
  actor.observe_first(obs)
  tracker = envs_lib.EpisodeTracker(n)
  tracker.update(obs)
  scores = np.full(n, np.nan)
  lengths = np.zeros(n, np.int64)
  while np.isnan(scores).any():
    if should_stop is not None:
      should_stop()
    action = actor.select_action(obs)
    obs = envs.step(action, reset=obs['is_last'])
    for ep in tracker.update(obs):
      if np.isnan(scores[ep.env_index]):
        scores[ep.env_index] = ep.score
        lengths[ep.env_index] = ep.length
  return scores, lengths


def eval_metrics(scores, lengths, mode: str, seconds: float) -> Dict[str, Any]:
  """The `eval/...` metric names of docs/metrics.md."""
  return {'eval/policy': mode, 'eval/episodes': len(scores),
          'eval/score_mean': float(np.mean(scores)),
          'eval/score_std': float(np.std(scores)),
          'eval/score_min': float(np.min(scores)),
          'eval/score_max': float(np.max(scores)),
          'eval/length_mean': float(np.mean(lengths)),
          'eval/seconds': seconds}


# --- logging ------------------------------------------------------------------------


class RunLogger:
  """metrics.jsonl + TensorBoard scalars; an acme ``loggers.Logger``-like API."""

  def __init__(self, logdir: str, tensorboard: bool = True):
    self._path = os.path.join(logdir, METRICS_FILE)
    self._file = open(self._path, 'a')
    self._tb = None
    if tensorboard:
      import tensorflow as tf
      self._tf = tf
      self._tb = tf.summary.create_file_writer(os.path.join(logdir, TB_DIR))

  def write(self, row: Dict[str, Any]) -> None:
    clean = {k: _jsonable(v) for k, v in row.items()}
    self._file.write(json.dumps(clean) + '\n')
    self._file.flush()
    if self._tb is not None:
      step = int(row.get('env_step', 0))
      prefix = 'eval/' if row.get('kind') == 'eval' else ''
      with self._tb.as_default():
        for k, v in clean.items():
          if k in ('env_step', 'kind') or not isinstance(v, (int, float)) or (
              isinstance(v, bool)):
            continue
          name = k if (k.startswith('eval/') or not prefix) else prefix + k
          self._tf.summary.scalar(name, v, step=step)
      self._tb.flush()

  def close(self) -> None:
    self._file.close()
    if self._tb is not None:
      self._tb.close()


def _jsonable(v):
  if isinstance(v, (np.floating, np.integer)):
    v = v.item()
  if isinstance(v, float) and not math.isfinite(v):
    return None
  return v


def _file_size(path: str) -> int:
  return os.path.getsize(path) if os.path.exists(path) else 0


def _cut_file(path: str, size: int) -> int:
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


def _fmt_steps(x: float) -> str:
  if x >= 1e6:
    return f'{x / 1e6:.2f}M'
  if x >= 1e3:
    return f'{x / 1e3:.1f}K'
  return f'{int(x)}'


def _fmt_secs(s: float) -> str:
  if not math.isfinite(s):
    return '?'
  s = int(s)
  if s >= 3600:
    return f'{s // 3600}h{(s % 3600) // 60:02d}m'
  if s >= 60:
    return f'{s // 60}m{s % 60:02d}s'
  return f'{s}s'


# --- the trainer ----------------------------------------------------------------------


class Trainer:
  """One synchronous DreamerV3 run (see module doc).

  ``Trainer(run, config)`` only validates (flags, --logdir, resume
  compatibility) and touches nothing; ``run()`` builds, trains to
  ``run.env_steps``, evaluates, checkpoints and reports; ``close()`` releases
  the server and envs.
  """

  def __init__(self, run: RunConfig, config: DreamerConfig):
    if run.env_steps <= 0:
      raise ValueError(f'--env_steps must be positive, got {run.env_steps}')
    if run.num_envs < 1:
      raise ValueError(f'--num_envs must be >= 1, got {run.num_envs}')
    if run.eval_policy not in ('sample', 'mode'):
      raise ValueError(f"--eval_policy must be 'sample' or 'mode', got "
                       f'{run.eval_policy!r}')
    self.run_config = run
    self.config = config
    self.logdir = run.logdir
    # Validate everything before touching the run directory.
    check_logdir_writable(self.logdir)
    self._resume_from = latest_run_checkpoint(self.logdir)
    if self._resume_from is not None:
      check_single_process_checkpoint(self._resume_from, run.logdir)
      check_resume_compatible(self._resume_from, run, config)
    self._closed = False
    self._stop_signal = None
    self._built = False

  # -- construction --------------------------------------------------------------
  def _log(self, msg: str) -> None:
    if self.run_config.verbose:
      print(msg, file=sys.stderr, flush=True)

  def _build(self) -> None:
    from acme.utils import counting

    from agent.builder import DreamerBuilder, seed_keys
    from experiments import envs as envs_lib
    from reverb_tables import checkpoint as rckpt
    from reverb_tables.ratio import TrainSchedule
    from reverb_tables.tables import make_server

    run, c = self.run_config, self.config
    self._rckpt = rckpt
    self._envs_lib = envs_lib
    resumed = clean_checkpoints(self.logdir)   # only unreferenced / partial saves
    assert resumed == self._resume_from, (resumed, self._resume_from)
    run_state = (_read_json(os.path.join(resumed, RUN_STATE_FILE))
                 if resumed else None)
    self.segment = (run_state['segment'] + 1) if run_state else 0

    # Environments (spec 7.5); seeds move with the segment (docstring).
    seed = c.seed + SEGMENT_SEED_STRIDE * self.segment
    self.envs = envs_lib.VectorEnv(run.task, run.num_envs, run.action_repeat,
                                   seed=seed, time_limit=run.time_limit)
    self.spaces = self.envs.spaces
    self.eval_envs = None

    # Replay server (loads the kept Reverb checkpoint, if any).
    self.builder = DreamerBuilder(c, self.spaces, num_envs=run.num_envs,
                                  chunk_length=run.chunk_length,
                                  eval_policy=run.eval_policy)
    reverb_root = os.path.join(checkpoint_root(self.logdir), REVERB_DIR)
    os.makedirs(reverb_root, exist_ok=True)
    tables = self.builder.make_replay_tables()
    signature = {t.name: t.info.signature for t in tables}
    self.server = make_server(tables, checkpoint_dir=reverb_root)
    self.client = self.server.localhost_client()
    if resumed:
      info = self.client.server_info()
      for name, sig in signature.items():
        if name not in info or info[name].signature != sig:
          raise ValueError(
              f'the Reverb checkpoint in {reverb_root} stores items in another '
              f'layout than this code writes (table {name!r}); it was written '
              'by an incompatible version of reverb_tables. Resume with that '
              'version or start a new --logdir.')
    self.adder = self.builder.make_adder(self.client)
    self.dataset = self.builder.make_dataset_iterator(self.client)
    self.sampler = self.dataset.sampler
    self.schedule = TrainSchedule(c)

    # Learner and actors.
    self.keys = seed_keys(c.seed)
    self.networks = self.builder.make_networks()
    self.counter = counting.Counter()
    self.learner = self.builder.make_learner(
        self.keys['learner'], self.networks, self.dataset, self.client,
        counting.Counter(self.counter, prefix='', time_delta=0.0))
    policy, mode = self.builder.make_policy(self.networks)
    self.actor = self.builder.make_actor(
        self.keys['actor'], (policy, mode), self.adder, self.learner,
        on_add=self._on_add)
    self._eval_policy = self.builder.make_policy(self.networks, evaluation=True)
    self.eval_actor = None

    # Counters (restored below).
    self.agent_steps = 0
    self.updates = 0
    self.episodes = 0
    self.wall_time = 0.0
    self.next_log = run.log_every
    self.next_eval = run.eval_every if run.eval_every else None
    self.eval_calls = 0
    self.eval_runs = 0
    self.last_eval_step = None
    self.recent_scores: List[float] = []
    if resumed:
      self._restore(resumed, run_state)
    # Everything is validated: now the run directory may change. Log lines
    # from after the checkpoint (a killed segment) move to *.discarded.
    for name, key in ((METRICS_FILE, 'metrics_bytes'), (SCORES_FILE, 'scores_bytes'),
                      (os.path.join(EVAL_DIR, SCORES_FILE), 'eval_scores_bytes')):
      keep = run_state['files'][key] if run_state else 0
      cut = _cut_file(os.path.join(self.logdir, name), keep)
      if cut:
        self._log(f'[run] moved {cut} bytes of {name} written after the last '
                  f'checkpoint to {name}.discarded')
    if run.flags_text:
      _write_file(os.path.join(self.logdir, 'flags.txt'), run.flags_text.encode())
    self.logger = RunLogger(self.logdir)
    self.tracker = envs_lib.EpisodeTracker(run.num_envs)
    self._built = True

  def _restore(self, ckpt: str, state: Dict[str, Any]) -> None:
    rname = self._rckpt.load_replay_state(
        ckpt, None, adder=self.adder, schedule=self.schedule,
        latent_store=self.dataset.latent_store)['reverb_checkpoint']
    with open(os.path.join(ckpt, LEARNER_FILE), 'rb') as f:
      self.learner.restore(pickle.load(f))
    self.actor.set_state(state['actor'])
    self.counter.restore(state['counter'])
    s = state['counters']
    self.agent_steps = s['agent_steps']
    self.updates = s['updates']
    self.episodes = s['episodes']
    self.wall_time = s['wall_time']
    # Log / eval grids follow the current flags (they may change on resume).
    run = self.run_config
    self.next_log = (self.env_steps // run.log_every + 1) * run.log_every
    self.next_eval = ((self.env_steps // run.eval_every + 1) * run.eval_every
                      if run.eval_every else None)
    self.eval_calls = s['eval_calls']
    self.eval_runs = s['eval_runs']
    self.last_eval_step = s.get('last_eval_step')
    self.recent_scores = list(s['recent_scores'])
    self.sampler.num_online_rows = s['online_rows']
    self.sampler.num_uniform_rows = s['uniform_rows']
    info = self.client.server_info()
    size = int(info['uniform'].current_size)
    if size != self.adder.num_items:
      raise ValueError(f'Reverb checkpoint {rname} holds {size} items but the '
                       f'run state expects {self.adder.num_items}; the '
                       'checkpoint directory is inconsistent')
    self._log(f'[run] resumed from {ckpt} (segment {self.segment}): '
              f'{_fmt_steps(self.env_steps)} env steps, {self.updates} updates, '
              f'{size} replay items')

  # -- properties --------------------------------------------------------------------
  @property
  def env_steps(self) -> int:
    """Agent transitions x action repeat (spec 7.5 x-axis)."""
    return self.agent_steps * self.run_config.action_repeat

  @property
  def done(self) -> bool:
    return self.env_steps >= self.run_config.env_steps

  # -- the per-transition hook (spec 6.1) ------------------------------------------
  def _on_add(self, worker: int) -> None:
    """After env ``worker``'s step was added: step += 1, then train (Alg. K)."""
    self.agent_steps += 1
    for _ in range(self.schedule(self.agent_steps, self.adder.num_items)):
      self.learner.step()
      self.updates += 1

  # -- main loop ---------------------------------------------------------------------
  def run(self) -> Dict[str, Any]:
    """Trains to ``env_steps``; returns a summary dict."""
    if not self._built:
      self._build()
    handlers = self._install_signal_handlers()
    try:
      summary = self._loop()
    finally:
      self._restore_signal_handlers(handlers)
    return summary

  def _loop(self) -> Dict[str, Any]:
    run = self.run_config
    t_start = time.perf_counter()
    wall0 = self.wall_time
    self._t_env = self._t_eval = self._t_ckpt = self._t_log = 0.0
    last_ckpt = time.perf_counter()
    last_progress = 0.0
    self._row_mark = (time.perf_counter(), self.env_steps, self.updates,
                      self._timing_snapshot())
    self._row_scores: List[float] = []
    self._row_lengths: List[int] = []
    self._last_row_step = None
    self._log(f'[run] {run.task} size={self.config.size} envs={run.num_envs} '
              f'repeat={run.action_repeat} train_ratio={self.config.train_ratio:g} '
              f'B={self.config.batch_size} T={self.config.batch_length} '
              f'target={_fmt_steps(run.env_steps)} env steps, logdir={self.logdir}')

    def wall():
      return wall0 + time.perf_counter() - t_start

    worked = not self.done
    if worked:
      obs = self.envs.reset()
      self.tracker = self._envs_lib.EpisodeTracker(run.num_envs)
      self.actor.observe_first(obs)
      self.actor.update(wait=True)
    while not self.done and self._stop_signal is None:
      action = self.actor.select_action(obs)
      t0 = time.perf_counter()
      next_obs = self.envs.step(action, reset=obs['is_last'])
      self._t_env += time.perf_counter() - t0
      self.actor.observe(action, next_obs)      # adds + per-transition training
      self.actor.update(wait=True)
      self.counter.increment(actor_steps=run.num_envs,
                             env_steps=run.num_envs * run.action_repeat)
      for ep in self.tracker.update(obs, env_step=self.env_steps):
        self._record_episode(ep)
      obs = next_obs
      self.wall_time = wall()
      if self.env_steps >= self.next_log:
        self._write_row()
        self.next_log = (self.env_steps // run.log_every + 1) * run.log_every
      if self.next_eval is not None and self.env_steps >= self.next_eval:
        self.evaluate()
        self.next_eval = (self.env_steps // run.eval_every + 1) * run.eval_every
      now = time.perf_counter()
      if now - last_ckpt >= run.checkpoint_every:
        self.save_checkpoint()
        last_ckpt = time.perf_counter()
      if now - last_progress >= run.progress_every:
        self._progress(final=False)
        last_progress = now
    stopped = self._stop_signal is not None
    if worked or stopped:
      if not stopped:
        if self._final_eval_due():
          self.evaluate()
        if self._last_row_step != self.env_steps:
          self._write_row()
      self.wall_time = wall()
      self.save_checkpoint()
    else:
      self._log(f'[run] {self.logdir} already reached {_fmt_steps(self.env_steps)} '
                'env steps; nothing to train')
    self._progress(final=True)
    if stopped:
      self._log(f'[run] stopped by signal {self._stop_signal}; checkpoint saved, '
                'rerun the same command to resume')
    report_table = None
    if run.report and not stopped:
      report_table = self.make_report()
    return {
        'env_steps': self.env_steps, 'agent_steps': self.agent_steps,
        'updates': self.updates, 'episodes': self.episodes,
        'recent_scores': list(self.recent_scores), 'stopped': stopped,
        'wall_time': self.wall_time, 'report': report_table,
        'update_cache_size': self.learner.update_cache_size(),
    }

  def _final_eval_due(self) -> bool:
    """An eval at the end unless one ran less than eval_every / 2 ago."""
    run = self.run_config
    if not run.eval_episodes:
      return False
    if self.last_eval_step is None or not run.eval_every:
      return self.last_eval_step != self.env_steps
    return self.env_steps - self.last_eval_step >= run.eval_every / 2

  # -- episodes / rows -------------------------------------------------------------
  def _record_episode(self, ep) -> None:
    from experiments.report import append_score
    append_score(self.logdir, self.run_config.task, ep.env_step, ep.score,
                 self.config.seed)
    self.episodes += 1
    self.recent_scores = (self.recent_scores + [ep.score])[-5:]
    self._row_scores.append(ep.score)
    self._row_lengths.append(ep.length)

  def _timing_snapshot(self) -> Dict[str, float]:
    return {
        'env': getattr(self, '_t_env', 0.0),
        'policy': self.actor.timings['policy_s'],
        'replay_add': self.actor.timings['add_s'],
        'learner_sample': self.learner.timings['sample_s'],
        'learner_update': self.learner.timings['update_s'],
        'learner_write_back': self.learner.timings['write_back_s'],
        'eval': getattr(self, '_t_eval', 0.0),
        'checkpoint': getattr(self, '_t_ckpt', 0.0),
    }

  def _write_row(self) -> None:
    t0 = time.perf_counter()
    mark_t, mark_env, mark_upd, mark_tm = self._row_mark
    dt = max(t0 - mark_t, 1e-9)
    tm = self._timing_snapshot()
    info = self.client.server_info()
    row = {
        'kind': 'train', 'env_step': self.env_steps,
        'agent_step': self.agent_steps, 'updates': self.updates,
        'episodes': self.episodes, 'segment': self.segment,
        'wall_time': self.wall_time,
        'fps/env_steps_per_s': (self.env_steps - mark_env) / dt,
        'fps/updates_per_s': (self.updates - mark_upd) / dt,
        'episode/count': len(self._row_scores),
        'episode/score_mean': (float(np.mean(self._row_scores))
                               if self._row_scores else None),
        'episode/score_max': (float(np.max(self._row_scores))
                              if self._row_scores else None),
        'episode/length_mean': (float(np.mean(self._row_lengths))
                                if self._row_lengths else None),
        'replay/items': self.adder.num_items,
        'replay/online_items': self.adder.num_online_items,
        'replay/uniform_size': int(info['uniform'].current_size),
        'replay/online_size': int(info['online'].current_size),
        'replay/online_rows': self.sampler.num_online_rows,
        'replay/uniform_rows': self.sampler.num_uniform_rows,
        'replay/latent_store_entries': len(self.dataset.latent_store),
        'replay/ratio': (self.config.seq_len * self.updates * self.config.batch_size
                         / max(1, self.agent_steps)),
    }
    other = dt
    for k, v in tm.items():
      row[f'time/{k}_frac'] = (v - mark_tm[k]) / dt
      other -= v - mark_tm[k]
    row['time/other_frac'] = max(0.0, other / dt)
    for k, v in self.learner.pop_metric_means().items():
      row[f'train/{k}'] = v
    self.logger.write(row)
    self._last_row_step = self.env_steps
    self._row_scores, self._row_lengths = [], []
    self._t_log += time.perf_counter() - t0
    self._row_mark = (time.perf_counter(), self.env_steps, self.updates,
                      self._timing_snapshot())

  def _progress(self, final: bool) -> None:
    run = self.run_config
    recent = getattr(self, '_prog_mark', None)
    now = time.perf_counter()
    if recent is None or final:
      fps = self.env_steps / max(self.wall_time, 1e-9)
    else:
      fps = (self.env_steps - recent[1]) / max(now - recent[0], 1e-9)
    self._prog_mark = (now, self.env_steps)
    left = max(0, run.env_steps - self.env_steps)
    eta = left / fps if fps > 0 else float('inf')
    scores = ', '.join(f'{s:.0f}' for s in self.recent_scores) or '-'
    self._log(f'[{"done" if final else "run"}] {_fmt_steps(self.env_steps)}/'
              f'{_fmt_steps(run.env_steps)} env steps | {self.updates} updates | '
              f'{fps:.1f} env steps/s | last scores: {scores} | '
              f'elapsed {_fmt_secs(self.wall_time)} | ETA {_fmt_secs(eta)}')

  # -- evaluation (spec 7.3) ------------------------------------------------------------
  def evaluate(self) -> Dict[str, Any]:
    """One episode in each of ``eval_episodes`` separate envs (spec 7.3).

    The policy samples (paper) unless --eval_policy=mode. Scores go to
    eval/scores.jsonl and a metrics row with kind 'eval'.
    """
    run = self.run_config
    if not run.eval_episodes:
      return {}
    t0 = time.perf_counter()
    from experiments.report import append_score
    n = run.eval_episodes
    if self.eval_envs is None:
      seed = self.config.seed + EVAL_SEED_OFFSET + SEGMENT_SEED_STRIDE * self.segment
      self.eval_envs = self._envs_lib.VectorEnv(
          run.task, n, run.action_repeat, seed=seed, time_limit=run.time_limit)
    if self.eval_actor is None:
      from acme.jax import variable_utils
      from agent.actor import DreamerActor
      policy, mode = self._eval_policy
      self.eval_actor = DreamerActor(
          policy, self.spaces, n, self.keys['eval'],
          variable_utils.VariableClient(self.learner, 'policy'), None, mode=mode)
      self.eval_actor.num_policy_calls = self.eval_calls
    actor = self.eval_actor
    actor.update(wait=True)
    scores, lengths = run_eval_episodes(actor, self.eval_envs, n, self._envs_lib)
    self.eval_calls = actor.num_policy_calls
    self.eval_runs += 1
    for s in scores:
      append_score(os.path.join(self.logdir, EVAL_DIR), run.task, self.env_steps,
                   float(s), self.config.seed)
    row = {'kind': 'eval', 'env_step': self.env_steps, 'updates': self.updates,
           **eval_metrics(scores, lengths, actor.mode, time.perf_counter() - t0)}
    self.logger.write(row)
    self.last_eval_step = self.env_steps
    self._t_eval += time.perf_counter() - t0
    self._log(f'[eval] {_fmt_steps(self.env_steps)} env steps: score '
              f'{row["eval/score_mean"]:.1f} +- {row["eval/score_std"]:.1f} over '
              f'{n} episodes ({actor.mode} policy)')
    return row

  # -- checkpointing ----------------------------------------------------------------------
  def save_checkpoint(self) -> str:
    """Atomic checkpoint (module doc); returns the ckpt-* path."""
    t0 = time.perf_counter()
    root = checkpoint_root(self.logdir)
    os.makedirs(root, exist_ok=True)
    self.adder.flush()
    reverb_path = self.client.checkpoint()       # new Reverb dir, DONE last
    tmp = os.path.join(root, f'{TMP_PREFIX}{os.getpid()}-{time.time_ns()}')
    os.makedirs(tmp)
    self._rckpt.save_replay_state(
        tmp, reverb_path, adder=self.adder, schedule=self.schedule,
        latent_store=self.dataset.latent_store)
    _write_file(os.path.join(tmp, LEARNER_FILE),
                pickle.dumps(self.learner.save(), protocol=pickle.HIGHEST_PROTOCOL))
    _write_file(os.path.join(tmp, CONFIG_FILE), json.dumps({
        'config': dataclasses.asdict(self.config),
        'spaces': {'obs': {k: list(v) for k, v in self.spaces.obs.items()},
                   'act_dim': self.spaces.act_dim,
                   'discrete': self.spaces.discrete},
        'run': {k: getattr(self.run_config, k) for k in RESUME_FIXED},
    }, indent=1).encode())
    state = {
        'segment': self.segment,
        'actor': self.actor.get_state(),
        'counter': self.counter.save(),
        'counters': {
            'agent_steps': self.agent_steps, 'env_steps': self.env_steps,
            'updates': self.updates, 'episodes': self.episodes,
            'wall_time': self.wall_time, 'next_log': self.next_log,
            'next_eval': self.next_eval, 'eval_calls': self.eval_calls,
            'eval_runs': self.eval_runs, 'last_eval_step': self.last_eval_step,
            'recent_scores': list(self.recent_scores),
            'online_rows': self.sampler.num_online_rows,
            'uniform_rows': self.sampler.num_uniform_rows,
            'learner_state_step': int(np.asarray(self.learner.state.step)),
        },
        'files': {
            'metrics_bytes': _file_size(os.path.join(self.logdir, METRICS_FILE)),
            'scores_bytes': _file_size(os.path.join(self.logdir, SCORES_FILE)),
            'eval_scores_bytes': _file_size(
                os.path.join(self.logdir, EVAL_DIR, SCORES_FILE)),
        },
        'time': time.time(),
    }
    _write_file(os.path.join(tmp, RUN_STATE_FILE),
                json.dumps(state, indent=1).encode())
    _fsync_dir(tmp)
    final = os.path.join(root, f'{CKPT_PREFIX}{self.agent_steps:012d}')
    if os.path.exists(final):            # same step saved twice (e.g. at the end)
      shutil.rmtree(final)
    os.rename(tmp, final)
    _fsync_dir(root)
    clean_checkpoints(self.logdir)       # older ckpt-* and unreferenced Reverb dirs
    self._t_ckpt += time.perf_counter() - t0
    self._log(f'[ckpt] {final} ({time.perf_counter() - t0:.1f}s)')
    return final

  # -- report / close ------------------------------------------------------------------------
  def make_report(self) -> Optional[str]:
    from experiments.report import make_report
    try:
      table = make_report(self.logdir, os.path.join(self.logdir, REPORT_FILE))
    except (FileNotFoundError, ValueError) as e:
      self._log(f'[report] skipped: {e}')
      return None
    self._log(table)
    self._log(f'[report] wrote {os.path.join(self.logdir, REPORT_FILE)}')
    return table

  def close(self) -> None:
    """Closes whatever was built (also after a failed build)."""
    if self._closed:
      return
    self._closed = True
    for name, method in (('logger', 'close'), ('adder', 'close'),
                         ('envs', 'close'), ('eval_envs', 'close'),
                         ('server', 'stop')):
      obj = getattr(self, name, None)
      if obj is None:
        continue
      try:
        getattr(obj, method)()
      except Exception:  # noqa: BLE001  (e.g. the server is already down)
        pass

  # -- signals ------------------------------------------------------------------------------
  def _install_signal_handlers(self):
    def handler(signum, frame):
      del frame
      if self._stop_signal is not None:   # second signal: stop now
        raise KeyboardInterrupt
      self._stop_signal = signum
    handlers = {}
    for sig in (signal.SIGINT, signal.SIGTERM):
      try:
        handlers[sig] = signal.signal(sig, handler)
      except ValueError:                  # not the main thread
        pass
    return handlers

  @staticmethod
  def _restore_signal_handlers(handlers) -> None:
    for sig, h in handlers.items():
      signal.signal(sig, h)


def enable_compilation_cache(path: str) -> None:
  """Persistent XLA compilation cache at ``path`` (JAX's own, keyed by jax
  version, backend and flags): a resumed or repeated run skips recompiling
  the update (~40 s for size1m on 2 CPU cores; ~7 s with the cache)."""
  import jax
  os.makedirs(path, exist_ok=True)
  jax.config.update('jax_compilation_cache_dir', path)
  jax.config.update('jax_persistent_cache_min_compile_time_secs', 1.0)


def train(run: RunConfig, config: DreamerConfig) -> Dict[str, Any]:
  """Builds, runs and closes a Trainer; returns its summary."""
  trainer = Trainer(run, config)
  try:
    return trainer.run()
  finally:
    trainer.close()
