"""Where a learner update's time goes: each part jitted and timed on its own.

  python bench/breakdown.py --size=size1m --rounds=10

Parts (medians of interleaved rounds, seconds): the observe scan forward and
forward+backward (a VJP with unit cotangents, spec 2.7), the imagination scan
forward and forward+backward into the policy (spec 2.8, 3.3), the whole loss
forward (loss_fn) and forward+backward (value_and_grad), the optimizer
(Alg. I) and the full jitted update. "heads, losses and the rest" is the
loss's forward+backward minus the two scans' forward+backward, and
"optimizer, EMA and copies" the update minus the loss's forward+backward.
Each part is its own XLA program, so fusion across the parts is lost and the
shares are estimates; the full update is the ground truth.
"""

from __future__ import annotations

import statistics
import time

from absl import app, flags

import agent  # noqa: F401  (jax compat first)
import jax
import jax.numpy as jnp

from agent import config as config_lib
from agent import latents as latents_lib
from agent import learning, networks, rssm, synthetic

FLAGS = flags.FLAGS
flags.DEFINE_string('size', 'size1m', 'Size preset.')
flags.DEFINE_integer('rounds', 10, 'Interleaved timed rounds.')

sg = jax.lax.stop_gradient


def _ones_like(tree):
  return jax.tree_util.tree_map(jnp.ones_like, tree)


def main(_):
  c = config_lib.make_config(size=FLAGS.size)
  spaces = synthetic.WALKER_SPACES
  nets = networks.make_networks(spaces, c)
  ts = learning.make_train_step(nets)
  state = ts.init(jax.random.PRNGKey(0))
  batch = jax.device_put(synthetic.make_batch(spaces, c))
  key = jax.random.PRNGKey(1)
  B, L = batch['is_first'].shape
  N = B * (L - 1)

  W = nets.weights(state.params)
  ctx = jax.tree_util.tree_map(lambda x: x[:, 0], batch['latent'])
  start = rssm.Latent(*latents_lib.unpack(ctx, c))
  obs = {k: v[:, 1:] for k, v in batch['observation'].items()}
  tokens = jax.jit(nets.encode)(W, obs)
  prevact, is_first = batch['action'][:, :-1], batch['is_first'][:, 1:]

  def observe(Wdyn, tok):
    return rssm.observe(Wdyn, start, tok, prevact, is_first, key, c)

  def observe_vjp(Wdyn, tok):
    out, pull = jax.vjp(observe, Wdyn, tok)
    return pull(_ones_like(out))

  deter, stoch, _ = jax.jit(observe)(W['dyn'], tokens)
  start_feat = networks.feat(deter, stoch).reshape(N, -1)
  noise = jax.random.normal(key, (c.imag_horizon, N, spaces.act_dim))

  def imagine(Wpol):
    def policy_fn(rest, pre, n):
      out = nets.policy_outputs_from(rest, pre)
      return nets.policy_dist(out).sample(noise=n), out
    return rssm.imagine(sg(W['dyn']), sg(start_feat), policy_fn,
                        learning.policy_params(Wpol), noise, key, c)

  def imagine_vjp(Wpol):
    out, pull = jax.vjp(imagine, Wpol)
    return pull(_ones_like(out))

  def loss(params):
    return learning.loss_fn(params, state.slow_params, state.retnorm, batch, key,
                            nets)[0]

  grads = jax.jit(jax.grad(loss))(state.params)

  def optimizer(grads, opt_state, params):
    updates, opt_state = ts.optimizer.update(grads, opt_state, params)
    return jax.tree_util.tree_map(lambda p, u: p + u, params, updates), opt_state

  parts = {
      'observe scan fwd': (jax.jit(observe), (W['dyn'], tokens)),
      'observe scan fwd+bwd': (jax.jit(observe_vjp), (W['dyn'], tokens)),
      'imagine scan fwd': (jax.jit(imagine), (W['pol'],)),
      'imagine scan fwd+bwd': (jax.jit(imagine_vjp), (W['pol'],)),
      'loss fwd': (jax.jit(loss), (state.params,)),
      'loss fwd+bwd': (jax.jit(jax.value_and_grad(loss)), (state.params,)),
      'optimizer': (jax.jit(optimizer), (grads, state.opt_state, state.params)),
  }
  for fn, args in parts.values():          # compile + warm up
    jax.block_until_ready(fn(*args))
    jax.block_until_ready(fn(*args))
  upd_state = jax.tree_util.tree_map(jnp.copy, state)   # update donates it
  for _ in range(2):
    upd_state, m, o = ts.update(upd_state, batch)
  jax.block_until_ready(upd_state)
  times = {name: [] for name in list(parts) + ['full update']}
  for _ in range(FLAGS.rounds):
    for name, (fn, args) in parts.items():
      t = time.perf_counter()
      jax.block_until_ready(fn(*args))
      times[name].append(time.perf_counter() - t)
    t = time.perf_counter()
    upd_state, m, o = ts.update(upd_state, batch)
    jax.block_until_ready((upd_state, m, o))
    times['full update'].append(time.perf_counter() - t)
  med = {k: statistics.median(v) for k, v in times.items()}
  full = med['full update']
  print(f'size={c.size} B={c.batch_size} T={c.batch_length} H={c.imag_horizon} '
        f'rounds={FLAGS.rounds}')
  for name, t in med.items():
    print(f'{name:34s} {t:8.4f} s  {t / full:6.1%} of the update')
  rest = med['loss fwd+bwd'] - med['observe scan fwd+bwd'] - med['imagine scan fwd+bwd']
  print(f'{"heads, losses and the rest (est.)":34s} {rest:8.4f} s  {rest / full:6.1%}')
  other = full - med['loss fwd+bwd']
  print(f'{"optimizer, EMA and copies (est.)":34s} {other:8.4f} s  {other / full:6.1%}')


if __name__ == '__main__':
  app.run(main)
