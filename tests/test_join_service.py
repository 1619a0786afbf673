"""The join service against attacks, fast: a real Reverb server
with the program's tables, the real ``JoinService`` on loopback, raw
clients of the wire protocol and one real remote actor (dm_control envs,
the builder's actor) in this process.

Each attack is refused, nothing executes, nothing already stored changes,
and the service goes on serving the run's own remote actor. The learner's
variable source is a stand-in that serves the acting parameters of a real
network init (the service asks the learner for nothing else).
"""

import json
import os
import pickle
import socket
import struct
import threading
import time

import jax
import numpy as np
import pytest
from acme.utils import counting

from agent import acting
from agent.config import make_config
from experiments.layouts.distributed.addresses import parse_address
from experiments.layouts.distributed.join import remote, wire
from experiments.layouts import stopping
from experiments.layouts.distributed import program as program_lib
from experiments.layouts.distributed.secret import SECRET_FILE, read_secret
from experiments.layouts.distributed.settings import (
    DistributedConfig, ProgramSettings)
from experiments.run import rundir
from experiments.run.config import RunConfig
from experiments.run.experiment import experiment_of
from reverb_tables.tables import ONLINE_TABLE, UNIFORM_TABLE, make_server
from agent.types import EnvSpaces
from tests.smoke_model import CARTPOLE_SPACES

SLOTS = 3


class ParamsSource:
  """The learner's variable source, as the service calls it."""

  def __init__(self, params):
    self.params, self.version = params, 0

  def get_num_updates(self):
    return self.version

  def get_variables(self, names):
    table = {'policy': self.params, 'num_updates': self.version}
    return [table[n] for n in names]


def _serve(root, spaces, **run_kw):
  """(spec, service, replay client, counter) of a program with 3 join slots
  (at most 2 per remote actor) on ``spaces``, its join service serving on
  loopback; a generator: the code after its yield stops it all."""
  launch = root / 'launch'
  launch.mkdir()
  config = make_config(size='tiny', batch_size=2, batch_length=8,
                       imag_horizon=4, replay_capacity=10_000)
  run = RunConfig(task='cartpole_swingup', logdir=str(root / 'run'),
                  env_steps=100_000, num_envs=1, time_limit=1.0, **run_kw)
  os.makedirs(run.logdir)
  dist = DistributedConfig(num_actors=1, join_slots=SLOTS, join_max_envs=2,
                           join_lease_s=30.0, stop_grace_s=1.0)
  spec = ProgramSettings(
      experiment=experiment_of(run, config, spaces, SLOTS),
      dist=dist, launch_dir=str(launch))
  builder = spec.builder
  server = make_server(builder.make_replay_tables())
  replay = server.localhost_client()
  nets = builder.make_networks()
  params = acting.acting_params(nets.init(jax.random.PRNGKey(0)))
  counter = counting.Counter()
  service = program_lib.make_join_node(
      spec, replay, ParamsSource(jax.device_get(params)), counter)
  thread = threading.Thread(target=service.run, daemon=True)
  thread.start()
  yield spec, service, replay, counter
  stopping.mark_learner_done(spec.launch_dir)
  service.stop()
  thread.join(30)
  server.stop()


@pytest.fixture(scope='module')
def program(tmp_path_factory):
  """The program of ``_serve`` on cartpole_swingup's vector spaces."""
  yield from _serve(tmp_path_factory.mktemp('join'), CARTPOLE_SPACES)


def _secret(spec):
  return read_secret(os.path.join(spec.run.logdir, SECRET_FILE))


def _connect(service, secret):
  host, port = parse_address(service.address)
  return wire.connect(host, port, secret, 1 << 24)


def _claim(service, spec, num_envs=1, who='test'):
  conn = _connect(service, _secret(spec))
  conn.send({'type': 'claim', 'num_envs': num_envs, 'who': who})
  ticket, _ = conn.recv()
  assert ticket['type'] == 'claimed', ticket
  return conn, ticket


