"""experiments/run_dmc.py end to end and its bad-input rules (spec 6.1-6.5, 7.3).

The end-to-end test runs experiments/flags/smoke.flags as real subprocesses
(dm_control + Reverb + the tiny model): train until a checkpoint with updates
exists, SIGKILL, resume with the same command to the end (eval, report), then
load the policy and act; experiments/tools/watch.py then records the same run
(a video through MuJoCo's EGL rendering and the open-loop PNG).
"""

import agent  # noqa: F401  (jax compat before acme)

import json
import os
import pathlib
import shutil
import signal
import subprocess
import sys
import time

import numpy as np
import pytest
from absl import flags

from experiments.layouts.distributed.settings import check_layout
from experiments.run.experiment import make_experiment
from experiments import options
from experiments.layouts import local
from experiments.run import rundir

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SMOKE = os.path.join(REPO, 'experiments', 'flags', 'smoke.flags')
WATCH = os.path.join(REPO, 'experiments', 'tools', 'watch.py')


def _cmd(logdir, *extra):
  return [sys.executable, os.path.join(REPO, 'experiments', 'run_dmc.py'),
          f'--flagfile={SMOKE}', f'--logdir={logdir}', *extra]


def _env():
  env = dict(os.environ)
  env.setdefault('PYTHONUNBUFFERED', '1')
  return env


def _run_tool(*args, timeout=420):
  out = subprocess.run([sys.executable, *args], cwd=REPO, capture_output=True,
                       text=True, timeout=timeout, env=_env())
  return out.returncode, out.stdout + out.stderr


def _read_jsonl(path):
  with open(path) as f:
    return [json.loads(line) for line in f if line.strip()]


class SmokeRun:
  """What the ``smoke_run`` fixture did (checked by the tests below)."""
  logdir: pathlib.Path
  extra: tuple            # run_dmc.py flags of every run of it
  first_log: str          # output of the run that was killed
  first_returncode: int
  killed_at: dict         # learner counters of the checkpoint seen, or None
  resumed: subprocess.CompletedProcess   # None when there was no kill


@pytest.fixture(scope='module')
def smoke_run(tmp_path_factory, smoke_flags):
  """smoke.flags trained until a checkpoint with updates exists, SIGKILLed,
  then resumed with the same command (and --eval_policy=mode) to the end
  (eval, report). test_smoke_train_kill_resume_eval checks all of it; the
  watch test records the finished run (one training for both)."""
  tmp_path = tmp_path_factory.mktemp('smoke')
  r = SmokeRun()
  r.logdir = logdir = tmp_path / 'run'
  r.extra = extra = ('--env_steps=1000', '--checkpoint_every=1',
                     '--eval_every=400', *smoke_flags)
  log1 = open(tmp_path / 'first.log', 'w')
  proc = subprocess.Popen(_cmd(logdir, *extra), cwd=REPO, env=_env(),
                          stdout=log1, stderr=subprocess.STDOUT)
  killed_at = None
  # A bound on a hang, not a speed requirement: on a quiet 2-core machine the
  # first checkpoint with updates comes in well under a minute, on a busy one
  # it can take several (no load-sensitive thresholds).
  deadline = time.time() + 720
  try:
    while time.time() < deadline and proc.poll() is None:
      ckpt = rundir.latest_run_checkpoint(str(logdir))
      if ckpt:
        try:
          with open(os.path.join(ckpt, rundir.RUN_STATE_FILE)) as f:
            counters = json.load(f)['learner']
        except (OSError, ValueError):   # being pruned right now
          counters = {'updates': 0}
        if counters['updates'] > 0:
          killed_at = counters
          break
      time.sleep(0.2)
  finally:
    if proc.poll() is None:
      os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    log1.close()
  r.killed_at, r.first_returncode = killed_at, proc.returncode
  r.first_log = open(tmp_path / 'first.log').read()
  r.resumed = None
  if killed_at is not None and proc.returncode == -signal.SIGKILL:
    # The kill may land mid-save; resume must still use a complete checkpoint.
    # Eval settings may change on resume: the deterministic eval policy.
    r.resumed = subprocess.run(_cmd(logdir, *extra, '--eval_policy=mode'),
                               cwd=REPO, env=_env(), capture_output=True,
                               text=True, timeout=300)
  return r


