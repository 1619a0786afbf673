"""The jitted DreamerV3 train step (Algorithm J) and its checkpointable state.

`make_train_step(nets)` returns `init(key) -> TrainingState` and
`update(state, batch) -> (state, metrics, outs)`, where `batch` is the replay
layout of agent/types.py with [B, T + 1] leading axes and `outs` holds the
packed posterior latents of indices 1..T for the write-back (spec 5.9).

Order inside one update (spec 3.20): world-model forward on replay; imagination
from all B*T posterior starts with stop-gradient weights; heads on the imagined
states; lambda-returns, return-normaliser update-then-read, policy and value
losses; replay critic; one scalar loss and one gradient; LaProp update; slow
critic EMA; latents returned for write-back.

Bad input (README "Bad input"): shapes and dtypes are checked on the host before
the jitted call (`check_batch`); a non-finite batch, loss or gradient skips the
update (params, optimizer, normaliser and slow critic unchanged) and reports
`skipped_update = 1` and `nonfinite_batch` in the metrics.
"""

from __future__ import annotations

from typing import Any, Callable, NamedTuple

import chex
import jax
import jax.numpy as jnp
import numpy as np

from agent import actor_critic as ac
from agent import blocks
from agent import distributions as dists
from agent import latents as latents_lib
from agent import networks as nets_lib
from agent import optimizer as opt_lib
from agent import rssm as rssm_lib
from agent import world_model
from agent.config import DreamerConfig
from agent.parallel import LearnerPlacement, shard_rows
from agent.types import EnvSpaces, step_spec

sg = jax.lax.stop_gradient


class TrainingState(NamedTuple):
  """Everything a checkpoint needs to resume the learner bit-for-bit."""
  params: Any          # trainable Haiku params (enc, dyn, dec, rew, con, pol, val)
  slow_params: Any     # slow critic: same structure as the 'val/...' entries
  opt_state: Any
  retnorm: ac.RetNormState
  step: jax.Array      # int32 number of updates applied
  key: jax.Array


def val_params(params):
  return {k: v for k, v in params.items() if nets_lib.module_of(k) == 'val'}


def policy_params(Wpol):
  """(first, rest) of the policy's weights for rssm.imagine: its first Linear's
  kernel and bias, and everything else (that layer keeps its norm scale)."""
  layer0 = Wpol['mlp'][0]
  first = {'w': layer0['w'], 'b': layer0['b']}
  rest = {**Wpol, 'mlp': [{'scale': layer0['scale']}] + list(Wpol['mlp'][1:])}
  return first, rest


