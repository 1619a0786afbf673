"""Data that did not come through the run's own checks: items
written to the Reverb port directly, run files another user could have
written, a planted settings file of the remote learner processes, frames
that are not this protocol's, and checkpoints without pickle; finite but
implausible step values (rewards, observations, actions of 1e30), refused
by the adder and dropped by the learner's sampler.
"""

import json
import os
import re

import jax
import numpy as np
import pytest

from agent import distributions, types
from agent.config import make_config
from experiments.layouts.distributed import remote_peers
from experiments.layouts.distributed.join import wire
from experiments.layouts.distributed.secret import (
    SECRET_FILE, ensure_secret, joiner_secret, sign, verify)
from experiments.run import private_files, rundir, tree_files
from experiments.run.config import RunConfig
from experiments.run.experiment import experiment_of
from reverb_tables.adder import WindowAdder
from reverb_tables.packing import StepLayout
from reverb_tables.sampler import ReplaySampler
from reverb_tables.tables import UNIFORM_TABLE, make_replay_tables, make_server
from tests.smoke_model import CARTPOLE_SPACES

SPACES = types.EnvSpaces(obs={'a': (3,)}, act_dim=2)


def test_items_written_to_reverb_directly_are_dropped_not_trained_on():
  """Anyone who reaches the Reverb port can insert an item of the table's
  signature. The sampler deletes and counts an item with a NaN observation,
  an Inf (bf16) latent, a class index out of range, a step id of no worker
  or a column of another shape, and the batch is made of valid rows only
  (spec 5.1, 5.7)."""
  config = make_config(size='tiny', batch_size=4, batch_length=8,
                       replay_capacity=1000)
  spec = types.step_spec(SPACES, config)
  server = make_server(make_replay_tables(spec, config))
  try:
    client = server.localhost_client()
    adder = WindowAdder(client, config, num_workers=1, step_spec=spec)
    for n in range(12):
      adder.add_batch({
          'observation': {'a': np.full((1, 3), n, np.float32)},
          'action': np.zeros((1, 2), np.float32),
          'reward': np.zeros(1, np.float32), 'is_first': np.array([n == 0]),
          'is_last': np.zeros(1, bool), 'is_terminal': np.zeros(1, bool),
          'latent': {'deter': np.zeros((1, config.deter), np.uint16),
                     'stoch': np.zeros((1, config.stoch), np.uint8)}})
    adder.flush()
    good = client.server_info()[UNIFORM_TABLE].current_size
    layout = StepLayout.from_step_spec(spec)
    L = config.seq_len
    for bad in ('obs', 'deter', 'stoch', 'worker'):
      flat = {f.name: np.zeros((L,) + f.shape, f.dtype) for f in layout.fields}
      if bad == 'obs':
        flat['observation/a'][3, 1] = np.nan
      elif bad == 'deter':
        flat['latent/deter'][0, 0] = 0x7F80          # bf16 +Inf
      elif bad == 'stoch':
        flat['latent/stoch'][5, 2] = config.classes
      else:
        flat['step_id'][:, 0] = 10**6
      with client.trajectory_writer(num_keep_alive_refs=L) as writer:
        for row in layout.pack(list(flat.values()), L):
          writer.append({'step': row})
        writer.create_item(UNIFORM_TABLE, 1.0,
                           {'step': writer.history['step'][-L:]})
    # ... and one whose column has another shape ([1, L, width]: what
    # client.insert of a whole window makes; it crashed the learner before).
    client.insert([layout.pack(list(flat.values()), L)], {UNIFORM_TABLE: 1.0})
    assert client.server_info()[UNIFORM_TABLE].current_size == good + 5
    sampler = ReplaySampler(client, config, step_spec=spec, num_workers=1)
    for _ in range(40):
      batch = sampler.sample_train()
      assert np.isfinite(batch['observation']['a']).all()
      assert (batch['step_id'][..., 0] == 0).all()
      assert (batch['latent']['stoch'] < config.classes).all()
    assert sampler.num_dropped == 5
    assert client.server_info()[UNIFORM_TABLE].current_size == good
  finally:
    server.stop()