def test_smoke_train_kill_resume_eval(smoke_run):
  """Train, checkpoint, SIGKILL, resume to the end, eval, report, load policy."""
  logdir, extra = smoke_run.logdir, smoke_run.extra
  killed_at = smoke_run.killed_at
  assert killed_at is not None, smoke_run.first_log[-3000:]
  assert smoke_run.first_returncode == -signal.SIGKILL
  out = smoke_run.resumed
  log = out.stdout + out.stderr
  assert out.returncode == 0, log[-4000:]
  assert 'resumed from' in log, log[-4000:]
  done = [line for line in log.splitlines() if line.startswith('[done]')]
  assert len(done) == 1 and 'ETA' not in done[0], log[-4000:]
  # Library notices a person need not read are silenced where they start.
  for notice in ('owned by the same process', 'Unable to initialize backend'):
    assert notice not in log, log[-4000:]

  # Counters continue to the target; one checkpoint left, its Reverb dir only.
  ckpts = rundir.list_run_checkpoints(str(logdir))
  assert len(ckpts) == 1
  with open(os.path.join(ckpts[0], rundir.RUN_STATE_FILE)) as f:
    state = json.load(f)
  assert state['schema'] == rundir.RUN_STATE_SCHEMA
  assert state['segment'] >= 1
  assert state['counts']['env_steps'] >= 1000
  assert state['learner']['updates'] > killed_at['updates']
  reverb_dirs = os.listdir(logdir / 'checkpoints' / 'reverb')
  assert len(reverb_dirs) == 1

  # Run directory contents.
  flags_txt = (logdir / 'flags.txt').read_text()
  assert '--task=cartpole_swingup' in flags_txt and '--size=tiny' in flags_txt
  rows = _read_jsonl(logdir / 'metrics.jsonl')
  train_rows = [r for r in rows if r['kind'] == 'train']
  eval_rows = [r for r in rows if r['kind'] == 'eval']
  assert train_rows and eval_rows
  steps = [r['env_step'] for r in train_rows]
  assert steps == sorted(steps), 'rows after the checkpoint must be discarded'
  for key in ('fps/env_steps_per_s', 'replay/items', 'replay/online_rows',
              'train/loss/total', 'time/learner_update_frac'):
    assert any(r.get(key) is not None for r in train_rows), key
  assert eval_rows[-1]['eval/policy'] == 'mode'        # --eval_policy honoured
  assert eval_rows[-1]['env_step'] == state['counts']['env_steps']
  scores = _read_jsonl(logdir / 'scores.jsonl')
  assert scores and all(set(s) == {'task', 'env_step', 'score', 'seed'} for s in scores)
  assert [s['env_step'] for s in scores] == sorted(s['env_step'] for s in scores)
  assert len(_read_jsonl(logdir / 'eval' / 'scores.jsonl')) == 2 * len(eval_rows)
  assert any(n.startswith('events.out.tfevents')
             for n in os.listdir(logdir / 'tensorboard'))
  assert (logdir / 'report.png').stat().st_size > 1000

  # The saved policy acts (notebook API).
  from experiments.envs.vector import VectorEnv
  from experiments.tools.load_policy import load_policy
  policy = load_policy(str(logdir))
  assert (policy.task == 'cartpole_swingup' and
          policy.env_steps == state['counts']['env_steps'])
  envs = VectorEnv(policy.task, num_envs=3, action_repeat=2, seed=5, time_limit=0.2)
  obs = envs.reset().observation
  policy.reset(3)
  for mode in ('sample', 'mode', 'sample'):
    action = policy.act(obs, mode=mode)
    assert action.shape == (3, envs.act_dim) and np.isfinite(action).all()
    obs = envs.step(action).observation
  envs.close()

  # Re-running a finished run trains nothing and keeps everything.
  before = (logdir / 'scores.jsonl').read_text()
  out = subprocess.run(_cmd(logdir, *extra), cwd=REPO, env=_env(),
                       capture_output=True, text=True, timeout=120)
  assert out.returncode == 0, out.stderr[-3000:]
  assert 'nothing to train' in out.stderr
  assert (logdir / 'scores.jsonl').read_text() == before



