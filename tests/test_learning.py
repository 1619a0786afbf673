"""The train step (spec 2.14, 3.15, 4.1-4.2, Algorithm J) and its bad-input rules."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from agent import distributions as dists, latents, learning, networks, rssm
from agent import synthetic, world_model
from tests.smoke_model import CARTPOLE_SPACES, SMOKE_MODEL


def _batch(config, spaces, seed=0):
  return synthetic.make_batch(spaces, config, seed=seed, episode_len=5)


def test_reward_and_value_exactly_zero_at_init(tiny_nets, tiny_state):
  """spec 1.5 / 3.15: zero-initialised output layers predict exactly 0."""
  W = tiny_nets.weights(tiny_state.params)
  feat = jax.random.normal(jax.random.PRNGKey(0), (7, tiny_nets.config.feat_dim))
  assert np.all(np.asarray(dists.twohot_pred(tiny_nets.reward_logits(W, feat))) == 0)
  assert np.all(np.asarray(dists.twohot_pred(tiny_nets.value_logits(W['val'], feat))) == 0)
  slow = tiny_nets.weights({**tiny_state.params, **tiny_state.slow_params})['val']
  assert np.all(np.asarray(dists.twohot_pred(tiny_nets.value_logits(slow, feat))) == 0)


@pytest.mark.parametrize('logit_scale', [1.0, 0.03])
def test_free_bits_per_step_after_latent_sum(tiny_nets, tiny_state, tiny_config, spaces,
                                             logit_scale):
  """spec 2.14: dyn = rep = max(sum_latents KL, 1) per (b, t), in value and in
  gradient: below 1 nat (posterior and prior logits scaled down) both terms
  are exactly 1 and give no gradient. The KL is the reference's
  (tests/reference_losses.py) on the posterior logits and deter of the scan."""
  from tests import reference_losses as ref
  c = tiny_config
  b = _batch(c, spaces)
  params = {k: ({n: v * logit_scale for n, v in d.items()}
                if k.endswith(('obslogit', 'priorlogit')) else d)
            for k, d in tiny_state.params.items()}
  d0, s0 = latents.unpack(jax.tree_util.tree_map(lambda x: x[:, 0], b['latent']), c)
  obs = {k: v[:, 1:] for k, v in b['observation'].items()}
  key = jax.random.PRNGKey(5)

  def wm(p):
    return world_model.world_model_loss(
        tiny_nets, tiny_nets.weights(p), rssm.Latent(d0, s0), obs, b['action'][:, :-1],
        b['reward'][:, 1:], b['is_first'][:, 1:], b['is_terminal'][:, 1:], key)

  losses, (deter, _), _ = jax.jit(wm)(params)
  W = tiny_nets.weights(params)
  _, _, post = rssm.observe(W['dyn'], rssm.Latent(d0, s0), tiny_nets.encode(W, obs),
                            b['action'][:, :-1], b['is_first'][:, 1:], key, c)
  kl = np.asarray(ref.kl_latent_sum(post, ref.prior(params, deter, 32, c.classes)))
  assert losses['dyn'].shape == (c.batch_size, c.batch_length)
  np.testing.assert_allclose(losses['dyn'], np.maximum(kl, 1.0), rtol=1e-5)
  np.testing.assert_allclose(losses['rep'], np.maximum(kl, 1.0), rtol=1e-5)
  if logit_scale < 1:
    assert (kl < 1.0).all() and (kl > 0).any(), kl
    grads = jax.jit(lambda p: [jax.grad(lambda q, t=t: jnp.sum(wm(q)[0][t]))(p)
                               for t in ('dyn', 'rep')])(params)
    for term, g in zip(('dyn', 'rep'), grads):
      assert all(float(jnp.abs(x).max()) == 0 for x in jax.tree_util.tree_leaves(g)), term
  else:
    assert (kl > 1.0).all(), kl


# spec 4.2 routing matrix. Groups: RSSM core / prior MLP / posterior layers.
GROUPS = {
    'enc': lambda k: k.startswith('enc/'),
    'core': lambda k: k.startswith('dyn/') and k.split('/')[-1].startswith(('dynin', 'dynhid', 'dyngru')),
    'prior': lambda k: k.startswith('dyn/') and k.split('/')[-1].startswith('prior'),
    'post': lambda k: k.startswith('dyn/') and k.split('/')[-1].startswith('obs'),
    'dec': lambda k: k.startswith('dec/'), 'rew': lambda k: k.startswith('rew/'),
    'con': lambda k: k.startswith('con/'), 'pol': lambda k: k.startswith('pol/'),
    'val': lambda k: k.startswith('val/'),
}
ROUTING = {
    'rec': {'enc', 'core', 'post', 'dec'},
    'rew': {'enc', 'core', 'post', 'rew'},
    'con': {'enc', 'core', 'post', 'con'},
    'dyn': {'enc', 'core', 'prior', 'post'},
    'rep': {'enc', 'core', 'post'},
    'policy': {'pol'},
    'value': {'val'},
    'repval': {'enc', 'core', 'post', 'val'},
}


def test_gradient_routing_matrix(tiny_nets, tiny_state, tiny_config, spaces):
  """spec 4.2: loss term by loss term, exactly these module groups get gradients."""
  b = jax.device_put(_batch(tiny_config, spaces, seed=1))
  s = tiny_state
  params = jax.tree_util.tree_map(lambda x: x + 0.01, s.params)  # non-zero heads

  def losses_of(p):
    return learning.compute_losses(p, s.slow_params, s.retnorm, b, s.key, tiny_nets)[0]

  names = sorted(jax.eval_shape(losses_of, params))   # the terms, nothing computed

  def vec(p):
    losses = losses_of(p)
    return jnp.stack([jnp.mean(losses[n]) for n in names])

  # Jitted forward and backward (one compile each; an op-by-op forward pass
  # costs more). A term that does not reach a group gives it exactly zero
  # gradient by construction (stop_gradient, parameter use), jitted or not.
  _, vjp = jax.vjp(jax.jit(vec), params)
  vjp = jax.jit(vjp)
  for i, name in enumerate(names):
    (g,) = vjp(jnp.zeros(len(names)).at[i].set(1.0))
    term = 'rec' if name.startswith('rec_') else name
    got = set()
    for group, match in GROUPS.items():
      norms = [float(jnp.abs(v).max()) for k, d in g.items() if match(k) for v in d.values()]
      assert norms, group
      if max(norms) > 0:
        got.add(group)
    assert got == ROUTING[term], (name, got)


# spec 4.1 loss scales, typed in (not read from the config under test); each
# decoder key is its own 'rec' term with scale 1.0.
SPEC_LOSS_SCALES = {'dyn': 1.0, 'rep': 0.1, 'rew': 1.0, 'con': 1.0,
                    'policy': 1.0, 'value': 1.0, 'repval': 0.3, 'rec': 1.0}


def _spec_scale(name):
  return SPEC_LOSS_SCALES['rec' if name.startswith('rec_') else name]


# Two programs cover both action kinds and both OQ 6 start-state rules (each
# variant is one XLA compile of the fast and the literal loss, ~30-60 s).
@pytest.mark.parametrize('discrete,start_from_data', [(False, True), (True, False)])
def test_losses_and_gradients_match_literal_reference(spaces, discrete, start_from_data):
  """spec 1.3-4.1 / Algorithms A-H: the fast loss (hoisted scans, time-major
  imagination, split heads, fused two-hot, custom VJPs) equals
  tests/reference_losses.py, a literal reading of the spec that imports no
  project code, term by term, in the return normaliser, and in the gradient
  of the spec-weighted total w.r.t. every parameter. The batch has episode
  starts, ends and terminals inside its windows."""
  from agent import config as config_lib
  from tests import reference_losses
  if discrete:
    spaces = synthetic.EnvSpaces(obs=dict(spaces.obs), act_dim=5, discrete=True)
  c = config_lib.make_config(size='tiny', batch_size=3, batch_length=6, imag_horizon=4,
                             latent_store_dtype='float32', start_from_data=start_from_data)
  nets = networks.make_networks(spaces, c)
  state = learning.make_train_step(nets, jit=False).init(jax.random.PRNGKey(3))
  # Perturb so reward/value heads are non-zero and the slow critic differs.
  leaves, tree = jax.tree_util.tree_flatten(state.params)
  keys = jax.random.split(jax.random.PRNGKey(4), len(leaves))
  params = jax.tree_util.tree_unflatten(tree, [
      x + 0.05 * jax.random.normal(k, x.shape) for x, k in zip(leaves, keys)])
  # Two-hot output biases favour the central bins, so predictions stay O(1)
  # instead of weighting the +-4.8e8 edge bins (f32 noise there would dominate).
  center = -0.5 * jnp.abs(jnp.arange(255) - 127.0)
  params = {m: {n: (v + center if v.shape == (255,) else v) for n, v in d.items()}
            for m, d in params.items()}
  slow = jax.tree_util.tree_map(lambda x: 0.9 * x, learning.val_params(params))
  retnorm = state.retnorm._replace(lo=jnp.float32(-0.5), hi=jnp.float32(1.5))
  b = synthetic.make_batch(spaces, c, seed=2, episode_len=4)
  # Terminal episode ends (is_last and is_terminal), so the continue target,
  # the start-state continuation and the replay return see both kinds of end.
  b['is_terminal'] = b['is_last'] & (np.arange(c.seq_len)[None] % 2 == 1)
  assert b['is_terminal'][:, 1:].any() and (b['is_last'] & ~b['is_terminal'])[:, 1:].any()
  b = jax.device_put(b)
  key = jax.random.PRNGKey(7)

  def fast(p):
    losses, (rn, _, _) = learning.compute_losses(p, slow, retnorm, b, key, nets)
    return losses, (rn.lo, rn.hi)

  def ref(p):
    return reference_losses.compute_losses(
        p, slow, (retnorm.lo, retnorm.hi), b, key,
        act_dim=spaces.act_dim, discrete=spaces.discrete,
        imag_horizon=4, start_from_data=start_from_data)

  def total(losses_fn):     # losses and their gradient
    def fn(p):
      losses, rn = losses_fn(p)
      return sum(_spec_scale(k) * jnp.mean(v) for k, v in losses.items()), (losses, rn)
    return jax.grad(fn, has_aux=True)

  # The fast total with the config's scales is the same function (spec 4.1).
  scales = learning.loss_scales(c, spaces)
  assert {k: _spec_scale(k) for k in scales} == scales

  # Both sides in one jitted program: one XLA compile instead of two.
  (g_fast, (l_fast, rn_fast)), (g_ref, (l_ref, rn_ref)) = jax.jit(
      lambda p: (total(fast)(p), total(ref)(p)))(params)
  assert sorted(l_fast) == sorted(l_ref)
  for name in l_ref:
    assert l_fast[name].shape == l_ref[name].shape, name
    np.testing.assert_allclose(l_fast[name], l_ref[name], rtol=2e-5, atol=2e-6,
                               err_msg=name)
  np.testing.assert_allclose(rn_fast[0], rn_ref[0], rtol=1e-5)
  np.testing.assert_allclose(rn_fast[1], rn_ref[1], rtol=1e-5)
  for path in g_ref:
    for name in g_ref[path]:
      ref_g = np.asarray(g_ref[path][name])
      np.testing.assert_allclose(g_fast[path][name], ref_g, rtol=1e-3,
                                 atol=1e-3 * np.abs(ref_g).max() + 1e-9,
                                 err_msg=f'{path}/{name}')


def test_train_step_compiles_once_and_first_update_noop():
  """Algorithm J in one jitted update; lr_0 = 0 leaves params unchanged (4.7)."""
  # The shared model on cartpole_swingup's spaces (tests/smoke_model.py): the
  # update test_env_loop compiles, so the session's cache serves it here.
  from agent import config as config_lib
  tiny_config = config_lib.make_config(**SMOKE_MODEL)
  spaces = CARTPOLE_SPACES
  ts = learning.make_train_step(networks.make_networks(spaces, tiny_config))
  state = ts.init(jax.random.PRNGKey(0))
  before = jax.tree_util.tree_map(np.asarray, state.params)
  state, metrics, outs = ts.update(state, _batch(tiny_config, spaces, 0))
  after = jax.tree_util.tree_map(np.asarray, state.params)
  jax.tree_util.tree_map(np.testing.assert_array_equal, before, after)
  assert float(metrics['skipped_update']) == 0 and int(state.step) == 1
  c = tiny_config
  assert outs['deter'].shape == (c.batch_size, c.batch_length, c.deter)
  assert outs['stoch'].shape == (c.batch_size, c.batch_length, c.stoch)
  assert outs['stoch'].dtype == jnp.uint8
  for seed in (1, 2):
    state, metrics, outs = ts.update(state, _batch(tiny_config, spaces, seed))
  assert ts.update._cache_size() == 1
  assert np.isfinite(float(metrics['loss/total']))
  # Slow critic: EMA of the value params after each step (spec 3.18).
  val = learning.val_params(state.params)
  assert set(val) == set(state.slow_params)

  # NaN in a batch: the update is skipped and flagged, nothing changes.
  bad = _batch(tiny_config, spaces, 3)
  bad['reward'][0, 3] = np.nan
  prev = jax.tree_util.tree_map(np.asarray, (state.params, state.opt_state))
  state, metrics, _ = ts.update(state, bad)
  assert float(metrics['skipped_update']) == 1 and float(metrics['nonfinite_batch']) == 1
  jax.tree_util.tree_map(np.testing.assert_array_equal, prev,
                         jax.tree_util.tree_map(np.asarray, (state.params, state.opt_state)))
  assert int(state.step) == 3
  assert ts.update._cache_size() == 1


def test_check_batch_names_bad_key(tiny_config, spaces):
  """Bad input: wrong shape, dtype or missing key -> ValueError naming the key."""
  good = _batch(tiny_config, spaces)
  learning.check_batch(good, spaces, tiny_config)
  bad = _batch(tiny_config, spaces); bad['observation']['height'] = np.zeros((2, 9, 2), np.float32)
  with pytest.raises(ValueError, match='observation/height'):
    learning.check_batch(bad, spaces, tiny_config)
  bad = _batch(tiny_config, spaces); bad['reward'] = bad['reward'].astype(np.float64)
  with pytest.raises(ValueError, match='reward.*float64'):
    learning.check_batch(bad, spaces, tiny_config)
  bad = _batch(tiny_config, spaces); del bad['latent']['stoch']
  with pytest.raises(ValueError, match='latent/stoch'):
    learning.check_batch(bad, spaces, tiny_config)


def test_bfloat16_compute_runs(spaces):
  """spec 1.12 / OQ 10: bf16 compute (f32 params, losses and optimizer state)."""
  from agent import config as config_lib
  c = config_lib.make_config(size='tiny', batch_size=2, batch_length=8, imag_horizon=3,
                             compute_dtype='bfloat16')
  nets = networks.make_networks(spaces, c)
  ts = learning.make_train_step(nets)
  state = ts.init(jax.random.PRNGKey(0))
  state, metrics, outs = ts.update(state, _batch(c, spaces))
  assert np.isfinite(float(metrics['loss/total']))
  assert all(v.dtype == jnp.float32 for d in state.params.values() for v in d.values())
  assert outs['deter'].dtype == jnp.uint16   # bf16 bits: lossless for bf16 compute
  W = nets.weights(state.params)
  tokens = nets.encode(W, {k: jnp.zeros((1,) + s) for k, s in spaces.obs.items()})
  assert tokens.dtype == jnp.bfloat16
