"""An independent, literal DreamerV3 loss (spec 1.3-1.11, 2.2-2.16, 3.1-3.19,
Algorithms A-H) for tests.

Nothing here imports the project: no ``agent`` module, so no network, RSSM,
distribution or loss code of the learner is reused. The reference reads the
parameters by their names in the flat Haiku dict (``'dyn/dynin0'``,
``'enc/linear0norm'``, ...), the only interface it shares with the code under
test, and computes every step as the spec writes it: batch-major tensors,
Python loops over time and over the horizon, a full ``jnp.repeat`` of the
block-GRU input (Algorithm A), the posterior's Linear on the concatenation
(h_t, e_t), one-hot samples by an explicit cumulative sum, two-hot losses
against an explicit two-hot target vector, and the symmetric two-hot
expectation summed pair by pair.

The spec's constants (unimix, free nats, discount horizon, lambdas, entropy
scale, normaliser percentiles, policy std bounds, RMSNorm eps, two-hot range)
are typed in below, not read from the config under test. The loss *scales*
are typed into the test that sums the terms (tests/test_learning.py).

Random numbers: the reference draws the same arrays as agent/learning.py
(the same key split into observe / imagine / policy keys, one uniform per
latent for each observe step [T, B, S] and imagination step [H, N, S], a
normal [H, N, A] or Gumbel [H, N, A] policy noise), so both compute the same
function of (params, batch, key). That is the one contract between them.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

sg = jax.lax.stop_gradient

# Spec constants (the "Spec (exact)" column and the final table), typed in.
UNIMIX = 0.01            # latent unimix (1.8)
ACTOR_UNIMIX = 0.01      # discrete actor unimix (3.14, OQ 5)
FREE_NATS = 1.0          # free bits after the latent sum (2.14)
RMS_EPS = 1e-4           # RMSNorm eps (1.3)
BLOCKS = 8               # GRU blocks g (2.4)
LATENTS = 32             # S (2.1)
HORIZON = 333            # discount horizon: gamma = 1 - 1/333 (3.6)
LAMBDA = 0.95            # imagination lambda (3.7)
REPLAY_LAMBDA = 0.95     # replay lambda (3.19)
ACTENT = 3e-4            # actor entropy scale eta (3.12)
SLOWREG = 1.0            # slow-critic regulariser (3.17)
RETNORM_RATE = 0.01      # return normaliser EMA rate (3.8)
RETNORM_LIMIT = 1.0
PERC_LO, PERC_HI = 5.0, 95.0
MINSTD, MAXSTD = 0.1, 1.0   # bounded normal policy (3.13)
STD_OFFSET = 2.0
TWOHOT_HALF = 128        # 255 bins = 128 + 127 (1.9)
TWOHOT_RANGE = 20.0      # bins in symlog space span [-20, 20]


# --- 1.6, 1.9: symlog and the two-hot bins -------------------------------------------

def symlog(x):
  return jnp.sign(x) * jnp.log(1 + jnp.abs(x))


def bins_255():
  """half = symexp(linspace(-20, 0, 128, f32)); bins = [half, -reverse(half[:-1])]
  (symexp evaluated in float64, then rounded to float32)."""
  x = np.linspace(-TWOHOT_RANGE, 0.0, TWOHOT_HALF, dtype=np.float32).astype(np.float64)
  half = np.sign(x) * (np.exp(np.abs(x)) - 1)
  return jnp.asarray(np.concatenate([half, -half[:-1][::-1]]).astype(np.float32))


def twohot_target(target, bins):
  """Algorithm D as a dense [..., K] target vector (raw-space interpolation)."""
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
  """Cross-entropy against the explicit two-hot target (no gradient to it)."""
  assert logits.shape[-1] == 2 * TWOHOT_HALF - 1, logits.shape
  bins = bins_255()
  target = jnp.asarray(target, jnp.float32)
  return -jnp.sum(sg(twohot_target(target, bins)) * jax.nn.log_softmax(logits, -1), -1)


def twohot_pred(logits):
  """softmax, products p_k b_k, mirror pairs from small to large |b| (1.9)."""
  bins = bins_255()
  p = jax.nn.softmax(logits, -1)
  pb = p * bins
  m = (bins.shape[0] - 1) // 2
  pairs = pb[..., :m][..., ::-1] + pb[..., m + 1:]
  return pb[..., m] + jnp.sum(pairs, -1)


def lambda_return_loop(last, term, rew, boot, disc, lam):
  """Algorithm H as a Python loop; [N, L] -> [N, L-1]."""
  L = rew.shape[1]
  rets = [boot[:, -1]]
  for t in reversed(range(L - 1)):
    live = (1.0 - term[:, t + 1]) * disc
    cont = (1.0 - last[:, t + 1]) * lam
    rets.append(rew[:, t + 1] + live * ((1 - cont) * boot[:, t + 1] + cont * rets[-1]))
  return jnp.stack(rets[1:][::-1], 1)


# --- 1.1-1.4: Linear, RMSNorm, SiLU, MLP --------------------------------------------

def linear(P, name, x):
  return x @ P[name]['w'] + P[name]['b']


def rms(P, name, x):
  return x / jnp.sqrt(jnp.mean(x * x, -1, keepdims=True) + RMS_EPS) * P[name]['scale']


def block(P, name, x):
  """Linear -> RMSNorm -> SiLU (spec 1.3)."""
  y = rms(P, name + 'norm', linear(P, name, x))
  return y * jax.nn.sigmoid(y)


def mlp(P, module, x, prefix='linear'):
  i = 0
  while f'{module}/{prefix}{i}' in P:
    x = block(P, f'{module}/{prefix}{i}', x)
    i += 1
  return x


# --- 1.8: categoricals with unimix ----------------------------------------------------

def mixed_probs(logits, unimix):
  return (1 - unimix) * jax.nn.softmax(logits, -1) + unimix / logits.shape[-1]


def onehot_sample(logits, u):
  """Inverse CDF: idx = #{c : cdf_c <= u}; straight-through through p_mix."""
  p = mixed_probs(logits, UNIMIX)
  cdf = jnp.cumsum(sg(p), -1)
  idx = jnp.minimum(jnp.sum(cdf <= u[..., None], -1), p.shape[-1] - 1)
  hard = jax.nn.one_hot(idx, p.shape[-1])
  return sg(hard) + p - sg(p)


