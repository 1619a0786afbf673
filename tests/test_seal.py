"""The sealed program (experiments/layouts/distributed/seal.py).

Fast: the ``--isolation`` decision (refused namespaces simulated with
``DREAMER_SEAL_FAIL``), ``required`` refusing before anything is written,
an unprivileged user namespace (a child that drops to ``nobody`` first,
when this runs as root), the join listener handed across namespaces.

A real sealed ``--distributed`` smoke program with join slots (default
suite, bounded): every port its processes listen on, read from their own
network namespace, is refused or times out from this namespace (loopback
and this host's addresses) and from a second one over a veth pair
(``tests/netns.py``, when this runs as root with `ip`), and a courier
pickle, a forged ``increment`` and a Reverb client sent to each from here
reach nothing; the join port answers, and an authorised remote actor joins
and adds env steps; the run ends at its budget. From inside the program's
network (a process that entered it with nsenter), windows with reward 1e6
written straight into both Reverb tables are dropped by the learner's
sampler and counted, and its return scale stays within what the task's
rewards allow.
"""

import json
import os
import socket
import subprocess
import sys
import time

import psutil
import pytest

from experiments.layouts.distributed import seal
from experiments.layouts.distributed.join import wire
from experiments.layouts.distributed.join.service import (
    join_address, make_listener)
from experiments.layouts.distributed.settings import DistributedConfig
from experiments.run import rundir
from bench.attacks import POISON  # the Reverb writer of the attack bench
from tests import netns as ns
from tests.test_join import _rows, _wait  # one home for the run-file helpers

# Why this machine cannot seal a program ('' when it can): the tests that
# need a namespace say so and skip rather than fail on such a kernel.
CANNOT_SEAL = seal._probe()  # noqa: SLF001
needs_seal = pytest.mark.skipif(bool(CANNOT_SEAL), reason=f'this kernel '
                                f'refuses a private network: {CANNOT_SEAL}')

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SMOKE = os.path.join(REPO, 'experiments', 'flags', 'smoke.flags')
RUN_DMC = os.path.join(REPO, 'experiments', 'run_dmc.py')


def test_isolation_decides_before_anything_is_written(monkeypatch):
  assert seal.decide(DistributedConfig(isolation='off')) == seal.Decision(
      False, '--isolation=off')
  assert seal.decide(DistributedConfig()).sealed == (not CANNOT_SEAL)
  monkeypatch.setenv(seal.FAIL_ENV, '1')
  auto = seal.decide(DistributedConfig())
  assert not auto.sealed and 'simulated' in auto.reason
  with pytest.raises(ValueError, match='--isolation=required: cannot seal'):
    seal.decide(DistributedConfig(isolation='required'))
  remote = dict(learner_processes=2, remote_learner_processes=1,
                coordinator_address='10.0.0.1:1234', bind='10.0.0.1')
  monkeypatch.delenv(seal.FAIL_ENV)
  assert 'trusted' in seal.decide(DistributedConfig(**remote)).reason
  with pytest.raises(ValueError, match='remote_learner_processes'):
    seal.decide(DistributedConfig(isolation='required', **remote))
  with pytest.raises(ValueError, match='--isolation must be one of'):
    DistributedConfig(isolation='maybe')
  line = seal.open_ports_line('why', {'replay': [1], 'actor': [2, 3]})
  assert line.count('\n') == 0 and 'why' in line and 'actor 2,3' in line


def test_required_refuses_to_start_where_it_cannot_seal(tmp_path):
  """``--isolation=required`` where namespaces are refused (simulated): exit
  2 naming why, and the run directory was never made."""
  logdir = tmp_path / 'run'
  out = subprocess.run(
      [sys.executable, RUN_DMC, '--distributed', f'--flagfile={SMOKE}',
       f'--logdir={logdir}', '--isolation=required', '--join_slots=1'],
      cwd=REPO, capture_output=True, text=True, timeout=120,
      env={**os.environ, seal.FAIL_ENV: '1'})
  assert out.returncode == 2, out.stderr[-2000:]
  assert 'cannot seal' in out.stderr and 'simulated' in out.stderr
  assert not logdir.exists()


def _in_child(fn) -> str:
  """Runs ``fn()`` in a forked child; '' when it returned, else its error."""
  read, write = os.pipe()
  pid = os.fork()
  if pid == 0:
    os.close(read)
    try:
      fn()
      os._exit(0)
    except BaseException as e:  # noqa: BLE001
      os.write(write, repr(e).encode()[:2000])
      os._exit(1)
  os.close(write)
  with os.fdopen(read, 'rb') as f:
    why = f.read().decode()
  _, status = os.waitpid(pid, 0)
  return why or ('' if status == 0 else f'status {status}')


