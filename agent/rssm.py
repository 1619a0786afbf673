"""RSSM: block-GRU core, posterior, prior, observe and imagine scans (spec 2.1-2.8).

`RSSM` is a Haiku module whose call creates (at init) or reads (at apply) every
parameter and returns them as a dict; the maths are pure functions of that dict
(Algorithms A-C). This keeps the `lax.scan` bodies free of Haiku state, lets the
observe scan hoist everything that does not depend on the carry out of the loop,
and keeps the scan carry to two arrays (deter, flat stoch).

Hoisting is exact algebra, not an approximation:
  * the action embedding x2 = silu(rms(Linear(a / max(1, |a|)))) only depends on
    the (known) previous actions and is_first flags;
  * the posterior's first Linear on concat(h_t, e_t) splits into h_t @ W_h +
    (e_t @ W_e + b), and the token part is computed for all (B, T) at once;
  * the dynhid0 BlockLinear input is concat(deter_k, x) per block k with the same
    embedding x in every block, so its output is the block-diagonal product on
    deter plus one dense product of x with the kernel's x-rows (no repeat).
Sampling noise (one uniform per latent, inverse CDF) for all steps is drawn
before the scan. The observe scan's backward takes its kernel gradients after
the loop, one matmul per kernel over all T * B rows (`_observe_scan`, a custom
VJP), instead of accumulating them in the scan carry step by step.
"""

from __future__ import annotations

import functools
from typing import NamedTuple

import haiku as hk
import jax
import jax.numpy as jnp

from agent import blocks
from agent import distributions as dists
from agent.config import DreamerConfig
from agent.parallel import shard_rows

sg = jax.lax.stop_gradient


class Latent(NamedTuple):
  """RSSM state: deter [..., D], stoch [..., S, C] (spec 2.1)."""
  deter: jax.Array
  stoch: jax.Array


class RSSM(hk.Module):
  """Creates the RSSM parameters (spec 2.4-2.6); call returns them as a dict."""

  def __init__(self, config: DreamerConfig, act_dim: int, token_dim: int,
               name: str = 'dyn'):
    super().__init__(name=name)
    self.c = config
    self.act_dim = act_dim
    self.token_dim = token_dim

  def __call__(self) -> dict:
    c = self.c
    D, H, g = c.deter, c.hidden, c.blocks
    SC = c.stoch * c.classes
    W = {}
    for name, fan_in in (('dynin0', D), ('dynin1', SC), ('dynin2', self.act_dim)):
      w, b = blocks.dense_params(name, fan_in, H)
      W[name] = {'w': w, 'b': b, 'scale': blocks.norm_params(name + 'norm', H)}
    # dynhid0: BlockLinear(D, g) on g * (D/g + 3H) inputs; fan_in = D + 3Hg.
    w, b = blocks.block_params('dynhid0', D + 3 * H * g, D, g)
    W['dynhid0'] = {'w': w, 'b': b, 'scale': blocks.norm_params('dynhid0norm', D)}
    w, b = blocks.block_params('dyngru', D, 3 * D, g)
    W['dyngru'] = {'w': w, 'b': b}
    w, b = blocks.dense_params('obs0', D + self.token_dim, H)
    W['obs0'] = {'w': w, 'b': b, 'scale': blocks.norm_params('obs0norm', H)}
    w, b = blocks.dense_params('obslogit', H, SC, c.outscale_rssm)
    W['obslogit'] = {'w': w, 'b': b}
    W['prior'] = blocks.mlp_weights(D, c.img_layers, H, prefix='prior')
    w, b = blocks.dense_params('priorlogit', H, SC, c.outscale_rssm)
    W['priorlogit'] = {'w': w, 'b': b}
    return W


# --- pure maths (Algorithms A-C) -----------------------------------------------