def test_watch_smoke_run_mp4_and_open_loop(smoke_run, tmp_path):
  """smoke.flags (dm_control through MuJoCo EGL): experiments/tools/watch.py
  on the run above writes a short .mp4 and the open-loop PNG."""
  assert smoke_run.resumed is not None and smoke_run.resumed.returncode == 0, (
      'the smoke run did not finish: see test_smoke_train_kill_resume_eval')
  logdir = smoke_run.logdir
  out = tmp_path / 'video.mp4'
  code, log = _run_tool(WATCH, f'--logdir={logdir}', f'--out={out}',
                        f'--openloop={tmp_path / "ol.png"}')
  assert code == 0, log[-3000:]
  assert 'os.fork()' not in log, log[-3000:]
  import imageio.v2 as imageio
  reader = imageio.get_reader(str(out))
  frames = [f for f in reader]
  assert len(frames) == 51 and frames[0].shape == (240, 320, 3)  # 50 steps + reset
  assert frames[5].std() > 1                                     # not blank
  assert (tmp_path / 'ol.png').stat().st_size > 10_000
  code, log = _run_tool(WATCH, f'--logdir={logdir}', f'--out={tmp_path}/v.avi')
  assert code == 2 and '.mp4 or .gif' in log


def test_watch_mp4_writer_starts_ffmpeg_without_a_fork_warning(tmp_path):
  """imageio-ffmpeg's default preexec_fn made jax warn that os.fork() "will
  likely lead to a deadlock" on every .mp4; watch.py starts ffmpeg without
  it, with jax running."""
  script = ('import sys\n'
            'import numpy as np\n'
            'from experiments.tools import watch\n'
            'import jax\n'
            'jax.numpy.ones(3).block_until_ready()\n'
            'watch.write_video(sys.argv[1], [np.zeros((16, 16, 3), np.uint8)] * 3)\n')
  out = tmp_path / 'v.mp4'
  code, log = _run_tool('-c', script, str(out), timeout=300)
  assert code == 0, log[-3000:]
  assert out.stat().st_size > 0
  assert 'os.fork()' not in log, log[-3000:]

# --- checkpoint folder consistency (kill mid-save) ------------------------------------


def _fake_ckpt(root, name, reverb_name):
  path = root / name
  path.mkdir(parents=True)
  (path / 'replay_state.json').write_text(json.dumps({'reverb_checkpoint': reverb_name}))
  (path / rundir.RUN_STATE_FILE).write_text('{}')
  return path


def test_clean_checkpoints_after_kill_mid_save(tmp_path):
  """A save killed after its Reverb checkpoint but before the rename leaves a
  newer Reverb dir and a .tmp dir: both go, the last good pair stays."""
  root = tmp_path / 'checkpoints'
  for name in ('2026-01-01T00:00:00', '2026-01-01T00:10:00', '2026-01-01T00:20:00'):
    (root / 'reverb' / name).mkdir(parents=True)
    (root / 'reverb' / name / 'DONE').write_text('')
  (root / 'reverb' / '2026-01-01T00:30:00').mkdir()          # incomplete
  _fake_ckpt(root, 'ckpt-000000000100', '2026-01-01T00:00:00')
  good = _fake_ckpt(root, 'ckpt-000000000200', '2026-01-01T00:10:00')
  (root / '.tmp-123-456').mkdir()
  (root / 'ckpt-000000000300').mkdir()                         # no run_state: incomplete
  assert rundir.clean_checkpoints(str(tmp_path)) == str(good)
  assert sorted(os.listdir(root)) == ['ckpt-000000000200', 'reverb']
  assert os.listdir(root / 'reverb') == ['2026-01-01T00:10:00']
  # A checkpoint whose Reverb dir is gone is reported, not silently reset.
  shutil.rmtree(root / 'reverb' / '2026-01-01T00:10:00')
  with pytest.raises(ValueError, match='corrupted'):
    rundir.clean_checkpoints(str(tmp_path))


# --- bad input -------------------------------------------------------------------------


def _parse(*argv):
  fv = flags.FlagValues()
  options.define_flags(fv)
  fv(['run_dmc.py', *argv])
  return fv


