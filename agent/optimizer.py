"""One LaProp optimizer over all trainable modules (spec 4.3-4.7, Algorithm I).

chain: per-tensor AGC (0.3, pmin 1e-3) -> RMS (beta2 0.999, eps 1e-20 after the
sqrt, bias-corrected) -> momentum on the normalised update (beta1 0.9,
bias-corrected, own counter) -> x -lr_k with lr_k = lr * min(k / warmup, 1)
(k read before increment, so the first update has lr 0).
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
import optax

from agent import blocks


def tensor_norm(x):
  """||x||_2 over the whole tensor (blocks.sum_of_squares: a GEMV-based sum)."""
  return jnp.sqrt(blocks.sum_of_squares(x))


def clip_by_agc(clip: float = 0.3, pmin: float = 1e-3) -> optax.GradientTransformation:
  """Adaptive gradient clipping per TENSOR (spec 4.4): not NFNet's unit-wise AGC.

  g <- g / max(1, ||g|| / (clip * max(pmin, ||p||))), norms over the whole tensor.
  """

  def init(params):
    del params
    return optax.EmptyState()

  def update(grads, state, params=None):
    if params is None:
      raise ValueError('clip_by_agc needs params: call update(grads, state, params)')

    def one(g, p):
      upper = clip * jnp.maximum(pmin, tensor_norm(p))
      return g / jnp.maximum(1.0, tensor_norm(g) / upper)

    return jax.tree_util.tree_map(one, grads, params), state

  return optax.GradientTransformation(init, update)


class MomentState(NamedTuple):
  count: jax.Array  # int32 steps taken by this stage
  moment: optax.Updates


def scale_by_rms(beta2: float = 0.999, eps: float = 1e-20) -> optax.GradientTransformation:
  """u = g / (sqrt(nu / (1 - beta2^t)) + eps), nu = EMA of g^2 (spec 4.5)."""

  def init(params):
    return MomentState(jnp.zeros([], jnp.int32),
                       jax.tree_util.tree_map(jnp.zeros_like, params))

  def update(grads, state, params=None):
    del params
    count = state.count + 1
    nu = jax.tree_util.tree_map(lambda v, g: beta2 * v + (1 - beta2) * g * g,
                                state.moment, grads)
    corr = 1 - beta2 ** count.astype(jnp.float32)
    out = jax.tree_util.tree_map(lambda g, v: g / (jnp.sqrt(v / corr) + eps), grads, nu)
    return out, MomentState(count, nu)

  return optax.GradientTransformation(init, update)


def scale_by_momentum(beta1: float = 0.9) -> optax.GradientTransformation:
  """mu = EMA of the normalised update, output mu / (1 - beta1^t) (spec 4.6)."""

  def init(params):
    return MomentState(jnp.zeros([], jnp.int32),
                       jax.tree_util.tree_map(jnp.zeros_like, params))

  def update(updates, state, params=None):
    del params
    count = state.count + 1
    mu = jax.tree_util.tree_map(lambda m, u: beta1 * m + (1 - beta1) * u,
                                state.moment, updates)
    corr = 1 - beta1 ** count.astype(jnp.float32)
    return jax.tree_util.tree_map(lambda m: m / corr, mu), MomentState(count, mu)

  return optax.GradientTransformation(init, update)


def lr_schedule(lr: float = 4e-5, warmup: int = 1000) -> optax.Schedule:
  """Linear warmup from 0 over `warmup` updates, then constant (spec 4.7)."""
  if warmup <= 0:
    return optax.constant_schedule(lr)
  return optax.join_schedules(
      [optax.linear_schedule(0.0, lr, warmup), optax.constant_schedule(lr)], [warmup])


def make_optimizer(lr: float = 4e-5, agc: float = 0.3, beta1: float = 0.9,
                   beta2: float = 0.999, eps: float = 1e-20, warmup: int = 1000,
                   pmin: float = 1e-3) -> optax.GradientTransformation:
  """The LaProp chain of Algorithm I; its `update` takes params (for AGC)."""
  return optax.chain(
      clip_by_agc(agc, pmin),
      scale_by_rms(beta2, eps),
      scale_by_momentum(beta1),
      optax.scale_by_learning_rate(lr_schedule(lr, warmup)),
  )
