"""The Launchpad program (experiments/layouts/distributed/, run_dmc.py --distributed).

Fast tests build the lp.Program without launching it and exercise the pieces
the nodes are made of (worker-offset adders, the prefetching ReplayIterator,
SyncedCounter) on an
in-process Reverb server. One test of the default suite launches the real
local_mp program (Reverb, learner, 2 actors, evaluator, counter, step
limiter; the shared smoke model and the session's compilation cache) as a
subprocess: it must train, checkpoint, stop by the step limiter and leave no
process behind. The Ctrl-C and resume run is slow.
"""

import agent  # noqa: F401  (jax compat before acme)

import json
import os
import signal
import subprocess
import sys
import threading
import time

import cloudpickle
import numpy as np
import pytest

from agent import synthetic, types
from agent.config import make_config
from agent.learner import ReplayIterator, StopRequested
from experiments.layouts.distributed import lp_init, rpc
from experiments.layouts.distributed import program as program_lib
from experiments.layouts.distributed import settings as settings_lib
from experiments.layouts.distributed import supervisor
from experiments.run import rundir
from experiments.run.config import RunConfig
from experiments.run.experiment import experiment_of

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SMOKE = os.path.join(REPO, 'experiments', 'flags', 'smoke.flags')


def _spec(tmp_path, num_actors=2, num_envs=4, eval_episodes=1, join_slots=0,
          **config_kw):
  config_kw.setdefault('size', 'tiny')
  config_kw.setdefault('batch_size', 2)
  config_kw.setdefault('batch_length', 8)
  config_kw.setdefault('replay_capacity', 10_000)
  run = RunConfig(task='cartpole_swingup', logdir=str(tmp_path),
                  env_steps=100, num_envs=num_envs,
                  eval_episodes=eval_episodes)
  dist = settings_lib.DistributedConfig(num_actors=num_actors,
                                        join_slots=join_slots)
  experiment = experiment_of(run, make_config(**config_kw),
                             synthetic.WALKER_SPACES, join_slots)
  settings_lib.check_layout(experiment.run, dist)
  return settings_lib.ProgramSettings(
      experiment=experiment, dist=dist, launch_dir=str(tmp_path / 'launch'))


# --- program construction (fast) ------------------------------------------------


def test_program_groups_and_serialisation(tmp_path):
  spec = _spec(tmp_path, num_actors=2, num_envs=4)
  program = program_lib.build_program(spec)
  sizes = {g: len(nodes) for g, nodes in program.groups.items()}
  assert sizes == {'replay': 1, 'counter': 1, 'learner': 1, 'actor': 2,
                   'evaluator': 1, 'limiter': 1}
  assert set(sizes) <= set(program_lib.GROUPS)
  # Every node must travel to its process (local_mp pickles them).
  for nodes in program.groups.values():
    cloudpickle.dumps([node.function for node in nodes])
  # The learner is wired to both actors and the evaluator (checkpoints read
  # their state); actors get the replay, learner and counter handles.
  learner = program.groups['learner'][0]
  assert len(learner.input_handles) == 2 + 2 + 1  # replay, counter, actors,
  # eval
  for actor in program.groups['actor']:
    assert len(actor.input_handles) == 3
  resources = program_lib.local_resources(spec, '/x/lp_init.pkl', program.groups)
  assert set(resources) == set(program.groups)
  for group, res in resources.items():
    assert res.args['init_file'] == '/x/lp_init.pkl'
    assert ('JAX_PLATFORMS' in res.env) == (group != 'learner')
    assert int(res.env['DREAMER_LP_TERMINATION_NOTICE_SECS']) > (
        spec.dist.stop_grace_s)


def test_join_slots_add_the_join_service_node(tmp_path):
  """Remote actors come in through a node of their own: it gets
  the replay, the learner and the counter; the learner gets it (rows,
  checkpoints, the stop)."""
  spec = _spec(tmp_path, join_slots=2)
  program = program_lib.build_program(spec)
  assert len(program.groups['join']) == 1
  join = program.groups['join'][0]
  assert len(join.input_handles) == 3
  assert len(program.groups['learner'][0].input_handles) == 2 + 2 + 1 + 1
  cloudpickle.dumps(join.function)
  assert 'join' in supervisor.RESTARTABLE_GROUPS


def test_program_without_evaluator_and_bad_split(tmp_path):
  program = program_lib.build_program(_spec(tmp_path, num_actors=3, num_envs=3,
                                         eval_episodes=0))
  sizes = {g: len(nodes) for g, nodes in program.groups.items()}
  assert sizes == {'replay': 1, 'counter': 1, 'learner': 1, 'actor': 3,
                   'limiter': 1}
  with pytest.raises(ValueError, match='num_envs'):
    _spec(tmp_path, num_actors=3, num_envs=4)
  with pytest.raises(ValueError, match='num_actors'):
    settings_lib.DistributedConfig(num_actors=0)