def _sigmoid(x):
  """sigmoid(x) = (1 + tanh(x / 2)) / 2: exact identity; one tanh instead of
  exp + divide measured ~6 % faster for the imagination scan on XLA:CPU."""
  return 0.5 * jnp.tanh(0.5 * x) + 0.5


def _embed(layer, x, eps):
  return jax.nn.silu(blocks.rms_norm(blocks.dense(x, layer['w'], layer['b']),
                                     layer['scale'], eps))


def embed_action(W, action, is_first, config: DreamerConfig):
  """x2 = silu(rms(Linear(a / sg(max(1, |a|))))) with a zeroed at is_first (2.2, 2.3).

  action [..., A] float, is_first [...] bool. Returns [..., H].
  """
  dtype = config.jnp_compute_dtype
  a = jnp.where(is_first[..., None], 0.0, action.astype(jnp.float32))
  a = a / sg(jnp.maximum(1.0, jnp.abs(a)))
  return _embed(W['dynin2'], a.astype(dtype), config.rms_eps)


@jax.custom_vjp
def _block_matmul(x, w, w_t):
  """[g, B, i] x [g, i, o] -> [g, B, o], block axis leading (spec 1.2).

  The backward uses `w_t` = swapaxes(w, 1, 2), prepared once outside the scans,
  so XLA does not re-transpose the kernel in every scan iteration.
  """
  return jnp.einsum('kbi,kio->kbo', x, w)


def _block_matmul_fwd(x, w, w_t):
  return _block_matmul(x, w, w_t), (x, w_t)


def _block_matmul_bwd(res, g):
  x, w_t = res
  return (jnp.einsum('kbo,koi->kbi', g, w_t), jnp.einsum('kbi,kbo->kio', x, g), None)


_block_matmul.defvjp(_block_matmul_fwd, _block_matmul_bwd)


# Kernels the scan bodies multiply by, by name (the tap names of `core` and
# `posterior_logits`), and the layers whose biases / norm scales they also read.
LOOP_KERNELS = ('dynin0', 'dynin1', 'hid_x', 'hid_d', 'gru', 'obs0_h', 'obslogit')
_LOOP_LAYERS = ('dynin0', 'dynin1', 'dynhid0', 'dyngru', 'obs0', 'obslogit')


def loop_kernels(W, config: DreamerConfig) -> dict:
  """The loop-invariant kernels of `core` and `posterior_logits`, by name.

  dynhid0's kernel [g, D/g + 3H, D/g] splits into its deter rows (block-
  diagonal, 'hid_d') and its x rows; as the same embedding x enters every
  block, the x rows act as one dense [3H, D] kernel ('hid_x'). The posterior's
  first Linear keeps only its h_t rows ('obs0_h'; the token rows are hoisted,
  `token_projection`). Same parameters, same maths; all in the compute dtype.
  """
  D, H, g = config.deter, config.hidden, config.blocks
  Dg = D // g
  kernel = W['dynhid0']['w']
  K = {
      'dynin0': W['dynin0']['w'], 'dynin1': W['dynin1']['w'],
      'hid_x': jnp.transpose(kernel[:, Dg:], (1, 0, 2)).reshape(3 * H, D),
      'hid_d': kernel[:, :Dg], 'gru': W['dyngru']['w'],
      'obs0_h': W['obs0']['w'][:D], 'obslogit': W['obslogit']['w'],
  }
  return {n: k.astype(config.jnp_compute_dtype) for n, k in K.items()}


def with_kernels(W, K: dict) -> dict:
  """W plus the loop kernels K ('K') and their transposes ('T').

  Every kernel comes transposed too, so a scan's backward multiplies by a
  prepared W.T (blocks.dense) instead of re-transposing it every iteration.
  """
  return {**W, 'K': K, 'T': {n: jnp.swapaxes(k, -1, -2) for n, k in K.items()}}


def prepare_core(W, config: DreamerConfig) -> dict:
  """Loop-invariant kernel layouts for `core`, computed once before a scan."""
  return with_kernels(W, loop_kernels(W, config))


