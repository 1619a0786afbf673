"""A literal, unoptimised DreamerV3 loss (spec 3.1-3.20, Algorithms E-H) for tests.

agent/learning.py computes the same losses with the layout tricks that make it
fast (time-major imagination, one feature carry, heads split into start/imagined
parts, fused two-hot maths). This file is the plain reading of the spec that the
fast code is checked against (tests/test_learning.py): batch-major tensors, a
Python loop over the horizon, full feature tensors sliced with [:, 1:] /
[:, :-1], and two-hot losses against an explicit two-hot target vector.

It draws its random numbers exactly as the fast code does (same key splits,
same noise shapes), so both compute the same function of (params, batch, key).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from agent import distributions as dists
from agent import latents as latents_lib
from agent import networks as nets_lib
from agent import rssm as rssm_lib
from agent import world_model

sg = jax.lax.stop_gradient


def twohot_target(target, bins):
  """Algorithm D as a dense [..., K] target vector."""
  n = bins.shape[0]
  below = jnp.clip(jnp.sum(bins <= target[..., None], -1) - 1, 0, n - 1)
  above = jnp.clip(n - jnp.sum(bins > target[..., None], -1), 0, n - 1)
  equal = below == above
  d_below = jnp.where(equal, 1.0, jnp.abs(bins[below] - target))
  d_above = jnp.where(equal, 1.0, jnp.abs(bins[above] - target))
  total = d_below + d_above
  return (jax.nn.one_hot(below, n) * (d_above / total)[..., None] +
          jax.nn.one_hot(above, n) * (d_below / total)[..., None])


def twohot_loss(logits, target):
  bins = jnp.asarray(dists.symexp_bins(logits.shape[-1]))
  return -jnp.sum(sg(twohot_target(target, bins)) * jax.nn.log_softmax(logits, -1), -1)


def twohot_pred(logits):
  bins = jnp.asarray(dists.symexp_bins(logits.shape[-1]))
  p = jax.nn.softmax(logits, -1)
  m = (bins.shape[0] - 1) // 2
  return jnp.sum((p * bins)[..., m + 1:] + (p * bins)[..., :m][..., ::-1], -1)


def lambda_return_loop(last, term, rew, boot, disc, lam):
  """Algorithm H as a Python loop; [N, L] -> [N, L-1]."""
  L = rew.shape[1]
  rets = [boot[:, -1]]
  for t in reversed(range(L - 1)):
    live = (1.0 - term[:, t + 1]) * disc
    cont = (1.0 - last[:, t + 1]) * lam
    rets.append(rew[:, t + 1] + live * ((1 - cont) * boot[:, t + 1] + cont * rets[-1]))
  return jnp.stack(rets[1:][::-1], 1)


def compute_losses(params, slow_params, retnorm, batch, key, nets):
  """Same contract as agent.learning.compute_losses (losses only + retnorm)."""
  c = nets.config
  B, L = batch['is_first'].shape
  T = L - 1
  N = B * T
  H = c.imag_horizon
  k_obs, k_img, k_pol = jax.random.split(key, 3)
  W = nets.weights(params)
  Wsg = sg(W)
  W_slow = sg(nets.weights({**params, **slow_params})['val'])

  ctx = jax.tree_util.tree_map(lambda x: x[:, 0], batch['latent'])
  start = rssm_lib.Latent(*latents_lib.unpack(ctx, c))
  obs = {k: v[:, 1:] for k, v in batch['observation'].items()}
  reward = batch['reward'][:, 1:]
  is_last = batch['is_last'][:, 1:]
  is_terminal = batch['is_terminal'][:, 1:]
  losses, (deter, stoch), _ = world_model.world_model_loss(
      nets, W, start, obs, batch['action'][:, :-1], reward, batch['is_first'][:, 1:],
      is_terminal, k_obs)

  # Imagination (Algorithm C, spec 3.2-3.3): a plain loop over the horizon.
  pnoise = (jax.random.gumbel(k_pol, (H, N, nets.spaces.act_dim)) if nets.spaces.discrete
            else jax.random.normal(k_pol, (H, N, nets.spaces.act_dim)))
  znoise = jax.random.uniform(k_img, (H, N, c.stoch), jnp.float32)
  d = sg(deter).reshape(N, c.deter)
  s = sg(stoch).reshape(N, c.stoch * c.classes)
  ds, ss, acts, outs = [d], [s], [], []
  for t in range(H):
    f = jnp.concatenate([d, s], -1)
    out = nets.policy_outputs(W, sg(f))
    a = sg(nets.policy_dist(out).sample(noise=pnoise[t]))
    x2 = rssm_lib.embed_action(Wsg['dyn'], a, jnp.zeros((N,), bool), c)
    d = rssm_lib.core(rssm_lib.prepare_core(Wsg['dyn'], c), d, s, x2, c)
    z = dists.onehot_sample(rssm_lib.prior_logits(Wsg['dyn'], d, c), c.unimix,
                            noise=znoise[t])
    s = z.reshape(N, -1)
    ds.append(d), ss.append(s), acts.append(a), outs.append(out)
  feat = sg(jnp.concatenate([jnp.stack(ds, 1), jnp.stack(ss, 1)], -1))   # [N, H+1, F]
  act = jnp.stack(acts, 1)
  pol_out = jax.tree_util.tree_map(lambda *x: jnp.stack(x, 1), *outs)

  rew_hat = twohot_pred(nets.reward_logits(Wsg, feat))
  con_hat = dists.binary_prob(nets.cont_logit(Wsg, feat))
  if c.start_from_data:                                            # OQ 6
    rew_hat = rew_hat.at[:, 0].set(reward.reshape(N))
    con_hat = con_hat.at[:, 0].set(1.0 - is_terminal.reshape(N).astype(jnp.float32))
  val_logits = nets.value_logits(W['val'], feat)
  slow_pred = twohot_pred(nets.value_logits(W_slow, feat))
  disc = 1.0 if c.contdisc else c.gamma
  v_on = sg(twohot_pred(val_logits))
  weight = sg(jnp.cumprod(disc * con_hat, 1) / disc)
  ret = lambda_return_loop(jnp.zeros_like(con_hat), 1.0 - con_hat, rew_hat, v_on,
                           disc, c.lam)                             # [N, H]
  lo = jnp.percentile(ret, c.retnorm_perclo)
  hi = jnp.percentile(ret, c.retnorm_perchi)
  r = c.retnorm_rate
  new_lo, new_hi = (1 - r) * retnorm.lo + r * lo, (1 - r) * retnorm.hi + r * hi
  scale = jnp.maximum(c.retnorm_limit, new_hi - new_lo)
  adv = (ret - v_on[:, :-1]) / scale
  pi = nets.policy_dist(pol_out)
  w = weight[:, :-1]
  pol = w * -(pi.log_prob(act) * sg(adv) + c.actent * pi.entropy())
  val = w * (twohot_loss(val_logits[:, :-1], sg(ret)) +
             c.slowreg * twohot_loss(val_logits[:, :-1], sg(slow_pred[:, :-1])))
  losses['policy'] = pol.mean(1).reshape(B, T)
  losses['value'] = val.mean(1).reshape(B, T)

  # Replay critic (Algorithm G).
  rfeat = nets_lib.feat(deter, stoch)
  rep_logits = nets.value_logits(W['val'], rfeat)
  rep_slow = twohot_pred(nets.value_logits(W_slow, sg(rfeat)))
  rret = lambda_return_loop(is_last, is_terminal, reward, ret[:, 0].reshape(B, T),
                            c.gamma, c.replay_lam)
  mask = 1.0 - is_last[:, :-1].astype(jnp.float32)
  losses['repval'] = mask * (twohot_loss(rep_logits[:, :-1], sg(rret)) +
                             c.slowreg * twohot_loss(rep_logits[:, :-1], sg(rep_slow[:, :-1])))
  return losses, (new_lo, new_hi)
