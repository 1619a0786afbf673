"""Data-parallel learner on N devices (agent/parallel.py).

The CPU gets two devices from ``XLA_FLAGS=--xla_force_host_platform_device_count=2``,
which must be set before jax starts, so each check runs in its own
interpreter.
"""

import json
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _run_two_devices(code: str, timeout: int = 600) -> str:
  env = {**os.environ, 'JAX_PLATFORMS': 'cpu',
         'XLA_FLAGS': '--xla_force_host_platform_device_count=2'}
  proc = subprocess.run([sys.executable, '-c', textwrap.dedent(code)], cwd=REPO,
                        env=env, capture_output=True, text=True, timeout=timeout)
  assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
  return proc.stdout


@pytest.mark.slow
def test_two_device_update_equals_one_device_update():
  """One update on the same batch, params and key: 2 devices (rows split,
  state replicated, XLA's all-reduce) against 1 device. Losses, metrics,
  write-back latents and new params agree to f32 reduction-order tolerance:
  each device sums its B/2 rows and the all-reduce adds the two partial sums,
  a different association of the same float additions (relative ~1e-6 per
  sum). Measured here: the largest parameter difference after the two
  updates is 8e-13. LaProp divides by sqrt(nu) ~ |g| on the first real step,
  so every parameter moves by about lr (1e-3) whatever its gradient's size;
  atol 1e-6 (0.1 % of that step) would catch a single parameter stepping the
  other way, or a device updating from its own half of the batch only."""
  out = _run_two_devices('''
    import agent, jax, numpy as np
    from agent import learning, networks, synthetic
    from agent.config import make_config
    from agent.parallel import LearnerPlacement
    assert len(jax.devices()) == 2
    c = make_config(size='tiny', batch_size=4, batch_length=8, imag_horizon=4,
                    latent_store_dtype='float32', lr=1e-3)
    spaces = synthetic.WALKER_SPACES
    nets = networks.make_networks(spaces, c)
    batch = synthetic.make_batch(spaces, c, seed=1, episode_len=5)
    results = []
    for n in (1, 2):
      place = LearnerPlacement(n)
      step = learning.make_train_step(nets, placement=place)
      state = place.put_state(step.init(jax.random.PRNGKey(0)))
      # Two updates: the first is the warmup no-op of spec 6.4 (lr 0 at step 0).
      for _ in range(2):
        state, metrics, outs = step.update(state, place.put_batch(batch))
      if n == 2:
        leaf = jax.tree_util.tree_leaves(state.params)[0]
        assert len(leaf.sharding.device_set) == 2, leaf.sharding
        assert len(outs['deter'].sharding.device_set) == 2
      results.append(jax.device_get((state, metrics, outs)))
    (s1, m1, o1), (s2, m2, o2) = results
    for k in m1:
      np.testing.assert_allclose(m2[k], m1[k], rtol=1e-4, atol=1e-5, err_msg=k)
    for k in o1:
      np.testing.assert_allclose(o2[k], o1[k], rtol=1e-4, atol=1e-4, err_msg=k)
    flat1 = jax.tree_util.tree_leaves_with_path(s1.params)
    flat2 = jax.tree_util.tree_leaves(s2.params)
    worst = 0.0
    for (path, a), b in zip(flat1, flat2):
      np.testing.assert_allclose(b, a, rtol=0, atol=1e-6,
                                 err_msg=jax.tree_util.keystr(path))
      worst = max(worst, float(np.max(np.abs(b - a))))
    assert int(s2.step) == int(s1.step) == 2
    print('OK loss', float(m1['loss/total']), float(m2['loss/total']),
          'max param diff', worst)
  ''')
  assert 'OK' in out, out


_UPDATE_SCRIPT = '''
import sys, agent, jax, numpy as np
from agent import learning, networks, synthetic
from agent.config import make_config
from agent.parallel import LearnerPlacement, initialize_processes
procs, pid, addr, out = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4]
initialize_processes(addr, procs, pid)
c = make_config(size='tiny', batch_size=4, batch_length=8, imag_horizon=4,
                latent_store_dtype='float32', lr=1e-3)
spaces = synthetic.WALKER_SPACES
nets = networks.make_networks(spaces, c)
batch = synthetic.make_batch(spaces, c, seed=1, episode_len=5)
place = LearnerPlacement(procs)
rows = place.local_batch_size(c.batch_size)
mine = jax.tree_util.tree_map(lambda x: x[pid * rows:(pid + 1) * rows], batch)
step = learning.make_train_step(nets, placement=place)
state = place.put_state(place.host(step.init(jax.random.PRNGKey(0))))
for _ in range(2):        # the first is the warmup no-op of spec 6.4
  state, metrics, outs = step.update(state, place.put_batch(mine))
outs = place.gather_rows(outs)
metrics, state = place.host(metrics), place.host(state)
if pid == 0:
  flat = {jax.tree_util.keystr(p): v for p, v in
          jax.tree_util.tree_leaves_with_path(state.params)}
  np.savez(out, **{'m:' + k: v for k, v in metrics.items()},
           **{'o:' + k: v for k, v in outs.items()},
           **{'p:' + k: v for k, v in flat.items()}, step=int(state.step))
print('OK', pid, jax.process_count(), len(jax.devices()))
'''


