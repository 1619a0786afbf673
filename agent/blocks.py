"""Shared building blocks (spec 1.1-1.7): Linear, BlockLinear, RMSNorm, MLP.

Parameters are float32; the compute dtype (f32 default, bf16 option, spec 1.12)
applies to matmul inputs and outputs. RMSNorm statistics are always f32.
"""

from __future__ import annotations

import math
from typing import Optional, Sequence

import haiku as hk
import jax
import jax.numpy as jnp
import numpy as np

TRUNC_STD_CORRECTION = 1.1368  # 1 / std of a unit normal truncated to [-2, 2]


def kernel_init(fan_in: int, outscale: float = 1.0) -> hk.initializers.Initializer:
  """outscale * 1.1368 * sqrt(1/fan_in) * TruncNormal(-2, 2) (spec 1.5).

  outscale 0 gives exact zeros (reward and value heads).
  """
  if outscale == 0.0:
    return hk.initializers.Constant(0.0)
  std = outscale * TRUNC_STD_CORRECTION / math.sqrt(fan_in)
  return hk.initializers.TruncatedNormal(stddev=std)


def dense_params(name: str, fan_in: int, units: int, outscale: float = 1.0):
  """Creates/reads a Linear's kernel [fan_in, units] and zero bias (spec 1.1)."""
  with hk.name_scope(name):
    w = hk.get_parameter('w', (fan_in, units), jnp.float32,
                         kernel_init(fan_in, outscale))
    b = hk.get_parameter('b', (units,), jnp.float32, jnp.zeros)
  return w, b


def block_params(name: str, fan_in: int, units: int, blocks: int,
                 outscale: float = 1.0):
  """BlockLinear kernel (g, I/g, U/g) with fan_in = I, the TOTAL width (1.2)."""
  if fan_in % blocks or units % blocks:
    raise ValueError(f'{name}: widths {fan_in}->{units} not divisible by {blocks}')
  with hk.name_scope(name):
    w = hk.get_parameter('w', (blocks, fan_in // blocks, units // blocks),
                         jnp.float32, kernel_init(fan_in, outscale))
    b = hk.get_parameter('b', (units,), jnp.float32, jnp.zeros)
  return w, b


def norm_params(name: str, width: int):
  """RMSNorm scale, ones, f32 (spec 1.3)."""
  with hk.name_scope(name):
    return hk.get_parameter('scale', (width,), jnp.float32, jnp.ones)


def dense(x, w, b):
  """y = x @ W + b in x's dtype (spec 1.1)."""
  return x @ w.astype(x.dtype) + b.astype(x.dtype)


def block_dense(x, w, b):
  """Block-diagonal dense (spec 1.2): output block k sees input block k only."""
  g, i, o = w.shape
  lead = x.shape[:-1]
  xb = jnp.moveaxis(x.reshape((-1, g, i)), 1, 0)                   # [g, N, i]
  y = jnp.einsum('kni,kio->kno', xb, w.astype(x.dtype))            # block axis leading
  return jnp.moveaxis(y, 0, 1).reshape(lead + (g * o,)) + b.astype(x.dtype)


def rms_norm(x, scale, eps: float = 1e-4):
  """RMSNorm over the last axis, f32 statistics, cast back (spec 1.3)."""
  x32 = x.astype(jnp.float32)
  y = x32 * jax.lax.rsqrt(jnp.mean(x32 * x32, -1, keepdims=True) + eps) * scale
  return y.astype(x.dtype)


def mlp_weights(in_dim: int, layers: int, units: int, prefix: str = 'linear'):
  """Weights of layers x [Linear -> RMSNorm -> SiLU] (spec 1.3, 1.4)."""
  ws = []
  for i in range(layers):
    w, b = dense_params(f'{prefix}{i}', in_dim, units)
    ws.append({'w': w, 'b': b, 'scale': norm_params(f'{prefix}{i}norm', units)})
    in_dim = units
  return ws


def mlp_apply(ws, x, eps: float = 1e-4):
  """Applies mlp_weights in x's dtype (the compute dtype)."""
  for layer in ws:
    x = jax.nn.silu(rms_norm(dense(x, layer['w'], layer['b']), layer['scale'], eps))
  return x


def concat_inputs(values: dict, shapes: dict, squish=None, dtype=jnp.float32):
  """DictConcat for continuous vector keys (spec 1.7).

  Keys sorted; `shapes[k]` is key k's feature shape, leading axes are batch.
  Per-key, per-sample availability (no element equal to -inf) zeroes the whole
  key vector; optional squish (symlog) runs in f32 before the cast to the
  compute dtype; feature dims are flattened and the keys concatenated.
  """
  parts = []
  for k in sorted(shapes):
    v = jnp.asarray(values[k], jnp.float32)
    rank = len(shapes[k])
    if tuple(v.shape[v.ndim - rank:]) != tuple(shapes[k]):
      raise ValueError(f'observation {k!r} has shape {v.shape}, expected '
                       f'[..., {", ".join(map(str, shapes[k]))}]')
    v = v.reshape(v.shape[:v.ndim - rank] + (int(np.prod(shapes[k])),))
    avail = jnp.all(v != -jnp.inf, -1, keepdims=True)
    v = jnp.where(avail, v, 0.0)
    if squish is not None:
      v = squish(v)
    parts.append(jnp.where(avail, v, 0.0).astype(dtype))
  return jnp.concatenate(parts, -1)