def _steps(ticket, k, n, **changes):
  """The k-th vector step of a claim's n envs: a real episode start at
  k = 0, reward 0.5 after it, the ids the claim expects."""
  from reverb_tables.packing import StepLayout
  from agent.types import step_spec
  layout = StepLayout.from_step_spec(step_spec(
      CARTPOLE_SPACES, make_config(size='tiny', batch_size=2, batch_length=8,
                                   imag_horizon=4, replay_capacity=10_000)))
  flat = {f.name: np.zeros((n,) + f.shape, f.dtype) for f in layout.fields}
  flat['is_first'][:] = k == 0
  flat['reward'][:] = 0.0 if k == 0 else 0.5
  flat['step_id'][:, 0] = ticket['offset'] + np.arange(n)
  flat['step_id'][:, 1] = ticket['index_base'] + k
  flat.update(changes)
  assert list(flat) == ticket['names']
  return list(flat.values())


def _send_steps(conn, ticket, arrays):
  conn.send({'type': 'steps', 'claim': ticket['claim'],
             'token': ticket['token'], 'names': ticket['names']}, arrays)


def _refused(conn, timeout=30.0):
  """The service's answer to a refused message; the connection then ends."""
  conn.sock.settimeout(timeout)
  while True:
    header, _ = conn.recv()
    if header['type'] == 'refused':
      with pytest.raises((ConnectionError, OSError)):
        conn.recv()
      return header['reason']


def _remote_actor_until(spec, num_envs, done, timeout=240):
  """The real remote actor (``remote.join_program``) with ``num_envs`` envs,
  in a thread, until ``done()``; then its stop signal. Returns its summary."""
  stop = threading.Event()
  box = {}
  thread = threading.Thread(target=lambda: box.update(
      remote.join_program(spec.run.logdir, num_envs, stop=stop)), daemon=True)
  thread.start()
  deadline = time.monotonic() + timeout
  while not done():
    assert thread.is_alive() and time.monotonic() < deadline, box
    time.sleep(0.5)
  stop.set()
  thread.join(60)
  assert not thread.is_alive()
  return box


def _uniform_size(replay):
  return replay.server_info()[UNIFORM_TABLE].current_size


def test_a_remote_actor_with_the_secret_joins_acts_and_leaves(program):
  """The real remote actor (``remote.join_program``): it claims slots, gets
  the settings as JSON and the acting params, acts in dm_control envs; the
  service stores its steps (items in Reverb), counts them and its episodes
  (scores summed from the stored rewards: those the actor saw), and its
  leave frees the slots."""
  spec, service, replay, counter = program
  before = service.row()
  scores_file = os.path.join(spec.run.logdir, rundir.SCORES_FILE)
  offset = os.path.getsize(scores_file) if os.path.exists(scores_file) else 0
  box = _remote_actor_until(
      spec, 2, lambda: service.row()['join/episodes']
      >= before['join/episodes'] + 2)
  row = service.row()
  assert row['join/actors'] == 0 and row['join/left'] == before['join/left'] + 1
  assert row['join/items'] > before['join/items'] and _uniform_size(replay)
  counts = counter.get_counts()
  assert counts['env_steps'] == 2 * counts['actor_steps'] > 0   # repeat 2
  assert box['steps'] > 0 and box['stopped_by'] == 'a stop signal'
  with open(scores_file) as f:
    f.seek(offset)
    stored = [json.loads(line)['score'] for line in f]
  assert len(stored) >= 2
  assert all(any(abs(x - y) < 1e-9 for y in box['scores']) for x in stored)


def test_a_remote_actor_sends_images_through_the_join(tmp_path):
  """DMC vision through the join (spec 2.10): the real remote actor renders
  64x64 frames with MuJoCo EGL and sends them as uint8 arrays; the service
  checks and stores them, and the stored items hold the frames."""
  spaces = EnvSpaces(obs={'image': (64, 64, 3), **CARTPOLE_SPACES.obs},
                     act_dim=CARTPOLE_SPACES.act_dim)
  served = _serve(tmp_path, spaces, image=True)
  spec, service, replay, _ = next(served)
  try:
    box = _remote_actor_until(spec, 1, lambda: service.row()['join/items'] >= 2)
    assert box['steps'] > 0
    from reverb_tables.packing import StepLayout
    from agent.types import step_spec
    layout = StepLayout.from_step_spec(step_spec(spaces, spec.config))
    # The uniform table's rate limiter waits for the fill; the online queue
    # (spec 5.4) hands out what is stored.
    sample = next(replay.sample(ONLINE_TABLE, num_samples=1,
                                emit_timesteps=False))
    frames = layout.unpack(np.stack([sample.data[0]]))['observation']['image']
    assert frames.dtype == np.uint8 and frames.shape[-3:] == (64, 64, 3)
    assert frames.std() > 5
  finally:
    for _ in served:
      pass


