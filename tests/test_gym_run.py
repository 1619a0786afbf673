"""Discrete actions end to end on a real gym task, the env-factory entry point,
and watching runs (videos, open-loop PNG, report links); spec 3.14, 7.2, 7.3.

The runs are real subprocesses of experiments/run_dmc.py (gym CartPole-v1,
tiny model, Reverb) followed by experiments/tools/watch.py on their
checkpoints. Watching a dm_control run (smoke.flags, an .mp4) is in
test_run_dmc.py, on the run its end-to-end test trains.
"""

import agent  # noqa: F401  (jax compat before acme)

import json
import os
import subprocess
import sys

import jax
import numpy as np
import pytest
from acme.utils import counting

from agent import acting
from agent.actor import DreamerActor, StaticVariableClient
from agent.builder import DreamerBuilder, seed_keys
from agent.config import make_config
from experiments import run_dmc
from experiments.envs.vector import VectorEnv
from experiments.run import env_loop
from tests.test_env_loop import RecordingAdder
from tests.test_suites import ToyEnv

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RUN = os.path.join(REPO, 'experiments', 'run_dmc.py')
WATCH = os.path.join(REPO, 'experiments', 'tools', 'watch.py')
SMOKE = os.path.join(REPO, 'experiments', 'flags', 'smoke.flags')
# smoke.flags' settings without the dm_control-only --time_limit.
GYM_TINY = ['--suite=gym', '--task=CartPole-v1', '--size=tiny', '--batch_size=4',
            '--batch_length=8', '--replay_capacity=100000', '--train_ratio=16',
            '--action_repeat=1', '--num_envs=2', '--env_steps=500', '--seed=0',
            '--eval_every=250', '--eval_episodes=2', '--eval_policy=mode',
            '--checkpoint_every=5', '--log_every=100', '--progress_every=5']


def _run(args, timeout=420):
  out = subprocess.run([sys.executable, *args], cwd=REPO, capture_output=True,
                       text=True, timeout=timeout,
                       env={**os.environ, 'PYTHONUNBUFFERED': '1'})
  return out.returncode, out.stdout + out.stderr


def _rows(path):
  with open(path) as f:
    return [json.loads(line) for line in f if line.strip()]


def test_discrete_actor_stores_one_hot_and_sends_indices():
  """Spec 3.14: the env gets indices, the replay one-hots (zero at is_last);
  the policy's 'mode' (eval_policy=mode) is the argmax of its logits."""
  config = make_config(size='tiny', batch_size=2, batch_length=8, imag_horizon=4,
                       latent_store_dtype='float32')
  env = VectorEnv('CartPole-v1', 3, 1, seed=0, suite='gym')
  assert env.spaces.discrete and env.action_spec().shape == (3,)
  builder = DreamerBuilder(config, env.spaces, num_envs=3)
  nets = builder.make_networks()
  params = acting.acting_params(nets.init(jax.random.PRNGKey(0)))
  adder = RecordingAdder(3)
  actor = DreamerActor(acting.make_policy(nets), env.spaces, 3, seed_keys(0)['actor'],
                       StaticVariableClient(params), adder)
  sent = []

  step = env.step

  def spy_step(action, reset=None):
    sent.append(np.array(action))
    return step(action, reset)

  env.step = spy_step
  spy = env
  loop = env_loop.VectorEnvironmentLoop(spy, actor, counting.Counter(),
                                        should_stop=lambda: len(sent) >= 40)
  loop.run(num_episodes=1)
  assert all(a.shape == (3,) and a.dtype == np.int64 for a in sent)
  stored = np.stack([s['action'] for _, s in adder.steps])
  last = np.array([bool(s['is_last']) for _, s in adder.steps])
  assert stored.shape[1] == 2 and last.any()
  assert np.all(stored[last] == 0)
  np.testing.assert_array_equal(stored[~last].sum(-1), 1.0)      # one-hot rows
  per_env = {w: [s for ww, s in adder.steps if ww == w] for w in range(3)}
  for w, steps in per_env.items():                                # index = argmax
    for t, s in enumerate(steps[:len(sent)]):
      if not s['is_last']:
        assert int(np.argmax(s['action'])) == int(sent[t][w])
  from agent import distributions as dists
  logits = jax.random.normal(jax.random.PRNGKey(3), (64, 5))
  mode = dists.OneHotCategorical(logits, config.actor_unimix).mode()
  np.testing.assert_array_equal(np.argmax(mode, -1), np.argmax(logits, -1))
  env.close()


@pytest.fixture(scope='module')
def gym_run(tmp_path_factory, jax_cache_dir):
  logdir = tmp_path_factory.mktemp('gym') / 'run'
  code, log = _run([RUN, *GYM_TINY, f'--logdir={logdir}',
                    f'--jax_cache_dir={jax_cache_dir}'])
  assert code == 0, log[-4000:]
  return logdir


def test_gym_cartpole_trains_evaluates_and_watches(gym_run):
  """A real gym task (discrete) through the whole run: metrics, eval (argmax
  policy), scores, flags.txt; then tools/watch.py writes a GIF and the open-loop PNG
  and the report links them."""
  logdir = gym_run
  assert '--suite=gym' in (logdir / 'flags.txt').read_text()
  rows = _rows(logdir / 'metrics.jsonl')
  train = [r for r in rows if r['kind'] == 'train']
  evals = [r for r in rows if r['kind'] == 'eval']
  assert train and evals and evals[-1]['eval/policy'] == 'mode'
  assert train[-1]['updates'] > 0 and np.isfinite(train[-1]['train/loss/total'])
  scores = [s['score'] for s in _rows(logdir / 'scores.jsonl')]
  assert scores and all(s >= 8 for s in scores)      # CartPole: >= 8 steps alive
  code, log = _run([WATCH, f'--logdir={logdir}', f'--out={logdir}/watch/ep.gif',
                    '--episodes=2', '--horizon=10'])
  assert code == 0, log[-3000:]
  import imageio.v2 as imageio
  frames = imageio.mimread(str(logdir / 'watch' / 'ep.gif'))
  assert len(frames) > 16 and frames[0].shape[-1] in (3, 4)
  assert (logdir / 'watch' / 'openloop.png').stat().st_size > 10_000
  from experiments.tools.report import make_report
  table = make_report(str(logdir), str(logdir / 'r.png'))
  assert 'ep.gif' in table and 'openloop.png' in table


