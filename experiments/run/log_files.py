"""The run directory's log files and JSON helpers (docs/metrics.md).

  flags.txt          the flags of the latest start (usable as --flagfile)
  metrics.jsonl      one JSON row per log interval ('kind': 'train') or eval
                     ('kind': 'eval'); appended with O_APPEND, one write a row,
                     so several processes may write it
  scores.jsonl       one row per finished training episode (report input)
  eval/scores.jsonl  one row per evaluation episode
  tensorboard/       TensorBoard event files (same scalars as metrics.jsonl)
  report.png         experiments/tools/report.py output at the end of the run

Every log file is opened through ``private_files.open_run_file`` (no symbolic
link, nothing outside the logdir). Their sizes are saved with each checkpoint
(``file_sizes``) and cut back to them on resume (``cut_file``).
"""

from __future__ import annotations

import errno
import json
import math
import os
from typing import Any, Dict, List, Optional

import numpy as np

from experiments.run.private_files import open_run_file

METRICS_FILE = 'metrics.jsonl'
SCORES_FILE = 'scores.jsonl'
EVAL_DIR = 'eval'
TB_DIR = 'tensorboard'
REPORT_FILE = 'report.png'
FLAGS_FILE = 'flags.txt'
LOG_FILES = {'metrics_bytes': METRICS_FILE, 'scores_bytes': SCORES_FILE,
             'eval_scores_bytes': os.path.join(EVAL_DIR, SCORES_FILE)}


def read_json(path: str) -> Any:
  with open(path) as f:
    return json.load(f)


# Test-only fault injection: with DREAMER_INJECT_WRITE_FAULT=ENOSPC@3
# (or EIO@1, ...) the 3rd and later ``atomic_write`` calls of this process
# fail with that errno, as a full or failing disk would.
FAULT_ENV = 'DREAMER_INJECT_WRITE_FAULT'
_WRITES = [0]


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


def fsync_dir(path: str) -> None:
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


def open_in(logdir: str, path: str, flags: int):
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
  with open_in(logdir, path, os.O_RDWR) as f:
    total = os.fstat(f.fileno()).st_size
    if total <= size:
      return 0
    f.seek(size)
    tail = f.read()
    with open_in(logdir, path + '.discarded',
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
  """'dmc_walker_walk' / 'walker_walk' -> 'walker_walk'; 'cup_catch' ->
  'ball_in_cup_catch'; 'atari_pong' / 'atari100k_pong' -> 'pong' (the
  official score files' prefixes)."""
  name = str(name).strip().lower()
  for prefix in ('dmc_', 'atari100k_', 'atari_'):
    if name.startswith(prefix):
      name = name[len(prefix):]
      break
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
  with open_in(logdir, os.path.join(logdir, SCORES_FILE),
                os.O_WRONLY | os.O_APPEND | os.O_CREAT) as f:
    f.write((line + '\n').encode())