@needs_seal
def test_an_unprivileged_user_gets_a_sealed_network():
  """As ``nobody`` (a fork of this root process): a user namespace that maps
  the uid and gid to themselves, and a network namespace whose only
  interface is lo, up (a listener there takes connections)."""
  if os.geteuid() != 0:
    pytest.skip('needs root to drop to another user (this already is one)')

  def unprivileged():
    os.setgroups([])
    os.setgid(65534)
    os.setuid(65534)
    # A uid change makes a process undumpable, its /proc files root's; a
    # user's own process (an exec after login) is dumpable.
    import ctypes
    ctypes.CDLL(None).prctl(4, 1, 0, 0, 0)        # PR_SET_DUMPABLE
    seal.enter_private_network()
    assert os.getuid() == 65534 and os.getgid() == 65534
    names = [n for _, n in socket.if_nameindex()]
    assert names == ['lo'], names
    with socket.socket() as s:
      s.bind(('127.0.0.1', 0))
      s.listen(1)
      socket.create_connection(s.getsockname(), timeout=5).close()

  why = _in_child(unprivileged)
  if why.startswith('PermissionError') and 'unshare' in why:
    pytest.skip(f'unprivileged user namespaces are off here: {why}')
  assert why == '', why


@needs_seal
def test_the_join_listener_crosses_namespaces():
  """Bound here, handed over the broker's Unix socket to a child in a sealed
  namespace, it accepts there the connections made here."""
  listener = make_listener('', 0)
  port = listener.getsockname()[1]
  broker = seal.ListenerBroker(listener, join_address('', port))
  assert oct(os.stat(os.path.dirname(broker.path)).st_mode & 0o777) == '0o700'

  def accept_one():
    seal.enter_private_network()
    sock, address = seal.receive_listener(broker.path)
    assert address == f'127.0.0.1:{port}'
    sock.settimeout(20)
    conn, _ = sock.accept()
    conn.sendall(b'sealed')
    conn.close()

  read, write = os.pipe()
  pid = os.fork()
  if pid == 0:
    os.close(read)
    code = 0
    try:
      accept_one()
    except BaseException as e:  # noqa: BLE001
      os.write(write, repr(e).encode())
      code = 1
    os._exit(code)
  os.close(write)
  try:
    with socket.create_connection(('127.0.0.1', port), timeout=20) as c:
      c.settimeout(20)
      assert c.recv(16) == b'sealed'
  finally:
    _, status = os.waitpid(pid, 0)
    with os.fdopen(read, 'rb') as f:
      err = f.read().decode()
    broker.close()
  assert status == 0, err


# --- a real sealed program ---------------------------------------------------------------


def _listening_ports(pid):
  """Ports in LISTEN state in the network namespace of process ``pid``."""
  ports = set()
  for name in ('tcp', 'tcp6'):
    try:
      with open(f'/proc/{pid}/net/{name}') as f:
        lines = f.read().splitlines()[1:]
    except OSError:
      continue
    for line in lines:
      fields = line.split()
      if fields[3] == '0A':
        ports.add(int(fields[1].rsplit(':', 1)[1], 16))
  return ports


def _host_addresses():
  out = ['127.0.0.1', '::1']
  for addrs in psutil.net_if_addrs().values():
    for a in addrs:
      if a.family == socket.AF_INET and not a.address.startswith('127.'):
        out.append(a.address)
  return out


def _reaches(host, port, timeout=1.0):
  family = socket.AF_INET6 if ':' in host else socket.AF_INET
  with socket.socket(family, socket.SOCK_STREAM) as s:
    s.settimeout(timeout)
    try:
      s.connect((host, port))
      return True
    except OSError:
      return False


class Evil:
  """A pickle that writes a marker file when it is loaded (courier
  unpickles the arguments of a call before it looks at the method)."""

  def __init__(self, marker):
    self.marker = str(marker)

  def __reduce__(self):
    return (os.system, (f'echo $PPID >> {self.marker}',))


def _inside(pid, cmd):
  """``cmd`` run in the network namespace of process ``pid`` (the owner of
  a user namespace holds every capability in it: no root needed)."""
  enter = ['nsenter', '-t', str(pid), '-n']
  if os.getuid() != 0:
    enter = ['nsenter', '-t', str(pid), '-U', '-n', '--preserve-credentials']
  return enter + cmd


PROBE = r'''
import socket, sys, json
host, ports = sys.argv[1], json.loads(sys.argv[2])
out = {}
for p in ports:
  s = socket.socket(); s.settimeout(1.0)
  try:
    s.connect((host, p)); out[p] = True
  except OSError:
    out[p] = False
  s.close()
print(json.dumps(out))
'''