def test_join_without_the_secret_or_with_a_wrong_one_is_refused(program,
                                                                tmp_path):
  spec, service, replay, _ = program
  before = service.row()
  with pytest.raises(wire.AuthError, match='refused the run secret'):
    _connect(service, b'\x01' * 32)
  # A client that sends no proof at all: cut off after the handshake time.
  host, port = parse_address(service.address)
  with socket.create_connection((host, port), timeout=30) as s:
    s.recv(48)
    s.sendall(b'GET / HTTP/1.0\r\n\r\n' + b'x' * 64)
    assert s.recv(4) == wire.DENY
  # ... and --join with a run directory whose secret is not private.
  other = tmp_path / 'copy'
  other.mkdir()
  (other / 'join.json').write_text(json.dumps({'address': service.address}))
  (other / SECRET_FILE).write_text('ab' * 32)
  os.chmod(other / SECRET_FILE, 0o644)
  with pytest.raises(ValueError, match='readable by other users'):
    remote.join_program(str(other), 1)
  deadline = time.monotonic() + 10     # the service counts after its DENY
  while service.row()['join/refused'] < before['join/refused'] + 2:
    assert time.monotonic() < deadline, service.row()
    time.sleep(0.1)
  assert service.row()['join/actors'] == before['join/actors']


def test_a_pickled_payload_never_runs(program, tmp_path):
  """Before the handshake and after it: a pickle whose ``__reduce__`` would
  write a marker file is refused as malformed, never loaded."""
  spec, service, _, _ = program
  marker = tmp_path / 'pwned'

  class Evil:
    def __reduce__(self):
      return (os.system, (f'echo $PPID > {marker}',))

  payload = pickle.dumps(Evil())
  host, port = parse_address(service.address)
  with socket.create_connection((host, port), timeout=30) as s:
    s.recv(48)
    s.sendall(payload.ljust(64, b'\0'))
    assert s.recv(4) == wire.DENY
  conn = _connect(service, _secret(spec))     # authenticated, then a pickle
  with conn._lock:                            # noqa: SLF001 (raw frame)
    mac = wire.hmac.new(conn._send_key, struct.pack('>Q', conn._send_seq),  # noqa: SLF001
                        wire.hashlib.sha256)
    mac.update(payload)
    conn.sock.sendall(struct.pack('>I', len(payload)) + payload + mac.digest())
  with pytest.raises((ConnectionError, OSError)):
    conn.recv()
  time.sleep(1.0)
  assert not marker.exists()


def test_forged_and_stale_claim_tokens_are_refused(program):
  spec, service, _, _ = program
  a, ta = _claim(service, spec)
  b, tb = _claim(service, spec)
  # b names a's claim with a guessed token.
  b.send({'type': 'heartbeat', 'claim': ta['claim'], 'token': '0' * 32})
  assert 'unknown claim or wrong token' in _refused(b)
  # a is untouched and still held.
  a.send({'type': 'heartbeat', 'claim': ta['claim'], 'token': ta['token']})
  assert a.recv()[0]['answer'] == 'ok'
  a.send({'type': 'leave', 'claim': ta['claim'], 'token': ta['token']})
  assert a.recv()[0]['type'] == 'left'
  # The stale token of a claim that ended grants nothing.
  c, _ = _claim(service, spec)
  c.send({'type': 'heartbeat', 'claim': ta['claim'], 'token': ta['token']})
  assert 'unknown claim or wrong token' in _refused(c)
  assert service.row()['join/actors'] == 0


