"""Crafter (Hafner 2021) through ``--suite=crafter``: the official env
semantics (64x64x3 uint8 image, 17 discrete actions, reward = achievement
unlocks + health change / 10, a 10000-step cap, death a termination), the
achievements channel to scores.jsonl (never an observation), the bad inputs
(unknown task, action repeat, missing package), each refused before anything
is written, and a tiny end-to-end run of experiments/run_dmc.py."""

import agent  # noqa: F401  (jax compat before acme)

import json
import os
import subprocess
import sys

import numpy as np
import pytest
from absl import flags

from experiments import options
from experiments.envs import crafter as crafter_env
from experiments.envs import suites
from experiments.envs.vector import VectorEnv
from experiments.run import env_loop

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# The Crafter paper's 22 achievements (Hafner 2021, Figure 4 / Appendix).
ACHIEVEMENTS = (
    'collect_coal', 'collect_diamond', 'collect_drink', 'collect_iron',
    'collect_sapling', 'collect_stone', 'collect_wood', 'defeat_skeleton',
    'defeat_zombie', 'eat_cow', 'eat_plant', 'make_iron_pickaxe',
    'make_iron_sword', 'make_stone_pickaxe', 'make_stone_sword',
    'make_wood_pickaxe', 'make_wood_sword', 'place_furnace', 'place_plant',
    'place_stone', 'place_table', 'wake_up')


def _episode(env, actions):
  """Steps ``env`` (a ProtocolEnv) from a reset with ``actions`` (cycled)
  until is_last; returns the obs list."""
  out = [env.reset()]
  i = 0
  while not out[-1]['is_last']:
    out.append(env.step(actions[i % len(actions)]))
    i += 1
  return out


def test_spaces_and_observation_are_the_official():
  env = suites.make_env('crafter', 'reward', 1, seed=0)
  assert env.spaces.obs == {'image': (64, 64, 3)}
  assert env.discrete and env.act_dim == 17
  obs = env.reset()
  assert obs['image'].dtype == np.uint8 and obs['image'].shape == (64, 64, 3)
  assert set(obs) == {'image', 'reward', 'is_first', 'is_last', 'is_terminal'}
  assert obs['is_first'] and obs['reward'] == 0
  assert crafter_env.EPISODE_LENGTH == 10000
  assert env.dm_env._env._length == 10000    # the cap crafter.Env enforces


def test_reward_is_unlocks_plus_health_change_and_death_terminates():
  """Our reward against crafter's own accounting of the same steps: +1 on a
  step with a first-time unlock, plus (health - previous health) / 10; the
  noreward task gives 0 on the same actions; dying is is_terminal."""
  env = suites.make_env('crafter', 'reward', 1, seed=3)
  quiet = suites.make_env('crafter', 'noreward', 1, seed=3)
  inner = env.dm_env._env
  rng = np.random.default_rng(0)
  obs, qobs = env.reset(), quiet.reset()
  health, seen, steps = inner._player.health, set(), 0
  while not obs['is_last']:
    action = int(rng.integers(17))
    obs = env.step(action)
    if not qobs['is_last']:
      qobs = quiet.step(action)
      assert qobs['reward'] == 0.0
    steps += 1
    done = {k for k, v in inner._player.achievements.items() if v > 0}
    expected = (inner._player.health - health) / 10 + (1.0 if done - seen else 0.0)
    health, seen = inner._player.health, done
    assert obs['reward'] == pytest.approx(expected, abs=1e-6), steps
  assert steps < 10000 and inner._player.health <= 0
  assert obs['is_terminal']
  stats = env.episode_stats()['achievements']
  assert tuple(sorted(stats)) == ACHIEVEMENTS
  assert {k for k, v in stats.items() if v > 0} == seen
  assert env.step(0)['is_first']               # auto-reset after is_last