def _node_pids(launcher):
  """{group: [pid]} of the program's node processes."""
  out = {}
  for proc in psutil.Process(launcher.pid).children(recursive=True):
    try:
      group = proc.environ().get('DREAMER_NODE_GROUP')
    except (psutil.NoSuchProcess, psutil.AccessDenied):
      continue
    if group:
      out.setdefault(group, []).append(proc.pid)
  return out


@needs_seal
def test_a_sealed_program_exposes_only_its_join_port(tmp_path, smoke_flags):
  """The program's node ports (Reverb and every courier) exist only in its
  own network namespace: from this one (loopback and this host's addresses)
  and from a second one over a veth pair, each is refused or times out.
  The join port answers, an authorised remote actor (in the second
  namespace when there is one) joins and adds env steps, and the run ends
  at its budget."""
  logdir = str(tmp_path / 'run')
  netns = ns.up()
  host = ns.HOST_IP if netns else '127.0.0.1'
  log = open(tmp_path / 'main.log', 'w')
  # Train ratio 4 (smoke's is 16): the budget is reached in a quarter of the
  # updates, and the remote actor still joins early (measured: at env step
  # ~250 of 12000, adding ~4400).
  program = subprocess.Popen(
      [sys.executable, RUN_DMC, f'--flagfile={SMOKE}', f'--logdir={logdir}',
       '--distributed', '--num_actors=1', '--env_steps=12000',
       '--train_ratio=4',
       '--eval_episodes=0', '--noreport', '--join_slots=1', f'--bind={host}',
       '--stop_grace=20', '--learner_log_every=5', *smoke_flags],
      cwd=REPO, stdout=log, stderr=subprocess.STDOUT,
      env={**os.environ, 'PYTHONUNBUFFERED': '1'}, start_new_session=True)
  procs = [program]
  joiner = None
  try:
    join_file = os.path.join(logdir, 'join.json')
    _wait(lambda: os.path.exists(join_file), 240, 'join.json', procs)
    address = rundir.read_json(join_file)['address']
    join_port = int(address.rsplit(':', 1)[1])
    assert address == f'{host}:{join_port}'
    # Wait for every node (the learner's and actor's couriers come up last).
    groups = _wait(lambda: (lambda g: g if {'replay', 'counter', 'learner',
                                            'actor', 'join', 'limiter'}
                            <= set(g) else None)(_node_pids(program)),
                   120, 'the nodes', procs)
    # An authorised remote actor joins through the join port and adds env
    # steps; started now, so that its start-up overlaps the checks below and
    # the program has not reached its budget before it acts.
    secret = tmp_path / 'a.secret'
    secret.write_bytes(open(os.path.join(logdir, 'join.secret'), 'rb').read())
    os.chmod(secret, 0o600)
    cmd = [sys.executable, RUN_DMC, '--distributed', f'--join={address}',
           '--num_envs=1', f'--join_secret_file={secret}']
    joiner = subprocess.Popen(ns.wrap(cmd) if netns else cmd, cwd=REPO,
                              stdout=open(tmp_path / 'a.log', 'w'),
                              stderr=subprocess.STDOUT,
                              env={**os.environ, 'PYTHONUNBUFFERED': '1'})
    procs.append(joiner)
    ours = os.readlink('/proc/self/ns/net')
    spaces = {os.readlink(f'/proc/{p}/ns/net') for ps in groups.values()
              for p in ps}
    assert len(spaces) == 1 and ours not in spaces, (spaces, ours)
    pid = groups['replay'][0]
    ports = _wait(lambda: (lambda p: p if len(p) >= 6 else None)(
        _listening_ports(pid)), 120, 'the node ports', procs)
    # A port number the program uses may be taken here by something else
    # (the namespaces pick ports independently): leave those out.
    mine = _listening_ports(os.getpid())
    assert join_port in mine and join_port not in ports
    checked = sorted(ports - mine)
    assert len(checked) >= 5, (ports, mine)
    reached = [(h, p) for h in _host_addresses() for p in checked
               if _reaches(h, p)]
    assert not reached, reached
    assert _reaches(host, join_port)
    if netns:
      out = subprocess.run(ns.wrap([sys.executable, '-c', PROBE, ns.HOST_IP,
                                    json.dumps(checked + [join_port])]),
                           capture_output=True, text=True, timeout=120)
      seen = {int(k): v for k, v in json.loads(out.stdout).items()}
      assert seen.pop(join_port) is True
      assert not any(seen.values()), seen
    # The known attacks, from this namespace: a code-running pickle and a
    # forged step count to every port as a courier call, a Reverb client on
    # every port: nothing connects, nothing runs.
    import courier
    import reverb
    marker = tmp_path / 'pwned'
    for p in checked:
      client = courier.Client(f'127.0.0.1:{p}', call_timeout=2)
      for call in (lambda: client.run(Evil(marker)),
                   lambda: client.increment(env_steps=10**9)):
        with pytest.raises(Exception):  # noqa: B017  (gRPC: unavailable)
          call()
      with pytest.raises(Exception):    # noqa: B017
        reverb.Client(f'127.0.0.1:{p}').server_info(timeout=2)
    assert not marker.exists()
    # From inside: windows of reward 1e6 written straight into both tables
    # (the finiteness check alone stored them, and ret_scale went to 4.6e4).
    out = subprocess.run(_inside(pid, [sys.executable, '-c', POISON,
                                       json.dumps(checked), '30']),
                         capture_output=True, text=True, timeout=240, cwd=REPO)
    assert out.returncode == 0, out.stderr[-2000:]
    written = json.loads(out.stdout)  # the limiter may hold some writes
    assert sum(written.values()) > 0, written
    # The join port speaks the wire protocol (an unauthenticated hello).
    with socket.create_connection((host, join_port), timeout=10) as s:
      assert s.recv(len(wire.MAGIC)) == wire.MAGIC
    row = _wait(lambda: next((r for r in reversed(_rows(logdir))
                              if r.get('join/env_steps', 0) > 0), None),
                300, 'the remote actor\'s env steps', procs)
    assert row['join/actors'] == 1
    assert joiner.wait(300) == 0, open(tmp_path / 'a.log').read()[-3000:]
    assert program.wait(120) == 0, open(tmp_path / 'main.log').read()[-3000:]
  finally:
    for p in procs:
      if p.poll() is None:
        p.kill()
    try:                    # the sealed child and its nodes share the group
      os.killpg(program.pid, 9)
    except ProcessLookupError:
      pass
    if netns:
      ns.down()
  text = open(tmp_path / 'main.log').read()
  assert '[run] sealed' in text and 'not sealed' not in text
  last = _rows(logdir)[-1]
  assert last['env_step'] >= 12000 and last['join/env_steps'] > 0
  assert last['env_step'] < 10**6          # no forged count got in
  assert last['replay/dropped_items'] > 0  # the poisoned windows, counted
  # Rewards of this task are at most 1 per control step, so 2 per agent step
  # (repeat 2); with the discount 1 - 1/333 (spec 3.6)
  # no return exceeds 2 * 333, and so neither can the return scale.
  learner = [r for r in map(json.loads, open(os.path.join(logdir,
                                                          rundir.METRICS_FILE)))
             if r.get('kind') == 'learner']
  assert learner
  assert max(r['train/ret_scale'] for r in learner) <= 2 * 333


