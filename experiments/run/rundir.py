"""The run directory, shared by the single-process and Launchpad layouts.

One module owns what both layouts write and read (docs/metrics.md):

  flags.txt          the flags of the latest start (usable as --flagfile)
  metrics.jsonl      one JSON row per log interval ('kind': 'train') or eval
                     ('kind': 'eval'); appended with O_APPEND, one write a row,
                     so several processes may write it
  scores.jsonl       one row per finished training episode (report input)
  eval/scores.jsonl  one row per evaluation episode
  tensorboard/       TensorBoard event files (same scalars as metrics.jsonl)
  checkpoints/       ckpt-<agent steps>/ (learner.npz, replay_state.json,
                     latents.npz, config.json, run_state.json) and
                     reverb/<timestamp>/ (the Reverb checkpoint it references)
  report.png         experiments/tools/report.py output at the end of the run
  restarts.jsonl     one row per node restart of a Launchpad run
                     (experiments.run.restarts); kept across resumes

Checkpoints are atomic (``write_checkpoint``): everything goes into
``checkpoints/.tmp-*`` which is renamed to ``ckpt-*``. Reverb's server deletes
its previous checkpoint as soon as it writes a new one, so right before each
Reverb checkpoint the one the newest ``ckpt-*`` references is hard-linked into
``checkpoints/reverb-kept/`` (``keep_reverb_checkpoint``; no data is copied)
and is dropped only once a newer ``ckpt-*`` exists. Before the server starts,
``clean_checkpoints`` puts a kept copy back if the newest ``ckpt-*`` needs it
and deletes every Reverb checkpoint that ``ckpt-*`` does not reference, so a
save that fails or is killed anywhere falls back to the previous checkpoint,
and replay data is never held twice.

Resume (``validate``, then ``load_resume_state``): a start whose logdir holds a complete checkpoint
continues from it. Everything is validated before anything is written: the
logdir is writable, the checkpoint was written by the same layout ('mode') and
with the same settings (every DreamerConfig field and ``RESUME_FIXED``). Log
lines written after the checkpoint are then moved to ``<file>.discarded`` so
the curves stay consistent.

The run state (``run_state.json``) has one schema in both layouts
(``make_run_state``; older checkpoints are upgraded by ``load_run_state``).
"""

from __future__ import annotations

import dataclasses
import errno
import json
import math
import os
import shutil
import time
from typing import Any, Dict, List, Mapping, Optional

import numpy as np

from experiments.run.config import RunConfig, log
from experiments.run.private_files import (
    UntrustedFileError, check_not_link, check_private_tree, check_run_folder,
    open_run_file)
from experiments.run.run_state import (  # noqa: F401  (rundir's public API)
    ACTOR_KEYS, LEARNER_KEYS, MODES, ONE_PROCESS_LEARNER_KEYS, RUN_STATE_FILE,
    RUN_STATE_SCHEMA, load_run_state, make_run_state)
from experiments.run.tree_files import load_tree, save_tree

CKPT_PREFIX = 'ckpt-'
TMP_PREFIX = '.tmp-'
REVERB_DIR = 'reverb'
LEARNER_FILE = 'learner.npz'
# What checkpoints of earlier versions held instead (pickle: never loaded).
OLD_LEARNER_FILE = 'learner.pkl'
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
# Run settings that must not change on resume (besides every DreamerConfig field).
RESUME_FIXED = ('suite', 'task', 'num_envs', 'action_repeat', 'time_limit',
                'image', 'proprio', 'chunk_length')


# --- files ----------------------------------------------------------------------


def read_json(path: str) -> Any:
  with open(path) as f:
    return json.load(f)


# Test-only fault injection: with DREAMER_INJECT_WRITE_FAULT=ENOSPC@3
# (or EIO@1, ...) the 3rd and later ``atomic_write`` calls of this process
# fail with that errno, as a full or failing disk would.
FAULT_ENV = 'DREAMER_INJECT_WRITE_FAULT'
_WRITES = [0]


class CheckpointError(RuntimeError):
  """A checkpoint could not be written; the previous complete one is kept."""


def _injected_fault(path: str) -> None:
  spec = os.environ.get(FAULT_ENV)
  if not spec:
    return
  name, _, at = spec.partition('@')
  _WRITES[0] += 1
  if _WRITES[0] >= int(at or 1):
    code = getattr(errno, name)
    raise OSError(code, f'{os.strerror(code)} (injected by {FAULT_ENV})', path)