def test_init_file_restores_compat(tmp_path):
  path = lp_init.write_init_file(str(tmp_path))
  code = ('import cloudpickle, sys; cloudpickle.load(open(sys.argv[1], "rb"))(); '
          'import jax; assert hasattr(jax, "tree_multimap"); '
          'import acme.jax.variable_utils')
  subprocess.run([sys.executable, '-c', code, path], check=True, cwd=REPO,
                 env={**os.environ, 'DREAMER_LP_PDEATHSIG': '0'})


# --- node pieces on an in-process Reverb server (fast) -----------------------------


SPACES = types.EnvSpaces(obs={'a': (3,)}, act_dim=2)


def _steps(config, workers, n):
  """One step of each worker in ``workers`` at index n (leading [len])."""
  k = len(workers)
  return {
      'observation': {'a': np.stack([np.array([w, n, 0], np.float32)
                                     for w in workers])},
      'action': np.zeros((k, 2), np.float32),
      'reward': np.zeros(k, np.float32),
      'is_first': np.full(k, n == 0),
      'is_last': np.zeros(k, bool),
      'is_terminal': np.zeros(k, bool),
      'latent': {'deter': np.zeros((k, config.deter), np.float32),
                 'stoch': np.zeros((k, config.stoch), np.uint8)},
  }


@pytest.fixture
def replay():
  from agent.builder import DreamerBuilder
  from reverb_tables.tables import make_replay_tables, make_server
  config = make_config(size='tiny', batch_size=4, batch_length=8,
                       replay_capacity=10_000, latent_store_dtype='float32',
                       train_fill=4)
  builder = DreamerBuilder(config, SPACES, num_envs=4)
  # Only inserts here, no learner to sample: no rate limit (MinSize(1)).
  server = make_server(make_replay_tables(builder.step_spec, config))
  client = server.localhost_client()
  yield config, builder, client
  server.stop()


def test_actor_slice_adder_writes_global_step_ids(replay):
  """An actor owning workers [2, 4) of the global layout writes ids (2|3, n)."""
  config, builder, client = replay
  adder = builder.make_adder(client, num_workers=2, worker_offset=2)
  assert adder.num_workers == 2 and adder.worker_offset == 2
  for n in range(config.seq_len + 3):
    adder.add_batch(_steps(config, [2, 3], n))
  adder.flush()
  assert adder.lengths.tolist() == [config.seq_len + 3] * 2
  from reverb_tables.sampler import ReplaySampler
  batch = ReplaySampler(client, config, None,
                        step_spec=builder.step_spec).sample_train(16)
  workers = batch['step_id'][..., 0]
  assert set(np.unique(workers)) <= {2, 3}
  # The stored observation carries the writer's worker id: ids match data.
  np.testing.assert_array_equal(batch['observation']['a'][..., 0], workers)
  with pytest.raises(ValueError, match='worker_offset'):
    builder.make_adder(client, num_workers=2, worker_offset=-1)


def test_replay_iterator_prefetch_overlays_latest_write_back(replay):
  from reverb_tables.latent_store import LatentStore
  from reverb_tables.sampler import ReplaySampler
  config, builder, client = replay
  adder = builder.make_adder(client)
  for n in range(config.seq_len + 4):
    adder.add_batch(_steps(config, [0, 1, 2, 3], n))
  adder.flush()
  store = LatentStore(config, 4)
  sampler = ReplaySampler(client, config, None, step_spec=builder.step_spec)
  it = ReplayIterator(sampler, store, prefetch=True)
  first = next(it)
  assert first['observation']['a'].shape == (4, config.seq_len, 3)
  assert not first['latent']['deter'].any()
  # Written back after the next batch was already drawn (prefetch): the
  # overlay happens when the batch is handed out, so it is visible.
  ids = np.stack(np.meshgrid(np.arange(4), np.arange(config.seq_len + 4),
                             indexing='ij'), -1).reshape(-1, 2)
  it.write_back(ids, {
      'deter': np.full((len(ids), config.deter), 7.0, np.float32),
      'stoch': np.full((len(ids), config.stoch), 1, np.uint8)})
  second = next(it)
  assert (second['latent']['deter'] == 7.0).all()
  assert (second['latent']['stoch'] == 1).all()
  assert it.batches == 2
  it.close()


