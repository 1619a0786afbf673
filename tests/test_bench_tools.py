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
