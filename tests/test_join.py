"""Remote actors that join a running Launchpad program.

Fast: the join service's book of claims (``join.slots.JoinSlots``), the
latent store's step-id jump, the flags (also those of learner processes on
other hosts, whose run is in tests/test_parallel.py). Slow: a real local_mp
program with join slots and real remote actors (``run_dmc.py --join``): one
in another network namespace joined by a veth pair (``tests/netns.py``, when
this runs as root with `ip`) with a copy of the run secret, SIGKILLed
mid-run; its slots freed when its connection drops and claimed again by a
second one that joins through the run directory, which stays to the end and
leaves cleanly. The attacks on the service: tests/test_join_service.py.
"""

import json
import os
import signal
import subprocess
import sys
import time

import numpy as np
import pytest
from absl import flags

from experiments import options, program_flags, run_dmc
from experiments.layouts.distributed.addresses import parse_address
from experiments.layouts.distributed.join import remote
from experiments.layouts.distributed.join.slots import (
    EPISODE_BURST, EPISODE_RATE, JoinSlots)
from experiments.run import rundir
from agent.config import make_config
from reverb_tables.config import latent_store_np_dtype
from reverb_tables.latent_store import LatentStore, id_jump, ring_capacity
from tests import netns as ns

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SMOKE = os.path.join(REPO, 'experiments', 'flags', 'smoke.flags')
RUN_DMC = os.path.join(REPO, 'experiments', 'run_dmc.py')


def test_join_slots_fit_expire_and_give_every_claim_new_step_ids():
  slots = JoinSlots(first_worker=4, num_slots=3, id_jump=90, lease_s=10.0)
  a = slots.claim(2, 'a', now=0.0)
  assert (a.offset, a.num_envs, slots.index_base(a)) == (4, 2, 90)
  with pytest.raises(ValueError, match='no 2 free join slots in a row'):
    slots.claim(2, 'b', now=1.0)
  b = slots.claim(1, 'b', now=1.0)
  assert b.offset == 6 and slots.index_base(b) == 180
  # A claim is a capability: its token, not its id.
  assert slots.check(a.claim, a.token, now=5.0) is a
  assert slots.check(a.claim, b.token, now=5.0) is None
  assert slots.check(a.claim, None, now=5.0) is None
  assert slots.check(True, a.token, now=5.0) is None
  slots.record(a, env_steps=10, items=3)
  slots.record(a, env_steps=20, items=5, episodes=1)
  # b sends nothing: its lease runs out at 11 s; a's holds to 15 s.
  assert slots.check(b.claim, b.token, now=12.0) is None
  assert list(slots.active) == [a.claim]
  # ... unless its steps wait on the replay (busy): not idle.
  a.busy = True
  assert slots.expire(now=100.0) == [] and a.claim in slots.active
  a.busy = False
  c = slots.claim(1, 'c;$(x)', now=100.0)   # a expired, b's slot: new ids
  assert c.offset == 4 and slots.index_base(c) == 3 * 90
  assert c.who == 'c___x_'
  assert slots.end(c.claim) is c and slots.end(c.claim) is None
  row = slots.row()
  assert row['join/actors'] == 0 and row['join/envs'] == 0
  assert row['join/left'] == 3
  assert (row['join/env_steps'], row['join/items'], row['join/episodes']) == (
      30, 8, 1)
  # A resumed program continues the claim numbers: ids never repeat.
  again = JoinSlots(4, 3, 90)
  again.restore(slots.state())
  assert again.index_base(again.claim(3, 'd', now=0.0)) == 4 * 90
  with pytest.raises(ValueError, match='--join_slots'):
    JoinSlots(4, 0, 90).claim(1, 'e', now=0.0)
  with pytest.raises(ValueError, match='>= 1 envs'):
    JoinSlots(4, 2, 90).claim(0, 'e', now=0.0)
  with pytest.raises(ValueError, match='at most 1'):
    JoinSlots(4, 2, 90, max_envs=1).claim(2, 'e', now=0.0)
  with pytest.raises(ValueError, match='must be an integer'):
    JoinSlots(4, 2, 90).claim('2', 'e', now=0.0)