@pytest.mark.parametrize('argv, name', [
    (('--num_envs=0',), 'num_envs'),
    (('--train_ratio=-1',), 'train_ratio'),
    (('--train_ratio=0',), 'train_ratio'),
    (('--task=walker_flyaway',), 'task'),
    (('--env_steps=0',), 'env_steps'),
    (('--action_repeat=0',), 'action_repeat'),
    (('--checkpoint_every=0',), 'checkpoint_every'),
    (('--eval_episodes=-1',), 'eval_episodes'),
    (('--batch_length=1',), 'batch_length'),
    (('--seed=-3',), 'seed'),
    (('--config_overrides=not_a_field=1',), 'config_overrides'),
    (('--config_overrides=batch_size=4',), 'config_overrides'),
])
def test_bad_flag_values_name_the_flag(argv, name):
  with pytest.raises(flags.IllegalFlagValueError, match=f'--{name}'):
    _parse('--logdir=/tmp/x', *argv)


BAD_OVERRIDES = [
    ('lr=abc', r"lr='abc' must be a number \(DreamerConfig.lr is float\)"),
    ('warmup=1.5', r'warmup=1.5 must be an integer'),
    ('online_queue=1', r'online_queue=1 must be a bool'),
    ('latent_store_dtype=3', r'latent_store_dtype=3 must be a string'),
]


@pytest.fixture(scope='module')
def bad_cli_runs(tmp_path_factory):
  """run_dmc.py (smoke.flags) with each bad flag the tests below check, each
  with its own --logdir. Every run is a whole interpreter start (~4 s of
  CPU), so they are started together and run side by side. Returns
  {flag: (returncode, stderr, whether its logdir exists afterwards)}."""
  root = tmp_path_factory.mktemp('bad_cli')
  bad = [f'--config_overrides={entry}' for entry, _ in BAD_OVERRIDES]
  bad.append('--num_envs=0')
  runs = []
  for i, arg in enumerate(bad):
    logdir, err = root / f'r{i}', open(root / f'r{i}.err', 'w+')
    runs.append((arg, logdir, err, subprocess.Popen(
        _cmd(logdir, arg), cwd=REPO, env=_env(), stdout=subprocess.DEVNULL,
        stderr=err, text=True)))
  results = {}
  for arg, logdir, err, proc in runs:
    proc.wait(timeout=120)
    err.seek(0)
    results[arg] = (proc.returncode, err.read(), logdir.exists())
    err.close()
  return results


@pytest.mark.parametrize('entry, message', BAD_OVERRIDES)
def test_config_overrides_are_type_checked_before_anything_is_written(
    tmp_path, entry, message, bad_cli_runs):
  """A wrong override value names the field and the type it needs, at flag
  parsing (no logdir, no checkpoint folder)."""
  with pytest.raises(flags.IllegalFlagValueError, match=message):
    _parse(f'--logdir={tmp_path / "r"}', f'--config_overrides={entry}')
  code, stderr, logdir_exists = bad_cli_runs[f'--config_overrides={entry}']
  assert code != 0 and entry.split('=')[0] in stderr
  assert not logdir_exists
  ok = options.parse_overrides(['lr=1', 'warmup=10.0', 'units_override=None'])
  assert ok == {'lr': 1.0, 'warmup': 10, 'units_override': None}
  assert isinstance(ok['lr'], float) and isinstance(ok['warmup'], int)


def test_learner_process_flags_are_checked(tmp_path):
  """--learner_processes / --coordinator_address: checked at flag
  parsing, in configs_from_flags or in the layout check
  (``settings.check_layout``, the first thing ``launch.prepare`` does),
  before anything is written."""
  with pytest.raises(flags.IllegalFlagValueError, match='--coordinator_address'):
    _parse(f'--logdir={tmp_path}', '--coordinator_address=nohost')
  with pytest.raises(flags.IllegalFlagValueError, match='--learner_processes'):
    _parse(f'--logdir={tmp_path}', '--learner_processes=0')
  base = (f'--flagfile={SMOKE}', f'--logdir={tmp_path / "r"}')
  with pytest.raises(ValueError, match='--learner_processes needs --distributed'):
    options.configs_from_flags(_parse(*base, '--learner_processes=2',
                                      '--learner_devices=2'))
  with pytest.raises(ValueError, match='--learner_devices 1 must be a multiple '
                     'of --learner_processes 2'):
    experiment, dist = options.experiment_from_flags(_parse(
        *base, '--distributed', '--learner_processes=2'))
    check_layout(experiment.run, dist)
  _, _, dist = options.configs_from_flags(_parse(
      *base, '--distributed', '--learner_processes=2', '--learner_devices=2',
      '--coordinator_address=10.0.0.1:1234'))
  assert dist.learner_processes == 2
  assert dist.coordinator_address == '10.0.0.1:1234'
  assert not (tmp_path / 'r').exists()


