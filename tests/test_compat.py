"""The jax compat module restores exactly the names acme 0.4.0 uses."""
import jax
import jax.numpy as jnp
import pytest

from agent import compat


def test_aliases_present_and_idempotent():
  assert jax.xla.Device is jax.Device
  assert jax.xla.DeviceArray is jax.Array
  assert jnp.DeviceArray is jax.Array
  assert jax.pxla.ShardedDeviceArray is jax.Array
  assert jax.tree_map is jax.tree_util.tree_map
  assert jax.tree_multimap is jax.tree_util.tree_map
  assert jax.tree_flatten is jax.tree_util.tree_flatten
  assert compat.install() == []  # second call adds nothing


def test_acme_imports_with_compat():
  import acme  # noqa: F401
  from acme.jax import utils, variable_utils  # noqa: F401
  from acme.agents.jax import builders  # noqa: F401
  x = jnp.ones(3)
  assert isinstance(x, jnp.DeviceArray)
  assert utils.add_batch_dim(x).shape == (1, 3)


def test_import_agent_quiets_the_tpu_probe_line():
  """absl's INFO verbosity printed jax's "Unable to initialize backend 'tpu'"
  (a machine without a TPU) in every run; ``import agent`` sets that logger's
  level to WARNING, and the jax backend still comes up."""
  import os
  import subprocess
  import sys
  script = ('import logging, sys\n'
            'logging.basicConfig(level=logging.INFO)\n'
            'if sys.argv[1] == "agent":\n'
            '  import agent\n'
            'import jax\n'
            'print(jax.devices()[0].platform)\n')
  env = {k: v for k, v in os.environ.items() if k != 'JAX_PLATFORMS'}
  runs = {how: subprocess.run([sys.executable, '-c', script, how],
                              capture_output=True, text=True, timeout=300,
                              env=env)
          for how in ('plain', 'agent')}
  for out in runs.values():
    assert out.returncode == 0 and out.stdout.strip(), out.stderr[-2000:]
  if "Unable to initialize backend 'tpu'" not in runs['plain'].stderr:
    pytest.skip('this jax install does not probe a TPU here')
  assert 'Unable to initialize backend' not in runs['agent'].stderr