def _dmc_replay(tmp_path, **run_kw):
  """(builder, server, client) of a dm_control run (cartpole_swingup,
  action repeat 2) with one env: the builder's step bounds are the run's."""
  config = make_config(size='tiny', batch_size=4, batch_length=8,
                       replay_capacity=1000)
  run = RunConfig(task='cartpole_swingup', logdir=str(tmp_path / 'run'),
                  env_steps=1000, num_envs=1, **run_kw)
  builder = experiment_of(run, config, CARTPOLE_SPACES).builder
  server = make_server(make_replay_tables(builder.step_spec, config))
  return builder, server, server.localhost_client()


def _step(builder, n=0, **changes):
  """Step n of one worker, plausible: reward 0.5 (0 at is_first)."""
  step = {'observation': {'position': np.full((1, 3), 0.1, np.float32),
                          'velocity': np.full((1, 2), -3.0, np.float32)},
          'action': np.full((1, 1), 0.5, np.float32),
          'reward': np.full(1, 0.0 if n == 0 else 0.5, np.float32),
          'is_first': np.array([n == 0]), 'is_last': np.zeros(1, bool),
          'is_terminal': np.zeros(1, bool),
          'latent': {'deter': np.zeros((1, builder.config.deter), np.uint16),
                     'stoch': np.zeros((1, builder.config.stoch), np.uint8)}}
  for key, value in changes.items():
    node = step
    *parents, leaf = key.split('/')
    for p in parents:
      node = node[p]
    node[leaf] = np.full_like(node[leaf], value)
  return step


@pytest.mark.parametrize('key,value,match', [
    ('reward', 1e30, "step key 'reward' is outside the env's declared range "
     '[0, 2]'),
    ('reward', -0.5, "step key 'reward' is outside the env's declared range"),
    ('observation/velocity', 1e30, "step key 'observation/velocity' holds "
     '|value| 1e+30 > the replay value limit 1e+06 (--replay_value_limit)'),
    ('observation/position', np.finfo(np.float32).max, "step key "
     "'observation/position' holds |value| 3.4e+38 > the replay value limit"),
    ('action', 8.0, "step key 'action' is outside the policy's range [-7, 7]"),
    ('action', -1e30, "step key 'action' is outside the policy's range"),
])
def test_implausible_steps_are_refused_by_the_adder_naming_the_key(
    tmp_path, key, value, match):
  """Finite but implausible values (a buggy or hostile actor's): the
  adder the builder makes for a dm_control run refuses them before
  anything is written. dm_control rewards are in [0, 1] per control step,
  so [0, 2] at action repeat 2; the bounded-normal policy's unclipped
  samples lie in 1 + maxstd * 6 = 7 (a sample of 5.0 is a real one:
  tanh(mean) 1, std 1, noise 4); the rest is bounded by the value limit."""
  builder, server, client = _dmc_replay(tmp_path)
  try:
    adder = builder.make_adder(client)
    adder.add_batch(_step(builder, 0))
    adder.add_batch(_step(builder, 1, reward=2.0, action=6.9))    # the edges
    with pytest.raises(ValueError, match=re.escape(match)):
      adder.add_batch(_step(builder, 2, **{key: value}))
    assert adder.lengths.tolist() == [2]              # nothing was written
    adder.add_batch(_step(builder, 2))                # the stream goes on
    assert adder.lengths.tolist() == [3]
  finally:
    server.stop()


def test_the_value_limit_is_the_runs_to_state_and_a_users_to_override(
    tmp_path):
  """``--replay_value_limit`` (RunConfig.replay_value_limit) sets the
  bound of values without a declared range; it must be > 0."""
  builder, server, client = _dmc_replay(tmp_path, replay_value_limit=1e31)
  try:
    adder = builder.make_adder(client)
    adder.add_batch(_step(builder, 0, **{'observation/velocity': 1e30}))
    with pytest.raises(ValueError, match=r'limit 1e\+31'):
      adder.add_batch(_step(builder, 1, **{'observation/velocity': 2e31}))
  finally:
    server.stop()
  for bad in (0.0, -1.0, float('nan')):
    with pytest.raises(ValueError, match='--replay_value_limit must be > 0'):
      _dmc_replay(tmp_path, replay_value_limit=bad)
  builder, server, client = _dmc_replay(tmp_path,       # inf: finite only
                                        replay_value_limit=float('inf'))
  try:
    adder = builder.make_adder(client)
    adder.add_batch(_step(builder, 0, **{'observation/velocity': 3e38}))
    with pytest.raises(ValueError, match="'reward' is outside the env's"):
      adder.add_batch(_step(builder, 1, reward=1e30))   # its range still holds
  finally:
    server.stop()