class _BlockingSampler:
  def __init__(self):
    self.release = threading.Event()

  def sample_train(self, batch_size=None):
    self.release.wait()
    return {'step_id': np.zeros((1, 2, 2), np.int64),
            'latent': {'deter': np.zeros((1, 2, 3)),
                       'stoch': np.zeros((1, 2, 3))}}


def test_replay_iterator_stops_while_blocked():
  from reverb_tables.latent_store import LatentStore
  config = make_config(size='tiny', batch_size=1, batch_length=2,
                       replay_capacity=100)
  stop = threading.Event()
  hooks = []
  it = ReplayIterator(_BlockingSampler(), LatentStore(config, 1),
                      should_stop=stop.is_set, on_wait=lambda: hooks.append(1))
  threading.Timer(1.3, stop.set).start()
  t0 = time.monotonic()
  with pytest.raises(StopRequested):
    next(it)
  assert time.monotonic() - t0 < 3.0
  assert hooks                           # bookkeeping ran while it waited
  assert it.wait_s >= 1.0                # counted as learner idle time
  it.close()


def test_synced_counter_batches_and_flushes():
  from acme.utils import counting
  calls = []

  class Parent:
    def __init__(self):
      self.counter = counting.Counter()

    def increment(self, **kw):
      calls.append(kw)
      return self.counter.increment(**kw)

  parent = Parent()
  counter = rpc.SyncedCounter(parent, time_delta=3600)
  counter.increment(actor_steps=2)        # first call syncs (no sync yet)
  for _ in range(5):
    counts = counter.increment(actor_steps=2, env_steps=4)
  assert len(calls) == 1
  assert counts == {'actor_steps': 12, 'env_steps': 20}
  assert parent.counter.get_counts() == {'actor_steps': 2}
  assert counter.flush() == {'actor_steps': 12, 'env_steps': 20}
  assert parent.counter.get_counts() == {'actor_steps': 12, 'env_steps': 20}


# --- the real program ---------------------------------------------------------


def _alive(pid, created):
  import psutil
  try:
    proc = psutil.Process(pid)
    return proc.create_time() == created and proc.status() != psutil.STATUS_ZOMBIE
  except psutil.NoSuchProcess:
    return False


def _run_launcher(logdir, *extra, timeout=240, on_poll=None):
  """Runs run_dmc.py --distributed; returns (returncode, output,
  {pid: create_time})."""
  import psutil
  cmd = [sys.executable, os.path.join(REPO, 'experiments', 'run_dmc.py'),
         '--distributed', f'--flagfile={SMOKE}', f'--logdir={logdir}',
         '--num_actors=2',
         '--eval_every=0', '--eval_episodes=1', '--report=false',
         '--stop_grace=20', '--progress_every=5', *extra]
  log_path = os.path.join(os.path.dirname(str(logdir)),
                          os.path.basename(str(logdir)) + '.out')
  with open(log_path, 'w') as log:
    proc = subprocess.Popen(cmd, cwd=REPO, stdout=log, stderr=subprocess.STDOUT,
                            env={**os.environ, 'PYTHONUNBUFFERED': '1'},
                            start_new_session=True)
    seen = {}
    deadline = time.monotonic() + timeout
    try:
      while proc.poll() is None:
        if time.monotonic() > deadline:
          os.killpg(proc.pid, signal.SIGKILL)
          proc.wait()
          raise AssertionError(f'launcher still running after {timeout}s')
        try:
          for child in psutil.Process(proc.pid).children(recursive=True):
            try:
              seen.setdefault(child.pid, child.create_time())
            except psutil.NoSuchProcess:
              pass
        except psutil.NoSuchProcess:
          pass
        if on_poll is not None:
          on_poll(proc)
        time.sleep(0.2)
    finally:
      if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGKILL)
  with open(log_path) as f:
    out = f.read()
  return proc.returncode, out, seen


def _rows(logdir, kind='train'):
  with open(os.path.join(logdir, rundir.METRICS_FILE)) as f:
    rows = [json.loads(line) for line in f if line.strip()]
  return [r for r in rows if r.get('kind') == kind]


