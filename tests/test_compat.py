"""The jax compat module restores exactly the names acme 0.4.0 uses."""
import jax
import jax.numpy as jnp

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