def test_a_discrete_policy_stores_one_hot_actions_only(tmp_path):
  """A discrete policy's stored action is a one-hot (zeros at is_last);
  anything else is refused (spec 3.14)."""
  spaces = types.EnvSpaces(obs={'a': (3,)}, act_dim=3, discrete=True)
  config = make_config(size='tiny', batch_size=4, batch_length=8,
                       replay_capacity=1000)
  spec = types.step_spec(spaces, config)
  server = make_server(make_replay_tables(spec, config))
  try:
    adder = WindowAdder(server.localhost_client(), config, 1, spec,
                        bounds=types.step_bounds(spaces, config))
    step = {'observation': {'a': np.zeros((1, 3), np.float32)},
            'action': np.array([[0, 1, 0]], np.float32),
            'reward': np.zeros(1, np.float32), 'is_first': np.ones(1, bool),
            'is_last': np.zeros(1, bool), 'is_terminal': np.zeros(1, bool),
            'latent': {'deter': np.zeros((1, config.deter), np.uint16),
                       'stoch': np.zeros((1, config.stoch), np.uint8)}}
    adder.add_batch(step)
    adder.add_batch({**step, 'action': np.zeros((1, 3), np.float32)})
    for bad in ([[1, 1, 0]], [[0, 0.5, 0]], [[0, 2, 0]]):
      with pytest.raises(ValueError, match="'action' is not one-hot"):
        adder.add_batch({**step, 'action': np.array(bad, np.float32)})
    assert adder.lengths.tolist() == [2]
  finally:
    server.stop()


def test_the_policy_range_holds_every_sample_jax_can_draw():
  """The stored-action bound is not a guess: jax.random.normal (float32)
  is sqrt(2) erfinv(u) of a u >= nextafter(-1, 0), so |noise| <= 5.42,
  under the 6 the bound allows for; with tanh(mean) in [-1, 1] and std <=
  maxstd every bounded-normal sample lies in 1 + maxstd * 6."""
  from scipy.special import erfinv
  lowest = np.nextafter(np.float32(-1), np.float32(0))
  z_max = float(np.sqrt(2) * -erfinv(np.float64(lowest)))
  assert 5.4 < z_max < distributions.NORMAL_SAMPLE_LIMIT == 6.0
  z = jax.random.normal(jax.random.PRNGKey(0), (1 << 20,))
  assert float(np.abs(np.asarray(z)).max()) <= z_max + 1e-3
  assert distributions.BoundedNormal.sample_range(1.0) == (-7.0, 7.0)
  assert distributions.BoundedNormal.sample_range(0.5) == (-4.0, 4.0)


def test_implausible_items_written_to_reverb_are_dropped_by_the_learner(
    tmp_path):
  """The issue's attack: a plain Reverb client inserts windows with reward
  1e6 (finite, so the finiteness check let them through and ret_scale went
  from 1 to 45,784). The learner's dataset (the builder's, with the run's
  step bounds) deletes them, counts them (``replay/dropped_items``) and
  trains on valid rows only; so with an observation of 1e30."""
  builder, server, client = _dmc_replay(tmp_path)
  config = builder.config
  dataset = None
  try:
    adder = builder.make_adder(client)
    for n in range(12):
      adder.add_batch(_step(builder, n))
    adder.flush()
    good = client.server_info()[UNIFORM_TABLE].current_size
    layout = StepLayout.from_step_spec(builder.step_spec)
    L = config.seq_len
    for k in range(4):
      flat = {f.name: np.zeros((L,) + f.shape, f.dtype) for f in layout.fields}
      if k < 3:
        flat['reward'][:] = 1e6
      else:
        flat['observation/position'][7, 0] = 1e30
      with client.trajectory_writer(num_keep_alive_refs=L) as writer:
        for row in layout.pack(list(flat.values()), L):
          writer.append({'step': row})
        writer.create_item(UNIFORM_TABLE, 1.0,
                           {'step': writer.history['step'][-L:]})
    assert client.server_info()[UNIFORM_TABLE].current_size == good + 4
    dataset = builder.make_dataset_iterator(client)
    for _ in range(40):
      batch = next(dataset)
      assert np.asarray(batch['reward']).max() <= 2.0
      assert np.abs(np.asarray(batch['observation']['position'])).max() < 1
    assert dataset.sampler.num_dropped == 4
    assert 'step key' in dataset.sampler.last_drop_reason
    assert client.server_info()[UNIFORM_TABLE].current_size == good
  finally:
    if dataset is not None:
      dataset.close()
    server.stop()