def test_episode_allowance_is_a_bucket_per_env():
  slots = JoinSlots(0, 2, 90)
  c = slots.claim(2, 'a', now=0.0)
  burst = EPISODE_BURST * 2
  assert slots.allow_episodes(c, int(burst), dt=0.0)
  assert not slots.allow_episodes(c, 1, dt=0.0)
  assert slots.allow_episodes(c, 2 * int(EPISODE_RATE), dt=1.0)
  assert not slots.allow_episodes(c, 1, dt=0.0)


def test_a_worker_jumped_by_id_jump_allocates_nothing_new():
  """Step ids moved by ``id_jump`` (a restarted or joined actor) restart at
  slot 0 of the ring: the store's arrays do not grow to the full ring."""
  config = make_config(size='tiny', batch_length=8, replay_capacity=100_000)
  d, st = config.deter, config.stoch
  cap = ring_capacity(config, 4)
  jump = id_jump(config, 4, at_least=1000)
  assert jump >= 1000 and jump % cap == 0 and jump % 9 == 0
  store = LatentStore(config, 4)
  latents = lambda n: {  # noqa: E731
      'deter': np.ones((n, d), latent_store_np_dtype(config)),
      'stoch': np.ones((n, st), np.uint8)}
  ids = np.stack([np.full(10, 3), np.arange(10)], -1)
  store.update(ids, latents(10))
  before = store.allocated
  jumped = ids + np.array([0, 5 * jump])
  assert store.update(jumped, latents(10)) == 10
  assert store.allocated == before < cap
  got, found = store.lookup(jumped)
  assert found.all()
  _, old_found = store.lookup(ids)        # the same slots, newer steps
  assert not old_found.any()


def _parse(*args):
  fv = flags.FlagValues()
  options.define_flags(fv)
  fv(['run_dmc.py', *args])
  return fv