def _no_tap(name, x, y):
  return y


def to_blocks(x, g: int):
  """[B, D] -> block-major [g, B, D/g] (a transpose copy)."""
  return jnp.swapaxes(x.reshape(x.shape[0], g, -1), 0, 1)


def _linear(Wc, name, x, b, tap):
  """x @ K[name] + b with the prepared transpose; `tap` sees (name, x, y)."""
  return tap(name, x, blocks.dense(x, Wc['K'][name], b, Wc['T'][name]))


def _norm_act(x, scale, eps):
  return jax.nn.silu(blocks.rms_norm(x, scale, eps))


def core(Wc, deter, stoch_flat, x2, config: DreamerConfig, tap=_no_tap):
  """Block-GRU step h_t = f(h_{t-1}, z_{t-1}, a_{t-1}) (Algorithm A, spec 2.4).

  Wc = prepare_core(W). deter [B, D], stoch_flat [B, S*C], x2 [B, H] (the
  action embedding). The block maths run in block-major layout [g, B, D/g]
  (batched matmuls with the block axis leading), measured ~1.8x faster on
  XLA:CPU than one '...ki,kio' einsum on [B, g, D/g]; tests/test_rssm.py checks
  the result against Algorithm A written literally. `tap(name, x, y)` sees
  every kernel product (input x, output y) and returns the y to use
  (`observe`'s backward).
  """
  D, g = config.deter, config.blocks
  Dg = D // g
  eps = config.rms_eps
  dtype = deter.dtype
  K, T = Wc['K'], Wc['T']
  dk = to_blocks(deter, g)                                         # [g, B, Dg]
  x0 = _norm_act(_linear(Wc, 'dynin0', deter, Wc['dynin0']['b'], tap),
                 Wc['dynin0']['scale'], eps)
  x1 = _norm_act(_linear(Wc, 'dynin1', stoch_flat, Wc['dynin1']['b'], tap),
                 Wc['dynin1']['scale'], eps)
  x = jnp.concatenate([x0, x1, x2.astype(dtype)], -1)            # [B, 3H]
  hid_x = _linear(Wc, 'hid_x', x, Wc['dynhid0']['b'], tap)         # same x, every block
  hid = tap('hid_d', dk, _block_matmul(dk, K['hid_d'], T['hid_d'])) + to_blocks(hid_x, g)
  # RMSNorm over the FULL deter vector (both block axes), f32 statistics.
  # The sum of squares is a GEMV per block row (blocks.row_sum), then a sum
  # over the g blocks: XLA:CPU's reduction over (blocks, minor axis) is slower.
  h32 = hid.astype(jnp.float32)
  ms = (blocks.row_sum(h32 * h32).sum(0) / D)[None, :, None]
  scale = Wc['dynhid0']['scale'].reshape(g, 1, Dg)
  hid = jax.nn.silu((h32 * jax.lax.rsqrt(ms + eps) * scale).astype(dtype))
  gates = (tap('gru', hid, _block_matmul(hid, K['gru'], T['gru'])) +
           Wc['dyngru']['b'].astype(dtype).reshape(g, 1, 3 * Dg))  # no norm, no act
  return _gru_update(gates, deter, dk, g).astype(dtype)


def _gate(gates, h):
  """u * tanh(r * c) + (1 - u) * h from gates [..., 3 n] = [r | c | u] (spec 2.4)."""
  r, c, u = jnp.split(gates, 3, -1)
  c = jnp.tanh(_sigmoid(r) * c)
  u = _sigmoid(u - 1)
  return u * c + (1 - u) * h


