"""Tests of experiments/envs/dmc.py and vector.py against real dm_control (spec 7.1-7.5, 7.7, 2.15)."""

import agent  # noqa: F401  (project rule: before anything that may import acme)
import dm_env
import numpy as np
import pytest

from agent.types import EnvSpaces
from experiments.envs import dmc, vector  # first: picks MuJoCo's GL backend
from dm_control import suite  # noqa: E402

# cartpole: control timestep 0.01 s, so time_limit 0.1 s = 10 control steps.
SHORT = 0.1


class _Recorder:
  """Proxy around a dm_control env that records the actions it receives."""

  def __init__(self, env, step_fn=None):
    self._env = env
    self.actions = []
    self._step_fn = step_fn

  def step(self, action):
    self.actions.append(np.array(action, copy=True))
    if self._step_fn is not None:
      return self._step_fn(self._env, action)
    return self._env.step(action)

  def __getattr__(self, name):
    return getattr(self._env, name)


# --- task names (spec 7.5, 7.7) ------------------------------------------------


def test_proprio_task_list_and_parse():
  """Spec 7.5/7.7: the 18 DMC-proprio tasks all resolve; underscore domains work."""
  assert len(dmc.DMC_PROPRIO_TASKS) == 18
  assert len(set(dmc.DMC_PROPRIO_TASKS)) == 18
  assert 'quadruped_walk' not in dmc.DMC_PROPRIO_TASKS
  for name in dmc.DMC_PROPRIO_TASKS:
    domain, task = dmc.parse_task(name)
    assert (domain, task) in suite.ALL_TASKS
    assert f'{domain}_{task}' == name
  assert dmc.parse_task('walker_walk') == ('walker', 'walk')
  assert dmc.parse_task('ball_in_cup_catch') == ('ball_in_cup', 'catch')
  assert dmc.parse_task('cartpole_swingup_sparse') == ('cartpole', 'swingup_sparse')
  assert dmc.parse_task('point_mass_easy') == ('point_mass', 'easy')
  assert dmc.parse_task('dmc_walker_walk') == ('walker', 'walk')  # anchor naming
  assert dmc.parse_task('cup_catch') == ('ball_in_cup', 'catch')  # reference alias
  for domain, task in suite.ALL_TASKS:
    assert dmc.parse_task(f'{domain}_{task}') == (domain, task)


def test_unknown_task_lists_valid_tasks():
  """Spec 7.5: an unknown task name fails loudly and lists the valid names."""
  with pytest.raises(ValueError) as err:
    dmc.parse_task('walker_fly')
  msg = str(err.value)
  assert "'walker_fly'" in msg
  for name in ('walker_walk', 'ball_in_cup_catch', 'cartpole_swingup_sparse'):
    assert name in msg
  with pytest.raises(ValueError, match='Valid tasks'):
    dmc.DMCEnv('not_a_task')


# --- observations and reset (spec 7.5, 7.2, 2.15) -------------------------------


def test_obs_keys_dtypes_and_spaces():
  """Spec 7.5: each dm_control key is a float32 vector; scalars become (1,)."""
  env = dmc.DMCEnv('walker_walk', seed=0)
  obs = env.reset()
  assert env.spaces == EnvSpaces(
      obs={'orientations': (14,), 'height': (1,), 'velocity': (9,)}, act_dim=6)
  assert set(obs) == {'orientations', 'height', 'velocity', 'reward', 'is_first',
                      'is_last', 'is_terminal'}
  for key, shape in env.spaces.obs.items():
    assert obs[key].dtype == np.float32 and obs[key].shape == shape
  assert obs['reward'].dtype == np.float32 and obs['reward'].shape == ()
  for key in ('is_first', 'is_last', 'is_terminal'):
    assert obs[key].dtype == np.bool_ and obs[key].shape == ()
  obs = env.step(np.zeros(6))
  for key, shape in env.spaces.obs.items():
    assert obs[key].dtype == np.float32 and obs[key].shape == shape


def test_reset_semantics():
  """Spec 7.2 / 2.15: a reset obs has reward 0, is_first, not last or terminal."""
  env = dmc.DMCEnv('cartpole_swingup', seed=1)
  obs = env.reset()
  assert obs['reward'] == 0 and obs['is_first']
  assert not obs['is_last'] and not obs['is_terminal']
  obs = env.step(np.ones(1))
  assert not obs['is_first'] and obs['reward'] > 0
  # A step before any reset is a reset (the driver's initial reset=True).
  fresh = dmc.DMCEnv('cartpole_swingup', seed=1)
  obs = fresh.step(np.ones(1))
  assert obs['is_first'] and obs['reward'] == 0 and fresh.control_steps == 0


def test_same_seed_same_episode():
  """Spec 7.5: task_kwargs random=seed makes the env reproducible."""
  a = dmc.DMCEnv('walker_walk', seed=7).reset()
  b = dmc.DMCEnv('walker_walk', seed=7).reset()
  c = dmc.DMCEnv('walker_walk', seed=8).reset()
  np.testing.assert_array_equal(a['orientations'], b['orientations'])
  assert not np.array_equal(a['orientations'], c['orientations'])


