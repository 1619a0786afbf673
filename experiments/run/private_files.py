"""Which files of a run may be read back (issue 29, docs/security.md).

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
"""

from __future__ import annotations

import os
import stat


class UntrustedFileError(ValueError):
  """A run file that another user could have written (or read, a secret)."""


def _check_one(path: str, secret: bool) -> None:
  st = os.stat(path)
  mode = stat.S_IMODE(st.st_mode)
  if stat.S_ISDIR(st.st_mode) and (st.st_uid == 0 or mode & stat.S_ISVTX):
    # A folder of root's (/home) or a sticky one (/tmp): nobody else may
    # replace or remove a file of this user's in it.
    if mode & stat.S_ISVTX or not mode & 0o022:
      return
  if st.st_uid != os.getuid():
    raise UntrustedFileError(
        f'{path} belongs to user id {st.st_uid}, not to this user '
        f'({os.getuid()}): not read (it decides what this run loads)')
  if mode & 0o022:
    raise UntrustedFileError(
        f'{path} is writable by other users (mode {mode:o}): not read. If '
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


def check_private_tree(root: str) -> None:
  """``check_private`` for ``root`` and every file and folder under it."""
  _check_one(root, False)
  for folder, dirs, files in os.walk(root):
    for name in dirs + files:
      _check_one(os.path.join(folder, name), False)


def restrict_umask() -> None:
  """Adds go-w to this process's umask (and its children's): the run's
  files and folders are writable by this user only (module doc)."""
  os.umask(os.umask(0) | 0o022)
