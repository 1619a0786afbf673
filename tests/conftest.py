"""Shared fixtures. `import agent` first: it installs the jax aliases acme needs."""
import os

# The suite is compile-bound (tiny models, few updates): without LLVM's
# backend optimisations XLA compiles about twice as fast here (the literal
# loss reference: 74 s -> 33 s) and the tiny programs still run quickly. Set
# before jax starts its backend, and inherited by every training subprocess
# and Launchpad node the tests start. The HLO, and so what each program
# computes, is unchanged; the learner's speed is measured by bench/, never
# here.
if '--xla_backend_optimization_level' not in os.environ.get('XLA_FLAGS', ''):
  os.environ['XLA_FLAGS'] = (os.environ.get('XLA_FLAGS', '') +
                             ' --xla_backend_optimization_level=0').strip()

import agent  # noqa: F401
import jax
import pytest

from agent import config as config_lib
from agent import learning, networks, synthetic
from tests.smoke_model import SMOKE_MODEL_FLAGS


@pytest.fixture(scope='session')
def tiny_config():
  return config_lib.make_config(size='tiny', batch_size=2, batch_length=8,
                                imag_horizon=4, latent_store_dtype='float32')


@pytest.fixture(scope='session')
def spaces():
  return synthetic.WALKER_SPACES


@pytest.fixture(scope='session')
def tiny_nets(spaces, tiny_config):
  return networks.make_networks(spaces, tiny_config)


@pytest.fixture(scope='session')
def tiny_state(tiny_nets):
  ts = learning.make_train_step(tiny_nets, jit=False)
  return ts.init(jax.random.PRNGKey(0))


@pytest.fixture(scope='session', autouse=True)
def jax_cache_dir(tmp_path_factory):
  """One persistent XLA compilation cache for the session, enabled here for
  this process; tests pass it to training subprocesses (``--jax_cache_dir``)
  and to ``run_dmc.train`` (which would otherwise move this process's cache
  to its logdir). JAX keys an entry by the program's HLO, compile options
  (which name this directory), XLA flags, backend and version, so a hit is
  exactly the executable that would have been compiled; the directory is
  fresh per session, so the first use of each program still compiles it.
  Under pytest-xdist (``make test``) each worker has its own: jax writes an
  entry in place (no rename) unless eviction is on, so a shared directory
  could hand one worker another's half-written executable.
  Only compiles of >= 1 s are stored, as
  ``experiments.run.config.enable_compilation_cache`` does. With
  tests/smoke_model.py, one update compile serves six modules."""
  # DREAMER_TEST_JAX_CACHE names a directory to keep across sessions (the
  # mutation runs of bench/mutants.py share one, so a program a mutant does
  # not change is compiled once for all of them).
  path = os.environ.get('DREAMER_TEST_JAX_CACHE') or str(
      tmp_path_factory.mktemp('jax_cache'))
  jax.config.update('jax_compilation_cache_dir', path)
  jax.config.update('jax_persistent_cache_min_compile_time_secs', 1.0)
  return path


@pytest.fixture(scope='session')
def smoke_flags(jax_cache_dir):
  """Extra run_dmc.py flags for a smoke.flags run: the session's cache and
  the shared model (tests/smoke_model.py)."""
  return (f'--jax_cache_dir={jax_cache_dir}', *SMOKE_MODEL_FLAGS)