def test_bad_suite_flags_fail_before_anything_is_written(tmp_path):
  cases = ((['--suite=gym', '--task=walker_walk'], "Unknown gym task 'walker_walk'"),
           (['--suite=gym', '--task=CartPole-v1'], 'time_limit'))
  runs = []          # started together: each is a whole interpreter start
  for i, (extra, match) in enumerate(cases):
    logdir, log = tmp_path / f'x{i}', open(tmp_path / f'x{i}.log', 'w+')
    runs.append((logdir, log, match, subprocess.Popen(
        [sys.executable, RUN, f'--flagfile={SMOKE}', f'--logdir={logdir}', *extra],
        cwd=REPO, stdout=log, stderr=subprocess.STDOUT, text=True,
        env={**os.environ, 'PYTHONUNBUFFERED': '1'})))
  for logdir, log, match, proc in runs:
    code = proc.wait(timeout=420)
    log.seek(0)
    out = log.read()
    log.close()
    assert code != 0 and match in out, out[-2000:]
    assert not logdir.exists()


def _toy_factory(seed):
  return ToyEnv(seed=seed % 7, length=6, discrete=True)


@pytest.mark.slow
def test_train_entry_point_with_an_env_factory(tmp_path, jax_cache_dir):
  """README "Your own environment": a dm_env factory into run_dmc.train, to the
  end (eval included), then resumed (nothing to do) with the same factory."""
  logdir = tmp_path / 'toy'
  kwargs = dict(task='toy', logdir=str(logdir), flagfile=SMOKE, action_repeat=1,
                env_steps=120, eval_every=60, report=False,
                jax_cache_dir=jax_cache_dir)
  with pytest.raises(ValueError, match='not run flags'):
    run_dmc.train(_toy_factory, **kwargs, tasks=3)
  assert not logdir.exists()
  from dm_env import specs
  with pytest.raises(ValueError, match="'pixels'.*image"):
    run_dmc.train(lambda seed: ToyEnv(obs_spec={
        'pixels': specs.Array((16, 16, 3), np.uint8)}), **kwargs)
  assert not logdir.exists()
  summary = run_dmc.train(_toy_factory, **kwargs)
  assert summary['env_steps'] >= 120 and summary['updates'] > 0
  text = (logdir / 'flags.txt').read_text()
  assert 'suite custom' in text and '--task=' not in text
  evals = [r for r in _rows(logdir / 'metrics.jsonl') if r['kind'] == 'eval']
  assert evals and evals[-1]['eval/score_mean'] == 6.0   # 6 steps of reward 1
  again = run_dmc.train(_toy_factory, **kwargs)          # finished: resumes, no work
  assert (again['env_steps'], again['updates']) == (summary['env_steps'],
                                                    summary['updates'])


def test_train_keyword_typos_get_did_you_mean(tmp_path):
  logdir = tmp_path / 'typo'
  with pytest.raises(ValueError, match="'env_step': Did you mean 'env_steps'"):
    run_dmc.train(_toy_factory, task='toy', logdir=str(logdir), env_step=100)
  with pytest.raises(ValueError, match="'tasks': Did you mean 'task'"):
    run_dmc.train(_toy_factory, task='toy', logdir=str(logdir), tasks=3)
  with pytest.raises(ValueError, match="'flagfil': Did you mean 'flagfile'"):
    run_dmc.train(_toy_factory, task='toy', logdir=str(logdir), flagfil=SMOKE)
  assert not logdir.exists()


def _nan_factory(seed):
  return ToyEnv(seed=seed % 7, length=6, discrete=True, bad_obs='nan')


@pytest.mark.parametrize('distributed', [False, True])
def test_train_refuses_a_non_finite_observation_before_making_the_logdir(
    tmp_path, distributed):
  """An env whose second step observes a NaN: train() raises naming the key,
  and no run directory is left behind, in either layout."""
  from experiments.envs.observations import ObservationError
  logdir = tmp_path / 'nan'
  with pytest.raises(ObservationError, match="'pos' has non-finite"):
    run_dmc.train(_nan_factory, task='toy', logdir=str(logdir),
                  flagfile=SMOKE, action_repeat=1, env_steps=120,
                  distributed=distributed)
  assert not logdir.exists()


@pytest.mark.slow
def test_env_factory_trains_in_the_launchpad_layout(tmp_path):
  """The same entry point with distributed=True: a custom discrete dm_env
  factory (module-level, so Launchpad can pickle it) through local_mp."""
  summary = run_dmc.train(
      _toy_factory, task='toy', logdir=str(tmp_path / 'mp'), flagfile=SMOKE,
      action_repeat=1, env_steps=300, eval_every=0, eval_episodes=1,
      report=False, num_actors=2, stop_grace=20, progress_every=5,
      distributed=True)
  assert summary['env_steps'] >= 300 and summary['updates'] > 0, summary
  assert not summary['leftover_processes']
  rows = _rows(tmp_path / 'mp' / 'metrics.jsonl')
  evals = [r for r in rows if r['kind'] == 'eval']
  assert evals and evals[-1]['eval/score_mean'] == 6.0