def _netns_summary():
  """What a sealed child reports about itself (picklable by reference)."""
  return {'netns': os.readlink('/proc/self/ns/net'), 'inside': seal.inside(),
          'interfaces': [n for _, n in socket.if_nameindex()]}


def _fails():
  raise ValueError('a bad flag, found in the child')


@needs_seal
@pytest.mark.parametrize('fresh', [False, True])
def test_the_sealed_child_returns_its_summary_or_its_error(fresh):
  """A fork, or a new interpreter (what a process that already runs jax
  gets): the body runs in its own network with only lo; its summary comes
  back, and a ValueError comes back as one. The fork is made from a clean
  interpreter, as the command line makes it: this pytest process may run
  jax's threads already (earlier tests), and forking it could crash."""
  if fresh:
    out = seal.run_sealed(_netns_summary, fresh=True)
    with pytest.raises(ValueError, match='found in the child') as e:
      seal.run_sealed(_fails, fresh=True)
    err = str(e.value)
  else:
    script = (
        'import json\n'
        'from experiments.layouts.distributed import seal\n'
        'from tests.test_seal import _netns_summary, _fails\n'
        'out = seal.run_sealed(_netns_summary, fresh=False)\n'
        'try:\n'
        '  seal.run_sealed(_fails, fresh=False)\n'
        '  err = None\n'
        'except ValueError as e:\n'
        '  err = str(e)\n'
        'print(json.dumps({"out": out, "err": err}))\n')
    repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    proc = subprocess.run([sys.executable, '-c', script], cwd=repo,
                          capture_output=True, text=True, timeout=300,
                          env={**os.environ, 'PYTHONPATH': repo})
    assert proc.returncode == 0, proc.stderr[-3000:]
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    out, err = got['out'], got['err']
  assert out['netns'] != os.readlink('/proc/self/ns/net')
  assert out['inside'] and out['interfaces'] == ['lo']
  assert err is not None and 'found in the child' in err
