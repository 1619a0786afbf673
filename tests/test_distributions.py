"""Distributions (spec 1.8-1.11, 3.13, Algorithm D)."""
import jax
import jax.numpy as jnp
import numpy as np

from agent import distributions as dists


def test_bins_antisymmetric():
  """spec 1.9: 255 bins, bins[127] = 0, exact antisymmetry, +-symexp(20)."""
  b = dists.symexp_bins(255)
  assert b.shape == (255,) and b[127] == 0
  np.testing.assert_array_equal(b, -b[::-1])
  np.testing.assert_allclose(b[-1], np.expm1(20.0), rtol=1e-5)


def test_twohot_exact_bin_and_out_of_range():
  """Algorithm D: an exact bin hit puts all mass on it; out-of-range -> edge bin."""
  b = dists.symexp_bins(255)
  logits = jnp.asarray(np.random.default_rng(0).normal(size=(3, 255)), jnp.float32)
  targets = jnp.array([b[140], 1e12, -1e12])
  loss = dists.twohot_loss(logits, targets)
  logp = jax.nn.log_softmax(logits, -1)
  np.testing.assert_allclose(loss, -np.array([logp[0, 140], logp[1, 254], logp[2, 0]]),
                             rtol=1e-5)


def test_twohot_interpolation_in_raw_space():
  """Algorithm D: weights linear in raw space between neighbours."""
  b = dists.symexp_bins(255)
  y = b[130] + 0.25 * (b[131] - b[130])
  logits = jnp.asarray(np.random.default_rng(1).normal(size=(255,)), jnp.float32)
  logp = jax.nn.log_softmax(logits)
  ref = -(0.75 * logp[130] + 0.25 * logp[131])
  np.testing.assert_allclose(dists.twohot_loss(logits, jnp.float32(y)), ref, rtol=1e-4)


def test_twohot_pred_zero_at_uniform():
  """spec 1.9: symmetric sum gives exactly 0 for uniform probabilities."""
  assert float(dists.twohot_pred(jnp.zeros((255,)))) == 0.0
  logits = jnp.full((255,), -30.0).at[200].set(30.0)
  np.testing.assert_allclose(dists.twohot_pred(logits), dists.symexp_bins()[200], rtol=1e-4)


def test_onehot_unimix_and_straight_through():
  """spec 1.8: p = 0.99 softmax + 0.01/C; value = sg(onehot) + p - sg(p)."""
  logits = jnp.array([[[10.0, 0.0, 0.0, 0.0]]])
  lp = dists.unimix_logits(logits, 0.01)
  np.testing.assert_allclose(jnp.exp(lp).sum(-1), 1.0, rtol=1e-6)
  assert float(jnp.exp(lp).min()) >= 0.01 / 4 - 1e-7
  f = lambda l: jnp.sum(dists.onehot_sample(l, 0.01, key=jax.random.PRNGKey(0)) *
                        jnp.arange(4.0))
  g = jax.grad(f)(logits)
  assert np.any(np.asarray(g) != 0)  # gradient flows through the mixed softmax
  sample = dists.onehot_sample(logits, 0.01, key=jax.random.PRNGKey(0))
  np.testing.assert_allclose(sample.sum(-1), 1.0, rtol=1e-6)


def test_kl_and_entropy_sum_over_latents():
  """spec 1.8: KL and entropy are summed over the S latents."""
  p = jnp.zeros((32, 4)); q = jnp.zeros((32, 4)).at[:, 0].set(2.0)
  one = dists.onehot_kl(p[:1], q[:1], 0.01)
  np.testing.assert_allclose(dists.onehot_kl(p, q, 0.01), 32 * one, rtol=1e-5)
  np.testing.assert_allclose(dists.onehot_entropy(p, 0.01), 32 * np.log(4), rtol=1e-5)


def test_binary_soft_label_and_symlog_mse():
  """spec 1.10 soft-label BCE; spec 1.11 symlog MSE summed, no 1/2."""
  l = jnp.array(0.3)
  ref = -(0.997 * jax.nn.log_sigmoid(l) + 0.003 * jax.nn.log_sigmoid(-l))
  np.testing.assert_allclose(dists.binary_loss(l, 0.997), ref, rtol=1e-6)
  pred = jnp.array([[1.0, 2.0]]); tgt = jnp.array([[np.e - 1, 0.0]])
  np.testing.assert_allclose(dists.symlog_mse_loss(pred, tgt), [0.0 + 4.0], rtol=1e-5)


def test_bounded_normal():
  """spec 3.13: tanh mean, 0.9 sigmoid(x + 2) + 0.1 std, unsquashed log-prob."""
  d = dists.BoundedNormal(jnp.zeros((1, 2)), jnp.zeros((1, 2)))
  np.testing.assert_allclose(d.std, 0.9 * jax.nn.sigmoid(2.0) + 0.1, rtol=1e-6)
  x = jnp.array([[3.0, -3.0]])   # outside [-1, 1]: plain Normal density
  s = float(d.std[0, 0])
  ref = 2 * (-0.5 * (3 / s) ** 2 - np.log(s) - 0.5 * np.log(2 * np.pi))
  np.testing.assert_allclose(d.log_prob(x), [ref], rtol=1e-5)
  np.testing.assert_allclose(d.entropy(), [2 * (0.5 * np.log(2 * np.pi * np.e * s * s))],
                             rtol=1e-5)


