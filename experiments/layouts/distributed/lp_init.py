"""Per-process initialisation of every Launchpad node (``local_mp``).

Launchpad's ``PythonProcess(args={'init_file': path})`` makes each node process
(``launchpad/nodes/python/process_entry.py``) unpickle the function stored at
``path`` and call it *before* it unpickles the node itself. ``init`` below is
that function. It

  * imports ``agent.compat``, which restores the jax aliases acme 0.4.0 needs,
    so it runs before anything in the node imports acme (README "Requirements");
  * sets Launchpad's termination notice of the node from
    ``DREAMER_LP_TERMINATION_NOTICE_SECS``;
  * asks the kernel to send SIGTERM to the node when its launcher dies
    (``PR_SET_PDEATHSIG``), so a launcher killed with SIGKILL leaves no orphans
    (a SIGTERM starts Launchpad's normal, bounded stop of the node);
  * turns on JAX's persistent compilation cache at ``DREAMER_JAX_CACHE_DIR``
    (``--jax_cache_dir``), so a resumed program skips recompiling as one
    process does.

``write_init_file(directory)`` writes the pickle; ``python_process(...)`` builds
the ``lp.PythonProcess`` resource that uses it. The function is pickled by
reference (``experiments.layouts.distributed.lp_init.init``), so node
processes import this module,
which must therefore not import acme, reverb or TensorFlow at module level.
"""

from __future__ import annotations

import os
import signal
from typing import Mapping, Optional

INIT_FILE_NAME = 'lp_init.pkl'
# Env var carrying Launchpad's termination notice (seconds) into each node.
NOTICE_ENV = 'DREAMER_LP_TERMINATION_NOTICE_SECS'
# Env var carrying --jax_cache_dir into each node.
JAX_CACHE_ENV = 'DREAMER_JAX_CACHE_DIR'
_PR_SET_PDEATHSIG = 1


def _set_parent_death_signal(sig: int = signal.SIGTERM) -> None:
  """Linux only: deliver ``sig`` to this process when its parent exits."""
  try:
    import ctypes
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(_PR_SET_PDEATHSIG, int(sig), 0, 0, 0)
  except (OSError, AttributeError):  # not Linux / no prctl: best effort
    return
  # The parent may have died before prctl took effect (re-parented to init).
  if os.getppid() == 1:
    os.kill(os.getpid(), sig)


def init() -> None:
  """Runs in every node process before the node is unpickled."""
  os.environ.setdefault('MUJOCO_GL', 'disable')
  from agent import compat  # noqa: F401  (jax aliases before any acme import)
  notice = os.environ.get(NOTICE_ENV)
  if notice:
    # Read by the node's WorkerManager, which process_entry creates after
    # this function: seconds between a stop signal and the node's self-kill.
    # (Passing it as a PythonProcess arg trips launchpad 0.5.0's flag
    # forwarding, which looks up a flag that does not exist.)
    from absl import flags
    flags.FLAGS.lp_termination_notice_secs = int(float(notice))
  if os.environ.get('DREAMER_LP_PDEATHSIG', '1') == '1':
    _set_parent_death_signal(signal.SIGTERM)
  cache = os.environ.get(JAX_CACHE_ENV)
  if cache:
    from experiments.run.config import enable_compilation_cache
    enable_compilation_cache(cache)


def write_init_file(directory: str) -> str:
  """Pickles ``init`` into ``directory``; returns the path (for init_file)."""
  import cloudpickle
  os.makedirs(directory, exist_ok=True)
  path = os.path.join(directory, INIT_FILE_NAME)
  with open(path, 'wb') as f:
    cloudpickle.dump(init, f)
  return path


def python_process(init_file: str, env: Optional[Mapping[str, str]] = None,
                   args: Optional[Mapping[str, object]] = None):
  """``lp.PythonProcess`` running ``init`` first, with extra env vars/args."""
  from launchpad.nodes.python.local_multi_processing import PythonProcess
  all_args = {'init_file': init_file}
  all_args.update(args or {})
  return PythonProcess(args=all_args, env={k: str(v) for k, v in
                                           (env or {}).items()})