def test_bad_enum_and_missing_logdir():
  with pytest.raises(flags.IllegalFlagValueError, match='eval_policy'):
    _parse('--logdir=/tmp/x', '--eval_policy=greedy')
  with pytest.raises(flags.IllegalFlagValueError, match='size'):
    _parse('--logdir=/tmp/x', '--size=size3m')
  with pytest.raises(flags.IllegalFlagValueError, match='--logdir'):
    _parse()


def test_flags_build_configs_and_overrides(tmp_path):
  fv = _parse(f'--flagfile={SMOKE}', f'--logdir={tmp_path}',
              '--config_overrides=lr=1e-4', '--config_overrides=online_queue=False')
  run, config, _ = options.configs_from_flags(fv)
  assert config.size == 'tiny' and config.lr == 1e-4 and not config.online_queue
  assert config.train_fill == config.batch_size * config.batch_length
  assert run.env_steps == 600 and run.num_envs == 2 and run.eval_policy == 'sample'
  assert '--task=cartpole_swingup' in run.flags_text
  # The compilation cache: <logdir>/jax_cache unless given; 'off' disables it.
  assert run.jax_cache_dir == os.path.join(str(tmp_path), 'jax_cache')
  fv = _parse(f'--flagfile={SMOKE}', f'--logdir={tmp_path}', '--jax_cache_dir=off')
  assert options.configs_from_flags(fv)[0].jax_cache_dir is None
  # Capacity below one batch is rejected with the flag name.
  fv = _parse(f'--flagfile={SMOKE}', f'--logdir={tmp_path}', '--replay_capacity=10')
  with pytest.raises(ValueError, match='--replay_capacity'):
    options.configs_from_flags(fv)


def test_unwritable_logdir_and_changed_flags_fail_without_touching_files(tmp_path):
  fv = _parse(f'--flagfile={SMOKE}', f'--logdir={tmp_path / "file" / "run"}')
  (tmp_path / 'file').write_text('not a directory')
  run, config, _ = options.configs_from_flags(fv)
  with pytest.raises(ValueError, match='--logdir .*cannot be made: .*file is '
                     'a file, not a directory'):
    local.Trainer(make_experiment(run, config))
  # A logdir that is itself a file says so, and the file stays as it was.
  fv = _parse(f'--flagfile={SMOKE}', f'--logdir={tmp_path / "file"}')
  run, config, _ = options.configs_from_flags(fv)
  with pytest.raises(ValueError, match="--logdir '.*file' is a file, not a "
                     'directory'):
    local.Trainer(make_experiment(run, config))
  assert (tmp_path / 'file').read_text() == 'not a directory'
  # A logdir with a checkpoint of another size: error names the difference,
  # and nothing in the directory changes.
  logdir = tmp_path / 'old'
  ckpt = logdir / 'checkpoints' / 'ckpt-000000000010'
  ckpt.mkdir(parents=True)
  fv = _parse(f'--flagfile={SMOKE}', f'--logdir={logdir}')
  run, config, _ = options.configs_from_flags(fv)
  saved = {'config': {**json.loads(json.dumps(vars_of(config))), 'size': 'size1m'},
           'run': {k: getattr(run, k) for k in rundir.RESUME_FIXED}}
  (ckpt / rundir.CONFIG_FILE).write_text(json.dumps(saved))
  (ckpt / rundir.RUN_STATE_FILE).write_text('{}')
  (logdir / 'scores.jsonl').write_text('keep me\n')
  listing = sorted(str(p) for p in logdir.rglob('*'))
  with pytest.raises(ValueError, match="size: saved 'size1m', given 'tiny'"):
    local.Trainer(make_experiment(run, config))
  assert sorted(str(p) for p in logdir.rglob('*')) == listing
  assert (logdir / 'scores.jsonl').read_text() == 'keep me\n'