@pytest.mark.parametrize('bad,match', [
    ('nan', "'observation/position' contains NaN"),
    ('shape', "'action': shape"),
    ('step_id', "'step_id' must be"),
    ('classes', "'latent/stoch' holds a class index"),
    ('orphan', 'not is_first outside an episode'),
    ('reward', "'reward' is outside the env's declared range [0, 2]"),
    ('obs', "'observation/velocity' holds |value| 1e+30 > the replay value "
     'limit'),
    ('action', "'action' is outside the policy's range [-7, 7]"),
])
def test_bad_steps_are_refused_and_nothing_stored_changes(program, bad,
                                                          match):
  """A claim sends one bad vector step (after a good one, or as its first):
  refused with the key named, counted, its claim ends; nothing stored or
  counted changes. Finite but implausible values too (``step_checks``:
  dm_control rewards, the policy's actions, the value limit), and the
  episode that a bad step ends writes no score: the issue's one-step
  episodes of reward 1e30 put 1e30 into scores.jsonl."""
  spec, service, replay, counter = program
  conn, ticket = _claim(service, spec, 2)
  k = 1
  if bad == 'orphan':                  # its first step is not is_first
    arrays = _steps(ticket, 0, 2, is_first=np.zeros(2, bool))
    k = 0
  else:
    _send_steps(conn, ticket, _steps(ticket, 0, 2))
    assert conn.recv()[0] == {'type': 'stored', 'steps': 1}
    arrays = _steps(ticket, 1, 2)
  names = ticket['names']
  if bad == 'nan':
    arrays[names.index('observation/position')][1, 2] = np.nan
  elif bad == 'shape':
    arrays[names.index('action')] = np.zeros((2, 3), np.float32)
  elif bad == 'step_id':
    arrays[names.index('step_id')][:, 1] += 10**6
  elif bad == 'classes':
    arrays[names.index('latent/stoch')][0, 0] = spec.config.classes
  elif bad == 'reward':               # ... and it ends both envs' episodes
    arrays[names.index('reward')][1] = 1e30
    arrays[names.index('is_last')][:] = True
  elif bad == 'obs':
    arrays[names.index('observation/velocity')][0, 1] = 1e30
  elif bad == 'action':
    arrays[names.index('action')][1, 0] = -8.0
  scores_file = os.path.join(spec.run.logdir, rundir.SCORES_FILE)
  scores = os.path.getsize(scores_file) if os.path.exists(scores_file) else 0
  steps = counter.get_counts().get('actor_steps', 0)
  size, refused = _uniform_size(replay), service.row()['join/refused']
  _send_steps(conn, ticket, arrays)
  assert match in _refused(conn)
  row = service.row()
  assert row['join/refused'] == refused + 1
  assert _uniform_size(replay) == size
  assert counter.get_counts().get('actor_steps', 0) == steps
  assert row['join/actors'] == 0
  assert (os.path.getsize(scores_file) if os.path.exists(scores_file)
          else 0) == scores
  del k


def test_an_oversized_message_is_refused_before_it_is_read(program):
  spec, service, _, _ = program
  conn, ticket = _claim(service, spec)
  refused = service.row()['join/refused']
  conn.sock.sendall(struct.pack('>I', 1 << 30))      # a 1 GiB frame
  with pytest.raises((ConnectionError, OSError)):
    conn.sock.settimeout(30)
    while conn.sock.recv(1 << 16):
      pass
    raise ConnectionError('closed')
  time.sleep(0.5)
  assert service.row()['join/refused'] == refused + 1
  assert service.row()['join/actors'] == 0


def test_one_client_cannot_take_more_than_its_cap_nor_slots_beyond_the_free(
    program):
  spec, service, _, _ = program
  conn = _connect(service, _secret(spec))
  conn.send({'type': 'claim', 'num_envs': 3, 'who': 'greedy'})
  assert 'at most 2' in conn.recv()[0]['reason']
  a, _ = _claim(service, spec, 2, who='a; rm -rf / #' + 'x' * 200)
  b, _ = _claim(service, spec, 1)                    # every slot is taken
  c = _connect(service, _secret(spec))
  c.send({'type': 'claim', 'num_envs': 1, 'who': 'late'})
  assert 'no 1 free join slots' in c.recv()[0]['reason']
  assert service.row()['join/envs'] == SLOTS
  for conn in (a, b):          # a closed connection frees its slots at once
    conn.close()
  deadline = time.monotonic() + 30
  while service.row()['join/envs']:
    assert time.monotonic() < deadline
    time.sleep(0.2)


