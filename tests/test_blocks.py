"""Building blocks (spec 1.1-1.7)."""
import haiku as hk
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from agent import blocks, distributions as dists


def _params(fn, *args):
  return hk.transform(lambda: fn(*args)).init(jax.random.PRNGKey(0))


@pytest.mark.parametrize('fan_in,units', [(512, 256), (2048, 256)])
def test_linear_init_std(fan_in, units):
  """spec 1.5: Std[W] ~= 1/sqrt(fan_in) (trunc normal x 1.1368), bias zero."""
  p = _params(blocks.dense_params, 'x', fan_in, units)
  w, b = p['x']['w'], p['x']['b']
  assert abs(float(w.std()) * np.sqrt(fan_in) - 1.0) < 0.03
  assert float(jnp.abs(w).max()) <= 2 * 1.1368 / np.sqrt(fan_in) + 1e-6
  assert not np.any(np.asarray(b))


def test_block_linear_fan_in_is_total_width():
  """spec 1.2: BlockLinear kernel (g, I/g, U/g) uses fan_in = I, not I/g."""
  p = _params(blocks.block_params, 'x', 8192, 2048, 8)
  w = p['x']['w']
  assert w.shape == (8, 1024, 256)
  assert abs(float(w.std()) * np.sqrt(8192) - 1.0) < 0.03


def test_outscale_zero_is_exact_zeros():
  """spec 1.5: outscale 0 (reward, value heads) gives a zero kernel."""
  p = _params(blocks.dense_params, 'x', 256, 255, 0.0)
  assert not np.any(np.asarray(p['x']['w']))


def test_block_dense_only_mixes_within_blocks():
  """spec 1.2: output block k depends only on input block k."""
  p = _params(blocks.block_params, 'x', 16, 8, 4)
  w, b = p['x']['w'], p['x']['b']
  x = jnp.zeros((1, 16)).at[0, 4:8].set(1.0)   # only block 1 active
  y = blocks.block_dense(x, w, b)
  assert np.all(np.asarray(y[0, :2]) == 0) and np.all(np.asarray(y[0, 4:]) == 0)
  ref = x[0, 4:8] @ w[1]
  np.testing.assert_allclose(y[0, 2:4], ref, rtol=1e-6)


def test_rms_norm_f32_stats_and_eps():
  """spec 1.3: y = x * rsqrt(mean(x^2) + 1e-4) * scale, stats in f32."""
  x = jnp.array([[3.0, 4.0]], jnp.bfloat16)
  y = blocks.rms_norm(x, jnp.ones(2))
  assert y.dtype == jnp.bfloat16
  ref = np.array([3.0, 4.0]) / np.sqrt((9 + 16) / 2 + 1e-4)
  np.testing.assert_allclose(np.asarray(y, np.float32)[0], ref, rtol=1e-2)


def test_concat_inputs_sorted_masked_symlog():
  """spec 1.7: sorted keys, per-key availability mask, symlog squish."""
  vals = {'b': jnp.array([[1.0, -jnp.inf]]), 'a': jnp.array([[np.e - 1]])}
  out = blocks.concat_inputs(vals, {'b': (2,), 'a': (1,)}, squish=dists.symlog)
  np.testing.assert_allclose(out, [[1.0, 0.0, 0.0]], atol=1e-6)
  with pytest.raises(ValueError, match="'a'"):
    blocks.concat_inputs({'a': jnp.zeros((1, 3))}, {'a': (1,)})


def test_rms_norm_values_and_gradients_match_plain_formula():
  """spec 1.3: the matmul-statistics RMSNorm (custom VJP) equals
  x * rsqrt(mean(x^2) + eps) * scale in value and in d/dx, d/dscale."""
  k1, k2, k3 = jax.random.split(jax.random.PRNGKey(0), 3)
  x = 3.0 * jax.random.normal(k1, (4, 5, 33))
  scale = 1.0 + 0.1 * jax.random.normal(k2, (33,))
  dy = jax.random.normal(k3, (4, 5, 33))

  def plain(x, s):
    return x * jax.lax.rsqrt(jnp.mean(x * x, -1, keepdims=True) + 1e-4) * s

  np.testing.assert_allclose(blocks.rms_norm(x, scale), plain(x, scale), rtol=1e-5, atol=1e-6)
  g_fast = jax.grad(lambda x, s: jnp.sum(blocks.rms_norm(x, s) * dy), (0, 1))(x, scale)
  g_ref = jax.grad(lambda x, s: jnp.sum(plain(x, s) * dy), (0, 1))(x, scale)
  for a, b in zip(g_fast, g_ref):
    np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5)
  xb = x.astype(jnp.bfloat16)                      # bf16 in, f32 statistics, bf16 out
  yb = blocks.rms_norm(xb, scale)
  assert yb.dtype == jnp.bfloat16
  np.testing.assert_allclose(yb.astype(jnp.float32), plain(xb.astype(jnp.float32), scale),
                             rtol=1e-2, atol=1e-2)


@pytest.mark.parametrize('shape', [(), (7,), (2560, 256), (8, 256, 768), (3, 5, 1)])
def test_sum_of_squares_is_the_plain_sum(shape):
  """The GEMV-based sum of squares (optimizer AGC and the norm metrics) equals
  jnp.sum(x ** 2) up to f32 summation order."""
  x = jax.random.normal(jax.random.PRNGKey(0), shape, jnp.float32)
  got = jax.jit(blocks.sum_of_squares)(x)
  np.testing.assert_allclose(got, np.sum(np.square(np.asarray(x, np.float64))),
                             rtol=1e-5)
  assert got.shape == () and got.dtype == jnp.float32


@pytest.mark.parametrize('x_shape,o', [((1024, 640), 64), ((15, 64, 256), 64),
                                       ((512, 64), 255), ((8, 16, 128), 64)])
def test_weight_grad_is_x_transpose_g(x_shape, o):
  """Both forms of the weight gradient (transposed-g GEMM for narrowing layers,
  plain x^T g otherwise) give x^T g over all leading rows."""
  x = jax.random.normal(jax.random.PRNGKey(0), x_shape, jnp.float32)
  g = jax.random.normal(jax.random.PRNGKey(1), x_shape[:-1] + (o,), jnp.float32)
  got = jax.jit(blocks.weight_grad)(x, g)
  want = (np.asarray(x, np.float64).reshape(-1, x_shape[-1]).T
          @ np.asarray(g, np.float64).reshape(-1, o))
  assert got.shape == (x_shape[-1], o)
  np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-3)
