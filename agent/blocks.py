"""Shared building blocks (spec 1.1-1.7): Linear, BlockLinear, RMSNorm, MLP.

Parameters are float32; the compute dtype (f32 default, bf16 option, spec 1.12)
applies to matmul inputs and outputs. RMSNorm statistics are always f32.
"""

from __future__ import annotations

import functools
import math

import haiku as hk
import jax
import jax.numpy as jnp
import numpy as np

from agent.parallel import data_parallel_tracing

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


def _flat2(x):
  return x.reshape(-1, x.shape[-1])


def _lead(x):
  return tuple(range(x.ndim - 1))


def sum_rows(g, dtype=None):
  """g [..., o] summed over every leading row axis -> [o] in ``dtype``
  (default g's), f32 accumulation.

  One device: a GEMV with a ones vector over the flattened rows (XLA:CPU's
  row reduction is slower). Data-parallel (``agent.parallel``): a plain sum
  over the leading axes, since flattening [H, N, o] with N split over the
  devices would make XLA gather the whole tensor first; the partitioner sums
  each device's rows and all-reduces the [o] partial sums."""
  dtype = dtype or g.dtype
  if data_parallel_tracing() and g.ndim > 2:
    return jnp.sum(g, axis=_lead(g), dtype=jnp.float32).astype(dtype)
  g2 = _flat2(g)
  return jnp.dot(jnp.ones((g2.shape[0],), g2.dtype), g2,
                 preferred_element_type=jnp.float32).astype(dtype)


def weight_grad(x, g):
  """dW = x^T g over every leading row: x [..., i], g [..., o] -> [i, o].

  For a narrowing layer (i >= 4 o: the heads' and policy's first layers on
  feat, the posterior's h_t rows) XLA:CPU runs x^T g, a GEMM contracting the
  long row axis of both operands, at ~135 GFLOP/s. Transposing g (o columns,
  the small operand) and computing (g^T x)^T runs as a plain GEMM at 250-400
  GFLOP/s; the optimization barrier keeps XLA from folding the outer transpose
  back into the slow form. The same products and sums (bench: [15360, 640] x
  [15360, 64] 9.1 -> 4.5 ms, [15360, 2560] x [15360, 256] 69 -> 48 ms); for
  i < 4 o the plain form is as fast or faster.

  Data-parallel (``agent.parallel``): one contraction over the leading axes
  without flattening them (flattening [H, N, i] with N split over the devices
  would make XLA gather the whole tensor); each device contracts its rows and
  the partitioner all-reduces the [i, o] partial products.
  """
  if data_parallel_tracing() and x.ndim > 2:
    lead = _lead(x)
    return jax.lax.dot_general(x, g, ((lead, lead), ((), ())))
  x, g = _flat2(x), _flat2(g)
  if x.shape[-1] >= 4 * g.shape[-1]:
    return jax.lax.optimization_barrier(g.T @ x).T
  return x.T @ g


@jax.custom_vjp
def _affine(x, w, b, w_t):
  """x @ w + b; w_t = w.T when the caller has it (loop-invariant, see `dense`)."""
  return x @ w + b


def _affine_fwd(x, w, b, w_t):
  return x @ w + b, (x, w, w_t)


def _affine_bwd(res, g):
  x, w, w_t = res
  dx = g @ (w.T if w_t is None else w_t)
  if not data_parallel_tracing():
    g = _flat2(g)       # one flatten for both products (see sum_rows)
  dw = weight_grad(x, g)
  db = sum_rows(g)      # a GEMV: XLA:CPU's row reduction is slower
  return dx, dw, db, None


_affine.defvjp(_affine_fwd, _affine_bwd)


@jax.custom_vjp
def _matmul(x, w, w_t):
  return x @ w


def _matmul_fwd(x, w, w_t):
  return x @ w, (x, w, w_t)


def _matmul_bwd(res, g):
  x, w, w_t = res
  return g @ (w.T if w_t is None else w_t), weight_grad(x, g), None


_matmul.defvjp(_matmul_fwd, _matmul_bwd)


def matmul(x, w, w_t=None):
  """x @ W in x's dtype, with an optional prepared W.T for the backward (`dense`)."""
  dtype = x.dtype
  return _matmul(x, w.astype(dtype), None if w_t is None else w_t.astype(dtype))


