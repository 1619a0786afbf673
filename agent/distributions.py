"""Output distributions and transforms (spec 1.6, 1.8-1.11, 3.13-3.14, Alg. D).

Everything here computes in float32 (spec 1.12): callers may pass bf16 logits,
they are upcast first. Losses are returned un-reduced.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np

sg = jax.lax.stop_gradient
f32 = jnp.float32


# --- symlog / symexp (spec 1.6) ---------------------------------------------

def symlog(x):
  """sign(x) log(1 + |x|) (spec 1.6, Eq. 9)."""
  return jnp.sign(x) * jnp.log1p(jnp.abs(x))


def symexp(x):
  """sign(x) (exp(|x|) - 1) (spec 1.6)."""
  return jnp.sign(x) * jnp.expm1(jnp.abs(x))


# --- two-hot symexp bins (spec 1.9, Algorithm D) ---------------------------------

@functools.lru_cache(maxsize=None)
def symexp_bins(n: int = 255) -> np.ndarray:
  """Bins built from a mirrored half so they are exactly antisymmetric (1.9).

  half = symexp(linspace(-20, 0, (n+1)/2)); bins = [half, -reverse(half[:-1])].
  """
  if n % 2 != 1:
    raise ValueError(f'two-hot needs an odd number of bins, got {n}')
  x = np.linspace(-20.0, 0.0, (n + 1) // 2, dtype=np.float32)
  half = np.sign(x) * np.expm1(np.abs(x))
  bins = np.concatenate([half, -half[:-1][::-1]]).astype(np.float32)
  bins.setflags(write=False)
  return bins


def _row_sum(x):
  """Sum over the last axis as a GEMV (see blocks.row_sum: XLA:CPU reductions
  over a minor axis wider than 32 are several times slower than a matmul)."""
  return (x @ jnp.ones((x.shape[-1], 1), x.dtype))[..., 0]


def _twohot_neighbours(bins, y):
  """Algorithm D: below/above bin indices and their (stop-gradient) weights."""
  n = bins.shape[0]
  # count = #bins <= y; below/above are its clipped neighbours. Out of range
  # (count 0 or n) both clip to the edge bin: equal, all mass there.
  count = _row_sum((bins <= y[..., None]).astype(f32)).astype(jnp.int32)
  below = jnp.clip(count - 1, 0, n - 1)
  above = jnp.clip(count, 0, n - 1)
  equal = below == above
  d_below = jnp.where(equal, 1.0, jnp.abs(bins[below] - y))
  d_above = jnp.where(equal, 1.0, jnp.abs(bins[above] - y))
  total = d_below + d_above
  return below, above, sg(d_above / total), sg(d_below / total)


def _row_max(x):
  """Max over the last axis as a halving tree of elementwise maxima.

  Exact (max does not depend on order). XLA:CPU fuses the tree into one loop;
  its own reduction over a wide minor axis is slow (bench: [15360, 255] max
  0.47 ms vs 2.75 ms; softmax shifts of the 255-bin heads use it).
  """
  while x.shape[-1] > 1:
    n = x.shape[-1]
    h = (n + 1) // 2
    x = jnp.maximum(x[..., :h], x[..., n - h:])      # overlap by one if n is odd
  return x[..., 0]


def _logsumexp(logits):
  m = sg(_row_max(logits))
  return m + jnp.log(_row_sum(jnp.exp(logits - m[..., None])))


@jax.custom_vjp
def _twohot_xent(logits, below, above, w_below, w_above):
  """sum_i -[w_below_i log p(below_i) + w_above_i log p(above_i)], p = softmax.

  below/above/w_* are [..., M]: M two-hot targets on the same logits (the
  critic's return and slow-critic targets, spec 3.16-3.17). Cross-entropy
  against a two-hot vector has two non-zero target entries, so the forward is
  one logsumexp and a gather; the backward is (sum_i w_i) softmax - target, one
  elementwise pass (no scatter, no one-hot [..., K] target in the forward).
  """
  return _twohot_xent_fwd(logits, below, above, w_below, w_above)[0]


def _twohot_xent_fwd(logits, below, above, w_below, w_above):
  lse = _logsumexp(logits)
  lb = jnp.take_along_axis(logits, below, -1)
  la = jnp.take_along_axis(logits, above, -1)
  loss = _row_sum((w_below + w_above) * lse[..., None] - w_below * lb - w_above * la)
  return loss, (logits, lse, below, above, w_below, w_above)


def _twohot_xent_bwd(res, g):
  logits, lse, below, above, w_below, w_above = res
  iota = jax.lax.broadcasted_iota(jnp.int32, logits.shape, logits.ndim - 1)
  coef = _row_sum(w_below + w_above)[..., None]
  grad = coef * jnp.exp(logits - lse[..., None])
  for i in range(below.shape[-1]):
    grad = (grad - jnp.where(iota == below[..., i:i + 1], w_below[..., i:i + 1], 0.0)
            - jnp.where(iota == above[..., i:i + 1], w_above[..., i:i + 1], 0.0))
  return g[..., None] * grad, None, None, None, None


_twohot_xent.defvjp(_twohot_xent_fwd, _twohot_xent_bwd)


def twohot_loss(logits, target, bins=None, scales=None):
  """Two-hot cross-entropy in raw space (Algorithm D). Returns logits.shape[:-1].

  Interpolation is linear in raw space between the symexp-spaced neighbours;
  out-of-range targets put all their mass on the edge bin, exact hits on that bin.
  The target is not symlogged and receives no gradient.
  `target` may be a tuple of targets with `scales`: sum_i scales_i loss(target_i)
  on the same logits, computed with one softmax (critic + slow-critic terms).
  """
  logits = logits.astype(f32)
  bins = jnp.asarray(symexp_bins(logits.shape[-1]) if bins is None else bins, f32)
  n = bins.shape[0]
  if logits.shape[-1] != n:
    raise ValueError(f'logits have {logits.shape[-1]} classes, bins {n}')
  targets = target if isinstance(target, (tuple, list)) else (target,)
  scales = (1.0,) * len(targets) if scales is None else tuple(scales)
  if len(scales) != len(targets):
    raise ValueError(f'{len(targets)} targets but {len(scales)} scales')
  parts = []
  for y, scale in zip(targets, scales):
    y = jnp.asarray(y, f32)
    if y.shape != logits.shape[:-1]:
      raise ValueError(f'target shape {y.shape} != logits batch shape {logits.shape[:-1]}')
    below, above, w_below, w_above = _twohot_neighbours(bins, y)
    parts.append((below, above, scale * w_below, scale * w_above))
  stack = lambda i: jnp.stack([p[i] for p in parts], -1)
  return _twohot_xent(logits, stack(0), stack(1), stack(2), stack(3))


def twohot_pred(logits, bins=None):
  """Symmetric expectation in the spec 1.9 float order: probs = softmax(logits)
  in f32, products p_k b_k, then mirror pairs summed from small to large |b|
  (uniform probabilities give exactly 0).

  The order of the products is part of the spec's exact column and it
  matters for learning. With bins up to 4.85e8 each far-bin product is ~1.9e6
  early in training and rounds at 0.125, so wherever two mirror probabilities
  differ in their last bit the pair contributes ~0.1. In the first hundreds
  of updates that noise is most of the advantage the actor sees (the
  reference's early |advantage| is ~0.1), and it keeps the policy entropy flat
  where an exact expectation lets the entropy bonus alone raise it
  (bench/results/parity). The softmax denominator and the sum over the 127
  pairs are GEMV row sums (docs/deviations.md "Same maths, different float
  order"): their order moves the result by a rounding of the result, not of
  the products; a literal jnp.sum form cost 1.13x the size1m update.
  """
  logits = logits.astype(f32)
  e = jnp.exp(logits - sg(_row_max(logits))[..., None])
  probs = e / _row_sum(e)[..., None]
  return twohot_symmetric_sum(probs, bins)


def twohot_symmetric_sum(probs, bins=None):
  """sum_k p_k b_k as spec 1.9 orders it: the products first, then each
  mirror pair (b_k = -b_k') added, then the pairs summed (plus the middle)."""
  bins = jnp.asarray(symexp_bins(probs.shape[-1]) if bins is None else bins, f32)
  pb = probs * bins
  half = bins.shape[0] // 2
  mid = pb[..., half] if bins.shape[0] % 2 else 0.0
  return mid + _row_sum(pb[..., :half][..., ::-1] + pb[..., -half:])


# --- categorical latents with unimix (spec 1.8) ------------------------------------

def unimix_probs(logits, unimix: float):
  """0.99 softmax(l) + 0.01 / C (spec 1.8); plain softmax when unimix = 0."""
  logits = logits.astype(f32)
  e = jnp.exp(logits - sg(jnp.max(logits, -1, keepdims=True)))
  probs = e / _row_sum(e)[..., None]
  if not unimix:
    return probs
  return (1 - unimix) * probs + unimix / logits.shape[-1]


def unimix_logits(logits, unimix: float):
  """log(0.99 softmax(l) + 0.01 / C) (spec 1.8); log_softmax when unimix = 0."""
  if not unimix:
    return jax.nn.log_softmax(logits.astype(f32), -1)
  return jnp.log(unimix_probs(logits, unimix))


def onehot_sample(logits, unimix: float, noise=None, key=None,
                  straight_through: bool = True):
  """Straight-through one-hot sample of OneHot(logits, unimix) (spec 1.8).

  value = sg(one_hot(idx)) + p_mix - sg(p_mix). The index is drawn by inverse
  CDF: idx = #{c : cdf_c <= u} for u ~ U[0, 1), one uniform per categorical
  (C times fewer random numbers than Gumbel-max, which dominated the cost of
  sampling; same distribution). `noise` is that uniform noise of shape
  logits.shape[:-1] (pre-drawn, e.g. for a whole scan) or drawn from `key`.
  straight_through=False returns the one-hot value alone, for samples no
  gradient flows through (imagination runs on stop-gradient RSSM weights, 3.4).
  """
  probs = unimix_probs(logits, unimix)
  C = probs.shape[-1]
  if noise is None:
    noise = jax.random.uniform(key, probs.shape[:-1], f32)
  if noise.shape != probs.shape[:-1]:
    raise ValueError(f'noise shape {noise.shape} != {probs.shape[:-1]}')
  cdf = sg(probs) @ jnp.triu(jnp.ones((C, C), f32))             # cdf_c = sum_{j<=c} p_j
  idx = _row_sum((cdf <= noise[..., None]).astype(f32)).astype(jnp.int32)
  idx = jnp.minimum(idx, C - 1)                                   # u >= rounded cdf_{C-1}
  hard = (jax.lax.broadcasted_iota(jnp.int32, probs.shape, probs.ndim - 1)
          == idx[..., None]).astype(f32)
  if not straight_through:
    return hard
  return sg(hard) + probs - sg(probs)


def _latent_sum(x):
  """Sum over the last two axes (latents, classes) as one GEMV."""
  return _row_sum(x.reshape(x.shape[:-2] + (-1,)))


def onehot_kl(post_logits, prior_logits, unimix: float):
  """KL(post || prior) of unimixed categoricals, summed over latents (1.8)."""
  lp = unimix_logits(post_logits, unimix)
  lq = unimix_logits(prior_logits, unimix)
  return _latent_sum(jnp.exp(lp) * (lp - lq))


def onehot_entropy(logits, unimix: float):
  """Entropy summed over latents (spec 1.8)."""
  lp = unimix_logits(logits, unimix)
  return -_latent_sum(jnp.exp(lp) * lp)


# --- Binary (spec 1.10) --------------------------------------------------------------

def binary_loss(logit, target):
  """Soft-label Bernoulli NLL (spec 1.10)."""
  logit = logit.astype(f32)
  target = jnp.asarray(target, f32)
  return -(target * jax.nn.log_sigmoid(logit) +
           (1 - target) * jax.nn.log_sigmoid(-logit))


def binary_prob(logit):
  return jax.nn.sigmoid(logit.astype(f32))


# --- symlog MSE (spec 1.11) -----------------------------------------------------------

def symlog_mse_loss(pred, target, event_dims: int = 1):
  """(pred - sg(symlog(target)))^2 summed over the key's feature dims, no 1/2."""
  pred = pred.astype(f32)
  err = (pred - sg(symlog(jnp.asarray(target, f32)))) ** 2
  return jnp.sum(err, tuple(range(-event_dims, 0))) if event_dims else err


# --- policies (spec 3.13, 3.14) -----------------------------------------------------

# The largest |z| that jax.random.normal draws in float32, rounded up: it is
# sqrt(2) * erfinv(u) of a float32 u in [nextafter(-1, 0), 1), so |z| <=
# sqrt(2) * erfinv(1 - 2**-24) = 5.42.
NORMAL_SAMPLE_LIMIT = 6.0


class BoundedNormal:
  """Normal(tanh(mean), (maxstd - minstd) sigmoid(std + 2) + minstd) (spec 3.13).

  Not squashed: samples are unbounded, log-probs are plain Normal log-densities
  summed over action dims, entropy is the unsquashed Normal's.
  """

  @staticmethod
  def sample_range(maxstd: float):
    """(low, high) that every ``sample`` lies in: |tanh| <= 1, std <=
    maxstd and |noise| <= ``NORMAL_SAMPLE_LIMIT`` (what the replay takes as
    a plausible stored action, ``agent.types.step_bounds``)."""
    hi = 1.0 + float(maxstd) * NORMAL_SAMPLE_LIMIT
    return (-hi, hi)

  def __init__(self, mean_raw, std_raw, minstd=0.1, maxstd=1.0):
    self.mean = jnp.tanh(mean_raw.astype(f32))
    self.std = (maxstd - minstd) * jax.nn.sigmoid(std_raw.astype(f32) + 2.0) + minstd

  def sample(self, key=None, noise=None):
    if noise is None:
      noise = jax.random.normal(key, self.mean.shape, f32)
    return self.mean + self.std * noise

  def log_prob(self, x):
    x = x.astype(f32)
    z = (x - self.mean) / self.std
    return jnp.sum(-0.5 * z ** 2 - jnp.log(self.std) - 0.5 * np.log(2 * np.pi), -1)

  def entropy(self):
    return jnp.sum(0.5 * np.log(2 * np.pi * np.e) + jnp.log(self.std), -1)

  def mode(self):
    return self.mean


class OneHotCategorical:
  """Discrete policy over one-hot actions with optional unimix (spec 3.14).

  Actions are one-hot float vectors (agent/types.py); unimix 0.01 follows the
  paper / 2411f7d (OQ 5), 0 gives HEAD's plain categorical.
  """

  def __init__(self, logits, unimix=0.01):
    self.logp = unimix_logits(logits, unimix)

  def sample(self, key=None, noise=None):
    if noise is None:
      noise = jax.random.gumbel(key, self.logp.shape, f32)
    idx = jnp.argmax(self.logp + noise, -1)
    return jax.nn.one_hot(idx, self.logp.shape[-1], dtype=f32)

  def log_prob(self, x):
    return jnp.sum(x.astype(f32) * self.logp, -1)

  def entropy(self):
    return -jnp.sum(jnp.exp(self.logp) * self.logp, -1)

  def mode(self):
    return jax.nn.one_hot(jnp.argmax(self.logp, -1), self.logp.shape[-1], dtype=f32)