def test_the_length_cap_is_a_truncation():
  """At crafter's length the episode ends without is_terminal (spec 7.2);
  the cap is shortened on the inner env only to keep the test fast."""
  env = suites.make_env('crafter', 'reward', 1, seed=0)
  env.dm_env._env._length = 5
  obs = _episode(env, [0])                     # noop: the player survives
  assert len(obs) == 6 and obs[-1]['is_last'] and not obs[-1]['is_terminal']


def test_achievements_reach_the_episode_not_the_observation():
  """EpisodeObserver attaches each finished episode's achievements (read
  from the env before its reset); the batched observation has no such key."""
  envs = VectorEnv('reward', 2, action_repeat=1, seed=0, suite='crafter')
  got = []
  observer = env_loop.EpisodeObserver(2, on_episode=got.append)
  ts = envs.reset()
  observer.observe_first(envs, ts)
  rng = np.random.default_rng(1)
  while not got:
    ts = envs.step(rng.integers(0, 17, size=2))
    assert set(ts.observation) == {'image', 'reward', 'is_first', 'is_last',
                                   'is_terminal'}
    observer.observe(envs, ts)
  ep = got[0]
  counts = ep.stats['achievements']
  assert tuple(sorted(counts)) == ACHIEVEMENTS
  assert counts == envs.envs[ep.env_index].episode_stats()['achievements']
  assert all(isinstance(v, int) and v >= 0 for v in counts.values())


def _parse(*argv):
  fv = flags.FlagValues()
  options.define_flags(fv)
  fv(['run_dmc.py', '--suite=crafter', '--logdir=/tmp/never', *argv])
  return fv


def test_unknown_task_names_the_valid_ones():
  with pytest.raises(flags.IllegalFlagValueError,
                     match=r"--task .*'rewards'.*Valid tasks: reward, noreward"):
    _parse('--task=rewards', '--action_repeat=1')
  with pytest.raises(ValueError, match='Valid tasks: reward, noreward'):
    suites.make_env('crafter', 'walker_walk', 1, seed=0)


def test_action_repeat_other_than_one_is_refused():
  with pytest.raises(flags.IllegalFlagValueError, match='--action_repeat must be 1'):
    _parse('--task=reward', '--action_repeat=2')
  assert _parse('--task=reward', '--action_repeat=1').suite == 'crafter'


def test_a_missing_crafter_package_says_what_to_install(monkeypatch):
  monkeypatch.setitem(sys.modules, 'crafter', None)   # import raises ImportError
  with pytest.raises(ImportError, match=r'pip install crafter==1\.8\.3'):
    crafter_env.import_crafter()
  with pytest.raises(flags.IllegalFlagValueError,
                     match=r'--suite=crafter needs the crafter package'):
    _parse('--task=reward', '--action_repeat=1')


def test_bad_crafter_flags_write_nothing(tmp_path):
  logdir = tmp_path / 'never'
  out = subprocess.run(
      [sys.executable, os.path.join(REPO, 'experiments', 'run_dmc.py'),
       '--suite=crafter', '--task=score', f'--logdir={logdir}'],
      cwd=REPO, capture_output=True, text=True, timeout=300)
  assert out.returncode != 0
  assert 'Valid tasks: reward, noreward' in out.stderr
  assert not logdir.exists()


def test_flagfile_is_the_official_crafter_config():
  """Spec 7.6 ("Crafter (Fig. 6 only): HEAD steps 1.1e6, envs 1, RR 512")
  and the official config's defaults: size200m, B16 x T64, no repeat."""
  fv = _parse('--flagfile=' + os.path.join(REPO, 'experiments', 'flags',
                                           'crafter.flags'))
  assert (fv.suite, fv.task) == ('crafter', 'reward')
  assert fv.env_steps == 1_100_000 and fv.num_envs == 1
  assert fv.train_ratio == 512 and fv.action_repeat == 1
  assert fv.size == 'size200m'
  assert (fv.batch_size, fv.batch_length) == (16, 64)
  assert fv.eval_episodes == 0

