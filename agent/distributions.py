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


def twohot_loss(logits, target, bins=None):
  """Two-hot cross-entropy in raw space (Algorithm D). Returns logits.shape[:-1].

  Interpolation is linear in raw space between the symexp-spaced neighbours;
  out-of-range targets put all their mass on the edge bin, exact hits on that bin.
  The target is not symlogged.
  """
  logits = logits.astype(f32)
  bins = jnp.asarray(symexp_bins(logits.shape[-1]) if bins is None else bins, f32)
  n = bins.shape[0]
  if logits.shape[-1] != n:
    raise ValueError(f'logits have {logits.shape[-1]} classes, bins {n}')
  y = jnp.asarray(target, f32)
  chex_shape = logits.shape[:-1]
  if y.shape != chex_shape:
    raise ValueError(f'target shape {y.shape} != logits batch shape {chex_shape}')
  below = jnp.clip(jnp.sum(bins <= y[..., None], -1) - 1, 0, n - 1)
  above = jnp.clip(n - jnp.sum(bins > y[..., None], -1), 0, n - 1)
  equal = below == above
  d_below = jnp.where(equal, 1.0, jnp.abs(bins[below] - y))
  d_above = jnp.where(equal, 1.0, jnp.abs(bins[above] - y))
  total = d_below + d_above
  w_below = sg(d_above / total)
  w_above = sg(d_below / total)
  # Cross-entropy against the two-hot target: only the two target bins carry
  # weight, so gather their log-probabilities instead of building one-hots.
  logp = jax.nn.log_softmax(logits, -1)
  lp_below = jnp.take_along_axis(logp, below[..., None], -1)[..., 0]
  lp_above = jnp.take_along_axis(logp, above[..., None], -1)[..., 0]
  return -(w_below * lp_below + w_above * lp_above)


def twohot_pred(logits, bins=None):
  """Symmetric expectation (spec 1.9): uniform probabilities give exactly 0."""
  logits = logits.astype(f32)
  bins = jnp.asarray(symexp_bins(logits.shape[-1]) if bins is None else bins, f32)
  p = jax.nn.softmax(logits, -1)
  m = (bins.shape[0] - 1) // 2
  pb = p * bins
  return pb[..., m] + jnp.sum(pb[..., :m][..., ::-1] + pb[..., m + 1:], -1)


# --- categorical latents with unimix (spec 1.8) ------------------------------------

def unimix_logits(logits, unimix: float):
  """log(0.99 softmax(l) + 0.01 / C) (spec 1.8); identity when unimix = 0."""
  logits = logits.astype(f32)
  if not unimix:
    return jax.nn.log_softmax(logits, -1)
  probs = jax.nn.softmax(logits, -1)
  probs = (1 - unimix) * probs + unimix / logits.shape[-1]
  return jnp.log(probs)


def onehot_sample(logits, unimix: float, noise=None, key=None):
  """Straight-through one-hot sample of OneHot(logits, unimix) (spec 1.8).

  value = sg(one_hot(idx)) + p_mix - sg(p_mix). `noise` is Gumbel noise of
  logits' shape (pre-drawn, e.g. for a whole scan) or drawn from `key`.
  """
  logp = unimix_logits(logits, unimix)
  if noise is None:
    noise = jax.random.gumbel(key, logp.shape, f32)
  idx = jnp.argmax(logp + noise, -1)
  hard = jax.nn.one_hot(idx, logp.shape[-1], dtype=f32)
  probs = jnp.exp(logp)
  return sg(hard) + probs - sg(probs)


def onehot_kl(post_logits, prior_logits, unimix: float):
  """KL(post || prior) of unimixed categoricals, summed over latents (1.8)."""
  lp = unimix_logits(post_logits, unimix)
  lq = unimix_logits(prior_logits, unimix)
  return jnp.sum(jnp.exp(lp) * (lp - lq), (-2, -1))


def onehot_entropy(logits, unimix: float):
  """Entropy summed over latents (spec 1.8)."""
  lp = unimix_logits(logits, unimix)
  return -jnp.sum(jnp.exp(lp) * lp, (-2, -1))


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

class BoundedNormal:
  """Normal(tanh(mean), (maxstd - minstd) sigmoid(std + 2) + minstd) (spec 3.13).

  Not squashed: samples are unbounded, log-probs are plain Normal log-densities
  summed over action dims, entropy is the unsquashed Normal's.
  """

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
