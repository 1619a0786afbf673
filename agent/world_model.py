"""World-model loss (Algorithm E, spec 2.11-2.16) on one replay batch."""

from __future__ import annotations

import jax
import jax.numpy as jnp

from agent import cnn
from agent import distributions as dists
from agent import networks as nets_lib
from agent import rssm as rssm_lib
from agent.config import DreamerConfig

sg = jax.lax.stop_gradient


def world_model_loss(nets: nets_lib.DreamerNetworks, W, start: rssm_lib.Latent,
                     obs: dict, prevact, reward, is_first, is_terminal, key):
  """Encode, observe (scan), then the per-(b, t) world-model losses.

  Args (batch-major, trained steps only, [B, T, ...]):
    start: replay-context latent (deter [B, D], stoch [B, S, C]), a constant.
    obs: vector observations and uint8 images; prevact: a_{t-1} for each obs_t (spec 5.8);
    reward, is_first, is_terminal: per-step flags.
  Returns (losses {name: [B, T]}, posterior (deter, stoch), metrics).
  """
  c: DreamerConfig = nets.config
  tokens = nets.encode(W, obs)
  deter, stoch, post = rssm_lib.observe(W['dyn'], start, tokens, prevact, is_first,
                                        key, c)
  prior = rssm_lib.prior_logits(W['dyn'], deter, c)               # parallel (2.5)
  dyn = dists.onehot_kl(sg(post), prior, c.unimix)
  rep = dists.onehot_kl(post, sg(prior), c.unimix)
  losses = {'dyn': jnp.maximum(dyn, c.free_nats),                # free bits per (b, t)
            'rep': jnp.maximum(rep, c.free_nats)}
  recon = nets.decode(W, deter, stoch)
  for k, pred in recon.items():
    if k in nets.spaces.image_keys:                               # spec 2.10
      losses[f'rec_{k}'] = cnn.image_loss(pred, obs[k])
    else:                                                         # spec 2.11
      losses[f'rec_{k}'] = dists.symlog_mse_loss(
          pred, sg(obs[k]), event_dims=len(nets.spaces.obs[k]))
  feat = nets_lib.feat(deter, stoch)                              # not sg (2.16)
  losses['rew'] = dists.twohot_loss(nets.reward_logits(W, feat), reward)
  cont = (~is_terminal).astype(jnp.float32)
  if c.contdisc:
    cont = cont * c.gamma                                         # soft label (2.13)
  losses['con'] = dists.binary_loss(nets.cont_logit(W, feat), cont)
  metrics = {
      'dyn_ent': dists.onehot_entropy(prior, c.unimix).mean(),
      'rep_ent': dists.onehot_entropy(post, c.unimix).mean(),
      'kl': dyn.mean(),
  }
  return losses, (deter, stoch), metrics
