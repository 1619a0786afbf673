"""Shared fixtures. `import agent` first: it installs the jax aliases acme needs."""
import agent  # noqa: F401
import jax
import pytest

from agent import config as config_lib
from agent import learning, networks, synthetic


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
