"""Data-parallel learner on N devices (agent/parallel.py, issue 21).

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