def test_join_and_remote_learner_flags_are_checked(tmp_path):
  """Checked at flag parsing or before anything is written or contacted."""
  with pytest.raises(flags.IllegalFlagValueError, match='--join'):
    _parse('--join=nohost')
  with pytest.raises(flags.IllegalFlagValueError, match='--join_slots'):
    _parse(f'--logdir={tmp_path}', '--join_slots=-1')
  with pytest.raises(flags.IllegalFlagValueError, match='--join_lease'):
    _parse(f'--logdir={tmp_path}', '--join_lease=0')
  # A remote actor takes only --distributed --join --num_envs
  # --join_secret_file.
  with pytest.raises(ValueError, match='--batch_size, --task'):
    run_dmc.join_args_from_flags(_parse(
        '--distributed', '--join=h:1', '--task=walker_walk', '--batch_size=8'))
  with pytest.raises(ValueError, match='--join needs --distributed'):
    run_dmc.join_args_from_flags(_parse('--join=h:1'))
  assert run_dmc.join_args_from_flags(_parse(
      '--distributed', '--join=10.0.0.1:7070', '--num_envs=3',
      '--join_secret_file=/s')) == ('10.0.0.1:7070', 3, '/s')
  # ... or the program's run directory, whose join.json names the address.
  assert run_dmc.join_args_from_flags(_parse(
      '--distributed', f'--join={tmp_path}'))[0] == str(tmp_path)
  with pytest.raises(ValueError, match='no join.json there'):
    remote.service_address(str(tmp_path))
  (tmp_path / 'join.json').write_text('{"address": "10.0.0.1:7070"}')
  assert remote.service_address(str(tmp_path)) == '10.0.0.1:7070'
  with pytest.raises(ValueError, match='must be HOST:PORT'):
    parse_address('10.0.0.1')
  assert parse_address('[::1]:7070') == ('::1', 7070)
  base = (f'--flagfile={SMOKE}', f'--logdir={tmp_path / "r"}')
  with pytest.raises(ValueError, match='need --distributed'):
    options.configs_from_flags(_parse(*base, '--join_slots=2'))
  with pytest.raises(ValueError, match='need --distributed'):
    options.configs_from_flags(_parse(*base, '--join_secret_file=/s'))
  with pytest.raises(flags.IllegalFlagValueError, match='--join_max_envs'):
    _parse(*base, '--join_max_envs=-1')
  _, _, dist = options.configs_from_flags(_parse(
      *base, '--distributed', '--join_slots=4', '--join_port=7070',
      '--bind=0.0.0.0', '--join_lease=5', '--join_max_envs=2',
      f'--join_secret_file={tmp_path / "s"}'))
  assert (dist.join_slots, dist.join_port, dist.bind, dist.join_lease_s,
          dist.join_max_envs, dist.join_secret_file) == (
      4, 7070, '0.0.0.0', 5.0, 2, str(tmp_path / 's'))
  # Learner processes on other hosts: a coordinator they reach, process 0
  # here; a remote process takes only --distributed --learner_peer --logdir
  # --bind.
  two = ('--distributed', '--learner_processes=2', '--learner_devices=2')
  with pytest.raises(ValueError, match='needs --coordinator_address'):
    options.configs_from_flags(_parse(*base, *two,
                                      '--remote_learner_processes=1'))
  with pytest.raises(ValueError, match='needs --bind'):
    options.configs_from_flags(_parse(*base, *two, '--remote_learner_processes=1',
                                      '--coordinator_address=10.0.0.1:1234'))
  with pytest.raises(ValueError, match='needs --bind'):
    run_dmc.peer_args_from_flags(_parse('--distributed', '--learner_peer=1',
                                        f'--logdir={tmp_path}'))
  with pytest.raises(ValueError, match=r'must be in \[0, --learner_processes'):
    options.configs_from_flags(_parse(
        *base, *two, '--remote_learner_processes=2',
        '--coordinator_address=10.0.0.1:1234'))
  with pytest.raises(ValueError, match='--task'):
    run_dmc.peer_args_from_flags(_parse('--distributed', '--learner_peer=1',
                                        f'--logdir={tmp_path}', '--task=walker_run'))
  assert run_dmc.peer_args_from_flags(_parse(
      '--distributed', '--learner_peer=1', f'--logdir={tmp_path}',
      '--bind=10.0.0.2')) == (str(tmp_path), 1, '10.0.0.2', '')
  # ... or from jax's environment variables: the same command on every host.
  env = {'JAX_COORDINATOR_ADDRESS': '10.0.0.1:6000', 'JAX_NUM_PROCESSES': '2',
         'JAX_PROCESS_ID': '1'}
  assert program_flags.jax_process_env(env) == {
      'coordinator_address': '10.0.0.1:6000', 'learner_processes': 2,
      'learner_peer': 1}
  assert program_flags.jax_process_env({})['learner_peer'] is None
  with pytest.raises(ValueError, match='JAX_NUM_PROCESSES'):
    program_flags.jax_process_env({'JAX_NUM_PROCESSES': 'two'})
  assert not (tmp_path / 'r').exists()


# --- slow: a real program and real remote actors ----------------------------------

def _rows(logdir):
  path = os.path.join(logdir, rundir.METRICS_FILE)
  if not os.path.exists(path):
    return []
  with open(path) as f:
    return [r for r in map(json.loads, f) if r.get('kind') == 'train']


def _wait(cond, timeout, what, procs=()):
  deadline = time.monotonic() + timeout
  while time.monotonic() < deadline:
    value = cond()
    if value:
      return value
    for p in procs:
      assert p.poll() is None, f'{what}: a process ended early ({p.args})'
    time.sleep(1.0)
  raise AssertionError(f'timed out waiting for {what}')


def _joiner(address, num_envs, log, in_ns=False, secret_file=None):
  cmd = [sys.executable, RUN_DMC, '--distributed', f'--join={address}',
         f'--num_envs={num_envs}']
  if secret_file:
    cmd.append(f'--join_secret_file={secret_file}')
  if in_ns:
    cmd = ns.wrap(cmd)
  return subprocess.Popen(cmd, cwd=REPO, stdout=log, stderr=subprocess.STDOUT,
                          env={**os.environ, 'PYTHONUNBUFFERED': '1'})