def test_an_episode_flood_is_refused(program):
  """Every step an episode end and a new start: more episodes than the
  per-env rate allows are refused, not written to the scores."""
  spec, service, _, _ = program
  conn, ticket = _claim(service, spec)
  flags = {'is_first': np.ones(1, bool), 'is_last': np.ones(1, bool)}
  reason = None
  for k in range(200):
    try:
      _send_steps(conn, ticket, _steps(ticket, k, 1, **flags))
    except OSError:
      break
  reason = _refused(conn)
  assert 'more episodes ended' in reason


# -- slow and hostile peers ------------------------------------------------------


def _closed_within(sock, seconds):
  """Seconds until the service closed ``sock`` (EOF or reset), or None when
  it stayed open ``seconds``."""
  t0 = time.monotonic()
  sock.settimeout(0.2)
  while time.monotonic() - t0 < seconds:
    try:
      if not sock.recv(1 << 16):
        return time.monotonic() - t0
    except socket.timeout:
      continue
    except OSError:
      return time.monotonic() - t0
  return None


def _conn_threads():
  return sum(t.name == 'join-conn' for t in threading.enumerate())


def test_a_handshake_trickled_a_byte_a_second_is_cut_at_its_deadline(
    program, monkeypatch):
  """One deadline for the whole handshake: each byte comes well within any
  per-read timeout, yet the connection closes when the deadline passes,
  long before its 64 bytes are in."""
  spec, service, _, _ = program
  monkeypatch.setattr(service, 'handshake_s', 3.0)
  refused = service.row()['join/refused']
  host, port = parse_address(service.address)
  with socket.create_connection((host, port), timeout=30) as s:
    assert len(s.recv(48)) == 48
    t0, closed = time.monotonic(), False
    for _ in range(wire.NONCE_BYTES + wire.TAG_BYTES - 1):
      try:
        s.sendall(b'x')
      except OSError:
        closed = True
        break
      if _closed_within(s, 1.0) is not None:
        closed = True
        break
    took = time.monotonic() - t0
  assert closed and took < 3.0 + 2.0, took
  deadline = time.monotonic() + 5
  while service.row()['join/refused'] < refused + 1:
    assert time.monotonic() < deadline
    time.sleep(0.1)


def test_connections_past_the_unauthenticated_cap_are_closed_at_once(
    program, monkeypatch):
  """Silent connections (what a half-open one looks like to the service)
  hold the cap of connections in their handshake; the next ones are closed
  before any hello and hold no thread; once the silent ones are gone an
  authorised actor connects."""
  spec, service, _, _ = program
  cap = 4
  monkeypatch.setattr(service, 'max_unauthenticated', cap)
  monkeypatch.setattr(service, 'handshake_s', 30.0)
  host, port = parse_address(service.address)
  threads = _conn_threads()
  silent = []
  for _ in range(cap):
    s = socket.create_connection((host, port), timeout=30)
    assert len(s.recv(48)) == 48            # its hello: in the handshake
    silent.append(s)
  extra = [socket.create_connection((host, port), timeout=30)
           for _ in range(10)]
  for s in extra:
    assert _closed_within(s, 5.0) is not None
    s.close()
  assert _conn_threads() <= threads + cap
  # An authorised client meanwhile: closed before the hello, a retryable
  # ConnectionError (remote._connect tries again), not an AuthError.
  with pytest.raises(ConnectionError):
    _connect(service, _secret(spec))
  for s in silent:
    s.close()
  deadline = time.monotonic() + 10
  while True:
    try:
      conn, ticket = _claim(service, spec)
      break
    except ConnectionError:
      assert time.monotonic() < deadline
      time.sleep(0.2)
  conn.send({'type': 'leave', 'claim': ticket['claim'],
             'token': ticket['token']})
  assert conn.recv()[0]['type'] == 'left'