def vars_of(config):
  import dataclasses
  return dataclasses.asdict(config)


def test_cli_bad_flag_exits_nonzero_with_message(bad_cli_runs):
  code, stderr, logdir_exists = bad_cli_runs['--num_envs=0']
  assert code != 0
  assert '--num_envs' in stderr
  assert not logdir_exists


def test_single_process_refuses_distributed_checkpoint(tmp_path):
  """Bad input: resuming a distributed run's logdir without --distributed is a
  clear error naming the mode, and touches nothing."""
  import json
  ckpt = tmp_path / 'ckpt'
  ckpt.mkdir()
  (ckpt / rundir.RUN_STATE_FILE).write_text(json.dumps({'mode': 'distributed'}))
  with pytest.raises(ValueError, match='distributed run.*--distributed'):
    rundir.check_mode(str(ckpt), str(tmp_path), 'single_process')
  assert json.loads((ckpt / rundir.RUN_STATE_FILE).read_text()) == {'mode': 'distributed'}


def test_checkpoint_of_an_older_run_layer_is_refused_untouched(tmp_path):
  """Bad input: a checkpoint whose run state this layer cannot resume (written
  before the run layer moved onto Acme's loop) is a clear error; nothing in
  the logdir changes."""
  fv = _parse(f'--flagfile={SMOKE}', f'--logdir={tmp_path}')
  run, config, _ = options.configs_from_flags(fv)
  ckpt = tmp_path / 'checkpoints' / 'ckpt-000000000010'
  ckpt.mkdir(parents=True)
  (ckpt / rundir.CONFIG_FILE).write_text(json.dumps(
      {'config': vars_of(config),
       'run': {k: getattr(run, k) for k in rundir.RESUME_FIXED}}))
  old_state = {'segment': 0, 'actor': {}, 'counters': {'env_steps': 10}}
  (ckpt / rundir.RUN_STATE_FILE).write_text(json.dumps(old_state))
  listing = sorted(str(p) for p in tmp_path.rglob('*'))
  with pytest.raises(ValueError, match='another version of the run layer'):
    local.Trainer(make_experiment(run, config))
  assert sorted(str(p) for p in tmp_path.rglob('*')) == listing


@pytest.mark.parametrize('layout', ['single_process', 'distributed'])
def test_run_state_of_either_layout_has_one_schema(tmp_path, layout):
  """Both layouts' checkpoints read back in one schema; run states written
  before it (real files from each layout, tests/data/) are upgraded, so an
  older run still resumes (rundir.load_run_state)."""
  old = json.loads((pathlib.Path(REPO) / 'tests' / 'data' /
                    f'run_state_schema1_{layout}.json').read_text())
  ckpt = tmp_path / 'ckpt-000000000001'
  ckpt.mkdir()
  (ckpt / rundir.RUN_STATE_FILE).write_text(json.dumps(old))
  state = rundir.load_run_state(str(ckpt))
  assert state['schema'] == rundir.RUN_STATE_SCHEMA and state['mode'] == layout
  for key in ('segment', 'counts', 'counter', 'learner', 'actors', 'evaluator',
              'recent_scores'):
    assert key in state, key
  assert set(rundir.LEARNER_KEYS) <= set(state['learner'])
  assert state['actors'] and state['actors'][0]['offset'] == 0
  assert state['learner']['updates'] == (old.get('counters') or
                                         old['learner'])['updates']
  assert state['counts']['env_steps'] == (old.get('counters') or
                                          old['counts'])['env_steps']
  # make_run_state writes the same schema (what write_checkpoint stores).
  new = rundir.make_run_state(
      mode=layout, segment=1, counts=state['counts'], counter=state['counter'],
      learner=state['learner'],
      actors=[{'num_envs': 2, 'num_items': 0, 'num_online_items': 0,
               'num_policy_calls': 0, **a} for a in state['actors']],
      evaluator=state['evaluator'], recent_scores=state['recent_scores'])
  (ckpt / rundir.RUN_STATE_FILE).write_text(json.dumps(new))
  assert rundir.load_run_state(str(ckpt)) == new
  (ckpt / rundir.RUN_STATE_FILE).write_text(json.dumps({**new, 'schema': 9}))
  with pytest.raises(ValueError, match='schema 9'):
    rundir.load_run_state(str(ckpt))
