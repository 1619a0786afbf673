"""Which files of a run may be read back (docs/security.md), and how the
run opens the files it writes.

A file the run reads back (a checkpoint, the run secret, the remote learner
processes' settings) decides what the learner loads. So it must belong to
the user running it and be writable by nobody else: ``check_private``
refuses it otherwise, naming the file and the fix, before anything is read.
Its folder counts too, as whoever may write the folder may replace the
file (a sticky folder such as /tmp, or one of root's that only root may
write, is fine). Secrets must also be unreadable by others.

The run's own files are made that way: ``restrict_umask`` (called at the
start of every run command) adds go-w to the process's umask, so files that
Reverb and numpy write are not group-writable even where the login umask
is 002.

The run directory itself follows the same rule (``check_run_folder``, run
by ``rundir.validate`` before anything is written): it must belong to this
user and be writable by nobody else, nor may its folder be (sticky or
root's folders as above; the run directory itself gets no such pass: in a
sticky /tmp-like run directory anyone may plant a file). Whoever else
could write it could plant a symlink at metrics.jsonl and have this run,
run as root, truncate and fill any file it points to.

Files the run appends to or cuts (metrics, scores, restarts and their
rotation) are opened with ``open_run_file``: never through a symbolic
link (``O_NOFOLLOW``), and, given the run directory, never outside it
(no folder on the way is a link out of it). Checkpoint files are written
by ``reverb_tables.files.atomic_write``, whose rename replaces a link
instead of following it.
"""

from __future__ import annotations

import errno
import os
import stat
from typing import Optional


class UntrustedFileError(ValueError):
  """A run file that another user could have written (or read, a secret)."""


_NOT_READ = 'not read (it decides what this run loads)'


def _check_one(path: str, secret: bool, shared_ok: bool = True,
               refusal: str = _NOT_READ) -> None:
  st = os.stat(path)
  mode = stat.S_IMODE(st.st_mode)
  if shared_ok and stat.S_ISDIR(st.st_mode) and (
      st.st_uid == 0 or mode & stat.S_ISVTX):
    # A folder of root's (/home) or a sticky one (/tmp): nobody else may
    # replace or remove a file of this user's in it.
    if mode & stat.S_ISVTX or not mode & 0o022:
      return
  if st.st_uid != os.getuid():
    raise UntrustedFileError(
        f'{path} belongs to user id {st.st_uid}, not to this user '
        f'({os.getuid()}): {refusal}')
  if mode & 0o022:
    raise UntrustedFileError(
        f'{path} is writable by other users (mode {mode:o}): {refusal}. If '
        f'nobody else wrote it, run: chmod go-w {path}')
  if secret and not stat.S_ISDIR(st.st_mode) and mode & 0o077:
    raise UntrustedFileError(
        f'{path} is readable by other users (mode {mode:o}): a secret must '
        f'be private. Run: chmod 600 {path}')


def check_private(path: str, secret: bool = False) -> None:
  """``UntrustedFileError`` unless ``path`` and its folder belong to this
  user and nobody else may write them (module doc); ``secret``: nobody else
  may read the file either."""
  _check_one(path, secret)
  _check_one(os.path.dirname(os.path.abspath(path)), False)


def check_run_folder(path: str) -> None:
  """``UntrustedFileError`` unless the run directory ``path`` belongs to
  this user and nobody else may write it, nor its folder (module doc)."""
  refusal = ('nothing is written there (another user could redirect or '
             'replace the run\'s files)')
  _check_one(path, False, shared_ok=False, refusal=refusal)
  _check_one(os.path.dirname(os.path.realpath(path)), False, refusal=refusal)


def check_not_link(path: str) -> None:
  """``UntrustedFileError`` when ``path`` is a symbolic link (a run file
  the run writes must be its own, module doc)."""
  if os.path.islink(path):
    raise UntrustedFileError(
        f'{path} is a symbolic link (to {os.readlink(path)!r}): not opened, '
        'so nothing it points to is written. A run file is only ever a '
        'plain file; if you made the link, replace it by the file.')


def open_run_file(path: str, flags: int, mode: int = 0o644,
                  root: Optional[str] = None) -> int:
  """``os.open(path, flags | O_NOFOLLOW)``: a symbolic link at ``path`` is
  refused (``UntrustedFileError``, ``check_not_link``), not followed; with
  ``root`` (the run directory), so is a ``path`` whose folder is not where
  it is inside ``root`` (a folder on the way links out of it)."""
  path = os.path.abspath(path)
  if root is not None:
    root = os.path.abspath(root)
    rel = os.path.relpath(os.path.dirname(path), root)
    inside = os.path.normpath(os.path.join(os.path.realpath(root), rel))
    if rel.startswith(os.pardir) or os.path.realpath(
        os.path.dirname(path)) != inside:
      raise UntrustedFileError(
          f'{path} is not inside the run directory {root} (a folder on the '
          'way is a symbolic link out of it): not opened')
  try:
    return os.open(path, flags | os.O_NOFOLLOW | os.O_CLOEXEC, mode)
  except OSError as e:
    if e.errno == errno.ELOOP:
      check_not_link(path)
    raise


def check_private_tree(root: str) -> None:
  """``check_private`` for ``root`` and every file and folder under it,
  none of which may be a symbolic link (a checkpoint is read as written,
  never through a link to elsewhere)."""
  check_not_link(root)
  _check_one(root, False)
  for folder, dirs, files in os.walk(root):
    for name in dirs + files:
      check_not_link(os.path.join(folder, name))
      _check_one(os.path.join(folder, name), False)


def restrict_umask() -> None:
  """Adds go-w to this process's umask (and its children's): the run's
  files and folders are writable by this user only (module doc)."""
  os.umask(os.umask(0) | 0o022)