def kl_latent_sum(post, prior):
  """KL(post || prior) of the unimixed categoricals, summed over S (1.8)."""
  lp = jnp.log(mixed_probs(post, UNIMIX))
  lq = jnp.log(mixed_probs(prior, UNIMIX))
  return jnp.sum(jnp.exp(lp) * (lp - lq), (-2, -1))


# --- Algorithm A: block-GRU core; Algorithm B: observe step ---------------------------

def core(P, deter, stoch_flat, action):
  B, D = deter.shape
  g = BLOCKS
  a = action / sg(jnp.maximum(1.0, jnp.abs(action)))
  x = jnp.concatenate([block(P, 'dyn/dynin0', deter), block(P, 'dyn/dynin1', stoch_flat),
                       block(P, 'dyn/dynin2', a)], -1)
  x = jnp.repeat(x[:, None, :], g, axis=1)
  x = jnp.concatenate([deter.reshape(B, g, D // g), x], -1)
  x = jnp.einsum('bki,kio->bko', x, P['dyn/dynhid0']['w']).reshape(B, D)
  x = x + P['dyn/dynhid0']['b']
  x = rms(P, 'dyn/dynhid0norm', x)                     # over the FULL D vector
  x = x * jax.nn.sigmoid(x)
  x = jnp.einsum('bki,kio->bko', x.reshape(B, g, -1), P['dyn/dyngru']['w'])
  x = x.reshape(B, 3 * D) + P['dyn/dyngru']['b']
  r, c, u = jnp.split(x.reshape(B, g, 3 * D // g), 3, -1)   # per block [r | c | u]
  r, c, u = (y.reshape(B, D) for y in (r, c, u))
  r = jax.nn.sigmoid(r)
  c = jnp.tanh(r * c)
  u = jax.nn.sigmoid(u - 1)
  return u * c + (1 - u) * deter


def posterior(P, deter, token, S, C):
  x = block(P, 'dyn/obs0', jnp.concatenate([deter, token], -1))
  return linear(P, 'dyn/obslogit', x).reshape(deter.shape[0], S, C)


def prior(P, deter, S, C):
  x = mlp(P, 'dyn', deter, prefix='prior')
  return linear(P, 'dyn/priorlogit', x).reshape(deter.shape[:-1] + (S, C))


# --- heads ------------------------------------------------------------------------------

def head(P, module, feat, out='out'):
  return linear(P, f'{module}/{out}', mlp(P, module, feat))


def policy(P, feat, discrete):
  x = mlp(P, 'pol', feat)
  if discrete:
    logp = jnp.log(mixed_probs(linear(P, 'pol/logits', x), ACTOR_UNIMIX))
    return ('discrete', logp)
  mean = jnp.tanh(linear(P, 'pol/mean', x))
  std = (MAXSTD - MINSTD) * jax.nn.sigmoid(linear(P, 'pol/std', x) + STD_OFFSET) + MINSTD
  return ('normal', mean, std)


def policy_sample(dist, noise):
  if dist[0] == 'discrete':
    logp = dist[1]
    return jax.nn.one_hot(jnp.argmax(logp + noise, -1), logp.shape[-1])
  _, mean, std = dist
  return mean + std * noise


def policy_logp_ent(dist, act):
  if dist[0] == 'discrete':
    logp = dist[1]
    return jnp.sum(act * logp, -1), -jnp.sum(jnp.exp(logp) * logp, -1)
  _, mean, std = dist
  logp = -0.5 * ((act - mean) / std) ** 2 - jnp.log(std) - 0.5 * np.log(2 * np.pi)
  ent = 0.5 * np.log(2 * np.pi * np.e) + jnp.log(std)
  return jnp.sum(logp, -1), jnp.sum(ent, -1)


def binary_nll(logit, target):
  """Soft-label Bernoulli (1.10)."""
  return -(target * jnp.log(jax.nn.sigmoid(logit)) +
           (1 - target) * jnp.log(jax.nn.sigmoid(-logit)))


# --- the losses -----------------------------------------------------------------------

def compute_losses(params, slow_params, retnorm, batch, key, *,
                   act_dim: int, discrete: bool, imag_horizon: int,
                   start_from_data: bool):
  """Every un-reduced loss term of one batch, as agent.learning.compute_losses
  names them: rec_<key>, rew, con, dyn, rep [B, T]; policy, value [B, T];
  repval [B, T-1]. Returns (losses, (new retnorm lo, hi)).

  params / slow_params: the flat Haiku dicts; retnorm: (lo, hi); batch: the
  replay layout [B, T+1] (index 0 is the context, latent deter stored as f32).
  """
  P = params
  B, L = batch['is_first'].shape
  T = L - 1
  N = B * T
  H = imag_horizon
  D = P['dyn/dynin0']['w'].shape[0]
  S = LATENTS
  C = P['dyn/dynin1']['w'].shape[0] // S
  gamma = 1 - 1 / HORIZON
  k_obs, k_img, k_pol = jax.random.split(key, 3)
  PW = sg(P)                                   # world model seen by imagination
  PS = sg({**P, **slow_params})                # slow critic (no gradient)

  # Replay context (5.8): the carry is the stored latent at index 0, a constant.
  deter = sg(jnp.asarray(batch['latent']['deter'][:, 0], jnp.float32))
  stoch = sg(jax.nn.one_hot(batch['latent']['stoch'][:, 0].astype(jnp.int32), C))
  stoch = stoch.reshape(B, S * C)
  obs = {k: jnp.asarray(v[:, 1:], jnp.float32) for k, v in batch['observation'].items()}
  prevact = jnp.asarray(batch['action'][:, :-1], jnp.float32)   # a_{t-1} for obs_t
  reward = jnp.asarray(batch['reward'][:, 1:], jnp.float32)
  is_first = jnp.asarray(batch['is_first'][:, 1:])
  is_last = jnp.asarray(batch['is_last'][:, 1:]).astype(jnp.float32)
  is_terminal = jnp.asarray(batch['is_terminal'][:, 1:]).astype(jnp.float32)

  # Encoder (2.9): sorted keys, flattened, symlog, 3 x [Linear, RMSNorm, SiLU].
  x = jnp.concatenate([symlog(obs[k].reshape(B, T, -1)) for k in sorted(obs)], -1)
  tokens = mlp(P, 'enc', x)                                     # [B, T, d]

  # Observe loop (2.7, Algorithm B), one step at a time.
  u_obs = jax.random.uniform(k_obs, (T, B, S), jnp.float32)
  deters, stochs, posts = [], [], []
  for t in range(T):
    keep = (~is_first[:, t])[:, None].astype(jnp.float32)
    deter = core(P, deter * keep, stoch * keep, prevact[:, t] * keep)
    logit = posterior(P, deter, tokens[:, t], S, C)
    stoch = onehot_sample(logit, u_obs[t]).reshape(B, S * C)
    deters.append(deter), stochs.append(stoch), posts.append(logit)
  deter = jnp.stack(deters, 1)                                   # [B, T, D]
  stoch = jnp.stack(stochs, 1)                                   # [B, T, S*C]
  post = jnp.stack(posts, 1)                                     # [B, T, S, C]
  pri = prior(P, deter, S, C)

  losses = {}
  # KL with free bits after the latent sum (2.14), both directions post || prior.
  losses['dyn'] = jnp.maximum(kl_latent_sum(sg(post), pri), FREE_NATS)
  losses['rep'] = jnp.maximum(kl_latent_sum(post, sg(pri)), FREE_NATS)
  # Decoder (2.11): concat(stoch, deter), symlog MSE summed per key, no 1/2.
  y = mlp(P, 'dec', jnp.concatenate([stoch, deter], -1))
  for k in sorted(obs):
    pred = linear(P, f'dec/head_{k}', y).reshape(obs[k].shape)
    err = (pred - sg(symlog(obs[k]))) ** 2
    losses[f'rec_{k}'] = jnp.sum(err.reshape(B, T, -1), -1)
  feat = jnp.concatenate([deter, stoch], -1)                     # NOT sg (2.16)
  losses['rew'] = twohot_loss(head(P, 'rew', feat), reward)
  losses['con'] = binary_nll(head(P, 'con', feat)[..., 0], (1 - is_terminal) * gamma)

  # Imagination (3.1-3.3, Algorithm C): all B*T posterior starts, batch-major.
  if discrete:
    pnoise = jax.random.gumbel(k_pol, (H, N, act_dim))
  else:
    pnoise = jax.random.normal(k_pol, (H, N, act_dim))
  u_img = jax.random.uniform(k_img, (H, N, S), jnp.float32)
  d = sg(deter).reshape(N, D)
  s = sg(stoch).reshape(N, S * C)
  ds, ss, acts, dists = [d], [s], [], []
  for t in range(H):
    f = sg(jnp.concatenate([d, s], -1))
    dist = policy(P, f, discrete)
    a = sg(policy_sample(dist, pnoise[t]))
    d = core(PW, d, s, a)
    z = onehot_sample(prior(PW, d, S, C), u_img[t])
    s = z.reshape(N, S * C)
    ds.append(d), ss.append(s), acts.append(a), dists.append(dist)
  ifeat = sg(jnp.concatenate([jnp.stack(ds, 1), jnp.stack(ss, 1)], -1))   # [N, H+1, F]

  rew_hat = twohot_pred(head(PW, 'rew', ifeat))                  # [N, H+1]
  con_hat = jax.nn.sigmoid(head(PW, 'con', ifeat)[..., 0])
  if start_from_data:                                            # OQ 6 (2411f7d)
    rew_hat = rew_hat.at[:, 0].set(reward.reshape(N))
    con_hat = con_hat.at[:, 0].set(1.0 - is_terminal.reshape(N))
  val_logits = head(P, 'val', ifeat)
  v = sg(twohot_pred(val_logits))                                # online critic
  slow = twohot_pred(head(PS, 'val', ifeat))
  weight = sg(jnp.cumprod(con_hat, 1))                           # disc = 1 (contdisc)
  ret = lambda_return_loop(jnp.zeros_like(con_hat), 1.0 - con_hat, rew_hat, v,
                           1.0, LAMBDA)                          # [N, H]
  r = RETNORM_RATE
  lo = (1 - r) * retnorm[0] + r * jnp.percentile(ret, PERC_LO)
  hi = (1 - r) * retnorm[1] + r * jnp.percentile(ret, PERC_HI)
  scale = jnp.maximum(RETNORM_LIMIT, hi - lo)
  adv = (ret - v[:, :-1]) / scale
  pol, val = [], []
  for t in range(H):
    logp, ent = policy_logp_ent(dists[t], acts[t])
    w = weight[:, t]
    pol.append(w * -(logp * sg(adv[:, t]) + ACTENT * ent))
    val.append(w * (twohot_loss(val_logits[:, t], sg(ret[:, t])) +
                    SLOWREG * twohot_loss(val_logits[:, t], sg(slow[:, t]))))
  losses['policy'] = jnp.mean(jnp.stack(pol, 1), 1).reshape(B, T)
  losses['value'] = jnp.mean(jnp.stack(val, 1), 1).reshape(B, T)

  # Replay critic (3.19, Algorithm G): non-sg posterior features.
  rep_logits = head(P, 'val', feat)
  rep_slow = twohot_pred(head(PS, 'val', sg(feat)))
  rret = lambda_return_loop(is_last, is_terminal, reward, ret[:, 0].reshape(B, T),
                            gamma, REPLAY_LAMBDA)                 # [B, T-1]
  mask = 1.0 - is_last[:, :-1]
  losses['repval'] = mask * (twohot_loss(rep_logits[:, :-1], sg(rret)) +
                             SLOWREG * twohot_loss(rep_logits[:, :-1],
                                                   sg(rep_slow[:, :-1])))
  return losses, (lo, hi)