@pytest.mark.slow
def test_two_process_update_equals_one_process_update(tmp_path):
  """The same update as the test above, split over two PROCESSES with one
  CPU device each (jax.distributed on 127.0.0.1, gloo collectives): each
  process puts its own 2 rows, ``put_batch`` assembles the global batch,
  and the gradients are reduced over TCP. Against one process with one
  device: the tolerances of the 2-device test (the same reduction-order
  argument), plus the write-back latents gathered to every process."""
  import portpicker
  script = tmp_path / 'update.py'
  script.write_text(_UPDATE_SCRIPT)
  env = {**os.environ, 'JAX_PLATFORMS': 'cpu'}
  env.pop('XLA_FLAGS', None)
  addr = f'127.0.0.1:{portpicker.pick_unused_port()}'
  outs = {n: tmp_path / f'{n}.npz' for n in (1, 2)}
  procs = [subprocess.Popen(
      [sys.executable, str(script), str(n), str(pid), addr, str(outs[n])],
      cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
      text=True) for n, pid in ((2, 0), (2, 1), (1, 0))]
  for proc in procs:
    stdout, stderr = proc.communicate(timeout=600)
    assert proc.returncode == 0, stdout[-2000:] + stderr[-5000:]
    assert 'OK' in stdout
  one, two = np.load(outs[1]), np.load(outs[2])
  assert int(one['step']) == int(two['step']) == 2
  assert sorted(one.files) == sorted(two.files)
  for k in one.files:
    if k.startswith('m:'):
      np.testing.assert_allclose(two[k], one[k], rtol=1e-4, atol=1e-5, err_msg=k)
    elif k.startswith('o:'):
      np.testing.assert_allclose(two[k], one[k], rtol=1e-4, atol=1e-4, err_msg=k)
    elif k.startswith('p:'):
      np.testing.assert_allclose(two[k], one[k], rtol=0, atol=1e-6, err_msg=k)


@pytest.mark.slow
def test_run_with_two_learner_devices_trains_and_resumes_on_one(tmp_path):
  """smoke.flags with --learner_devices=2 (the rows of every batch split over
  two CPU devices), then the same run resumed with one device: a checkpoint
  written with N devices resumes with M (the saved state is gathered to the
  host, so it does not remember the devices)."""
  logdir = tmp_path / 'run'
  env = {**os.environ, 'JAX_PLATFORMS': 'cpu', 'PYTHONUNBUFFERED': '1',
         'XLA_FLAGS': '--xla_force_host_platform_device_count=2'}
  base = [sys.executable, os.path.join(REPO, 'experiments', 'run_dmc.py'),
          f'--flagfile={os.path.join(REPO, "experiments", "flags", "smoke.flags")}',
          f'--logdir={logdir}', '--eval_episodes=0', '--noreport',
          '--jax_cache_dir=off']
  first = subprocess.run(base + ['--learner_devices=2', '--env_steps=300'],
                         cwd=REPO, env=env, capture_output=True, text=True,
                         timeout=600)
  assert first.returncode == 0, first.stderr[-4000:]
  rows = [json.loads(line) for line in open(logdir / 'metrics.jsonl')]
  updates = max(r['updates'] for r in rows if r['kind'] == 'train')
  assert updates > 0
  second = subprocess.run(base + ['--learner_devices=1', '--env_steps=400'],
                          cwd=REPO, env=env, capture_output=True, text=True,
                          timeout=600)
  assert second.returncode == 0, second.stderr[-4000:]
  assert 'resumed from' in second.stderr
  rows = [json.loads(line) for line in open(logdir / 'metrics.jsonl')]
  train = [r for r in rows if r['kind'] == 'train']
  assert train[-1]['segment'] == 1 and train[-1]['updates'] > updates
  assert all(np.isfinite(r['train/loss/total']) for r in train
             if r.get('train/loss/total') is not None)
  bad = subprocess.run(base + ['--learner_devices=3'], cwd=REPO, env=env,
                       capture_output=True, text=True, timeout=300)
  assert bad.returncode == 2 and '--learner_devices 3' in bad.stderr


