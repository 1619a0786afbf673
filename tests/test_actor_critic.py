"""Actor-critic pieces (spec 3.7, 3.8, 3.19, Algorithm H)."""
import jax.numpy as jnp
import numpy as np

from agent import actor_critic as ac, config as config_lib


def hand_lambda_return(last, term, rew, boot, disc, lam):
  N, L = rew.shape
  out = np.zeros((N, L - 1))
  for n in range(N):
    R = boot[n, -1]
    for t in reversed(range(L - 1)):
      live = (1 - term[n, t + 1]) * disc
      cont = (1 - last[n, t + 1]) * lam
      R = rew[n, t + 1] + live * ((1 - cont) * boot[n, t + 1] + cont * R)
      out[n, t] = R
  return out


def test_lambda_return_matches_hand_loop():
  """Algorithm H against a plain Python loop, with terminals and episode ends."""
  rng = np.random.default_rng(0)
  N, L = 3, 16
  last = (rng.uniform(size=(N, L)) < 0.2).astype(np.float32)
  term = (rng.uniform(size=(N, L)) < 0.1).astype(np.float32)
  rew, boot = rng.normal(size=(2, N, L)).astype(np.float32)
  got = ac.lambda_return(last, term, rew, boot, 0.997, 0.95)
  np.testing.assert_allclose(got, hand_lambda_return(last, term, rew, boot, 0.997, 0.95),
                             rtol=1e-5, atol=1e-5)
  assert got.shape == (N, L - 1)


def test_lambda_return_uses_next_state():
  """spec 3.7: R_t uses r, c and v of s_{t+1}; r_0 is unused."""
  z = np.zeros((1, 3), np.float32)
  rew = np.array([[100.0, 1.0, 2.0]], np.float32)
  boot = np.array([[0.0, 0.0, 10.0]], np.float32)
  got = np.asarray(ac.lambda_return(z, z, rew, boot, 1.0, 1.0))
  np.testing.assert_allclose(got, [[13.0, 12.0]])


def test_retnorm_update_then_read():
  """spec 3.8: lo = hi = 0 at start, EMA updated before the scale is read."""
  c = config_lib.make_config(size='tiny')
  state = ac.RetNormState.initial()
  assert float(state.lo) == 0 and float(state.hi) == 0
  ret = jnp.linspace(0.0, 1000.0, 15360).reshape(1024, 15)
  new, scale = ac.retnorm_update_then_read(state, ret, c)
  p5, p95 = np.percentile(np.asarray(ret), [5, 95])
  np.testing.assert_allclose([new.lo, new.hi], [0.01 * p5, 0.01 * p95], rtol=1e-5)
  np.testing.assert_allclose(scale, max(1.0, 0.01 * (p95 - p5)), rtol=1e-5)
  small = jnp.zeros((4, 15))
  _, s = ac.retnorm_update_then_read(state, small, c)
  assert float(s) == 1.0   # floor at limit 1