def _gru_update(gates, deter, dk, g: int):
  """h' = u * tanh(r * c) + (1 - u) * h per block (spec 2.4, [r | c | u]).

  gates [g, B, 3 D/g] block-major, deter [B, D] and the same state block-major
  dk [g, B, D/g]; returns [B, D].

  With many rows (imagination: B = 1,024 starts) each block's update is
  written straight into its column slice of the result, against deter's own
  slice: no block-major copy of h and no [g, B, D/g] -> [B, D] transpose.
  XLA:CPU fuses such a transpose into this elementwise chain as one loop
  fusion that runs about 10x slower than the chain alone: 1.4 ms per
  imagination step at size1m, 8.5 ms at size12m (bench/op_profile.py); the
  per-block form takes about 0.8 / 3.2 ms (the g block updates, then their
  concatenation). With few rows (the observe scan and acting: B = 16) that
  fusion is cheap and the g-fold ops cost more: the block-major form there
  measured 0.974x (size1m) and 0.968x (size12m) the update time of per-block
  everywhere, and keeps the observe step at 94 forward ops instead of 200
  (bench/hlo_ops.py; ops are kernel launches on an accelerator).
  """
  if deter.shape[0] >= _PER_BLOCK_MIN_ROWS:
    Dg = gates.shape[-1] // 3
    return jnp.concatenate(
        [_gate(gates[k], deter[:, k * Dg:(k + 1) * Dg]) for k in range(g)], -1)
  return jnp.swapaxes(_gate(gates, dk), 0, 1).reshape(deter.shape)


# Rows from which `_gru_update` writes per block (measured at 16 and 1,024 rows).
_PER_BLOCK_MIN_ROWS = 256


def token_projection(W, tokens, config: DreamerConfig):
  """e_t @ W_e + b: the token half of the posterior's first Linear (hoisted)."""
  w = W['obs0']['w']
  return blocks.dense(tokens, w[config.deter:], W['obs0']['b'])


def posterior_logits(Wc, deter, tok_proj, config: DreamerConfig, tap=_no_tap):
  """obs0 on concat(h_t, e_t) then obslogit (spec 2.6). Returns raw [B, S, C].

  Wc = prepare_core(W); tok_proj = token_projection(W, e_t) carries obs0's bias.
  """
  K, T = Wc['K'], Wc['T']
  x = tap('obs0_h', deter, blocks.matmul(deter, K['obs0_h'], T['obs0_h'])) + tok_proj
  x = _norm_act(x, Wc['obs0']['scale'], config.rms_eps)
  logit = _linear(Wc, 'obslogit', x, Wc['obslogit']['b'], tap)
  return logit.reshape(x.shape[:-1] + (config.stoch, config.classes))


def prior_logits(W, deter, config: DreamerConfig):
  """p(z_t | h_t): 2 x [Linear, RMSNorm, SiLU] then priorlogit (spec 2.5)."""
  x = blocks.mlp_apply(W['prior'], deter, config.rms_eps)
  logit = blocks.dense(x, W['priorlogit']['w'], W['priorlogit']['b'])
  return logit.reshape(x.shape[:-1] + (config.stoch, config.classes))


def observe_step(Wc, carry: Latent, tok_proj, x2, is_first, noise,
                 config: DreamerConfig, tap=_no_tap):
  """One filtering step (Algorithm B). carry stoch is [B, S*C] (flat).

  Wc = prepare_core(W): the RSSM weights plus loop-invariant kernel layouts.

  Returns the new (deter, flat stoch) and the raw posterior logits.
  """
  deter, stoch = carry
  keep = (~is_first)[:, None].astype(deter.dtype)
  deter, stoch = deter * keep, stoch * keep                       # zero state at is_first
  deter = core(Wc, deter, stoch, x2, config, tap)
  logit = posterior_logits(Wc, deter, tok_proj, config, tap)
  sample = dists.onehot_sample(logit, config.unimix, noise=noise)
  stoch = sample.reshape(sample.shape[:-2] + (-1,)).astype(deter.dtype)
  return Latent(deter, stoch), logit


