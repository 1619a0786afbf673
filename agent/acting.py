"""Batched act-time computation (spec 7.1, Algorithm B + policy sample).

`make_policy(nets)` returns pure, jit-able functions:
  * `initial_carry(num_envs)`: zeros (spec 2.2); the env's is_first resets it.
  * `step(params, carry, obs, key, mode)`: encode obs, one filtering step with
    is_first masking, then a ~ pi(. | feat). Returns the new carry, the raw
    (unclipped) action, and the packed posterior latents to store (spec 5.7).

`mode='sample'` is the paper's acting policy in every mode (spec 7.3);
`mode='mode'` is the deterministic policy (tanh mean / argmax), honoured for
evaluation when asked for (`--eval_policy=mode`).
Only the enc, dyn and pol parameters are read (`ACTING_MODULES`, spec 6.3a).
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp

from agent import latents as latents_lib
from agent import networks as nets_lib
from agent import rssm as rssm_lib

ACTING_MODULES = ('enc', 'dyn', 'pol')


class PolicyCarry(NamedTuple):
  deter: jax.Array     # [N, D] compute dtype
  stoch: jax.Array     # [N, S*C] compute dtype (flat one-hot)
  prevact: jax.Array   # [N, A] float32, the previous raw sample


def acting_params(params):
  """The subset of params the actor needs (enc, dyn, pol)."""
  return {k: v for k, v in params.items()
          if nets_lib.module_of(k) in ACTING_MODULES}


class Policy(NamedTuple):
  initial_carry: callable
  step: callable


def make_policy(nets: nets_lib.DreamerNetworks) -> Policy:
  c = nets.config

  def initial_carry(num_envs: int) -> PolicyCarry:
    dtype = c.jnp_compute_dtype
    return PolicyCarry(jnp.zeros((num_envs, c.deter), dtype),
                       jnp.zeros((num_envs, c.stoch * c.classes), dtype),
                       jnp.zeros((num_envs, nets.spaces.act_dim), jnp.float32))

  def step(params, carry: PolicyCarry, observation: dict, is_first, key,
           mode: str = 'sample'):
    """One vector step: observation {key: [N, ...]}, is_first [N] bool."""
    W = nets.weights_subset(params)
    k_lat, k_act = jax.random.split(key)
    tokens = nets.encode(W, observation)
    x2 = rssm_lib.embed_action(W['dyn'], carry.prevact, is_first, c)
    tok = rssm_lib.token_projection(W['dyn'], tokens, c)
    noise = jax.random.uniform(k_lat, (is_first.shape[0], c.stoch))
    latent, _ = rssm_lib.observe_step(
        rssm_lib.prepare_core(W['dyn'], c), rssm_lib.Latent(carry.deter, carry.stoch), tok, x2, is_first,
        noise, c)
    feat = jnp.concatenate([latent.deter, latent.stoch], -1)
    dist = nets.policy(W, feat)
    if mode == 'sample':
      action = dist.sample(key=k_act)
    elif mode == 'mode':
      action = dist.mode()
    else:
      raise ValueError(f"policy mode must be 'sample' or 'mode', got {mode!r}")
    stoch = latent.stoch.reshape(-1, c.stoch, c.classes)
    packed = latents_lib.pack(latent.deter, stoch, c)
    return PolicyCarry(latent.deter, latent.stoch, action), action, packed

  return Policy(initial_carry, step)
