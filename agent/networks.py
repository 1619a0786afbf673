"""DreamerV3 networks as Haiku modules plus pure apply functions.

`make_networks(spaces, config)` returns `DreamerNetworks`:
  * `init(key) -> params`: the flat Haiku params dict. Top-level module names
    are the spec's module groups (4.3): enc, dyn, dec, rew, con, pol, val.
  * `weights(params) -> dict`: the same arrays as a structured tree (a gather,
    free under jit) that the pure functions below consume.

Feature layouts (spec 2.11, 2.17): heads, actor and critic read
feat = concat(deter, stoch_flat); the decoder reads concat(stoch_flat, deter).
"""

from __future__ import annotations

import dataclasses
from typing import Callable

import haiku as hk
import jax
import jax.numpy as jnp
import numpy as np

from agent import blocks
from agent import cnn
from agent import distributions as dists
from agent import rssm as rssm_lib
from agent.config import DreamerConfig
from agent.types import EnvSpaces

MODULES = ('enc', 'dyn', 'dec', 'rew', 'con', 'pol', 'val')


class Encoder(hk.Module):
  """Vector encoder (spec 2.9): symlog DictConcat, 3 x [Linear, RMSNorm, SiLU];
  image encoder (spec 2.10, agent.cnn) when the spaces have image keys."""

  def __init__(self, spaces: EnvSpaces, config: DreamerConfig, name='enc'):
    super().__init__(name=name)
    self.spaces, self.c = spaces, config

  def __call__(self):
    sp, W = self.spaces, {}
    if sp.vector_keys:
      in_dim = sum(int(np.prod(sp.obs[k])) for k in sp.vector_keys)
      W['mlp'] = blocks.mlp_weights(in_dim, self.c.enc_layers, self.c.units)
    if sp.image_keys:
      shape = cnn.stacked_shape(sp.obs, sp.image_keys)
      W['cnn'] = cnn.encoder_weights(shape[-1], self.c.cnn_depth)
    return W


class Decoder(hk.Module):
  """Vector decoder (spec 2.11): 3-layer MLP, one symlog-MSE head per key;
  image decoder (spec 2.10, agent.cnn) when the spaces have image keys."""

  def __init__(self, spaces: EnvSpaces, config: DreamerConfig, name='dec'):
    super().__init__(name=name)
    self.spaces, self.c = spaces, config

  def __call__(self):
    c, sp, W = self.c, self.spaces, {}
    if sp.vector_keys:
      W['mlp'] = blocks.mlp_weights(c.feat_dim, c.dec_layers, c.units)
      W['heads'] = {}
      for k in sp.vector_keys:
        size = int(np.prod(sp.obs[k]))
        w, b = blocks.dense_params(f'head_{k}', c.units, size, c.outscale_dec)
        W['heads'][k] = {'w': w, 'b': b}
    if sp.image_keys:
      shape = cnn.stacked_shape(sp.obs, sp.image_keys)
      W['cnn'] = cnn.decoder_weights(shape, shape[-1], c.cnn_depth, c.deter,
                                     c.stoch * c.classes, c.units, c.outscale_img)
    return W


class Head(hk.Module):
  """MLP then output Linear(s) (spec 1.4). `outputs` maps name -> width."""

  def __init__(self, in_dim, layers, units, outputs, outscale, name):
    super().__init__(name=name)
    self.in_dim, self.layers, self.units = in_dim, layers, units
    self.outputs, self.outscale = outputs, outscale

  def __call__(self):
    W = {'mlp': blocks.mlp_weights(self.in_dim, self.layers, self.units)}
    for out, width in self.outputs.items():
      w, b = blocks.dense_params(out, self.units, width, self.outscale)
      W[out] = {'w': w, 'b': b}
    return W


def token_dim(spaces: EnvSpaces, config: DreamerConfig) -> int:
  """Width of the encoder's tokens, the posterior's input (spec 2.6, 2.9,
  2.10): d for the vector MLP plus the flattened CNN output."""
  width = config.units if spaces.vector_keys else 0
  if spaces.image_keys:
    shape = cnn.stacked_shape(spaces.obs, spaces.image_keys)
    width += cnn.feature_width(shape, config.cnn_depth)
  return width


def _module_builders(spaces: EnvSpaces, config: DreamerConfig) -> dict:
  """One zero-argument builder per module group; each returns its weights."""
  c = config
  act = spaces.act_dim
  pol_out = {'logits': act} if spaces.discrete else {'mean': act, 'std': act}
  return {
      'enc': lambda: Encoder(spaces, c)(),
      'dyn': lambda: rssm_lib.RSSM(c, act, token_dim(spaces, c))(),
      'dec': lambda: Decoder(spaces, c)(),
      'rew': lambda: Head(c.feat_dim, c.rew_layers, c.units, {'out': c.bins},
                          c.outscale_rew, 'rew')(),
      'con': lambda: Head(c.feat_dim, c.con_layers, c.units, {'out': 1},
                          c.outscale_con, 'con')(),
      'pol': lambda: Head(c.feat_dim, c.pol_layers, c.units, pol_out,
                          c.outscale_pol, 'pol')(),
      'val': lambda: Head(c.feat_dim, c.val_layers, c.units, {'out': c.bins},
                          c.outscale_val, 'val')(),
  }