def observe(W, start: Latent, tokens, prevact, is_first, key, config: DreamerConfig):
  """Observe scan over time (spec 2.7). Inputs are batch-major [B, T, ...].

  start: Latent with deter [B, D], stoch [B, S, C] (replay context, no grad).
  Returns deter [B, T, D], stoch [B, T, S, C] (straight-through samples) and
  posterior logits [B, T, S, C] (raw).
  """
  B, T = is_first.shape
  dtype = config.jnp_compute_dtype
  x2 = embed_action(W, prevact, is_first, config)                  # [B, T, H]
  tok = token_projection(W, tokens.astype(dtype), config)          # [B, T, H]
  noise = shard_rows(jax.random.uniform(key, (T, B, config.stoch), jnp.float32),
                     axis=1)                                   # sampling noise
  xs = (jnp.swapaxes(tok, 0, 1), jnp.swapaxes(x2, 0, 1),
        jnp.swapaxes(is_first, 0, 1), noise)
  carry = Latent(sg(start.deter).astype(dtype),
                 sg(start.stoch).reshape(B, -1).astype(dtype))
  small = {n: {k: v for k, v in W[n].items() if k != 'w'} for n in _LOOP_LAYERS}
  deter, stoch, logit = _observe_scan(config, loop_kernels(W, config), small, carry, xs)
  deter = jnp.swapaxes(deter, 0, 1)
  stoch = jnp.swapaxes(stoch, 0, 1).reshape(B, T, config.stoch, config.classes)
  logit = jnp.swapaxes(logit, 0, 1)
  return deter, stoch, logit


class _Tap:
  """Adds a (zero) probe to every kernel product in a step and keeps its input."""

  def __init__(self, probes):
    self.probes, self.inputs = probes, {}

  def __call__(self, name, x, y):
    self.inputs[name] = x
    return y + self.probes[name].astype(y.dtype)


def _observe_loop(config, K, small, carry, xs, probes=None):
  """The observe scan proper: time-major (deter, flat stoch, logits) per step.

  With `probes` (a dict of [T, ...] arrays, one per LOOP_KERNELS product,
  scanned with xs) it also returns every kernel product's input per step.
  """
  Wc = with_kernels(small, K)

  def step(carry, inp):
    if probes is None:
      tap, (tok_t, x2_t, first_t, noise_t) = _no_tap, inp
    else:
      (tok_t, x2_t, first_t, noise_t), p = inp
      tap = _Tap(p)
    carry, logit = observe_step(Wc, carry, tok_t, x2_t, first_t, noise_t, config, tap)
    ys = (carry.deter, carry.stoch, logit)
    return carry, (ys if probes is None else (ys, tap.inputs))

  T = xs[0].shape[0]
  _, ys = jax.lax.scan(step, carry, xs if probes is None else (xs, probes),
                       unroll=config.unroll_for(T))
  return ys


@functools.partial(jax.custom_vjp, nondiff_argnums=(0,))
def _observe_scan(config, K, small, carry, xs):
  """`_observe_loop` whose kernel gradients are taken after the loop.

  Plain autodiff of the scan accumulates each kernel's gradient in the scan's
  backward carry: per step, a [B]-row outer product the size of the kernel,
  read and written back (at size12m about 18 MB per step, 64 steps). Here the
  backward scan instead returns, per step, the cotangent of every kernel
  product (through zero probes added to the products), and each kernel's
  gradient is one matmul over all T * B rows afterwards:
  dK = sum_t x_t^T g_t, the same sum in another order (f32 rounding).
  Biases, norm scales, inputs and the carry differentiate as usual.
  """
  return _observe_loop(config, K, small, carry, xs)


def _probe_shapes(config, K, B):
  g = config.blocks
  out = {}
  for name, k in K.items():
    out[name] = (g, B, k.shape[-1]) if k.ndim == 3 else (B, k.shape[-1])
  return out


