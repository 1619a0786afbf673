"""Any vector dm_env, gym 0.26 tasks and discrete actions at the env boundary
(experiments/envs/protocol.py, experiments/envs/suites.py; spec 7.2, 7.4, 3.14, 2.9)."""

import agent  # noqa: F401  (jax compat before acme)

import dm_env
import numpy as np
import pytest
from dm_env import specs

from agent.types import EnvSpaces
from experiments.envs import suites, vector
from experiments.envs.observations import ObservationError
from experiments.envs.protocol import ProtocolEnv


class ToyEnv(dm_env.Environment):
  """A user's own dm_env: obs dict (or one array), episodes of `length` steps
  ending by termination (or truncation); `bad_obs` corrupts one observation."""

  def __init__(self, seed=0, length=4, discrete=False, obs_spec=None,
               truncate=False, bad_obs=None, action_spec=None):
    self.seed, self.length, self.truncate = seed, length, truncate
    self.discrete, self.bad_obs = discrete, bad_obs
    self._obs_spec = obs_spec or {
        'pos': specs.Array((2,), np.float64), 'speed': specs.Array((), np.float32),
        'arm': {'angle': specs.Array((3,), np.float32)}}
    self._action_spec = action_spec or (
        specs.DiscreteArray(3) if discrete else
        specs.BoundedArray((2,), np.float32, [-2.0, 0.0], [2.0, 10.0]))
    self.actions, self.t = [], 0

  def _obs(self):
    def fill(spec):
      if isinstance(spec, dict):
        return {k: fill(v) for k, v in spec.items()}
      return np.full(spec.shape, self.t + self.seed, spec.dtype)
    obs = fill(self._obs_spec)
    if self.bad_obs == 'nan' and self.t == 2:
      obs['pos'] = np.array([0.0, np.nan])
    if self.bad_obs == 'shape' and self.t == 2:
      obs['pos'] = np.zeros(3)
    return obs

  def reset(self):
    self.t = 0
    return dm_env.restart(self._obs())

  def step(self, action):
    self.actions.append(np.array(action, copy=True))
    self.t += 1
    if self.t >= self.length:
      end = dm_env.truncation if self.truncate else dm_env.termination
      return end(1.0, self._obs())
    return dm_env.transition(1.0, self._obs())

  def observation_spec(self):
    return self._obs_spec

  def action_spec(self):
    return self._action_spec


def test_custom_dm_env_protocol_continuous():
  """Spec 7.2/7.4/2.9: dict obs flattened to float32 vectors, actions clipped then
  mapped to the spec bounds, termination -> is_terminal, truncation -> not."""
  env = ProtocolEnv(ToyEnv(seed=1), action_repeat=1, name='toy')
  assert env.spaces == EnvSpaces(obs={'pos': (2,), 'speed': (1,), 'arm_angle': (3,)},
                                 act_dim=2)
  obs = env.reset()
  assert obs['is_first'] and obs['reward'] == 0 and obs['pos'].dtype == np.float32
  assert obs['arm_angle'].shape == (3,) and obs['speed'].shape == (1,)
  env.step(np.array([5.0, 0.0]))
  np.testing.assert_allclose(env.dm_env.actions[-1], [2.0, 5.0])  # clip, then map
  for _ in range(3):
    obs = env.step(np.zeros(2))
  assert obs['is_last'] and obs['is_terminal'] and obs['reward'] == 1.0
  assert env.step(np.zeros(2))['is_first']                          # auto-reset
  trunc = ProtocolEnv(ToyEnv(length=2, truncate=True), 1, 'toy')
  trunc.reset()
  trunc.step(np.zeros(2))
  obs = trunc.step(np.zeros(2))
  assert obs['is_last'] and not obs['is_terminal']
  with pytest.raises(ValueError, match='non-finite'):
    env.step(np.array([np.nan, 0.0]))


def test_custom_dm_env_discrete_and_single_array():
  """Spec 3.14: a DiscreteArray gives discrete spaces and index actions; an integer
  BoundedArray is offset by its minimum; a single-array obs is key 'vector'."""
  spec = specs.BoundedArray((4,), np.float32, -1, 1)
  env = ProtocolEnv(ToyEnv(discrete=True, obs_spec=spec), action_repeat=2, name='toy')
  assert env.spaces == EnvSpaces(obs={'vector': (4,)}, act_dim=3, discrete=True)
  env.reset()
  env.step(2)
  assert [int(a) for a in env.dm_env.actions] == [2, 2]             # repeat 2
  for bad in (3, -1, 1.5, np.array([0, 1])):
    with pytest.raises(ValueError, match='index'):
      env.step(bad)
  offset = ProtocolEnv(ToyEnv(action_spec=specs.BoundedArray((), np.int32, 1, 4)),
                       1, 'toy')
  assert offset.spaces.discrete and offset.act_dim == 4
  offset.reset()
  offset.step(0)
  assert int(offset.dm_env.actions[-1]) == 1
  venv = vector.VectorEnv('toy', 2, 1, env_factory=lambda s: ToyEnv(s, discrete=True))
  venv.reset()
  venv.step(np.array([0, 2]))
  with pytest.raises(ValueError, match=r'envs \[1\]'):
    venv.step(np.array([0, 3]))
  with pytest.raises(ValueError, match='indices'):
    venv.step(np.zeros((2, 3)))