def test_twohot_loss_and_gradient_match_dense_target():
  """Algorithm D: the gather/custom-VJP two-hot loss equals -sum(target * log_softmax)
  with an explicit two-hot target vector, in value and gradient, for one target
  and for a scaled sum of two targets on the same logits (spec 3.16-3.17)."""
  from tests import reference_losses as ref
  k1, k2, k3 = jax.random.split(jax.random.PRNGKey(0), 3)
  logits = 2.0 * jax.random.normal(k1, (6, 7, 255))
  y1 = 30.0 * jax.random.normal(k2, (6, 7))
  y2 = 1e9 * jnp.sign(jax.random.normal(k3, (6, 7)))        # out of range: edge bins
  y1 = y1.at[0, 0].set(dists.symexp_bins()[100])             # an exact hit
  dense = lambda l: ref.twohot_loss(l, y1) + 0.5 * ref.twohot_loss(l, y2)
  fast = lambda l: dists.twohot_loss(l, (y1, y2), scales=(1.0, 0.5))
  np.testing.assert_allclose(fast(logits), dense(logits), rtol=1e-5, atol=1e-5)
  np.testing.assert_allclose(dists.twohot_loss(logits, y1), ref.twohot_loss(logits, y1),
                             rtol=1e-5, atol=1e-5)
  w = jax.random.normal(k3, (6, 7))
  g_fast = jax.grad(lambda l: jnp.sum(w * fast(l)))(logits)
  g_ref = jax.grad(lambda l: jnp.sum(w * dense(l)))(logits)
  np.testing.assert_allclose(g_fast, g_ref, rtol=1e-4, atol=1e-6)


def test_twohot_pred_custom_bins():
  """spec 1.9: with bins= the prediction is the expectation, uniform -> 0 for
  symmetric bins."""
  bins = jnp.array([-2.0, -0.5, 0.0, 0.5, 2.0])
  logits = jnp.array([[0.1, 0.5, -1.0, 2.0, 0.3], [0.0] * 5])
  expect = jnp.sum(jax.nn.softmax(logits, -1) * bins, -1)
  pred = dists.twohot_pred(logits, bins=bins)
  np.testing.assert_allclose(pred, expect, rtol=1e-6, atol=1e-7)
  assert float(pred[1]) == 0.0


def test_onehot_sample_frequencies_match_unimix_probs():
  """spec 1.8: inverse-CDF samples are one-hot and follow 0.99 softmax + 0.01/C."""
  logits = jnp.array([[2.0, 0.0, -1.0, 1.0], [-30.0, 30.0, 0.0, 0.0]])
  p = np.asarray(dists.unimix_probs(logits, 0.01))
  n = 200_000
  s = dists.onehot_sample(jnp.broadcast_to(logits, (n, 2, 4)), 0.01,
                          key=jax.random.PRNGKey(1), straight_through=False)
  s = np.asarray(s)
  assert set(np.unique(s)) <= {0.0, 1.0} and np.all(s.sum(-1) == 1.0)
  freq = s.mean(0)
  assert np.all(np.abs(freq - p) <= 5 * np.sqrt(p * (1 - p) / n) + 1e-5), (freq, p)
  # u = 0 picks the first class with mass, u close to 1 the last.
  edge = dists.onehot_sample(logits, 0.01, noise=jnp.array([0.0, 0.9999999]),
                              straight_through=False)
  np.testing.assert_array_equal(np.asarray(edge), [[1, 0, 0, 0], [0, 0, 0, 1]])


def test_row_max_is_exact_max():
  """The halving-tree max equals jnp.max bit for bit, odd and even widths."""
  rng = np.random.default_rng(0)
  for n in (1, 2, 3, 4, 16, 255, 256):
    x = jnp.asarray(rng.normal(size=(7, 3, n)) * 50, jnp.float32)
    np.testing.assert_array_equal(dists._row_max(x), jnp.max(x, -1))


def test_twohot_pred_follows_the_spec_float_order():
  """spec 1.9: products p_k b_k first, then mirror pairs, then their sum (the
  reference's embodied/jax/outs.py TwoHot.pred).

  The order matters for learning, not just for the last bit: early in
  training the far-bin products (~1.9e6) round at 0.125, and where two mirror
  probabilities differ in their last bit that rounding is the prediction's
  noise, most of the advantage the actor sees in its first hundreds of
  updates. A subtract-the-mirror-first order ((p_k - p_k') b_k, exact to
  ~1e-9) gave 100x smaller early |advantage| and a policy entropy that rose
  where the reference's stays flat. Probabilities as a head has
  them early: mirror pairs equal or one rounding apart.
  """
  rng = np.random.default_rng(0)
  half = jax.nn.softmax(jnp.asarray(rng.normal(size=(512, 128)) * 0.01, jnp.float32))
  sym = np.concatenate([half, np.asarray(half)[:, :-1][:, ::-1]], 1) / 2
  ulp = np.nextafter(sym, np.float32(1)) - sym
  probs = (sym + ulp * rng.integers(0, 2, sym.shape)).astype(np.float32)
  bins = dists.symexp_bins()
  pb = probs * bins
  pairs = pb[:, :127][:, ::-1] + pb[:, 128:]                     # f32, as spec
  literal = pb[:, 127] + pairs.astype(np.float64).sum(-1)
  ours = np.asarray(dists.twohot_symmetric_sum(jnp.asarray(probs)))
  assert np.abs(literal).mean() > 1e-2          # the rounding noise is there
  np.testing.assert_allclose(ours, literal, rtol=0, atol=1e-5)
  # and twohot_pred is that sum over softmax(logits)
  logits = jnp.asarray(rng.normal(size=(64, 255)), jnp.float32)
  np.testing.assert_allclose(
      dists.twohot_pred(logits),
      dists.twohot_symmetric_sum(jax.nn.softmax(logits, -1)), rtol=1e-5, atol=1e-3)