def _observe_scan_fwd(config, K, small, carry, xs):
  T, B = xs[2].shape
  dtype = config.jnp_compute_dtype
  probes = {n: jnp.zeros((T,) + s, dtype)
            for n, s in _probe_shapes(config, K, B).items()}
  Ksg = jax.tree_util.tree_map(sg, K)

  def loop(small, carry, xs, probes):
    return _observe_loop(config, Ksg, small, carry, xs, probes)   # (ys, inputs)

  ys, vjp, inputs = jax.vjp(loop, small, carry, xs, probes, has_aux=True)
  return ys, (vjp, inputs)


def _observe_scan_bwd(config, res, g):
  vjp, inputs = res
  d_small, d_carry, d_xs, d_probes = vjp(g)
  dK = {}
  for name, x in inputs.items():
    gy = d_probes[name]
    if x.ndim == 4:                                     # block kernels: [T, g, B, i]
      dk = jnp.einsum('tkbi,tkbo->kio', x, gy, preferred_element_type=jnp.float32)
    else:
      dk = blocks.weight_grad(x.astype(jnp.float32), gy.astype(jnp.float32))
    dK[name] = dk.astype(config.jnp_compute_dtype)     # = loop_kernels' dtype
  return dK, d_small, d_carry, d_xs


_observe_scan.defvjp(_observe_scan_fwd, _observe_scan_bwd)


def imagine(W, start_feat, policy_fn, policy_params, policy_noise, key,
            config: DreamerConfig):
  """Imagination rollout (spec 2.8, 3.2, 3.3): H steps from each start state.

  start_feat [N, F] = concat(deter, stoch_flat) of the start states (spec 2.1
  feature layout, no gradient). W are stop-gradient RSSM weights: no gradient
  flows into the world model from imagination (spec 3.4).
  policy_params = (first, rest): the policy's first Linear {'w', 'b'} and the
  rest of its parameters. policy_fn(rest, pre [N, U], noise [N, A]) ->
  (action, outputs) runs the policy from its first pre-activation
  pre = feat @ w + b, which this function computes, and returns the sampled
  action and the policy head's raw outputs, so the actor loss reuses this
  forward pass instead of running the policy again on the same features
  (3.3). The action is stop-gradiented before it enters the core (Algorithm C).
  policy_noise [H, N, A] is the policy's sampling noise for every step, drawn
  before the scan like the latents' sampling noise (no RNG inside the loop).

  The scan carry is the feature vector itself (one array): the policy reads it
  as is, the core reads its deter / stoch halves, and the stacked carries are
  the features every head needs, with no re-concatenation afterwards. (Also
  carrying deter block-major, to skip the core's transposes, measured slower.)
  The first kernel's gradient is taken after the loop from those stacked
  features (`_imagine_scan`).
  Returns, time-major: feats [H, N, F] of imagined states 1..H, actions
  [H, N, A] and outputs [H, N, ...] at states 0..H-1. The action at state H is
  never used by any loss (spec 3.2), so it is not sampled.
  """
  N = start_feat.shape[0]
  horizon = policy_noise.shape[0]
  dtype = config.jnp_compute_dtype
  noise = shard_rows(jax.random.uniform(key, (horizon, N, config.stoch),
                                        jnp.float32), axis=1)
  first, rest = policy_params
  feats, actions, outputs = _imagine_scan(
      policy_fn, config, prepare_core(W, config), rest, first,
      sg(start_feat).astype(dtype), (policy_noise, noise))
  return sg(feats), actions, outputs