def dense(x, w, b, w_t=None):
  """y = x @ W + b in x's dtype (spec 1.1).

  Same maths as autodiff of x @ W + b; the custom backward takes the bias
  gradient as a GEMV and, inside scans, uses w_t = W.T prepared once outside
  the loop (`dx = g @ w_t` is a plain GEMM; with the transposed operand,
  XLA:CPU's small-batch dot in the observe scan's backward ran ~6 GFLOP/s).
  """
  dtype = x.dtype
  w_t = None if w_t is None else w_t.astype(dtype)
  return _affine(x, w.astype(dtype), b.astype(dtype), w_t)


def block_dense(x, w, b):
  """Block-diagonal dense (spec 1.2): output block k sees input block k only."""
  g, i, o = w.shape
  lead = x.shape[:-1]
  xb = jnp.moveaxis(x.reshape((-1, g, i)), 1, 0)                   # [g, N, i]
  y = jnp.einsum('kni,kio->kno', xb, w.astype(x.dtype))            # block axis leading
  return jnp.moveaxis(y, 0, 1).reshape(lead + (g * o,)) + b.astype(x.dtype)


def row_sum(x):
  """Sum over the last axis as a matmul with a ones vector: [..., n] -> [...].

  XLA:CPU lowers a reduction over a minor axis wider than 32 to a slow
  reduce-window; a GEMV is several times faster (bench: RMSNorm forward 2.5-3x).
  Float32 accumulation like the reduction it replaces.
  """
  return (x @ jnp.ones((x.shape[-1], 1), x.dtype))[..., 0]


def sum_of_squares(x):
  """sum(x ** 2) over every element of a tensor, in f32.

  A GEMV per row (row_sum), then a short sum over the rows: XLA:CPU reduces a
  whole large tensor to a scalar at about 5 GB/s on the 2-core host, the GEMV
  several times faster (the 85 parameter tensors of size12m: 4.6 ms as
  jnp.sum(jnp.square(x)), 12.6 ms as jnp.linalg.norm, 1.05 ms this way).
  The same sum in another order (f32 rounding).
  """
  x = x.astype(jnp.float32)
  if x.ndim < 2:
    return jnp.sum(x * x)
  x = x.reshape(-1, x.shape[-1])
  return jnp.sum(row_sum(x * x))


def _rms_fwd(x, scale, eps):
  r = jax.lax.rsqrt(row_sum(x * x)[..., None] / x.shape[-1] + eps)
  return x * r * scale, (x, r, scale)


def _rms_bwd(eps, res, dy):
  """y = s x r, r = (mean(x^2) + eps)^-1/2:
  dx = r (s dy) - x r^3 mean(s dy x);  ds = sum_rows(dy x r)."""
  x, r, scale = res
  n = x.shape[-1]
  sdy = dy * scale
  dx = r * sdy - x * (r ** 3) * (row_sum(sdy * x)[..., None] / n)
  dyxr = dy * x * r
  if data_parallel_tracing() and dyxr.ndim > 2:
    dscale = jnp.sum(dyxr, axis=_lead(dyxr))
  else:
    dyxr = dyxr.reshape(-1, n)
    dscale = (jnp.ones((1, dyxr.shape[0]), dyxr.dtype) @ dyxr)[0]
  return dx, dscale.reshape(scale.shape)


@functools.partial(jax.custom_vjp, nondiff_argnums=(2,))
def _rms_norm_f32(x, scale, eps):
  return _rms_fwd(x, scale, eps)[0]


_rms_norm_f32.defvjp(_rms_fwd, _rms_bwd)


def rms_norm(x, scale, eps: float = 1e-4):
  """RMSNorm over the last axis, f32 statistics, cast back (spec 1.3).

  x * rsqrt(mean(x^2) + eps) * scale. The row statistics (forward and
  backward) are matmuls with a ones vector (row_sum); tests/test_blocks.py
  checks values and gradients against the plain formula.
  """
  y = _rms_norm_f32(x.astype(jnp.float32), jnp.asarray(scale, jnp.float32), eps)
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