def test_bad_observations_name_the_key():
  """Spec 2.9 / 2.10: a uint8 (H, W, C) image is an image key; a float
  image, non-numeric and bad-shaped or non-finite obs: clear errors."""
  image = {'pixels': specs.Array((64, 64, 3), np.uint8)}
  assert ProtocolEnv(ToyEnv(obs_spec=image), 1, 'toy').spaces.image_keys == ('pixels',)
  with pytest.raises(ObservationError, match="'pixels'.*image of dtype float32"):
    ProtocolEnv(ToyEnv(obs_spec={'pixels': specs.Array((64, 64, 3), np.float32)}),
                1, 'toy')
  with pytest.raises(ObservationError, match="'frame'.*image"):
    ProtocolEnv(ToyEnv(obs_spec={'frame': specs.Array((8, 8), np.uint8)}), 1, 'toy')
  with pytest.raises(ObservationError, match="'name'.*not a number"):
    ProtocolEnv(ToyEnv(obs_spec={'name': specs.Array((), np.object_)}), 1, 'toy')
  with pytest.raises(ValueError, match='not supported'):
    ProtocolEnv(ToyEnv(action_spec=specs.BoundedArray((2, 2), np.float32, -1, 1)),
                1, 'toy')
  for kind, match in (('nan', "'pos' has non-finite"), ('shape', "'pos' has shape")):
    env = ProtocolEnv(ToyEnv(bad_obs=kind), 1, 'toy')
    env.reset()
    env.step(np.zeros(2))
    with pytest.raises(ObservationError, match=match):
      env.step(np.zeros(2))


def test_gym_cartpole_and_pendulum_episodes():
  """gym 0.26 via acme's GymWrapper: CartPole falls -> is_terminal (spec 7.2),
  Pendulum's 200-step TimeLimit -> is_last without is_terminal; seeds repeat."""
  cart = suites.make_env('gym', 'CartPole-v1', 1, seed=3)
  assert cart.spaces == EnvSpaces(obs={'vector': (4,)}, act_dim=2, discrete=True)
  first = cart.reset()['vector']
  np.testing.assert_array_equal(first, suites.make_env('gym', 'CartPole-v1', 1, 3)
                                .reset()['vector'])
  for t in range(500):
    obs = cart.step(1)                       # always push right: falls fast
    if obs['is_last']:
      break
  assert obs['is_terminal'] and t < 100
  assert cart.step(0)['is_first']
  pend = suites.make_env('gym', 'Pendulum-v1', 1, seed=0)
  assert pend.spaces == EnvSpaces(obs={'vector': (3,)}, act_dim=1)
  np.testing.assert_array_equal(pend.action_low, [-2.0])
  pend.reset()
  steps = 0
  while True:
    obs = pend.step(np.array([0.5]))
    steps += 1
    if obs['is_last']:
      break
  assert steps == 200 and not obs['is_terminal'] and obs['reward'] < 0


def test_unknown_tasks_and_suites():
  with pytest.raises(ValueError, match="Unknown gym task 'CartPole-v9'.*CartPole-v1"):
    suites.check_task('gym', 'CartPole-v9')
  with pytest.raises(ValueError, match='unknown suite'):
    suites.check_task('procgen', 'coinrun')
  # A typo gets "did you mean" with the close names, in every suite.
  with pytest.raises(ValueError, match="'CartPol-v1'. Did you mean 'CartPole-v1'"):
    suites.check_task('gym', 'CartPol-v1')
  with pytest.raises(ValueError, match="'Pendulm-v1'. Did you mean 'Pendulum-v1'"):
    suites.check_task('gymnasium', 'Pendulm-v1')
  with pytest.raises(ValueError, match="'walker_wlak'. Did you mean 'walker_walk'"):
    suites.check_task('dmc', 'walker_wlak')
  with pytest.raises(ValueError) as err:                 # nothing close: no guess
    suites.check_task('dmc', 'xyz')
  assert 'Did you mean' not in str(err.value)
  with pytest.raises(ValueError, match='time_limit'):
    suites.make_env('gym', 'CartPole-v1', 1, 0, time_limit=1.0)
  with pytest.raises(ValueError, match='not a dm_env.Environment'):
    suites.make_env('custom', 'x', 1, 0, env_factory=lambda seed: object())
