"""The one atomic file writer of the replay's and the run's files.

``atomic_write`` writes to a temporary file made by ``tempfile.mkstemp`` in
the target's folder (an unpredictable name, created exclusively with mode
0600, so no other user can plant or read it), fsyncs it and renames it over
the target: a reader sees the old file or the whole new one, never a part.
"""

from __future__ import annotations

import os
import tempfile
from typing import Callable, Union


def atomic_write(path: str,
                 data: Union[bytes, str, Callable[..., None]]) -> None:
  """Writes bytes, text, or what ``data(file)`` writes, to ``path``
  atomically (module doc)."""
  folder, name = os.path.split(os.path.abspath(path))
  fd, tmp = tempfile.mkstemp(prefix=f'.{name}.', suffix='.tmp', dir=folder)
  try:
    with os.fdopen(fd, 'wb') as f:
      if callable(data):
        data(f)
      else:
        f.write(data.encode() if isinstance(data, str) else data)
      f.flush()
      os.fsync(f.fileno())
    os.replace(tmp, path)
  except BaseException:
    try:
      os.remove(tmp)
    except OSError:
      pass
    raise
