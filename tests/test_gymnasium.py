"""--suite=gymnasium: gymnasium 1.x tasks under the env protocol (spec 7.2,
3.14, 2.9) and a real training run (experiments/envs/gymnasium.py)."""

import agent  # noqa: F401  (jax compat before acme)

import json
import os
import subprocess
import sys

import gymnasium
import numpy as np
import pytest

from experiments.envs import suites
from experiments.envs.gymnasium import GymnasiumEnv
from experiments.envs.protocol import ProtocolEnv

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_discrete_task_terminates_and_seeds_through_reset():
  """CartPole-v1: Box obs -> 'vector', Discrete actions (indices); a pole
  that falls is a termination (is_last and is_terminal); the env's seed goes
  to the first reset only, so the same seed gives the same episodes."""
  env = suites.make_env('gymnasium', 'CartPole-v1', 1, seed=3)
  assert env.spaces.discrete and env.spaces.act_dim == 2
  assert env.spaces.obs == {'vector': (4,)}
  first = env.reset()
  again = suites.make_env('gymnasium', 'CartPole-v1', 1, seed=3).reset()
  other = suites.make_env('gymnasium', 'CartPole-v1', 1, seed=4).reset()
  np.testing.assert_array_equal(first['vector'], again['vector'])
  assert not np.array_equal(first['vector'], other['vector'])
  assert first['is_first'] and first['reward'] == 0
  for _ in range(500):
    obs = env.step(np.int64(0))                   # always push left: falls
    if obs['is_last']:
      break
  assert obs['is_last'] and obs['is_terminal']
  assert env.step(np.int64(0))['is_first']        # auto-reset (spec 7.2)
  env.close()


def test_time_limit_is_a_truncation_and_box_actions_are_continuous():
  """Pendulum-v1 never terminates: its TimeLimit end is is_last without
  is_terminal; its Box action is continuous ([-1, 1] mapped to [-2, 2])."""
  inner = gymnasium.make('Pendulum-v1', max_episode_steps=3)
  env = ProtocolEnv(GymnasiumEnv(inner, 'Pendulum-v1', seed=0), 1,
                    'Pendulum-v1', 0)
  assert not env.spaces.discrete and env.spaces.act_dim == 1
  env.reset()
  flags = [(o['is_last'], o['is_terminal'])
           for o in (env.step(np.array([1.0])) for _ in range(3))]
  assert flags == [(False, False), (False, False), (True, False)]
  env.close()


def test_unsupported_spaces_and_tasks_are_named():
  with pytest.raises(ValueError, match='observation space Discrete'):
    suites.make_env('gymnasium', 'FrozenLake-v1', 1, seed=0)

  class DictEnv(gymnasium.Env):
    observation_space = gymnasium.spaces.Dict({
        'pos': gymnasium.spaces.Box(-1, 1, (2,)),
        'mode': gymnasium.spaces.Discrete(3)})
    action_space = gymnasium.spaces.Discrete(2)

  with pytest.raises(ValueError, match="observation key 'mode'"):
    GymnasiumEnv(DictEnv(), 'dict-task')
  with pytest.raises(ValueError, match="Unknown gymnasium task 'Nope-v0'"):
    suites.check_task('gymnasium', 'Nope-v0')
  with pytest.raises(ValueError, match='time_limit'):
    suites.check_task('gymnasium', 'CartPole-v1', time_limit=1.0)


def test_rgb_array_frames_for_watch():
  """tools/watch.py renders gymnasium tasks through render_mode='rgb_array'."""
  from experiments.tools import watch
  env = watch.make_render_env('gymnasium', 'CartPole-v1', 1, seed=0)
  env.reset()
  frame = watch.render_frame(env)
  assert frame.ndim == 3 and frame.shape[-1] == 3 and frame.std() > 0
  env.close()


def _train_cartpole(logdir, *extra, timeout=420):
  """run_dmc.py on gymnasium's CartPole-v1, tiny model, 300 env steps."""
  out = subprocess.run(
      [sys.executable, os.path.join(REPO, 'experiments', 'run_dmc.py'),
       '--suite=gymnasium', '--task=CartPole-v1', '--size=tiny',
       '--batch_size=4', '--batch_length=8', '--replay_capacity=100000',
       '--train_ratio=16', '--action_repeat=1', '--num_envs=2',
       '--env_steps=300', '--eval_every=0', '--log_every=100', '--noreport',
       f'--logdir={logdir}', *extra],
      cwd=REPO, capture_output=True, text=True, timeout=timeout,
      env={**os.environ, 'PYTHONUNBUFFERED': '1'})
  assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-4000:]


@pytest.mark.slow
def test_gymnasium_task_trains_in_one_process(tmp_path, jax_cache_dir):
  """A real gymnasium task through run_dmc.py: updates, finite losses, an
  evaluation, flags.txt naming the suite."""
  logdir = tmp_path / 'run'
  _train_cartpole(logdir, '--eval_episodes=2', '--eval_policy=mode',
                  f'--jax_cache_dir={jax_cache_dir}')
  assert '--suite=gymnasium' in (logdir / 'flags.txt').read_text()
  rows = [json.loads(line) for line in open(logdir / 'metrics.jsonl')]
  train = [r for r in rows if r['kind'] == 'train']
  assert train[-1]['updates'] > 0 and np.isfinite(train[-1]['train/loss/total'])
  assert [r for r in rows if r['kind'] == 'eval']
  scores = [json.loads(line)['score'] for line in open(logdir / 'scores.jsonl')]
  assert scores and all(s >= 8 for s in scores)      # CartPole: >= 8 steps alive


@pytest.mark.slow
def test_gymnasium_task_trains_in_the_launchpad_layout(tmp_path):
  """The same task with --distributed (2 actor processes)."""
  logdir = tmp_path / 'mp'
  _train_cartpole(logdir, '--distributed', '--num_actors=2', '--stop_grace=20',
                  '--eval_episodes=1', '--progress_every=5', timeout=600)
  rows = [json.loads(line) for line in open(logdir / 'metrics.jsonl')]
  train = [r for r in rows if r['kind'] == 'train']
  assert train and train[-1]['updates'] > 0
  assert [json.loads(line) for line in open(logdir / 'scores.jsonl')]
