"""Actor-critic learning in imagination and on replay (spec 3, Algorithms F-H)."""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp

from agent import distributions as dists
from agent.config import DreamerConfig

sg = jax.lax.stop_gradient


def lambda_return(last, term, rew, boot, disc, lam):
  """Lambda-return (Algorithm H). Inputs [N, L] (disc may be scalar); returns [N, L-1].

  R_{L-1} = boot_{L-1};  R_t = rew_{t+1} + live_t ((1 - cont_t) boot_{t+1}
  + cont_t R_{t+1}) with live = (1 - term_{t+1}) disc, cont = (1 - last_{t+1}) lam.
  Step t uses the reward, continuation and value of the NEXT state (spec 3.7).
  """
  last, term, rew, boot = (jnp.asarray(x, jnp.float32) for x in (last, term, rew, boot))
  live = (1.0 - term)[:, 1:] * disc
  cont = (1.0 - last)[:, 1:] * lam
  interm = rew[:, 1:] + (1.0 - cont) * live * boot[:, 1:]

  def step(ret, inp):
    interm_t, live_t, cont_t = inp
    ret = interm_t + live_t * cont_t * ret
    return ret, ret

  xs = (interm.T, live.T, cont.T)
  _, rets = jax.lax.scan(step, boot[:, -1], xs, reverse=True)
  return rets.T


class RetNormState(NamedTuple):
  """Percentile return normaliser state: EMAs of P5 and P95 (spec 3.8)."""
  lo: jax.Array
  hi: jax.Array

  @classmethod
  def initial(cls):
    return cls(jnp.zeros([], jnp.float32), jnp.zeros([], jnp.float32))


def retnorm_update_then_read(state: RetNormState, returns, config: DreamerConfig):
  """Update the EMAs with this batch first, then read S = max(limit, hi - lo) (3.8)."""
  x = sg(returns).reshape(-1).astype(jnp.float32)
  lo_b, hi_b = jnp.percentile(x, jnp.array([config.retnorm_perclo,
                                            config.retnorm_perchi]))  # one sort
  r = config.retnorm_rate
  new = RetNormState((1 - r) * state.lo + r * lo_b, (1 - r) * state.hi + r * hi_b)
  scale = jnp.maximum(config.retnorm_limit, new.hi - new.lo)
  return new, sg(scale)


def imag_loss(*, act, rew_hat, con_hat, pi, val_logits, slow_pred, retnorm: RetNormState,
              config: DreamerConfig):
  """Imagination policy and value losses (Algorithm F, spec 3.5-3.17).

  Time-major, on stop-gradient imagined features (N = B*T starts):
    act [H, N, A]: the actions sampled at states 0..H-1;
    rew_hat, con_hat [H+1, N]: predicted reward and continuation (index 0 may
      come from replay data, OQ 6);
    pi: the policy distribution at states 0..H-1 (batch shape [H, N]);
    val_logits: (online critic logits at state 0 [N, K], at states 1..H
      [H, N, K]), kept apart so the start and imagined features never have to
      be concatenated into one [H+1, N, F] tensor;
    slow_pred [H, N]: the slow critic's expectation at states 0..H-1.
  Returns (policy loss [N], value loss [N], R [H, N], new retnorm, metrics).
  """
  disc = 1.0 if config.contdisc else config.gamma
  logits0, logits_img = val_logits
  v_on = sg(jnp.concatenate([dists.twohot_pred(logits0)[None],
                             dists.twohot_pred(logits_img)], 0))    # [H+1, N]
  weight = sg(jnp.cumprod(disc * con_hat, 0) / disc)             # includes c_0
  ret = lambda_return(jnp.zeros_like(con_hat.T), 1.0 - con_hat.T, rew_hat.T, v_on.T,
                      disc, config.lam).T                        # [H, N]
  retnorm, scale = retnorm_update_then_read(retnorm, ret, config)
  adv = (ret - v_on[:-1]) / scale
  logpi = pi.log_prob(sg(act))
  ent = pi.entropy()
  w = weight[:-1]
  pol = w * -(logpi * sg(adv) + config.actent * ent)

  def critic(logits, ret_t, slow_t):                             # spec 3.16, 3.17
    return dists.twohot_loss(logits, (sg(ret_t), sg(slow_t)),
                             scales=(1.0, config.slowreg))

  # States 1..H-1 are trained; state H gets a dummy target and is dropped from
  # the [H, N] loss, so the [H, N, K] logits are never sliced (no copy, and no
  # padded gradient) for one extra row of elementwise work.
  pad = jnp.zeros_like(ret[:1])
  loss_img = critic(logits_img, jnp.concatenate([ret[1:], pad], 0),
                    jnp.concatenate([slow_pred[1:], pad], 0))
  val = w * jnp.concatenate([critic(logits0, ret[0], slow_pred[0])[None],
                             loss_img[:-1]], 0)
  metrics = {
      'ret_mean': ret.mean(), 'ret_scale': scale, 'ret_lo': retnorm.lo,
      'ret_hi': retnorm.hi, 'adv_mag': jnp.abs(adv).mean(),
      'policy_entropy': ent.mean(), 'policy_logprob': logpi.mean(),
      'value_mean': v_on.mean(), 'imag_weight_mean': w.mean(),
      'imag_reward_mean': rew_hat[1:].mean(), 'imag_cont_mean': con_hat[1:].mean(),
  }
  return pol.mean(0), val.mean(0), ret, retnorm, metrics


def repl_loss(*, val_logits, slow_pred, boot, reward, is_last, is_terminal,
              config: DreamerConfig):
  """Replay critic loss (Algorithm G, spec 3.19). Inputs [B, T, ...].

  val_logits come from NON-stop-gradient posterior features (repval_grad), so
  0.3 x this loss also trains the encoder and RSSM. Returns the [B, T-1] loss.
  """
  ret = lambda_return(is_last, is_terminal, reward, boot, config.gamma,
                      config.replay_lam)                          # [B, T-1]
  mask = 1.0 - is_last[:, :-1].astype(jnp.float32)
  loss = mask * dists.twohot_loss(val_logits[:, :-1], (sg(ret), sg(slow_pred[:, :-1])),
                                  scales=(1.0, config.slowreg))
  return loss, ret