def compute_losses(params, slow_params, retnorm, batch, key,
                   nets: nets_lib.DreamerNetworks):
  """Every un-reduced loss term of one batch (Algorithms E, F, G; spec 3.20).

  Returns (losses {name: [B, T] or [B, T-1]}, (new retnorm, metrics, outs)).
  """
  c: DreamerConfig = nets.config
  B, L = batch['is_first'].shape
  T = L - 1
  N = B * T
  k_obs, k_img, k_pol = jax.random.split(key, 3)
  W = nets.weights(params)
  Wsg = sg(W)
  W_slow = nets.weights({**params, **slow_params})['val']
  W_slow = sg(W_slow)

  # --- replay context (Algorithm J, spec 5.8) --------------------------------
  ctx = jax.tree_util.tree_map(lambda x: x[:, 0], batch['latent'])
  deter0, stoch0 = latents_lib.unpack(ctx, c)
  start = rssm_lib.Latent(deter0, stoch0)
  obs = {k: v[:, 1:] for k, v in batch['observation'].items()}
  prevact = batch['action'][:, :-1]
  reward = batch['reward'][:, 1:]
  is_first = batch['is_first'][:, 1:]
  is_last = batch['is_last'][:, 1:]
  is_terminal = batch['is_terminal'][:, 1:]

  # --- world model (Algorithm E) --------------------------------------------
  losses, (deter, stoch), metrics = world_model.world_model_loss(
      nets, W, start, obs, prevact, reward, is_first, is_terminal, k_obs)
  for name, value in losses.items():
    chex.assert_shape(value, (B, T))

  feat = nets_lib.feat(deter, stoch)               # [B, T, F], NOT sg (repval_grad)

  # --- imagination (spec 3.1-3.3), no gradient into the world model ----------
  # Time-major from here on: states 0..H on the leading axis, N = B*T starts.
  start_feat = shard_rows(sg(feat).reshape(N, c.feat_dim))
  def policy_fn(rest, pre, noise):
    # Policy weights NOT stop-gradiented: its raw outputs are reused by the
    # actor loss (log-prob of the stop-gradient action, entropy), spec 3.3, 3.11.
    outputs = nets.policy_outputs_from(rest, pre)
    return nets.policy_dist(outputs).sample(noise=noise), outputs

  shape = (c.imag_horizon, N, nets.spaces.act_dim)
  policy_noise = shard_rows(jax.random.gumbel(k_pol, shape)
                            if nets.spaces.discrete
                            else jax.random.normal(k_pol, shape), axis=1)
  feats, img_act, pol_out = rssm_lib.imagine(
      Wsg['dyn'], start_feat, policy_fn, policy_params(W['pol']), policy_noise,
      k_img, c)                                                   # feats: states 1..H
  # Heads run on the start features [N, F] and the imagined ones [H, N, F]
  # separately, never on a concatenated or sliced copy of the big tensor.
  if c.start_from_data:
    # OQ 6 (2411f7d): start-state reward and continuation from replayed data.
    rew0 = reward.reshape(N).astype(jnp.float32)
    con0 = 1.0 - is_terminal.reshape(N).astype(jnp.float32)
  else:                                                           # HEAD
    rew0 = dists.twohot_pred(nets.reward_logits(Wsg, start_feat))
    con0 = dists.binary_prob(nets.cont_logit(Wsg, start_feat))
  rew_hat = jnp.concatenate(
      [rew0[None], dists.twohot_pred(nets.reward_logits(Wsg, feats))], 0)  # [H+1, N]
  con_hat = jnp.concatenate(
      [con0[None], dists.binary_prob(nets.cont_logit(Wsg, feats))], 0)
  pi = nets.policy_dist(pol_out)                                  # states 0..H-1
  val_logits = (nets.value_logits(W['val'], start_feat),          # state 0
                nets.value_logits(W['val'], feats))               # states 1..H
  # Slow critic at states 0..H-1; running it on all of `feats` and dropping
  # state H's scalar is cheaper than slicing the [H, N, F] features.
  slow_pred = jnp.concatenate(
      [dists.twohot_pred(nets.value_logits(W_slow, start_feat))[None],
       dists.twohot_pred(nets.value_logits(W_slow, feats))[:-1]], 0)   # [H, N]
  pol_loss, val_loss, ret, new_retnorm, ac_metrics = ac.imag_loss(
      act=img_act, rew_hat=rew_hat, con_hat=con_hat, pi=pi, val_logits=val_logits,
      slow_pred=slow_pred, retnorm=retnorm, config=c)
  losses['policy'] = pol_loss.reshape(B, T)
  losses['value'] = val_loss.reshape(B, T)
  metrics.update(ac_metrics)
  if not nets.spaces.discrete:
    metrics['policy_std'] = pi.std.mean()

  # --- replay critic (Algorithm G) -------------------------------------------
  rep_logits = nets.value_logits(W['val'], feat)
  rep_slow = dists.twohot_pred(nets.value_logits(W_slow, sg(feat)))
  losses['repval'], _ = ac.repl_loss(
      val_logits=rep_logits, slow_pred=rep_slow, boot=ret[0].reshape(B, T),
      reward=reward, is_last=is_last, is_terminal=is_terminal, config=c)
  chex.assert_shape(losses['repval'], (B, T - 1))
  metrics.update({f'loss/{k}': jnp.mean(v) for k, v in losses.items()})
  outs = latents_lib.pack(sg(deter), sg(stoch), c)
  return losses, (new_retnorm, metrics, outs)


def loss_fn(params, slow_params, retnorm, batch, key, nets: nets_lib.DreamerNetworks):
  """Total loss = sum_k scale_k mean(loss_k) (spec 4.1): an f32 scalar.

  Means, not sums: masked or weighted-out entries count in the denominators.
  Returns (loss, (new retnorm, metrics, outs)).
  """
  losses, aux = compute_losses(params, slow_params, retnorm, batch, key, nets)
  scales = loss_scales(nets.config, nets.spaces)
  total = sum(scales[k] * jnp.mean(v) for k, v in losses.items())
  chex.assert_shape(total, ())
  return total.astype(jnp.float32), aux


def loss_scales(config: DreamerConfig, spaces: EnvSpaces) -> dict:
  """Per-term scales (spec 4.1); 'rec' expands to one term per obs key."""
  scales = {'dyn': config.loss_dyn, 'rep': config.loss_rep, 'rew': config.loss_rew,
            'con': config.loss_con, 'policy': config.loss_policy,
            'value': config.loss_value, 'repval': config.loss_repval}
  scales.update({f'rec_{k}': config.loss_rec for k in spaces.obs})
  return scales


def _tree_all_finite(tree):
  leaves = jax.tree_util.tree_leaves(tree)
  return jnp.all(jnp.stack([jnp.all(jnp.isfinite(x)) for x in leaves]))


def _global_norm(tree):
  return jnp.sqrt(sum(blocks.sum_of_squares(x) for x in jax.tree_util.tree_leaves(tree)))