# --- action repeat and episode ends (spec 7.5, 7.2) -------------------------------


def test_action_repeat_sums_rewards_like_raw_env():
  """Spec 7.5: one agent step = 2 dm_control steps with summed reward."""
  env = dmc.DMCEnv('walker_walk', action_repeat=2, seed=3)
  raw = suite.load('walker', 'walk', task_kwargs={'random': 3})
  obs, ts = env.reset(), raw.reset()
  np.testing.assert_array_equal(obs['velocity'], ts.observation['velocity'].astype(np.float32))
  rng = np.random.default_rng(0)
  for _ in range(10):
    action = rng.uniform(-1, 1, 6)
    obs = env.step(action)
    r1 = raw.step(action).reward
    ts = raw.step(action)
    np.testing.assert_allclose(obs['reward'], np.float32(r1 + ts.reward), rtol=1e-6)
    for key in ('orientations', 'velocity'):
      np.testing.assert_array_equal(obs[key], ts.observation[key].astype(np.float32))
    np.testing.assert_array_equal(obs['height'], np.float32([ts.observation['height']]))
  assert env.control_steps == 20


def test_time_limit_is_last_not_terminal_and_next_step_resets():
  """Spec 7.2/7.5: DMC time limit gives is_last and not is_terminal; then a reset."""
  env = dmc.DMCEnv('cartpole_swingup', action_repeat=2, seed=0, time_limit=SHORT)
  env.reset()
  flags = [env.step(np.zeros(1)) for _ in range(5)]  # 10 control steps
  assert [bool(o['is_last']) for o in flags] == [False] * 4 + [True]
  assert not any(o['is_terminal'] for o in flags)
  after = env.step(np.zeros(1))
  assert after['is_first'] and after['reward'] == 0 and not after['is_last']
  assert env.control_steps == 10


def test_full_dmc_episode_is_500_agent_steps():
  """Spec 7.5: a DMC episode is 1000 env steps = 500 agent steps at repeat 2."""
  env = dmc.DMCEnv('cartpole_balance', action_repeat=2, seed=0)
  env.reset()
  for i in range(1, 501):
    obs = env.step(np.zeros(1))
    assert bool(obs['is_last']) == (i == 500)
    assert not obs['is_terminal']  # these tasks never terminate (spec 7.5)


def test_action_repeat_stops_early_at_episode_end():
  """Spec 7.5: the repeat stops at is_last; the last agent step is shorter."""
  env = dmc.DMCEnv('cartpole_swingup', action_repeat=3, seed=0, time_limit=SHORT)
  env.reset()
  out = [env.step(np.zeros(1)) for _ in range(4)]  # 3 + 3 + 3 + 1 control steps
  assert out[-1]['is_last'] and not any(o['is_last'] for o in out[:-1])
  assert env.control_steps == 10


def test_discount_zero_is_terminal_and_stops_repeat():
  """Spec 7.2: is_terminal = (discount == 0); spec 7.5: the repeat stops there."""
  env = dmc.DMCEnv('cartpole_swingup', action_repeat=4, seed=0)
  env.reset()

  def terminate(inner, action):
    ts = inner.step(action)
    return dm_env.termination(reward=0.5, observation=ts.observation)

  env._env = _Recorder(env._env, terminate)
  obs = env.step(np.zeros(1))
  assert obs['is_terminal'] and obs['is_last']
  assert obs['reward'] == np.float32(0.5)
  assert len(env._env.actions) == 1  # stopped after the first of 4 repeats


# --- action handling (spec 7.4) ------------------------------------------------


def test_actions_clipped_then_mapped_for_the_env():
  """Spec 7.4: ClipAction then NormalizeAction; the env sees the clipped action."""
  env = dmc.DMCEnv('walker_walk', seed=0)
  env.reset()
  env._env = _Recorder(env._env)
  action = np.array([5.0, -7.0, 0.5, -0.25, 1.0, -1.0])
  env.step(action)
  sent = env._env.actions
  assert len(sent) == 2  # repeat 2: the same action twice
  for a in sent:
    np.testing.assert_allclose(a, [1.0, -1.0, 0.5, -0.25, 1.0, -1.0])
  assert action[0] == 5.0  # the caller's (replay's) copy is untouched
  # Mapping [-1, 1] -> [low, high] for a non-symmetric box.
  env._actions.low, env._actions.high = np.full(6, 0.0), np.full(6, 4.0)
  np.testing.assert_allclose(env.env_action([-1, 1, 0, 3, -3, 0.5]),
                             [0, 4, 2, 4, 0, 3])


