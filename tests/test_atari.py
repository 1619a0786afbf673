"""Atari through ale-py (spec 7.6 Atari100K; the official atari100k env,
embodied/envs/atari.py at e3f0224): the env's semantics against a reference
played by hand on a second ALE, the action sets, lives, the frame cap, a
tiny end-to-end run with watch, the bad inputs named before anything is
written, and the report (official curves, human-normalised table)."""

import os
import sys

import numpy as np
import pytest
from PIL import Image

from experiments.envs import atari, suites
from experiments.envs.atari import AtariEnv

SMOKE = 'experiments/flags/smoke.flags'


def _reference_ale(game, seed):
  """A plain ALE set up as the official env does for ``seed``: ALE's
  random_seed and the no-op count come from one numpy generator."""
  import ale_py
  from ale_py import roms
  rng = np.random.default_rng(seed)
  ale = ale_py.ALEInterface()
  ale.setLoggerMode(ale_py.LoggerMode.Error)
  ale.setInt('random_seed', int(rng.integers(0, 2 ** 31)))
  ale.setFloat('repeat_action_probability', 0.0)
  ale.loadROM(roms.get_rom_path(game))
  return ale, rng


def _resize(frame):
  return np.asarray(Image.fromarray(frame).resize((64, 64), Image.BILINEAR))


def test_steps_match_a_hand_played_reference():
  """Reset: 0..30 no-ops, the reset frame alone (pooling buffers filled
  with it); each step: the action repeated 4 frames, rewards summed, the
  max of frames 3 and 4, resized to 64x64 RGB with Pillow."""
  seed, steps = 3, 120
  env = AtariEnv('boxing', seed=seed)
  ale, rng = _reference_ale('boxing', seed)
  actions = ale.getMinimalActionSet()
  assert len(actions) == 18
  obs = env.reset()
  ale.reset_game()
  noops = int(rng.integers(31))
  for _ in range(noops):
    ale.act(actions[0])
  assert ale.getEpisodeFrameNumber() == noops
  np.testing.assert_array_equal(obs['image'], _resize(ale.getScreenRGB()))
  assert obs['image'].dtype == np.uint8 and obs['image'].shape == (64, 64, 3)
  assert obs['is_first'] and obs['reward'] == 0
  plan = np.random.default_rng(0).integers(18, size=steps)
  total = 0.0
  for index in plan:
    obs = env.step(index)
    reward, frames = 0.0, []
    for _ in range(4):
      reward += ale.act(actions[index])
      frames.append(ale.getScreenRGB())
    assert obs['reward'] == reward
    np.testing.assert_array_equal(
        obs['image'], _resize(np.maximum(frames[-2], frames[-1])))
    total += abs(reward)
  assert total > 0            # the comparison saw rewards
  assert env.control_steps == 4 * steps    # env steps are frames


def test_noops_at_reset_vary_within_0_to_30():
  env = AtariEnv('pong', seed=0)
  counts = []
  for _ in range(12):
    env.reset()
    counts.append(env.dm_env.ale.getEpisodeFrameNumber())
  assert min(counts) >= 0 and max(counts) <= 30 and len(set(counts)) > 3
  quiet = AtariEnv('pong', seed=0, noops=0)
  quiet.reset()
  assert quiet.dm_env.ale.getEpisodeFrameNumber() == 0


def test_reset_frame_does_not_pool_with_the_last_episode():
  """The e3f0224 fix: after an episode the first image is the reset frame
  alone, not its max with the previous episode's last frame."""
  env = AtariEnv('breakout', seed=1, max_frames=40)
  env.reset()
  for _ in range(10):
    obs = env.step(1)
  assert obs['is_last']
  obs = env.step(0)
  assert obs['is_first']
  np.testing.assert_array_equal(
      obs['image'], _resize(env.dm_env.ale.getScreenRGB()))


@pytest.mark.parametrize('game, count', [('pong', 6), ('breakout', 4),
                                         ('boxing', 18), ('ms_pacman', 9)])
def test_minimal_action_sets(game, count):
  env = AtariEnv(game, seed=0)
  assert env.spaces.discrete and env.act_dim == count
  with pytest.raises(ValueError, match='outside'):
    env.step(count)