@pytest.mark.slow
def test_remote_actors_join_leave_and_die_without_stopping_the_run(tmp_path):
  """A program with 2 join slots. Remote actor A (2 envs; in another network
  namespace when possible, reaching the program at its veth address) joins;
  its episodes reach the scores and its items the replay; it is SIGKILLed.
  The run goes on (updates, and the limiter's ratio within 10 % at the
  end); the lease frees A's slots; B (1 env, this namespace, the address
  from the run directory's join.json) claims one with step ids past A's,
  stays to the budget and leaves cleanly. A resume with other --join_slots
  is refused before anything is written."""
  logdir = str(tmp_path / 'run')
  netns = ns.up()
  host = ns.HOST_IP if netns else '127.0.0.1'
  main_log = open(tmp_path / 'main.log', 'w')
  program = subprocess.Popen(
      [sys.executable, RUN_DMC, f'--flagfile={SMOKE}', f'--logdir={logdir}',
       '--distributed', '--num_actors=1', '--env_steps=8000',
       '--eval_episodes=0', '--noreport', '--log_every=200',
       '--join_slots=2', f'--bind={host}', '--join_lease=8'],
      cwd=REPO, stdout=main_log, stderr=subprocess.STDOUT,
      env={**os.environ, 'PYTHONUNBUFFERED': '1'})
  procs = [program]
  try:
    join_file = os.path.join(logdir, 'join.json')
    _wait(lambda: os.path.exists(join_file), 240, 'join.json', procs)
    address = rundir.read_json(join_file)['address']
    assert address.startswith(host + ':')
    # A's copy of the run secret (as scp would make it), given by flag.
    secret = tmp_path / 'a.secret'
    secret.write_bytes(open(os.path.join(logdir, 'join.secret'), 'rb').read())
    os.chmod(secret, 0o600)
    log_a = open(tmp_path / 'a.log', 'w')
    a = _joiner(address, 2, log_a, in_ns=netns, secret_file=str(secret))
    procs.append(a)
    row = _wait(lambda: next((r for r in reversed(_rows(logdir))
                              if r.get('join/episodes', 0) >= 1), None),
                300, "A's first episode", procs)
    assert row['join/actors'] == 1 and row['join/envs'] == 2
    assert row['join/items'] > 0 and row['join/env_steps'] > 0
    a.send_signal(signal.SIGKILL)
    a.wait(30)
    procs.remove(a)
    killed_at = _rows(logdir)[-1]
    # The lease (8 s) frees A's slots; the run goes on meanwhile.
    row = _wait(lambda: next((r for r in reversed(_rows(logdir))
                              if r.get('join/left', 0) >= 1), None),
                120, "A's claim to expire", procs)
    assert row['join/actors'] == 0
    assert row['updates'] > killed_at['updates']
    log_b = open(tmp_path / 'b.log', 'w')
    b = _joiner(logdir, 1, log_b)          # the address from join.json
    procs.append(b)
    assert b.wait(400) == 0, open(tmp_path / 'b.log').read()[-3000:]
    assert program.wait(120) == 0, open(tmp_path / 'main.log').read()[-3000:]
  finally:
    for p in procs:
      if p.poll() is None:
        p.kill()
    if netns:
      ns.down()
  service_log = open(os.path.join(logdir, 'lp_logs', 'segment-0', 'join',
                                  '0')).read()
  bases = [int(line.rpartition('step ids from ')[2])
           for line in service_log.splitlines() if 'step ids from' in line]
  assert len(bases) == 2 and bases[1] > bases[0], bases
  b_text = open(tmp_path / 'b.log').read()
  assert 'claim 1' in b_text and '[join] left (the program stopped' in b_text
  last = _rows(logdir)[-1]
  assert last['env_step'] >= 8000
  assert last['join/left'] == 2 and last['join/actors'] == 0
  assert last['join/episodes'] >= 2 and last['join/env_steps'] < last['env_step']
  # The limiter held the ratio with actors joining, dying and leaving (the
  # tolerance of tests/test_distributed.py's runs without remote actors).
  assert abs(last['replay/ratio_after_fill'] / 16.0 - 1) < 0.1, last
  with open(os.path.join(logdir, rundir.SCORES_FILE)) as f:
    scores = sum(1 for _ in f)     # every actor's, the remote ones' included
  assert last['join/episodes'] <= scores <= last['episodes'] + 2
  # Resume with other join slots: refused, nothing written.
  before = sorted(os.listdir(logdir))
  again = subprocess.run(
      [sys.executable, RUN_DMC, f'--flagfile={SMOKE}', f'--logdir={logdir}',
       '--distributed', '--num_actors=1', '--env_steps=9000',
       '--eval_episodes=0', '--noreport', '--join_slots=1'],
      cwd=REPO, capture_output=True, text=True, timeout=120)
  assert again.returncode == 2, again.stderr[-2000:]
  assert '--join_slots 1 differs from the checkpoint' in again.stderr
  assert sorted(os.listdir(logdir)) == before