def test_run_files_other_users_could_write_are_refused(tmp_path):
  run = tmp_path / 'run'
  run.mkdir(mode=0o755)
  f = run / 'state.json'
  f.write_text('{}')
  os.chmod(f, 0o644)
  private_files.check_private(str(f))
  os.chmod(f, 0o664)
  with pytest.raises(private_files.UntrustedFileError, match='chmod go-w'):
    private_files.check_private(str(f))
  os.chmod(f, 0o644)
  os.chmod(run, 0o777)                    # the folder: anyone may replace it
  with pytest.raises(private_files.UntrustedFileError, match='writable by'):
    private_files.check_private(str(f))
  os.chmod(run, 0o755)
  secret = ensure_secret(str(run / SECRET_FILE))
  assert oct(os.stat(run / SECRET_FILE).st_mode & 0o777) == '0o600'
  assert ensure_secret(str(run / SECRET_FILE)) == secret   # never overwritten
  os.chmod(run / SECRET_FILE, 0o640)
  with pytest.raises(ValueError, match='readable by other users'):
    joiner_secret(str(run))


@pytest.fixture
def logdir_and_target(tmp_path):
  """(a run directory of this user's, mode 0755; a file outside it that a
  planted link points to, e.g. another user's or root's)."""
  logdir = tmp_path / 'run'
  logdir.mkdir(mode=0o755)
  target = tmp_path / 'precious.conf'
  target.write_text('do not touch\n')
  return logdir, target


def _run_config(logdir):
  return RunConfig(task='cartpole_swingup', logdir=str(logdir),
                   env_steps=1000, num_envs=1)


@pytest.mark.parametrize('name', [rundir.METRICS_FILE, rundir.SCORES_FILE])
def test_a_symlink_planted_at_a_log_file_is_refused_not_followed(
    logdir_and_target, name):
  """The issue's attack: a link at metrics.jsonl / scores.jsonl made a
  fresh run truncate and fill the file it points to. The start refuses the
  run directory by name; the writers and the rotation refuse to open the
  link (O_NOFOLLOW); the target is untouched."""
  from experiments.run import metrics
  logdir, target = logdir_and_target
  (logdir / name).symlink_to(target)
  config = make_config(size='tiny', batch_size=2, batch_length=8)
  with pytest.raises(ValueError, match=re.escape(
      f"--logdir '{logdir}' is refused: {logdir / name} is a symbolic link")):
    rundir.validate(_run_config(logdir), config, 'single_process')
  with pytest.raises(private_files.UntrustedFileError, match='symbolic link'):
    rundir.cut_file(str(logdir), name, 0)
  if name == rundir.METRICS_FILE:
    logger = metrics.RunLogger(str(logdir), tensorboard=False)
    with pytest.raises(private_files.UntrustedFileError,
                       match='symbolic link'):
      logger.write({'kind': 'train', 'env_step': 1})
  else:
    with pytest.raises(private_files.UntrustedFileError,
                       match='symbolic link'):
      rundir.append_score(str(logdir), 'walker_walk', 2, 1.0, 0)
  assert target.read_text() == 'do not touch\n'
  assert sorted(os.listdir(logdir)) == [name]