def test_lives_are_unused():
  """Losing Breakout lives (5 at the start) ends nothing: only game over."""
  env = AtariEnv('breakout', seed=0)
  env.reset()
  ale = env.dm_env.ale
  assert ale.lives() == 5
  plan = np.random.default_rng(0).integers(4, size=5000)
  for index in plan:
    obs = env.step(index)
    if ale.game_over():
      break
    assert not obs['is_last'] and not obs['is_terminal'], ale.lives()
  assert ale.lives() == 0 and obs['is_last'] and obs['is_terminal']


def test_frame_cap_truncates_without_termination():
  assert atari.MAX_FRAMES == 108_000     # 30 minutes at 60 Hz (official length)
  env = AtariEnv('pong', seed=0, max_frames=10)
  env.reset()
  flags = [env.step(0) for _ in range(3)]
  assert [bool(o['is_last']) for o in flags] == [False, False, True]
  assert not flags[-1]['is_terminal']
  assert env.control_steps == 10     # 4 + 4 + 2: the repeat stops at the cap
  assert env.step(0)['is_first']


def test_suite_wiring_and_names():
  env = suites.make_env('atari', 'atari100k_pong', 4, seed=0)
  assert env.task == 'pong' and env.action_repeat == 4
  suites.check_task('atari', 'james_bond')
  assert atari.rom_name('james_bond') == 'jamesbond'
  for game in atari.ATARI100K_GAMES:
    atari.check_game(game)                 # every benchmark ROM is shipped


def test_unknown_game_names_close_matches():
  with pytest.raises(ValueError, match=r"Unknown Atari game 'pongg'\. Did you "
                     r"mean 'pong'"):
    suites.check_task('atari', 'pongg')


def test_missing_rom_names_the_ale_py_version(monkeypatch, tmp_path):
  from ale_py import roms
  monkeypatch.setattr(roms, 'get_rom_path',
                      lambda name: tmp_path / f'{name}.bin')
  with pytest.raises(ValueError, match=r"ROM of Atari game 'pong' is missing "
                     r'.*ale-py==0\.12\.1 ships it'):
    suites.check_task('atari', 'pong')


def test_ale_import_failure_names_the_package(monkeypatch):
  monkeypatch.setitem(sys.modules, 'ale_py', None)   # import ale_py fails
  with pytest.raises(ValueError, match=r'pip install ale-py==0\.12\.1'):
    suites.check_task('atari', 'pong')


# smoke.flags' tiny settings for one Atari env (its --time_limit is dm_control's).
TINY = ['--suite=atari', '--size=tiny', '--batch_size=2', '--batch_length=8',
        '--replay_capacity=100000', '--train_ratio=16', '--action_repeat=4',
        '--num_envs=1', '--seed=0', '--eval_every=0', '--eval_episodes=0',
        '--checkpoint_every=5', '--log_every=100', '--progress_every=5',
        '--config_overrides=imag_horizon=4', '--noreport']


def _parse(args):
  from absl import flags
  from experiments import options
  fv = flags.FlagValues()
  options.define_flags(fv)
  fv(['run_dmc'] + args)
  return fv


def test_bad_game_flag_is_refused_before_anything_is_written(tmp_path):
  from absl import flags
  logdir = tmp_path / 'never'
  with pytest.raises(flags.IllegalFlagValueError,
                     match=r"--suite=atari: Unknown Atari game 'pongg'\. Did "
                     r"you mean 'pong'"):
    _parse(TINY + ['--task=pongg', f'--logdir={logdir}'])
  assert not logdir.exists()


