"""Resume checks: a start whose logdir holds a complete checkpoint continues
from it (``validate``, then ``load_resume_state``, then ``start_segment``).

Everything is validated before anything is written: the logdir is writable
and private (``private_files.check_run_folder``), the checkpoint's files are
the user's own, it was written by the same layout ('mode') and with the same
settings (every DreamerConfig field and ``checkpoints.RESUME_FIXED``). Log
lines written after the checkpoint are then moved to ``<file>.discarded`` so
the curves stay consistent.
"""

from __future__ import annotations

import dataclasses
import os
from typing import Any, Dict, Mapping, Optional

from experiments.run.checkpoints import (
    CONFIG_FILE, KEPT_DIR, REPLAY_STATE_FILE, RESUME_FIXED, checkpoint_root,
    clean_checkpoints, latest_run_checkpoint, reverb_dir)
from experiments.run.config import RunConfig, log
from experiments.run.log_files import (
    EVAL_DIR, FLAGS_FILE, LOG_FILES, TB_DIR, atomic_write, cut_file, open_in,
    read_json)
from experiments.run.private_files import (
    UntrustedFileError, check_not_link, check_private_tree, check_run_folder)
from experiments.run.run_state import MODES, RUN_STATE_FILE, load_run_state


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
    with open_in(logdir, probe, os.O_WRONLY | os.O_CREAT | os.O_EXCL) as f:
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