def test_rotation_never_writes_outside_the_run_directory(logdir_and_target):
  """``cut_file`` moves a log's tail to ``<name>.discarded`` in the run
  directory; a folder on the way that links out of it (eval/ -> elsewhere)
  is refused, and so is a link at the .discarded file."""
  logdir, target = logdir_and_target
  (logdir / rundir.SCORES_FILE).write_text('a\nb\n')
  assert rundir.cut_file(str(logdir), rundir.SCORES_FILE, 2) == 2
  assert (logdir / rundir.SCORES_FILE).read_text() == 'a\n'
  assert (logdir / (rundir.SCORES_FILE + '.discarded')).read_text() == 'b\n'
  outside = target.parent / 'elsewhere'
  outside.mkdir()
  (outside / rundir.SCORES_FILE).write_text('x\ny\n')
  (logdir / rundir.EVAL_DIR).symlink_to(outside)
  with pytest.raises(private_files.UntrustedFileError,
                     match='not inside the run directory'):
    rundir.cut_file(str(logdir), os.path.join(rundir.EVAL_DIR,
                                              rundir.SCORES_FILE), 2)
  assert sorted(os.listdir(outside)) == [rundir.SCORES_FILE]
  assert (outside / rundir.SCORES_FILE).read_text() == 'x\ny\n'
  (logdir / rundir.METRICS_FILE).write_text('1\n2\n')
  (logdir / (rundir.METRICS_FILE + '.discarded')).symlink_to(target)
  with pytest.raises(private_files.UntrustedFileError, match='symbolic link'):
    rundir.cut_file(str(logdir), rundir.METRICS_FILE, 2)
  assert target.read_text() == 'do not touch\n'


@pytest.mark.parametrize('how,match', [
    ('chown', 'belongs to user id 65534, not to this user'),
    (0o777, 'is writable by other users (mode 777)'),
    (0o1777, 'is writable by other users (mode 1777)'),
    (0o775, 'is writable by other users (mode 775)'),
])
def test_a_logdir_another_user_owns_or_may_write_is_refused_before_writing(
    logdir_and_target, how, match):
  """A run directory another user owns (chown to nobody, as root), or one
  others may write (o+w, sticky or not; g+w, as for checkpoints: one rule,
  ``private_files``), is refused by name before anything is written to it.
  Run as root in such a folder, a planted link would have made the run
  truncate root's files."""
  logdir, _ = logdir_and_target
  if how == 'chown':
    assert os.getuid() == 0, 'the test chowns: run it as root'
    os.chown(logdir, 65534, 65534)
  else:
    os.chmod(logdir, how)
  config = make_config(size='tiny', batch_size=2, batch_length=8)
  with pytest.raises(private_files.UntrustedFileError) as e:
    rundir.validate(_run_config(logdir), config, 'single_process')
  assert str(e.value).startswith(f"--logdir '{logdir}' is refused: ")
  assert match in str(e.value) and 'nothing is written there' in str(e.value)
  assert os.listdir(logdir) == []
  os.chown(logdir, os.getuid(), os.getgid())
  os.chmod(logdir, 0o755)
  rundir.validate(_run_config(logdir), config, 'single_process')
  assert os.listdir(logdir) == []          # the probe file is gone again


def test_a_checkpoint_writable_by_others_is_not_resumed(tmp_path):
  """``rundir.check_checkpoint_files`` (run by ``validate`` before anything
  is loaded) refuses a checkpoint with a file others may write."""
  logdir = tmp_path / 'run'
  ckpt = logdir / 'checkpoints' / 'ckpt-000000000010'
  ckpt.mkdir(parents=True)
  (ckpt / rundir.REPLAY_STATE_FILE).write_text(
      json.dumps({'reverb_checkpoint': None}))
  (ckpt / rundir.LEARNER_FILE).write_bytes(b'x')
  rundir.check_checkpoint_files(str(ckpt), str(logdir))
  os.chmod(ckpt / rundir.LEARNER_FILE, 0o666)
  with pytest.raises(ValueError, match='learner.npz is writable by other'):
    rundir.check_checkpoint_files(str(ckpt), str(logdir))
  # ... and one whose file is a link (read through it, it could be any file).
  os.chmod(ckpt / rundir.LEARNER_FILE, 0o644)
  os.rename(ckpt / rundir.LEARNER_FILE, tmp_path / 'elsewhere.npz')
  (ckpt / rundir.LEARNER_FILE).symlink_to(tmp_path / 'elsewhere.npz')
  with pytest.raises(ValueError, match='learner.npz is a symbolic link'):
    rundir.check_checkpoint_files(str(ckpt), str(logdir))


