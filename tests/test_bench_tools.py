"""bench/ tools' HLO parsing (no timings): dots, their layouts and executions."""
import jax
import jax.numpy as jnp
import numpy as np

from bench import dot_ceiling


def _program(x, w, v):
  def body(h, _):
    return jnp.tanh(h @ w), None             # one [8, 32] x [32, 32] dot per step
  h, _ = jax.lax.scan(body, x, None, length=7)
  return (h.T @ v).sum()                     # one dot outside, lhs read transposed


def test_collect_dots_counts_trips_shapes_and_flops():
  x = jnp.ones((8, 32), jnp.float32)
  w = jnp.ones((32, 32), jnp.float32)
  v = jnp.ones((8, 16), jnp.float32)
  text = jax.jit(_program).lower(x, w, v).compile().as_text()
  dots = dot_ceiling.collect_dots(text)
  per_sig = {}
  for sig, n, _, _ in dots:
    per_sig[sig] = per_sig.get(sig, 0) + n
  loop = [(s, n) for s, n in per_sig.items() if n == 7]
  assert len(loop) == 1, per_sig
  sig, _ = loop[0]
  assert dot_ceiling._flops(sig) == 2 * 8 * 32 * 32
  assert dot_ceiling._is_matrix_product(sig)
  outside = [s for s, n in per_sig.items() if n == 1 and dot_ceiling._flops(s) == 2 * 32 * 8 * 16]
  assert outside, per_sig


def test_time_dot_reproduces_a_transposed_layout():
  # lhs [4, 3] stored column-major ({0,1}): the timed product must accept it.
  sig = (((4, 3), (0, 1)), ((3, 5), (1, 0)), (1,), (0,), (), ())
  t = dot_ceiling.time_dot(sig, 0.001)
  assert np.isfinite(t) and t > 0


def test_parity_bins_by_updates_maps_names_and_widens_the_band():
  """bench/parity.py (issue 19): rows of means over 50 updates re-binned into
  250-update windows weighted by their update counts, the official and our
  metric names mapped to one name, and the acceptance band."""
  from bench import parity

  def rows(side, value_of):
    out = []
    for end in range(50, 501, 50):
      n = 50 if end != 300 else 25          # a short window (e.g. a resume)
      r = {'updates': end, 'n': n, 'env_step': 8 * end}
      if side == 'ours':
        r.update({'train/loss/dyn': value_of(end), 'train/loss/rec_position': 1.0,
                  'train/policy_entropy': 2.0})
      else:
        r.update({'loss/dyn': value_of(end), 'loss/position': 1.0, 'ent/action': 2.0})
      out.append(r)
    return {'side': side, 'rows': out, 'scores': []}

  for side in ('ours', 'official'):
    b = parity.binned(rows(side, float), 500)
    assert set(b) == {'loss/dyn', 'loss/rec_position', 'policy_entropy'}
    np.testing.assert_allclose(b['loss/dyn'][0], 150.0)             # 50..250
    w = np.array([25, 50, 50, 50, 50])                              # 300 (short)..500
    np.testing.assert_allclose(b['loss/dyn'][1],
                               (w * [300, 350, 400, 450, 500]).sum() / w.sum())
  official = np.array([[1.0, 10.0], [1.2, 10.0]])
  mean, lo, hi = parity.band(official)
  np.testing.assert_allclose(mean, [1.1, 10.0])
  np.testing.assert_allclose(lo, [1.0 - 0.2, 10.0 - 1.0])    # spread 0.2 > 10 % of 1.1
  np.testing.assert_allclose(hi, [1.2 + 0.2, 10.0 + 1.0])    # 10 % of 10 > spread 0