def test_bad_actions_raise_value_error():
  """Spec 7.4: NaN/inf or wrongly shaped actions are rejected with a clear error."""
  env = dmc.DMCEnv('walker_walk', seed=0)
  env.reset()
  with pytest.raises(ValueError, match='non-finite'):
    env.step(np.array([0, 0, np.nan, 0, 0, 0]))
  with pytest.raises(ValueError, match='non-finite'):
    env.step(np.array([0, 0, 0, 0, 0, np.inf]))
  with pytest.raises(ValueError, match=r'shape \(5,\), expected \(6,\)'):
    env.step(np.zeros(5))
  with pytest.raises(ValueError, match='shape'):
    env.step(np.zeros((1, 6)))
  with pytest.raises(ValueError, match='numeric'):
    env.step(np.array(['a'] * 6))
  with pytest.raises(ValueError, match='action_repeat'):
    dmc.DMCEnv('walker_walk', action_repeat=0)


# --- vector env (spec 7.1, 7.2, Algorithm K) -----------------------------------------


def test_vector_env_batches_and_seeds():
  """Spec 7.1: lock-step batch with leading [N]; env i seeded seed*1000 + i."""
  venv = vector.VectorEnv('walker_walk', num_envs=3, action_repeat=2, seed=2)
  obs = venv.reset().observation
  assert obs['orientations'].shape == (3, 14) and obs['height'].shape == (3, 1)
  assert obs['orientations'].dtype == np.float32
  assert obs['reward'].shape == (3,) and obs['reward'].dtype == np.float32
  assert obs['is_first'].all() and not obs['is_last'].any()
  assert (obs['reward'] == 0).all()
  assert [e.seed for e in venv.envs] == [2000, 2001, 2002]
  single = dmc.DMCEnv('walker_walk', seed=2001).reset()
  np.testing.assert_array_equal(obs['orientations'][1], single['orientations'])
  assert not np.array_equal(obs['orientations'][0], obs['orientations'][1])
  obs = venv.step(np.zeros((3, 6))).observation
  assert not obs['is_first'].any()
  assert venv.agent_steps == 6 and venv.env_steps == 12
  with pytest.raises(ValueError, match='shape'):
    venv.step(np.zeros((2, 6)))
  with pytest.raises(ValueError, match=r'envs \[1\].*non-finite'):
    venv.step(np.array([[0.0] * 6, [np.nan] * 6, [0.0] * 6]))
  with pytest.raises(ValueError, match=r'envs \[0, 2\].*non-finite'):
    venv.step(np.array([[np.inf] * 6, [0.0] * 6, [np.nan] * 6]))
  assert venv.agent_steps == 6          # a refused batch steps no env


def test_vector_env_num_envs_validation():
  """Spec 7.5: num_envs must be a positive integer."""
  for bad in (0, -1, 1.5, True, 1001):
    with pytest.raises(ValueError, match='num_envs'):
      vector.VectorEnv('cartpole_swingup', num_envs=bad)


def test_vector_env_resets_is_last_envs_on_next_step():
  """Spec 7.2 / Algorithm K: envs whose obs was is_last are reset, the others step."""
  venv = vector.VectorEnv('cartpole_swingup', num_envs=3, action_repeat=2, seed=0,
                        time_limit=SHORT)  # 5 agent steps per episode
  venv.reset()
  act = np.zeros((3, 1))
  venv.step(act)
  obs = venv.step(act, reset=np.array([True, False, False])).observation  # desync env 0
  assert obs['is_first'].tolist() == [True, False, False]
  for _ in range(3):
    obs = venv.step(act).observation
  assert obs['is_last'].tolist() == [False, True, True]
  obs = venv.step(act).observation
  assert obs['is_first'].tolist() == [False, True, True]
  assert obs['reward'][1:].tolist() == [0.0, 0.0] and obs['reward'][0] > 0
  assert not obs['is_last'].any()  # env 0 is at agent step 4 of 5
  obs = venv.step(act).observation
  assert obs['is_last'].tolist() == [True, False, False]  # env 0 ends 2 steps later
  obs = venv.step(act).observation
  assert obs['is_first'].tolist() == [True, False, False]
  assert venv.agent_steps == 3 * 9 and venv.env_steps == 2 * 3 * 9


def test_episode_tracker_scores_and_lengths():
  """Spec 7.7: episode score = return from is_first to is_last; length counts the first obs."""
  venv = vector.VectorEnv('cartpole_swingup', num_envs=2, action_repeat=2, seed=0,
                        time_limit=SHORT)
  tracker = vector.EpisodeTracker(2)
  obs = venv.reset().observation
  assert tracker.update(obs) == []
  rewards = [obs['reward'].astype(np.float64)]
  finished = []
  for _ in range(5):
    obs = venv.step(np.ones((2, 1))).observation
    rewards.append(obs['reward'].astype(np.float64))
    finished += tracker.update(obs, env_step=venv.env_steps)
  assert [e.env_index for e in finished] == [0, 1]
  for e in finished:
    assert e.length == 6 and e.env_step == venv.env_steps
    assert e.score == pytest.approx(sum(r[e.env_index] for r in rewards))
  assert tracker.update(venv.step(np.ones((2, 1))).observation) == []  # new episodes start
  with pytest.raises(ValueError, match='is_first'):
    vector.EpisodeTracker(1).update({'reward': [1.0], 'is_first': [False],
                                   'is_last': [False]})
