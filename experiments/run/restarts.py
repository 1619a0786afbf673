"""Restart records of a run directory: ``<logdir>/restarts.jsonl``,
one row per node restart of a Launchpad run (in place or of the program),
kept across resumes; its line count is the ``run/restarts`` metric."""

from __future__ import annotations

import json
import os
import time
from typing import Any, Mapping

from experiments.run.private_files import open_run_file
from experiments.run.log_files import json_default

RESTARTS_FILE = 'restarts.jsonl'


def append_restart(logdir: str, record: Mapping[str, Any]) -> int:
  """Appends one restart (node, exit status, kind, ...) to restarts.jsonl in
  one write; returns the run's restart count (the ``run/restarts`` metric)."""
  line = json.dumps({'time': time.time(), **record}, default=json_default)
  fd = open_run_file(os.path.join(logdir, RESTARTS_FILE),
                     os.O_WRONLY | os.O_APPEND | os.O_CREAT, root=logdir)
  with os.fdopen(fd, 'a') as f:
    f.write(line + '\n')
  return count_restarts(logdir)


def count_restarts(logdir: str) -> int:
  """Restarts recorded in ``logdir`` (complete lines of restarts.jsonl)."""
  try:
    with open(os.path.join(logdir, RESTARTS_FILE), 'rb') as f:
      return f.read().count(b'\n')
  except FileNotFoundError:
    return 0