@pytest.mark.slow
def test_two_learner_processes_train_resume_and_stop_together(tmp_path):
  """--distributed --learner_processes=2: two learner processes on
  127.0.0.1 (jax.distributed, gloo), one CPU device each, run every update
  together (agent.parallel.UpdateGate), each sampling half the batch. The
  run reaches its budget, resumes with both processes (the peer loads the
  same checkpoint), stops without Launchpad having to kill a learner (jax's
  SIGTERM notifier is undone), and resumes again with one process."""
  logdir = tmp_path / 'run'
  env = {**os.environ, 'JAX_PLATFORMS': 'cpu', 'PYTHONUNBUFFERED': '1'}
  env.pop('XLA_FLAGS', None)
  base = [sys.executable, os.path.join(REPO, 'experiments', 'run_dmc.py'),
          f'--flagfile={os.path.join(REPO, "experiments", "flags", "smoke.flags")}',
          f'--logdir={logdir}', '--eval_episodes=0', '--noreport',
          '--jax_cache_dir=off', '--distributed', '--num_actors=1',
          '--stop_grace=20', '--max_restarts=0']
  two = ['--learner_processes=2', '--learner_devices=2']

  def launch(extra, steps):
    proc = subprocess.run(base + extra + [f'--env_steps={steps}'], cwd=REPO,
                          env=env, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-4000:]
    out = proc.stdout + proc.stderr
    assert 'did not terminate in time' not in out, out[-3000:]
    return out

  def peer_updates(segment):
    text = (logdir / 'lp_logs' / f'segment-{segment}' / 'learner' / '1'
            ).read_text()
    return int(text.split('[learner 1] stopped after ')[1].split()[0])

  def updates():
    rows = [json.loads(line) for line in open(logdir / 'metrics.jsonl')]
    return max(r['updates'] for r in rows if r['kind'] == 'train')

  launch(two, 300)
  first = updates()
  assert first > 0 and peer_updates(0) == first
  launch(two, 400)
  second = updates()
  assert second > first and peer_updates(1) == second - first
  launch(['--learner_processes=1', '--learner_devices=1'], 500)
  assert updates() > second


@pytest.mark.slow
def test_a_learner_process_started_on_another_host_trains_with_the_program(
    tmp_path):
  """--remote_learner_processes=1: the program runs learner process 0 and
  waits for process 1, which `run_dmc.py --learner_peer=1` starts from the
  run directory, here in another network namespace (a veth pair) when this
  runs as root, so the coordination service, gloo and Reverb all go over
  that link (each side's gloo on its --bind address). Both reach the budget
  with the same update count; the launch's learner_peers.pkl is gone after."""
  import portpicker

  from tests import netns as ns
  logdir = tmp_path / 'run'
  env = {**os.environ, 'JAX_PLATFORMS': 'cpu', 'PYTHONUNBUFFERED': '1'}
  env.pop('XLA_FLAGS', None)
  in_ns = ns.up()
  host, peer_host = (ns.HOST_IP, ns.NS_IP) if in_ns else ('127.0.0.1',
                                                           '127.0.0.1')
  run_dmc = os.path.join(REPO, 'experiments', 'run_dmc.py')
  program_cmd = [
      sys.executable, run_dmc,
      f'--flagfile={os.path.join(REPO, "experiments", "flags", "smoke.flags")}',
      f'--logdir={logdir}', '--eval_episodes=0', '--noreport',
      '--jax_cache_dir=off', '--distributed', '--num_actors=1',
      '--stop_grace=20', '--max_restarts=0', '--env_steps=300',
      '--learner_processes=2', '--learner_devices=2',
      '--remote_learner_processes=1',
      f'--coordinator_address={host}:{portpicker.pick_unused_port()}',
      f'--bind={host}']
  peer_cmd = [sys.executable, run_dmc, '--distributed', '--learner_peer=1',
              f'--logdir={logdir}', f'--bind={peer_host}']
  if in_ns:
    peer_cmd = ns.wrap(peer_cmd)
  with open(tmp_path / 'program.log', 'w') as out, \
       open(tmp_path / 'peer.log', 'w') as peer_out:
    program = subprocess.Popen(program_cmd, cwd=REPO, env=env, stdout=out,
                               stderr=subprocess.STDOUT)
    peer = subprocess.Popen(peer_cmd, cwd=REPO, env=env, stdout=peer_out,
                            stderr=subprocess.STDOUT)
    try:
      assert program.wait(900) == 0, (tmp_path / 'program.log').read_text()[-4000:]
      assert peer.wait(120) == 0, (tmp_path / 'peer.log').read_text()[-4000:]
    finally:
      for p in (program, peer):
        if p.poll() is None:
          p.kill()
      if in_ns:
        ns.down()
  peer_text = (tmp_path / 'peer.log').read_text()
  assert f'(replay {host}:' in peer_text
  peer_updates = int(peer_text.split('[learner 1] stopped after ')[1].split()[0])
  from experiments.run import rundir
  final = rundir.load_run_state(rundir.latest_run_checkpoint(str(logdir)))
  updates = final['learner']['updates']       # the final checkpoint's count
  assert updates > 0 and peer_updates == updates
  assert not (logdir / 'learner_peers.pkl').exists()
  # Not sealed (other hosts need its ports): the log says so, once, with
  # the trusted-network assumption and the ports left open.
  lines = [x for x in (tmp_path / 'program.log').read_text().splitlines()
           if x.startswith('[run] not sealed')]
  assert len(lines) == 1 and 'trusted' in lines[0] and 'replay' in lines[0]
