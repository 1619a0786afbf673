"""Each range rule has one home, read by the flag validators and by the
configs themselves: a RunConfig or DreamerConfig made directly (not from
flags) refuses what the flags refuse (spec 5.1, 5.8, 6.1, 7.5)."""

import pytest
from absl import flags

from agent.config import make_config
from experiments import options
from experiments.run.config import RunConfig

# Values typed from the flag rules (and spec 5.1 capacity check).
BAD_RUN = [('num_envs', 0), ('num_envs', 1001), ('env_steps', 0),
           ('eval_episodes', -1), ('eval_episodes', 1001),
           ('checkpoint_every', 0), ('log_every', 0),
           ('learner_log_every', -1), ('progress_every', 0),
           ('action_repeat', 0), ('time_limit', 0.0), ('time_limit', -1.0),
           ('chunk_length', 0)]
BAD_AGENT = [('train_ratio', 0), ('train_ratio', -1), ('batch_length', 1),
             ('batch_size', 0), ('train_fill', -1), ('seed', -3),
             ('seed', 1_000_000)]


@pytest.mark.parametrize('name, value', BAD_RUN)
def test_run_config_made_directly_refuses_out_of_range(name, value):
  with pytest.raises(ValueError, match=f'--{name} must be'):
    RunConfig(task='walker_walk', logdir='/nonexistent/x',
              **{'env_steps': 10, name: value})


@pytest.mark.parametrize('name, value', BAD_AGENT)
def test_dreamer_config_made_directly_refuses_out_of_range(name, value):
  with pytest.raises(ValueError, match=f'--{name} must be'):
    make_config(size='tiny', replay_capacity=10_000, **{name: value})


def test_capacity_check_in_the_config():
  """spec 5.1: batch_size * length <= capacity (B=16, L=65: 1040)."""
  with pytest.raises(ValueError, match='--replay_capacity 1039 must be >= '
                     'batch_size'):
    make_config(size='tiny', batch_size=16, batch_length=64,
                replay_capacity=1039)
  make_config(size='tiny', batch_size=16, batch_length=64,
              replay_capacity=1040)


@pytest.mark.parametrize('name, value', BAD_RUN + BAD_AGENT)
def test_flags_refuse_the_same_values(name, value):
  fv = flags.FlagValues()
  options.define_flags(fv)
  with pytest.raises(flags.IllegalFlagValueError, match=f'--{name}'):
    fv(['run_dmc.py', '--logdir=/tmp/x', f'--{name}={value}'])


def test_latent_store_dtype_rule_once():
  with pytest.raises(ValueError, match='latent_store_dtype must be one of'):
    make_config(size='tiny', latent_store_dtype='float16')