@dataclasses.dataclass(frozen=True)
class DreamerNetworks:
  spaces: EnvSpaces
  config: DreamerConfig
  init: Callable
  weights: Callable
  weights_subset: Callable

  # --- encoder / decoder ------------------------------------------------------
  def encode(self, W, obs: dict):
    """Tokens e_t [..., d (+ CNN features)] from the observations: the vector
    MLP's output, then the flattened CNN output (spec 2.9, 2.10)."""
    sp, c, parts = self.spaces, self.config, []
    if sp.vector_keys:
      x = blocks.concat_inputs({k: obs[k] for k in sp.vector_keys},
                               {k: sp.obs[k] for k in sp.vector_keys},
                               squish=dists.symlog, dtype=c.jnp_compute_dtype)
      parts.append(blocks.mlp_apply(W['enc']['mlp'], x, c.rms_eps))
    if sp.image_keys:
      images = cnn.stack_images(obs, sp.image_keys)
      parts.append(cnn.encode(W['enc']['cnn'], images, c.rms_eps,
                              c.jnp_compute_dtype))
    return parts[0] if len(parts) == 1 else jnp.concatenate(parts, -1)

  def decode(self, W, deter, stoch) -> dict:
    """Per obs key: symlog-space vector predictions from the MLP on
    concat(stoch_flat, deter) (2.11); images in [0, 1] from the CNN (2.10)."""
    sp, c, out = self.spaces, self.config, {}
    if sp.vector_keys:
      x = jnp.concatenate([flat(stoch), deter], -1)
      x = blocks.mlp_apply(W['dec']['mlp'], x, c.rms_eps)
      for k, layer in W['dec']['heads'].items():
        y = blocks.dense(x, layer['w'], layer['b']).astype(jnp.float32)
        out[k] = y.reshape(y.shape[:-1] + tuple(sp.obs[k]))
    if sp.image_keys:
      shape = cnn.stacked_shape(sp.obs, sp.image_keys)
      pred = cnn.decode(W['dec']['cnn'], deter, flat(stoch).astype(deter.dtype),
                        shape, c.rms_eps)
      out.update(cnn.split_images(pred, sp.obs, sp.image_keys))
    return out

  # --- heads on feat = concat(deter, stoch_flat) -------------------------------
  def _head(self, Wh, feat, out='out'):
    x = blocks.mlp_apply(Wh['mlp'], feat, self.config.rms_eps)
    return blocks.dense(x, Wh[out]['w'], Wh[out]['b']).astype(jnp.float32)

  def reward_logits(self, W, feat):
    return self._head(W['rew'], feat)

  def cont_logit(self, W, feat):
    return self._head(W['con'], feat)[..., 0]

  def value_logits(self, Wval, feat):
    """Critic two-hot logits; Wval is W['val'] or the slow critic's weights."""
    return self._head(Wval, feat)

  def policy_outputs(self, W, feat) -> dict:
    """Raw policy head outputs (before the distribution's nonlinearities)."""
    first = W['pol']['mlp'][0]
    return self.policy_outputs_from(W['pol'], blocks.dense(feat, first['w'], first['b']))

  def policy_outputs_from(self, Wpol, pre) -> dict:
    """The policy after its first product: pre = feat @ W1 + b1 (spec 3.15).

    Reads W1's norm scale, the later layers and the output heads of Wpol
    (W['pol'], or the same without the first layer's 'w' and 'b'). The
    imagination computes `pre` itself, so that the gradient of the first
    kernel is one product after its loop (rssm.imagine).
    """
    eps = self.config.rms_eps
    mlp = Wpol['mlp']
    x = jax.nn.silu(blocks.rms_norm(pre, mlp[0]['scale'], eps))
    x = blocks.mlp_apply(mlp[1:], x, eps)
    names = ('logits',) if self.spaces.discrete else ('mean', 'std')
    return {n: blocks.dense(x, Wpol[n]['w'], Wpol[n]['b']) for n in names}

  def policy_dist(self, outputs: dict):
    """pi from raw outputs (spec 3.13 bounded normal / 3.14 categorical)."""
    if self.spaces.discrete:
      return dists.OneHotCategorical(outputs['logits'], self.config.actor_unimix)
    return dists.BoundedNormal(outputs['mean'], outputs['std'], self.config.minstd,
                               self.config.maxstd)

  def policy(self, W, feat):
    """The actor's distribution pi(a | feat)."""
    return self.policy_dist(self.policy_outputs(W, feat))


def flat(stoch):
  """[..., S, C] -> [..., S*C]."""
  return stoch.reshape(stoch.shape[:-2] + (-1,))


def feat(deter, stoch):
  """feat2tensor: concat(deter, stoch_flat) (spec 2.1)."""
  return jnp.concatenate([deter, flat(stoch).astype(deter.dtype)], -1)


def make_networks(spaces: EnvSpaces, config: DreamerConfig) -> DreamerNetworks:
  transforms = {m: hk.transform(f)
                for m, f in _module_builders(spaces, config).items()}

  def init(key):
    params = {}
    for m, k in zip(MODULES, jax.random.split(key, len(MODULES))):
      params.update(transforms[m].init(k))
    return params

  def weights_subset(params):
    """Structured weights of the module groups present in `params`."""
    present = {module_of(k) for k in params}
    return {m: transforms[m].apply(
        {k: v for k, v in params.items() if module_of(k) == m}, None)
            for m in MODULES if m in present}

  def weights(params):
    W = weights_subset(params)
    missing = set(MODULES) - set(W)
    if missing:
      raise ValueError(f'params lack module group(s) {sorted(missing)}')
    return W

  return DreamerNetworks(spaces, config, init, weights, weights_subset)


def module_of(param_path: str) -> str:
  """'dyn/~/dynin0' -> 'dyn' (the spec 4.3 module group of a parameter)."""
  return param_path.split('/')[0]


def count_params(params, module: str = None) -> int:
  return sum(int(np.prod(v.shape)) for path, leaves in params.items()
             if module is None or module_of(path) == module
             for v in leaves.values())
