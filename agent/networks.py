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
from agent import distributions as dists
from agent import rssm as rssm_lib
from agent.config import DreamerConfig
from agent.types import EnvSpaces

MODULES = ('enc', 'dyn', 'dec', 'rew', 'con', 'pol', 'val')


class Encoder(hk.Module):
  """Vector encoder (spec 2.9): symlog DictConcat, 3 x [Linear, RMSNorm, SiLU]."""

  def __init__(self, spaces: EnvSpaces, config: DreamerConfig, name='enc'):
    super().__init__(name=name)
    self.spaces, self.c = spaces, config

  def __call__(self):
    in_dim = sum(int(np.prod(s)) for s in self.spaces.obs.values())
    return {'mlp': blocks.mlp_weights(in_dim, self.c.enc_layers, self.c.units)}


class Decoder(hk.Module):
  """Vector decoder (spec 2.11): 3-layer MLP, one symlog-MSE head per key."""

  def __init__(self, spaces: EnvSpaces, config: DreamerConfig, name='dec'):
    super().__init__(name=name)
    self.spaces, self.c = spaces, config

  def __call__(self):
    c = self.c
    W = {'mlp': blocks.mlp_weights(c.feat_dim, c.dec_layers, c.units), 'heads': {}}
    for k in self.spaces.obs_keys:
      size = int(np.prod(self.spaces.obs[k]))
      w, b = blocks.dense_params(f'head_{k}', c.units, size, c.outscale_dec)
      W['heads'][k] = {'w': w, 'b': b}
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


def _module_builders(spaces: EnvSpaces, config: DreamerConfig) -> dict:
  """One zero-argument builder per module group; each returns its weights."""
  c = config
  act = spaces.act_dim
  pol_out = {'logits': act} if spaces.discrete else {'mean': act, 'std': act}
  return {
      'enc': lambda: Encoder(spaces, c)(),
      'dyn': lambda: rssm_lib.RSSM(c, act, c.units)(),
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
    """Tokens e_t [..., d] from the vector obs (spec 2.9)."""
    x = blocks.concat_inputs(obs, self.spaces.obs, squish=dists.symlog,
                             dtype=self.config.jnp_compute_dtype)
    return blocks.mlp_apply(W['enc']['mlp'], x, self.config.rms_eps)

  def decode(self, W, deter, stoch) -> dict:
    """Symlog-space predictions per obs key from concat(stoch_flat, deter) (2.11)."""
    x = jnp.concatenate([flat(stoch), deter], -1)
    x = blocks.mlp_apply(W['dec']['mlp'], x, self.config.rms_eps)
    out = {}
    for k, layer in W['dec']['heads'].items():
      y = blocks.dense(x, layer['w'], layer['b']).astype(jnp.float32)
      out[k] = y.reshape(y.shape[:-1] + tuple(self.spaces.obs[k]))
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
