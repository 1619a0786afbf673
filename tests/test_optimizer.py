"""Optimizer (spec 4.3-4.7, Algorithm I)."""
import jax
import jax.numpy as jnp
import numpy as np

from agent import optimizer as opt_lib


def algorithm_i(params, grads_seq, lr=4e-5, warmup=1000):
  """Algorithm I written literally in numpy."""
  p = {k: np.array(v, np.float64) for k, v in params.items()}
  nu = {k: np.zeros_like(v) for k, v in p.items()}
  mu = {k: np.zeros_like(v) for k, v in p.items()}
  for k_step, grads in enumerate(grads_seq):
    g = {}
    for n, gi in grads.items():
      gi = np.asarray(gi, np.float64)
      g[n] = gi / max(1.0, np.linalg.norm(gi) / (0.3 * max(1e-3, np.linalg.norm(p[n]))))
    t = k_step + 1
    step_lr = lr * min(k_step / warmup, 1.0)
    for n in p:
      nu[n] = 0.999 * nu[n] + 0.001 * g[n] ** 2
      u = g[n] / (np.sqrt(nu[n] / (1 - 0.999 ** t)) + 1e-20)
      mu[n] = 0.9 * mu[n] + 0.1 * u
      p[n] = p[n] - step_lr * mu[n] / (1 - 0.9 ** t)
  return p


def test_first_update_leaves_params_unchanged():
  """spec 4.7: lr_0 = 0, so the first update is a no-op (moments accumulate)."""
  opt = opt_lib.make_optimizer()
  params = {'w': jnp.ones((3, 3)), 'b': jnp.zeros(3)}
  state = opt.init(params)
  grads = {'w': jnp.full((3, 3), 2.0), 'b': jnp.ones(3)}
  updates, state = opt.update(grads, state, params)
  assert all(float(jnp.abs(u).max()) == 0 for u in jax.tree_util.tree_leaves(updates))
  assert float(jnp.abs(state[1].moment['w']).max()) > 0


def test_matches_algorithm_i():
  """Three steps of the optax chain equal Algorithm I (short warmup)."""
  rng = np.random.default_rng(0)
  params = {'w': jnp.asarray(rng.normal(size=(4, 5)), jnp.float32),
            'b': jnp.zeros(5, jnp.float32)}
  grads_seq = [{'w': jnp.asarray(rng.normal(size=(4, 5)) * s, jnp.float32),
                'b': jnp.asarray(rng.normal(size=5), jnp.float32)} for s in (1, 100, 0.01)]
  opt = opt_lib.make_optimizer(warmup=2)
  state = opt.init(params)
  p = params
  for g in grads_seq:
    u, state = opt.update(g, state, p)
    p = jax.tree_util.tree_map(lambda a, b: a + b, p, u)
  ref = algorithm_i(params, grads_seq, warmup=2)
  for k in p:
    np.testing.assert_allclose(p[k], ref[k], rtol=1e-5, atol=1e-9)


def test_agc_is_per_tensor():
  """spec 4.4: each tensor clipped to 0.3 max(1e-3, ||p||) on its own, whole-tensor norms."""
  agc = opt_lib.clip_by_agc(0.3, 1e-3)
  params = {'a': jnp.full((2, 2), 1.0), 'z': jnp.zeros(3)}       # ||a|| = 2, ||z|| = 0
  grads = {'a': jnp.full((2, 2), 10.0), 'z': jnp.full(3, 0.0001)}
  out, _ = agc.update(grads, agc.init(params), params)
  np.testing.assert_allclose(jnp.linalg.norm(out['a']), 0.3 * 2.0, rtol=1e-6)
  np.testing.assert_allclose(out['z'], grads['z'], rtol=1e-6)     # 1.7e-4 < 3e-4 cap
  big = {'a': grads['a'], 'z': jnp.full(3, 1.0)}
  out, _ = agc.update(big, agc.init(params), params)
  np.testing.assert_allclose(jnp.linalg.norm(out['z']), 3e-4, rtol=1e-5)
