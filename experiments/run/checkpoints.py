"""Run checkpoints: ``checkpoints/ckpt-<agent steps>/`` (learner.npz,
replay_state.json, latents.npz, config.json, run_state.json) and
``checkpoints/reverb/<timestamp>/`` (the Reverb checkpoint it references).

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
"""

from __future__ import annotations

import dataclasses
import errno
import json
import os
import shutil
import time
from typing import Any, List, Mapping, Optional

import numpy as np

from experiments.run.config import RunConfig
from experiments.run.log_files import (
    atomic_write, file_sizes, fsync_dir, json_default, read_json)
from experiments.run.run_state import RUN_STATE_FILE, RUN_STATE_SCHEMA
from experiments.run.tree_files import load_tree, save_tree

CKPT_PREFIX = 'ckpt-'
TMP_PREFIX = '.tmp-'
REVERB_DIR = 'reverb'
KEPT_DIR = 'reverb-kept'
LEARNER_FILE = 'learner.npz'
# What checkpoints of earlier versions held instead (pickle: never loaded).
OLD_LEARNER_FILE = 'learner.pkl'
CONFIG_FILE = 'config.json'
REPLAY_STATE_FILE = 'replay_state.json'
# Run settings that must not change on resume (besides every DreamerConfig field).
RESUME_FIXED = ('suite', 'task', 'num_envs', 'action_repeat', 'time_limit',
                'image', 'proprio', 'chunk_length')


class CheckpointError(RuntimeError):
  """A checkpoint could not be written; the previous complete one is kept."""


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
  fsync_dir(root)
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
  fsync_dir(tmp)
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


# --- what both layouts save and restore of the learner's side ------------------


def checkpoint_reverb(logdir: str, client) -> str:
  """The Reverb half of a checkpoint, both layouts: the Reverb checkpoint
  the newest ``ckpt-*`` references is kept first (Reverb's server drops its
  last one), then the server writes a new one; returns its path."""
  keep_reverb_checkpoint(logdir)
  return client.checkpoint()


def sampler_state(dataset) -> dict:
  """The sampler's row counts, saved in the run state's 'learner'."""
  return {'online_rows': dataset.sampler.num_online_rows,
          'uniform_rows': dataset.sampler.num_uniform_rows}


def restore_learner(ckpt: str, learner, dataset,
                    learner_state: Optional[Mapping[str, Any]] = None,
                    **replay_parts) -> None:
  """The learner's side of a resume, both layouts: the replay state saved
  beside the Reverb checkpoint (the latent store; ``replay_parts``: the
  one-process adder and schedule), the learner's ``TrainingState``, and,
  given the run state's ``learner_state``, the sampler's row counts (a
  learner peer has none of its own)."""
  from reverb_tables import checkpoint as rckpt
  rckpt.load_replay_state(ckpt, None, latent_store=dataset.latent_store,
                          **replay_parts)
  learner.restore(load_learner_state(ckpt, learner.state))
  if learner_state is not None:
    dataset.sampler.num_online_rows = int(learner_state['online_rows'])
    dataset.sampler.num_uniform_rows = int(learner_state['uniform_rows'])