def test_an_authenticated_connection_that_never_claims_is_dropped(
    program, monkeypatch):
  """A secret holder's connection that sends nothing, and one that
  trickles its claim frame a byte a second, are both closed when the claim
  deadline passes, and counted."""
  spec, service, _, _ = program
  monkeypatch.setattr(service, 'claim_s', 2.0)
  refused = service.row()['join/refused']
  idle = _connect(service, _secret(spec))
  slow = _connect(service, _secret(spec))
  t0 = time.monotonic()
  for _ in range(3):                        # a length prefix, slowly
    slow.sock.sendall(b'\0')
    time.sleep(1.0)
  assert _closed_within(idle.sock, 10.0) is not None
  assert _closed_within(slow.sock, 10.0) is not None
  assert time.monotonic() - t0 < 2.0 + 4.0
  deadline = time.monotonic() + 5
  while service.row()['join/refused'] < refused + 2:
    assert time.monotonic() < deadline
    time.sleep(0.1)
  assert service.row()['join/actors'] == 0


def _raw_frame(conn, header_bytes, array_bytes=b''):
  """Sends a correctly tagged frame whose header is ``header_bytes`` as
  given (no encoder in between)."""
  payload = struct.pack('>I', len(header_bytes)) + header_bytes + array_bytes
  with conn._lock:                            # noqa: SLF001 (raw frame)
    mac = wire.hmac.new(conn._send_key, struct.pack('>Q', conn._send_seq),  # noqa: SLF001
                        wire.hashlib.sha256)
    mac.update(payload)
    conn._send_seq += 1                       # noqa: SLF001
    conn.sock.sendall(struct.pack('>I', len(payload)) + payload +
                      mac.digest())


DEEP_JSON = b'{"a":' + b'[' * 20_000 + b']' * 20_000 + b'}'
# 2**32 * 2**32 = 2**64 elements: numpy's int64 product wraps to 0.
WRAPPING_SHAPE = json.dumps({'type': 'steps', 'arrays': [
    {'dtype': 'uint8', 'shape': [2**32, 2**32]}]}).encode()


@pytest.mark.parametrize('header,match', [
    (DEEP_JSON, 'nested deeper'),
    (WRAPPING_SHAPE, 'too large'),
    # wraps to 0 elements in int64; and to 16 bytes with 16 bytes sent
    (b'{"arrays": [{"dtype": "float32", "shape": [4611686018427387904, 4]}]}',
     'too large'),
    # an empty array numpy cannot shape
    (b'{"arrays": [{"dtype": "uint8", "shape": [0, 18446744073709551616]}]}',
     'too large'),
    # at the element bound: a plain size check against the frame
    (b'{"arrays": [{"dtype": "uint8", "shape": [1048576, 1048576]}]}',
     'exceeds the frame'),
    (b'{"n": ' + b'9' * 5000 + b'}', 'not JSON'),
])
def test_deep_json_and_huge_shapes_are_wire_errors(header, match):
  payload = struct.pack('>I', len(header)) + header + bytes(16)
  with pytest.raises(wire.WireError, match=match):
    wire.decode(memoryview(payload))


@pytest.mark.parametrize('frame', ['deep_json', 'wrapping_shape'])
def test_deep_json_and_wrapping_shapes_are_refused_in_one_log_line(
    program, monkeypatch, capfd, frame):
  """Before and after the claim: the connection is closed and counted, and
  the log gets one line for it (no traceback); a burst of them within
  ``DENIED_LOG_S`` adds no more."""
  spec, service, _, _ = program
  monkeypatch.setattr(service.refusal_log, '_logged', {})
  header = DEEP_JSON if frame == 'deep_json' else WRAPPING_SHAPE
  match = 'nested deeper' if frame == 'deep_json' else 'too large'
  capfd.readouterr()
  refused = service.row()['join/refused']
  conns = []
  for claimed in (True, False, False, False):
    conn, _ = (_claim(service, spec) if claimed else
               (_connect(service, _secret(spec)), None))
    _raw_frame(conn, header)
    conns.append(conn)
  for conn in conns:
    assert _closed_within(conn.sock, 10.0) is not None
  deadline = time.monotonic() + 10
  while service.row()['join/refused'] < refused + len(conns):
    assert time.monotonic() < deadline, service.row()
    time.sleep(0.1)
  time.sleep(0.5)
  err = capfd.readouterr().err
  lines = [line for line in err.splitlines() if match in line]
  assert len(lines) == 1, err
  assert 'Traceback' not in err, err
  assert service.row()['join/actors'] == 0