def atomic_write(path: str, data) -> None:
  """The run directory's file writer (a fsynced temp file, then a rename)."""
  from reverb_tables.files import atomic_write as write
  _injected_fault(path)
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


def tail_lines(path: str, nbytes: int = 65536) -> List[str]:
  """The lines of the last ``nbytes`` of a (log) file; [] without one."""
  if not os.path.exists(path):
    return []
  with open(path, 'rb') as f:
    f.seek(max(0, os.path.getsize(path) - nbytes))
    return f.read().decode(errors='replace').splitlines()


def _open_in(logdir: str, path: str, flags: int):
  """A binary file object of ``path``, a file of the run directory
  ``logdir`` (``private_files.open_run_file``: no symlink, nothing outside
  ``logdir``)."""
  fd = open_run_file(path, flags, root=logdir)
  access = flags & os.O_ACCMODE
  mode = ('rb' if access == os.O_RDONLY else 'ab' if flags & os.O_APPEND
          else 'wb' if access == os.O_WRONLY else 'r+b')
  return os.fdopen(fd, mode)


def cut_file(logdir: str, name: str, size: int) -> int:
  """Moves bytes past ``size`` of the log file ``name`` of ``logdir`` to
  ``<name>.discarded``; returns them. Neither file is opened through a
  symbolic link or outside ``logdir`` (``private_files.open_run_file``)."""
  path = os.path.join(logdir, name)
  if not os.path.lexists(path):
    return 0
  with _open_in(logdir, path, os.O_RDWR) as f:
    total = os.fstat(f.fileno()).st_size
    if total <= size:
      return 0
    f.seek(size)
    tail = f.read()
    with _open_in(logdir, path + '.discarded',
                  os.O_WRONLY | os.O_APPEND | os.O_CREAT) as out:
      out.write(tail)
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


def json_default(x):
  out = jsonable(x)
  if out is x:
    raise TypeError(f'not JSON serialisable: {type(x).__name__}')
  return out


def normalize_task(name: str) -> str:
  """'dmc_walker_walk' / 'walker_walk' -> 'walker_walk'; 'cup_catch' -> 'ball_in_cup_catch'."""
  name = str(name).strip().lower()
  if name.startswith('dmc_'):
    name = name[len('dmc_'):]
  if name.startswith('cup_'):  # the reference's alias of ball_in_cup
    name = 'ball_in_cup_' + name[len('cup_'):]
  return name


def append_score(logdir: str, task: str, env_step: int, score: float,
                 seed: int, stats: Optional[dict] = None) -> None:
  """Append one finished episode to logdir/scores.jsonl (the report's input).

  ``stats``: the env's per-episode facts (``Episode.stats``, e.g. Crafter's
  'achievements'), written as extra keys of the line."""
  score = float(score)
  if not math.isfinite(score):
    raise ValueError(f'episode score must be finite, got {score}')
  record = {'task': normalize_task(task), 'env_step': int(env_step),
            'score': score, 'seed': int(seed)}
  clash = sorted(set(stats or {}) & set(record))
  if clash:
    raise ValueError(f'episode stats keys {clash} clash with the score keys')
  record.update(stats or {})
  line = json.dumps(record)
  os.makedirs(logdir, exist_ok=True)
  with _open_in(logdir, os.path.join(logdir, SCORES_FILE),
                os.O_WRONLY | os.O_APPEND | os.O_CREAT) as f:
    f.write((line + '\n').encode())


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


KEPT_DIR = 'reverb-kept'