def test_learner_state_round_trips_without_pickle_and_refuses_another_model(
    tmp_path):
  from agent import learning, networks
  config = make_config(size='tiny', batch_size=2, batch_length=8)
  init = learning.make_train_step(networks.make_networks(SPACES, config),
                                  jit=False).init
  state = jax.device_get(init(jax.random.PRNGKey(3)))
  path = str(tmp_path / 'learner.npz')
  with open(path, 'wb') as f:
    tree_files.save_tree(f, state)
  template = rundir.learner_state_template(config, SPACES)
  back = tree_files.load_tree(path, template)
  for a, b in zip(jax.tree_util.tree_leaves(state),
                  jax.tree_util.tree_leaves(back)):
    np.testing.assert_array_equal(a, b)
  assert type(back) is type(state)
  other = rundir.learner_state_template(
      make_config(size='size1m', batch_size=2, batch_length=8),
      SPACES)
  with pytest.raises(ValueError, match='is float32'):
    tree_files.load_tree(path, other)
  # An earlier version's pickle is named, never loaded.
  ckpt = tmp_path / 'ckpt'
  ckpt.mkdir()
  (ckpt / rundir.OLD_LEARNER_FILE).write_bytes(b'\x80\x04K\x01.')
  with pytest.raises(ValueError, match='not read'):
    rundir.load_learner_state(str(ckpt), template)


def test_a_planted_settings_file_of_the_learner_processes_is_refused(tmp_path):
  """``learner_peers.json`` is JSON signed with the run secret: a file
  written without the secret, altered, or writable by others is refused
  before anything of it is used."""
  logdir = tmp_path / 'run'
  logdir.mkdir()
  key = ensure_secret(str(logdir / SECRET_FILE))
  path = logdir / remote_peers.PEERS_FILE
  body = {'spec': {'run': {}}, 'replay': '10.0.0.1:1'}
  path.write_text(json.dumps({'body': body, 'hmac': '0' * 64}))
  with pytest.raises(ValueError, match='does not verify'):
    remote_peers.run_remote_peer(str(logdir), 1, wait_s=1)
  path.write_text(sign(key, body).replace('10.0.0.1:1', '10.6.6.6:1'))
  with pytest.raises(ValueError, match='does not verify'):
    remote_peers.run_remote_peer(str(logdir), 1, wait_s=1)
  path.write_text(sign(b'another secret of 32 bytes long!', body))
  with pytest.raises(ValueError, match='does not verify'):
    remote_peers.run_remote_peer(str(logdir), 1, wait_s=1)
  path.write_text(sign(key, body))
  assert verify(key, path.read_text(), 'x') == body
  os.chmod(path, 0o666)
  with pytest.raises(ValueError, match='writable by other users'):
    remote_peers.run_remote_peer(str(logdir), 1, wait_s=1)


@pytest.mark.parametrize('header,arrays,match', [
    (b'{"arrays": [{"dtype": "object", "shape": [1]}]}', b'', 'bad dtype'),
    (b'{"arrays": [{"dtype": "float32", "shape": [1000000]}]}', b'',
     'exceeds the frame'),
    (b'{"arrays": [{"dtype": "uint8", "shape": [-1]}]}', b'', 'bad dtype'),
    (b'[1, 2]', b'', 'not a JSON object'),
    (b'\xff\xfe', b'', 'not JSON'),
    (b'{}', b'tail', 'after the last array'),
])
def test_malformed_payloads_are_named_not_parsed_further(header, arrays,
                                                         match):
  payload = len(header).to_bytes(4, 'big') + header + arrays
  with pytest.raises(wire.WireError, match=match):
    wire.decode(memoryview(payload))


def test_payloads_round_trip_their_arrays():
  import ml_dtypes
  arrays = [np.arange(6, dtype=np.float32).reshape(2, 3),
            np.array([True, False]), np.zeros((0, 4), np.int64),
            np.ones(3, ml_dtypes.bfloat16)]
  payload = b''.join(bytes(p) for p in wire.encode({'type': 'x'}, arrays))
  header, back = wire.decode(memoryview(payload))
  assert header == {'type': 'x'}
  for a, b in zip(arrays, back):
    assert a.dtype == b.dtype and a.shape == b.shape
    np.testing.assert_array_equal(a.astype(np.float32), b.astype(np.float32))