def test_tiny_atari_run_trains_from_frames(tmp_path, jax_cache_dir):
  """Boxing (all 18 actions) through run_dmc.py's path: env steps are
  frames (agent steps x 4). About 30 s on a 2-core CPU, almost all of it
  compiling the 64x64 CNN update and watch's programs."""
  import json
  from experiments.options import experiment_from_flags
  from experiments.run_dmc import start
  logdir = str(tmp_path / 'boxing')
  fv = _parse(TINY + ['--task=boxing', '--env_steps=200', f'--logdir={logdir}',
                      f'--jax_cache_dir={jax_cache_dir}'])
  experiment, dist = experiment_from_flags(fv)
  assert dist is None
  summary = start(experiment, dist)()
  assert summary['updates'] > 0 and summary['env_steps'] >= 200
  ckpts = sorted(name for name in os.listdir(os.path.join(logdir, 'checkpoints'))
                 if name.startswith('ckpt-'))
  with open(os.path.join(logdir, 'checkpoints', ckpts[-1], 'config.json')) as f:
    saved = json.load(f)
  assert saved['spaces']['obs'] == {'image': [64, 64, 3]}
  assert saved['spaces']['act_dim'] == 18
  # The signal write-ups' learner table reads this run's own log.
  from bench import learner_rows
  rows = learner_rows.main(['--logdir', logdir]).splitlines()[2:]
  assert rows and all(row.startswith('| ') and row.count('|') == 10 for row in rows)
  # watch.py records an Atari episode and the open-loop image prediction.
  from experiments.tools import watch
  result = watch.watch(logdir, out=str(tmp_path / 'w.gif'), episodes=1,
                       max_steps=40, horizon=10)
  assert os.path.getsize(result['video']) > 1000
  assert os.path.getsize(result['openloop_image']) > 1000


def test_human_normalised_scores_use_the_published_table():
  from experiments.tools import atari_scores
  reference = atari_scores.reference_scores()
  assert sorted(reference) == sorted(
      g if g != 'james_bond' else 'jamesbond' for g in atari.ATARI100K_GAMES)
  # Typed from the published tables (random, human).
  assert reference['pong'] == (-20.7, 14.6)
  assert reference['boxing'] == (0.1, 12.1)
  assert reference['ms_pacman'] == (307.3, 6951.6)
  assert atari_scores.normalised('pong', -20.7) == 0.0
  assert atari_scores.normalised('pong', 14.6) == pytest.approx(1.0)
  assert atari_scores.normalised('boxing', 6.1) == pytest.approx(0.5)
  with pytest.raises(ValueError, match="no random / human score for Atari "
                     "game 'cartpole'"):
    atari_scores.normalised('cartpole', 1.0)


def test_atari_report_plots_against_official_curves_with_hns_table(tmp_path):
  """An Atari run's report: official DreamerV3 curves, then the HNS table
  (ours, DreamerV3, PPO; mean and median over the games)."""
  from experiments.run import rundir
  from experiments.tools import report
  assert rundir.normalize_task('atari_pong') == 'pong'
  assert rundir.normalize_task('atari100k_ms_pacman') == 'ms_pacman'
  path = report.anchor_file(False, 'atari')
  assert path.endswith('atari100k-dreamerv3.json.gz')
  anchors = report.load_anchors(path)
  assert len(anchors) == 26 and anchors['pong'].ys.shape[0] == 5
  logdir = str(tmp_path / 'run')
  for step in range(40_000, 400_001, 40_000):
    rundir.append_score(logdir, 'pong', step, -21.0 + step / 40_000, 0)
    rundir.append_score(logdir, 'boxing', step, 0.1 + step / 100_000, 0)
  out = str(tmp_path / 'report.png')
  table = report.make_report(logdir, out, anchors_path=path)
  assert os.path.getsize(out) > 10_000
  # Last-5 means: pong (-15-14-13-12-11)/5 = -13, boxing 0.1+(2.4+...+4)/5 = 3.3.
  pong_hns = (-13.0 + 20.7) / 35.3
  boxing_hns = (3.3 - 0.1) / 12.0
  lines = {line.split('|')[1].strip(): line for line in table.splitlines()
           if line.startswith('|')}
  assert f'{pong_hns:.3f}' in lines['pong']
  assert f'{boxing_hns:.3f}' in lines['boxing']
  mean_row = [v.strip() for v in lines['**mean** (2 games)'].split('|')]
  assert mean_row[4] == f'{(pong_hns + boxing_hns) / 2:.3f}'
  official = (anchors['pong'].at(400_000)[1] + 20.7) / 35.3
  assert lines['pong'].split('|')[5].strip() == f'{official:.3f}'
  assert 'PPO HNS' in table and 'DreamerV3 HNS' in table