def _imagine_loop(policy_fn, config, Wc, rest, first, start, xs, probes=None):
  """The imagination scan proper: (feats, actions, outputs), time-major.

  With `probes` ([H, N, U], scanned with xs) a zero probe is added to the
  policy's first pre-activation at every step, and the first Linear's weights
  enter as constants: the probes' cotangents are then that pre-activation's
  gradient per step (`_imagine_scan`).
  """
  N = start.shape[0]
  D = config.deter
  dtype = config.jnp_compute_dtype
  w, b = first['w'].astype(dtype), first['b'].astype(dtype)
  no_first = jnp.zeros((N,), bool)

  def step(feat, inp):
    if probes is None:
      (pnoise_t, noise_t), pre = inp, blocks.dense(feat, w, b)
    else:
      (pnoise_t, noise_t), probe_t = inp
      pre = blocks.dense(feat, sg(w), sg(b)) + probe_t
    action, outputs = policy_fn(rest, pre, pnoise_t)
    x2 = embed_action(Wc, sg(action), no_first, config)
    deter = core(Wc, feat[:, :D], feat[:, D:], x2, config)
    logit = prior_logits(Wc, deter, config)
    # One-hot value of the sample; no straight-through term, as nothing
    # differentiates through imagined latents (sg weights, sg actions, 3.4).
    z = dists.onehot_sample(logit, config.unimix, noise=noise_t, straight_through=False)
    new = jnp.concatenate([deter, z.reshape(N, -1).astype(dtype)], -1)
    return new, (new, sg(action), outputs)

  horizon = xs[0].shape[0]
  _, ys = jax.lax.scan(step, start, xs if probes is None else (xs, probes),
                       unroll=config.unroll_for(horizon))
  return ys


@functools.partial(jax.custom_vjp, nondiff_argnums=(0, 1))
def _imagine_scan(policy_fn, config, Wc, rest, first, start, xs):
  """`_imagine_loop` whose first policy kernel gradient is taken after the loop.

  Plain autodiff of the scan keeps every step's [N, F] input of the policy's
  first Linear as a residual (a second [H, N, F] stacked buffer beside the
  features themselves) and accumulates the kernel's gradient, an [F, U]
  product over N rows, per backward step. Here the backward scan returns the
  first pre-activation's cotangent per step (zero probes) and
  dW = start^T g_0 + sum_t feats_t^T g_{t+1}, db = sum of the g rows: one
  product over all H * N rows on the features the scan returns anyway, the
  same sums in another order (f32 rounding). Against plain autodiff of the
  scan, in-process: about 0.97x the update time at size12m (0.92-1.04 over
  five sittings on a noisy host; dropping the in-loop kernel gradient
  altogether, an upper bound, gave 0.93x), 0.99x at size1m; XLA's temp buffer
  1,084 -> 948 MiB at size12m. The rest of the policy differentiates as
  usual; the core's weights, the start features and the noise get no
  gradient (the caller stops them, spec 3.4).
  """
  return _imagine_loop(policy_fn, config, Wc, rest, first, start, xs)


def _imagine_scan_fwd(policy_fn, config, Wc, rest, first, start, xs):
  horizon, N = xs[0].shape[:2]
  probes = jnp.zeros((horizon, N, first['w'].shape[-1]), config.jnp_compute_dtype)

  def loop(rest, probes):
    return _imagine_loop(policy_fn, config, Wc, rest, first, start, xs, probes)

  ys, vjp = jax.vjp(loop, rest, probes)
  return ys, (vjp, ys[0], start, Wc, first, xs)


def _imagine_scan_bwd(policy_fn, config, res, g):
  vjp, feats, start, Wc, first, xs = res
  d_rest, d_pre = vjp(g)                                         # d_pre [H, N, U]
  # Step t's policy reads state t: the start state, then feats[t - 1].
  d_next = jnp.concatenate([d_pre[1:], jnp.zeros_like(d_pre[:1])], 0)
  dw = blocks.weight_grad(start, d_pre[0]) + blocks.weight_grad(feats, d_next)
  db = blocks.sum_rows(d_pre, jnp.float32)
  d_first = {'w': dw.astype(first['w'].dtype), 'b': db.astype(first['b'].dtype)}
  zeros = lambda tree: jax.tree_util.tree_map(jnp.zeros_like, tree)
  return zeros(Wc), d_rest, d_first, zeros(start), zeros(xs)


_imagine_scan.defvjp(_imagine_scan_fwd, _imagine_scan_bwd)