def test_episode_stats_cannot_overwrite_the_score_keys(tmp_path):
  from experiments.run import rundir
  with pytest.raises(ValueError, match=r"\['score'\] clash"):
    rundir.append_score(str(tmp_path), 'reward', 1, 1.0, 0, {'score': 3})
  assert not (tmp_path / 'scores.jsonl').exists()
  rundir.append_score(str(tmp_path), 'reward', 1, 1.0, 0, {'achievements': {}})
  with open(tmp_path / 'scores.jsonl') as f:
    assert json.loads(f.read()) == {'task': 'reward', 'env_step': 1,
                                    'score': 1.0, 'seed': 0, 'achievements': {}}

def _short_crafter(seed):
  """Crafter's reward task with its length cap cut to 60 steps (the inner
  crafter.Env's own cap), so that episodes end within a tiny budget."""
  env = crafter_env.CrafterEnv('reward', seed)
  env._env._length = 60
  return env


def test_tiny_run_writes_achievements_to_scores(tmp_path, jax_cache_dir):
  """A tiny model trained through ``run_dmc.train`` on Crafter: every
  finished episode's achievements (the 22 counts) reach scores.jsonl. About
  20 s on a 2-core CPU, almost all of it compiling the 64x64 CNN update."""
  from experiments.run_dmc import train
  logdir = tmp_path / 'run'
  summary = train(_short_crafter, task='crafter_reward', logdir=str(logdir),
                  size='tiny', batch_size=2, batch_length=8, num_envs=2,
                  env_steps=200, train_ratio=2, action_repeat=1,
                  replay_capacity=10000, eval_episodes=0, log_every=100,
                  jax_cache_dir=jax_cache_dir, report=False)
  assert summary['updates'] > 0
  with open(logdir / 'scores.jsonl') as f:
    rows = [json.loads(line) for line in f]
  assert len(rows) >= 2, rows                 # 2 envs x 100 steps, cap 60
  for row in rows:
    assert tuple(sorted(row['achievements'])) == ACHIEVEMENTS, row
    assert all(isinstance(v, int) and v >= 0
               for v in row['achievements'].values()), row
    unlocked = sum(v > 0 for v in row['achievements'].values())
    # Each step with a first unlock adds 1; health changes add at most
    # (9 - 0) / 10 in size over an episode (health lies in 0..9).
    assert unlocked - 1 - 0.9 - 1e-4 <= row['score'] <= unlocked + 0.9 + 1e-4, row


def test_watch_records_a_crafter_run_and_its_open_loop(tmp_path, jax_cache_dir):
  """A tiny --suite=crafter run through run_dmc.py's flag path, then
  watch.py on its checkpoint: the episode video (crafter's 256x256 view)
  and the open-loop image prediction. About 30 s on a 2-core CPU, almost
  all of it compiling."""
  from experiments.options import experiment_from_flags
  from experiments.run_dmc import start
  from experiments.tools import watch
  logdir = str(tmp_path / 'crafter')
  fv = _parse('--task=reward', '--action_repeat=1', '--size=tiny',
              '--batch_size=2', '--batch_length=8', '--train_ratio=16',
              '--num_envs=1', '--env_steps=200', '--replay_capacity=10000',
              '--eval_every=0', '--eval_episodes=0', '--checkpoint_every=5',
              '--log_every=100', '--config_overrides=imag_horizon=4',
              '--noreport', f'--logdir={logdir}', f'--jax_cache_dir={jax_cache_dir}')
  experiment, dist = experiment_from_flags(fv)
  summary = start(experiment, dist)()
  assert summary['updates'] > 0
  result = watch.watch(logdir, out=str(tmp_path / 'w.gif'), episodes=1,
                       max_steps=40, horizon=10)
  assert os.path.getsize(result['video']) > 1000
  assert os.path.getsize(result['openloop_image']) > 1000