def keep_reverb_checkpoint(logdir: str) -> None:
  """Hard-links the Reverb checkpoint the newest ckpt-* references into
  ``checkpoints/reverb-kept/`` (call right before ``client.checkpoint()``).

  Reverb's server keeps only its latest checkpoint: the new one replaces the
  old on disk before our ``ckpt-*`` that references the new one exists. A
  save that then fails (a full disk) or is killed would leave the previous
  ``ckpt-*`` without its replay; the hard links keep those files (found and
  fixed by tests/test_faults.py)."""
  latest = latest_run_checkpoint(logdir)
  if latest is None:
    return
  name = read_json(os.path.join(latest, REPLAY_STATE_FILE))['reverb_checkpoint']
  src = os.path.join(reverb_dir(logdir), name or '')
  kept_root = os.path.join(checkpoint_root(logdir), KEPT_DIR)
  dst = os.path.join(kept_root, name or '')
  if not name or os.path.isdir(dst) or not os.path.isfile(
      os.path.join(src, 'DONE')):
    return
  shutil.rmtree(kept_root, ignore_errors=True)
  os.makedirs(kept_root)
  shutil.copytree(src, dst + TMP_PREFIX, copy_function=os.link)
  os.rename(dst + TMP_PREFIX, dst)


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
    kept = os.path.join(root, KEPT_DIR, keep_reverb or '')
    if (keep_reverb and not os.path.isfile(os.path.join(ref, 'DONE'))
        and os.path.isfile(os.path.join(kept, 'DONE'))):
      shutil.rmtree(ref, ignore_errors=True)       # Reverb deleted it: restore
      os.makedirs(os.path.dirname(ref), exist_ok=True)
      os.rename(kept, ref)
    if not keep_reverb or not os.path.isfile(os.path.join(ref, 'DONE')):
      raise ValueError(
          f'checkpoint {latest} references Reverb checkpoint {ref}, which is '
          'missing or incomplete; the run directory is corrupted')
  for name in os.listdir(root):
    path = os.path.join(root, name)
    if name.startswith(TMP_PREFIX) or name == KEPT_DIR or (
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


def check_finite_state(learner_state, final: str, logdir: str) -> None:
  """``CheckpointError`` unless every float leaf of ``learner_state`` (the
  ``TrainingState``: params, slow critic, optimizer, return normaliser) is
  finite, naming the first bad leaf and the checkpoint that is kept.

  The guard: a checkpoint never holds non-finite params,
  so the last checkpoint of a run whose updates diverged is one to resume
  from (``experiments.run.health``; the update itself skips non-finite
  steps, Algorithm J, but a finite step can still overflow the params).
  """
  import jax
  leaves = jax.tree_util.tree_flatten_with_path(learner_state)[0]
  for path, leaf in leaves:
    x = np.asarray(leaf)
    if not np.issubdtype(x.dtype, np.floating) or np.isfinite(x).all():
      continue
    name = jax.tree_util.keystr(path)
    bad = int(np.size(x) - np.isfinite(x).sum())
    kept = latest_run_checkpoint(logdir)
    raise CheckpointError(
        f'checkpoint {final} was not written: the learner state holds '
        f'non-finite values ({bad} of {np.size(x)} in {name}), so training '
        f'has diverged. The last complete checkpoint ({kept or "none"}) is '
        'kept; fix the cause (e.g. a smaller --config_overrides=lr=...) '
        'before resuming from it.')


def write_checkpoint(logdir: str, agent_steps: int, *, reverb_path: str,
                     learner_state, config, spaces, run: RunConfig, mode: str,
                     run_state: Mapping[str, Any],
                     adder_state: Optional[Mapping[str, Any]] = None,
                     schedule=None, latent_store=None) -> str:
  """Writes ``ckpt-<agent_steps>`` atomically (module doc); returns its path.

  ``reverb_path`` is the Reverb checkpoint just written (``client.checkpoint()``
  after the adders were flushed); ``adder_state`` is the adder counters (step
  ids: one adder's ``get_state()``, or the merged counters of a program's
  actors), saved with the one-process schedule (if any) and the latent
  store by ``reverb_tables.checkpoint.save_replay_state``. ``run_state`` is
  ``make_run_state``'s; it gets 'files' (log sizes) and 'time' added.
  A write that fails (a full or failing disk) removes the unfinished save and
  raises ``CheckpointError`` naming the error and the checkpoint that is
  kept; the run stops there (both layouts). So does a learner state with a
  non-finite value (``check_finite_state``), before anything is written.
  """
  assert run_state.get('schema') == RUN_STATE_SCHEMA, 'use make_run_state'
  assert run_state['mode'] == mode, (run_state['mode'], mode)
  root = checkpoint_root(logdir)
  final = os.path.join(root, f'{CKPT_PREFIX}{int(agent_steps):012d}')
  check_finite_state(learner_state, final, logdir)
  os.makedirs(root, exist_ok=True)
  tmp = os.path.join(root, f'{TMP_PREFIX}{os.getpid()}-{time.time_ns()}')
  try:
    _write_checkpoint_files(tmp, final, logdir, reverb_path, learner_state,
                            config, spaces, run, mode, run_state, adder_state,
                            schedule, latent_store)
  except OSError as e:                 # ENOSPC, EIO, EROFS, ...
    shutil.rmtree(tmp, ignore_errors=True)
    kept = latest_run_checkpoint(logdir)
    raise CheckpointError(
        f'checkpoint {final} was not written: {e.strerror or e} '
        f'[{errno.errorcode.get(e.errno, e.errno)}] at {e.filename}. The last '
        f'complete checkpoint ({kept or "none"}) is kept; free space or fix '
        'the disk, then rerun the same command to resume from it.') from e
  _fsync_dir(root)
  clean_checkpoints(logdir)            # older ckpt-* and unreferenced Reverb dirs
  return final


def _write_checkpoint_files(tmp, final, logdir, reverb_path, learner_state,
                            config, spaces, run, mode, run_state, adder_state,
                            schedule, latent_store) -> None:
  """``write_checkpoint``'s files into ``tmp``, then the rename to ``final``."""
  from reverb_tables import checkpoint as rckpt
  os.makedirs(tmp)
  rckpt.save_replay_state(tmp, reverb_path, adder_state=adder_state,
                          schedule=schedule, latent_store=latent_store)
  atomic_write(os.path.join(tmp, LEARNER_FILE),
               lambda f: save_tree(f, learner_state))
  atomic_write(os.path.join(tmp, CONFIG_FILE), json.dumps({
      'config': dataclasses.asdict(config),
      'spaces': {'obs': {k: list(v) for k, v in spaces.obs.items()},
                 'act_dim': spaces.act_dim, 'discrete': spaces.discrete},
      'run': {k: getattr(run, k) for k in RESUME_FIXED},
      'mode': mode,
  }, indent=1))
  state = {**run_state, 'files': file_sizes(logdir),
           'time': time.time()}
  atomic_write(os.path.join(tmp, RUN_STATE_FILE),
               json.dumps(state, indent=1, default=json_default))
  _fsync_dir(tmp)
  if os.path.exists(final):            # same step saved twice (e.g. at the end)
    shutil.rmtree(final)
  os.rename(tmp, final)


def read_saved_config(ckpt: str):
  """(DreamerConfig, EnvSpaces, {RESUME_FIXED run setting: value}) that
  ``write_checkpoint`` saved in ``config.json`` (the one reader)."""
  from agent.config import make_config
  from agent.types import EnvSpaces
  saved = read_json(os.path.join(ckpt, CONFIG_FILE))
  sp = saved['spaces']
  spaces = EnvSpaces(obs={k: tuple(v) for k, v in sp['obs'].items()},
                     act_dim=sp['act_dim'], discrete=sp['discrete'])
  run = {'suite': 'dmc', 'image': False, 'proprio': True,   # older runs
         **saved['run']}
  return make_config(**saved['config']), spaces, run


def learner_state_template(config, spaces):
  """The ``TrainingState`` structure (shapes and dtypes, nothing computed)
  of a learner of ``config`` on ``spaces``: what ``load_learner_state`` reads
  a checkpoint into."""
  import jax

  from agent import learning, networks
  init = learning.make_train_step(networks.make_networks(spaces, config),
                                  jit=False).init
  return jax.eval_shape(init, jax.random.PRNGKey(0))


def load_learner_state(ckpt: str, template):
  """The checkpoint's ``TrainingState`` in ``template``'s structure
  (``tree_files.load_tree``: no pickle; ValueError for another model)."""
  path = os.path.join(ckpt, LEARNER_FILE)
  if not os.path.exists(path) and os.path.exists(
      os.path.join(ckpt, OLD_LEARNER_FILE)):
    raise ValueError(
        f'checkpoint {ckpt} holds {OLD_LEARNER_FILE}, a pickle written by an '
        'earlier version; pickles can run code when loaded, so it is not '
        'read. Resume it with the version that wrote it, or start a new '
        '--logdir.')
  return load_tree(path, template)


def read_learner_state(ckpt: str):
  """The checkpoint's ``TrainingState``, in the structure of the config and
  spaces saved with it (tools, tests: no learner at hand)."""
  config, spaces, _ = read_saved_config(ckpt)
  return load_learner_state(ckpt, learner_state_template(config, spaces))


# --- validation before anything is written ----------------------------------------


def _file_in_the_way(path: str) -> Optional[str]:
  """The first existing component of ``path`` that is not a directory (the
  path itself, or a parent), or None."""
  p = os.path.abspath(path)
  while not os.path.lexists(p):
    parent = os.path.dirname(p)
    if parent == p:
      return None
    p = parent
  return None if os.path.isdir(p) else p


def check_logdir_writable(logdir: str) -> None:
  """ValueError naming --logdir when it cannot be created or written, or
  when another user could write it (``private_files.check_run_folder``) or
  has put a symbolic link where a log file goes (``check_not_link``): then
  nothing is written to it."""
  blocker = _file_in_the_way(logdir)
  if blocker is not None:
    where = ('is a file' if blocker == os.path.abspath(logdir) else
             f'cannot be made: {blocker} is a file')
    raise ValueError(f'--logdir {logdir!r} {where}, not a directory; give '
                     'a directory (a new one is made), or move the file')
  try:
    os.makedirs(logdir, exist_ok=True)
  except OSError as e:
    raise ValueError(f'--logdir {logdir!r} cannot be created: {e}') from e
  if not os.path.isdir(logdir):
    raise ValueError(f'--logdir {logdir!r} is not a directory')
  try:
    check_run_folder(logdir)
    for name in list(LOG_FILES.values()) + [FLAGS_FILE]:
      check_not_link(os.path.join(logdir, name))
  except UntrustedFileError as e:
    raise UntrustedFileError(f'--logdir {logdir!r} is refused: {e}') from None
  probe = os.path.join(logdir, f'.write-test-{os.getpid()}')
  try:
    with _open_in(logdir, probe, os.O_WRONLY | os.O_CREAT | os.O_EXCL) as f:
      f.write(b'ok')
    os.remove(probe)
  except OSError as e:
    raise ValueError(f'--logdir {logdir!r} is not writable: {e}') from e
  for sub in ('checkpoints', EVAL_DIR, TB_DIR):
    path = os.path.join(logdir, sub)
    if os.path.exists(path) and not os.access(path, os.W_OK | os.X_OK):
      raise ValueError(f'--logdir {logdir!r}: {path} is not writable')


def check_checkpoint_files(ckpt: str, logdir: str) -> None:
  """ValueError (``private_files.UntrustedFileError``) when a file of the
  checkpoint to resume, or of the Reverb checkpoint it references, could
  have been written by another user: nothing of it is then loaded."""
  check_private_tree(ckpt)
  try:
    name = read_json(os.path.join(ckpt, REPLAY_STATE_FILE)).get(
        'reverb_checkpoint')
  except (OSError, ValueError, AttributeError):
    return                       # unreadable: the later checks say why
  for root in (reverb_dir(logdir),
               os.path.join(checkpoint_root(logdir), KEPT_DIR)):
    if name and os.path.isdir(os.path.join(root, name)):
      check_private_tree(os.path.join(root, name))


def check_mode(ckpt: str, logdir: str, mode: str) -> None:
  """ValueError if ``ckpt`` was written by the other layout."""
  path = os.path.join(ckpt, RUN_STATE_FILE)
  try:
    saved = read_json(path).get('mode') or 'single_process'
  except (OSError, ValueError):
    saved = mode                    # unreadable: load_run_state says why
  if saved != mode:
    how = ('with --distributed' if saved == 'distributed'
           else 'without --distributed')
    raise ValueError(
        f'--logdir {logdir!r} holds a {saved} run (checkpoint {ckpt}); resume '
        f'it {how}, or use a new --logdir for a {mode} run.')


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

  Returns that checkpoint's path (None for a new run). (The env was checked
  when the experiment was made, ``experiments.run.experiment``.)"""
  assert mode in MODES, mode
  check_logdir_writable(run.logdir)
  latest = latest_run_checkpoint(run.logdir)
  if latest is not None:
    check_checkpoint_files(latest, run.logdir)
    check_mode(latest, run.logdir, mode)
    check_resume_compatible(latest, run, config)
    load_run_state(latest)                  # readable in this schema
  return latest


def load_resume_state(run: RunConfig,
                      resume: Optional[str]) -> Optional[Dict[str, Any]]:
  """After ``validate``, before the Reverb server starts: cleans the
  checkpoint folder (``clean_checkpoints``); returns the run_state to resume."""
  kept = clean_checkpoints(run.logdir)
  assert kept == resume, (kept, resume)
  return load_run_state(resume) if resume else None


def start_segment(run: RunConfig, state: Optional[Mapping[str, Any]]) -> None:
  """Once everything is restored and checked: cuts the log files back to the
  checkpoint (the tails move to ``*.discarded``) and writes flags.txt."""
  for key, name in LOG_FILES.items():
    cut = cut_file(run.logdir, name, state['files'][key] if state else 0)
    if cut and run.verbose:
      log(f'[run] moved {cut} bytes of {name} written after the last '
          f'checkpoint to {name}.discarded')
  if run.flags_text:
    atomic_write(os.path.join(run.logdir, FLAGS_FILE), run.flags_text)