PIXEL_SUITES = {
    # suite, task, its flags, a budget the remote actor joins well within
    # (the program's learner compiles for ~30 s before steps count).
    'atari': ['--suite=atari', '--task=boxing', '--action_repeat=4',
              '--env_steps=2000'],
    'crafter': ['--suite=crafter', '--task=reward', '--action_repeat=1',
                '--env_steps=800'],
}


@pytest.mark.slow
@pytest.mark.parametrize('suite', sorted(PIXEL_SUITES))
def test_a_remote_actor_plays_the_programs_pixel_suite(tmp_path, suite,
                                                       jax_cache_dir):
  """A --distributed program of Atari (Boxing) or Crafter with one env (Atari
  100k's Table 2 row), one actor and one join slot: a remote actor joins
  through the run directory, builds the program's suite and task from its
  settings (64x64x3 frames, the suite's action count), and its steps and
  items reach the program; at the budget the program stops and the remote
  actor leaves cleanly."""
  logdir = str(tmp_path / 'run')
  main_log = open(tmp_path / 'main.log', 'w')
  program = subprocess.Popen(
      [sys.executable, RUN_DMC, *PIXEL_SUITES[suite], f'--logdir={logdir}',
       '--distributed', '--num_actors=1', '--num_envs=1', '--size=tiny',
       '--batch_size=2', '--batch_length=8', '--train_ratio=16',
       '--config_overrides=imag_horizon=4', '--eval_episodes=0',
       '--noreport', '--log_every=100', '--join_slots=1',
       f'--jax_cache_dir={jax_cache_dir}'],
      cwd=REPO, stdout=main_log, stderr=subprocess.STDOUT,
      env={**os.environ, 'PYTHONUNBUFFERED': '1'}, start_new_session=True)
  procs = [program]
  try:
    _wait(lambda: os.path.exists(os.path.join(logdir, 'join.json')), 240,
          'join.json', procs)
    log_a = open(tmp_path / 'a.log', 'w')
    a = _joiner(logdir, 1, log_a)
    procs.append(a)
    row = _wait(lambda: next((r for r in reversed(_rows(logdir))
                              if r.get('join/items', 0) > 0), None),
                400, "the remote actor's items", procs)
    assert row['join/actors'] == 1 and row['join/envs'] == 1
    assert row['join/env_steps'] > 0
    assert a.wait(400) == 0, open(tmp_path / 'a.log').read()[-3000:]
    assert program.wait(180) == 0, open(tmp_path / 'main.log').read()[-3000:]
  finally:
    for p in procs:
      if p.poll() is None:
        p.kill()
    try:
      os.killpg(program.pid, signal.SIGKILL)
    except ProcessLookupError:
      pass
  a_text = open(tmp_path / 'a.log').read()
  assert 'claim 0' in a_text and '[join] left (the program stopped' in a_text
  budget = int(PIXEL_SUITES[suite][-1].split('=')[1])
  assert _rows(logdir)[-1]['env_step'] >= budget
  checkpoints = os.path.join(logdir, 'checkpoints')
  last = sorted(n for n in os.listdir(checkpoints) if n.startswith('ckpt-'))[-1]
  with open(os.path.join(checkpoints, last, 'config.json')) as f:
    spaces = json.load(f)['spaces']
  assert spaces['obs'] == {'image': [64, 64, 3]}
  assert spaces['act_dim'] == {'atari': 18, 'crafter': 17}[suite]