def test_local_mp_trains_checkpoints_and_stops_cleanly(tmp_path, smoke_flags):
  """A real Launchpad local_mp program in the default suite: Reverb, counter,
  learner, 2 actors, evaluator and step limiter as processes (tiny shared
  model, the session's compilation cache). It trains, checkpoints, stops by
  the step limiter (with a final checkpoint and evaluation) and no node
  process outlives the launcher. Its envs give proprio and 64x64 frames
  (``--image``, MuJoCo EGL in the actor processes, spec 2.10), so the
  program's replay, actors and learner carry uint8 images beside vectors."""
  logdir = str(tmp_path / 'run')
  t0 = time.monotonic()
  code, out, pids = _run_launcher(logdir, '--env_steps=500', '--image',
                                  '--checkpoint_every=3', '--learner_log_every=10',
                                  # a short warm-up, so the 200-odd updates move
                                  '--config_overrides=lr=3e-4',
                                  '--config_overrides=warmup=20', *smoke_flags,
                                  timeout=420)
  elapsed = time.monotonic() - t0
  assert code == 0, out[-4000:]
  assert '[done]' in out, out[-4000:]                 # the step limiter's stop
  # replay, counter, learner, 2 actors, evaluator, limiter
  assert len(pids) >= 7, pids
  time.sleep(0.5)
  alive = [pid for pid, created in pids.items() if _alive(pid, created)]
  assert not alive, f'processes left behind: {alive}'
  ckpt = rundir.latest_run_checkpoint(logdir)
  assert ckpt is not None
  with open(os.path.join(ckpt, rundir.RUN_STATE_FILE)) as f:
    state = json.load(f)
  assert state['mode'] == 'distributed'
  assert state['counts']['env_steps'] >= 500
  assert state['learner']['updates'] > 0
  assert len(state['actors']) == 2
  assert os.path.exists(os.path.join(ckpt, rundir.LEARNER_FILE))
  rows = _rows(logdir)
  assert rows and rows[-1]['updates'] == state['learner']['updates']
  last = rows[-1]
  # The limiter keeps samples x T / inserts at train_ratio (16) after the fill.
  assert abs(last['replay/ratio_after_fill'] / 16.0 - 1) < 0.1, last
  evals = _rows(logdir, 'eval')                      # final evaluation ran
  assert evals, out[-4000:]
  assert last['train/loss/rec_image'] > 0 and 'train/loss/rec_position' in last
  # The learner's rows (means over 10 updates each): the frames' reconstruction
  # loss falls as the program trains.
  rec = [r['train/loss/rec_image'] for r in _rows(logdir, 'learner')]
  assert len(rec) >= 3 and rec[-1] < 0.5 * rec[0], [round(v) for v in rec]
  with open(os.path.join(ckpt, 'config.json')) as f:
    assert json.load(f)['spaces']['obs']['image'] == [64, 64, 3]
  print(f'local_mp test: {elapsed:.0f}s, {last["updates"]} updates, ratio '
        f'after fill {last["replay/ratio_after_fill"]:.2f}')


@pytest.mark.slow
def test_local_mp_sigint_saves_and_resumes(tmp_path):
  """Ctrl-C (SIGINT to the process group) writes a checkpoint and stops every
  node; the same command then resumes from it (learner, latents, Reverb,
  counters) and finishes the budget."""
  logdir = str(tmp_path / 'run')
  metrics = os.path.join(logdir, rundir.METRICS_FILE)
  sent = []

  def interrupt(proc):
    if sent or not os.path.exists(metrics):
      return
    if any('"train"' in line and '"updates": 0,' not in line
           for line in open(metrics)):
      os.killpg(proc.pid, signal.SIGINT)
      sent.append(time.monotonic())

  code, out, pids = _run_launcher(logdir, '--env_steps=100000',
                                  '--checkpoint_every=600', on_poll=interrupt)
  assert sent, out[-4000:]
  assert code == 0, out[-4000:]
  assert 'stopped by a signal' in out, out[-4000:]
  time.sleep(0.5)
  assert not [p for p, c in pids.items() if _alive(p, c)]
  ckpt = rundir.latest_run_checkpoint(logdir)
  assert ckpt is not None, out[-4000:]
  with open(os.path.join(ckpt, rundir.RUN_STATE_FILE)) as f:
    first = json.load(f)
  updates0 = first['learner']['updates']
  steps0 = first['counts']['env_steps']
  assert updates0 > 0
  code, out, pids = _run_launcher(logdir, f'--env_steps={steps0 + 200}')
  assert code == 0, out[-4000:]
  assert 'resuming from' in out
  with open(os.path.join(rundir.latest_run_checkpoint(logdir),
                         rundir.RUN_STATE_FILE)) as f:
    second = json.load(f)
  assert second['segment'] == 1
  assert second['learner']['updates'] > updates0
  assert second['counts']['env_steps'] >= steps0 + 200
  rows = _rows(logdir)
  assert rows[-1]['segment'] == 1
  # Reverb's limiter counters continue from the checkpoint.
  assert rows[-1]['replay/inserts'] > max(
      r['replay/inserts'] for r in rows if r['segment'] == 0)