class TrainStep(NamedTuple):
  init: Callable       # key -> TrainingState
  update: Callable     # (state, batch) -> (state, metrics, outs); jitted
  optimizer: Any
  nets: nets_lib.DreamerNetworks


def make_train_step(nets: nets_lib.DreamerNetworks, jit: bool = True,
                    placement=None) -> TrainStep:
  """``init`` and the jitted ``update`` (module doc). ``placement``: an
  ``agent.parallel.LearnerPlacement`` (default one device); with N devices the
  update runs data-parallel (state replicated, batch rows split)."""
  c = nets.config
  optimizer = opt_lib.make_optimizer(lr=c.lr, agc=c.agc, beta1=c.beta1, beta2=c.beta2,
                                     eps=c.eps, warmup=c.warmup, pmin=c.agc_pmin)

  def init(key) -> TrainingState:
    k_param, k_state = jax.random.split(key)
    params = nets.init(k_param)
    slow = jax.tree_util.tree_map(jnp.array, val_params(params))  # exact copy (3.18)
    return TrainingState(params, slow, optimizer.init(params),
                         ac.RetNormState.initial(), jnp.zeros([], jnp.int32), k_state)

  def update(state: TrainingState, batch):
    key, k_loss = jax.random.split(state.key)
    finite_batch = _tree_all_finite(
        [batch['observation'], batch['action'], batch['reward']])
    grad_fn = jax.value_and_grad(loss_fn, has_aux=True)
    (loss, (retnorm, metrics, outs)), grads = grad_fn(
        state.params, state.slow_params, state.retnorm, batch, k_loss, nets)
    updates, opt_state = optimizer.update(grads, state.opt_state, state.params)
    params = jax.tree_util.tree_map(lambda p, u: p + u, state.params, updates)
    slow = jax.tree_util.tree_map(                                # EMA after step (3.18)
        lambda s, p: (1 - c.slow_rate) * s + c.slow_rate * p,
        state.slow_params, val_params(params))
    ok = finite_batch & jnp.isfinite(loss) & jnp.isfinite(_global_norm(grads))
    new_state = jax.lax.cond(
        ok, lambda: TrainingState(params, slow, opt_state, retnorm, state.step + 1, key),
        lambda: state._replace(key=key))
    metrics.update({
        'loss/total': loss, 'grad_norm': _global_norm(grads),
        'update_norm': _global_norm(updates), 'param_norm': _global_norm(params),
        'skipped_update': (~ok).astype(jnp.float32),
        'nonfinite_batch': (~finite_batch).astype(jnp.float32),
        'lr': opt_lib.lr_schedule(c.lr, c.warmup)(state.step),
    })
    return new_state, metrics, outs

  if jit:
    update = (placement or LearnerPlacement()).jit_update(update)
  return TrainStep(init, update, optimizer, nets)


# --- host-side batch validation ------------------------------------------------

def check_batch(batch, spaces: EnvSpaces, config: DreamerConfig) -> None:
  """Raises ValueError naming the first key whose shape or dtype is wrong."""
  spec = step_spec(spaces, config)
  lead = None

  def check(path, s, x):
    nonlocal lead
    name = '/'.join(str(getattr(p, 'key', p)) for p in path)
    if x is None:
      raise ValueError(f'batch is missing key {name!r}')
    x_shape = tuple(np.shape(x))
    if len(x_shape) != 2 + len(s.shape) or x_shape[2:] != tuple(s.shape):
      raise ValueError(f'batch[{name!r}] has shape {x_shape}, expected '
                       f'[B, T+1{"".join(", " + str(d) for d in s.shape)}]')
    if lead is None:
      lead = x_shape[:2]
    elif x_shape[:2] != lead:
      raise ValueError(f'batch[{name!r}] has leading shape {x_shape[:2]}, others {lead}')
    if np.dtype(x.dtype) != np.dtype(s.dtype):
      raise ValueError(f'batch[{name!r}] has dtype {x.dtype}, expected {np.dtype(s.dtype)}')

  missing = set(_paths(spec)) - set(_paths(batch))
  if missing:
    raise ValueError(f'batch is missing key(s) {sorted(missing)}')
  extra = set(_paths(batch)) - set(_paths(spec))
  if extra:
    raise ValueError(f'batch has unexpected key(s) {sorted(extra)}')
  jax.tree_util.tree_map_with_path(check, spec, batch,
                                   is_leaf=lambda x: hasattr(x, 'dtype'))
  if lead[1] < 3:
    raise ValueError(f'batch time length {lead[1]} too short (need T+1 >= 3)')


def _paths(tree, prefix=''):
  out = []
  for k, v in tree.items():
    if isinstance(v, dict):
      out.extend(_paths(v, f'{prefix}{k}/'))
    else:
      out.append(prefix + k)
  return out
