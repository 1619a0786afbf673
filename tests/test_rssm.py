"""RSSM (spec 2.1-2.8, Algorithms A-C)."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from agent import blocks, config as config_lib, networks, rssm, synthetic


def literal_core(W, deter, stoch, action, c):
  """Algorithm A written literally (repeat + one block einsum)."""
  D, H, g = c.deter, c.hidden, c.blocks
  B = deter.shape[0]
  emb = lambda l, x: jax.nn.silu(blocks.rms_norm(blocks.dense(x, l['w'], l['b']), l['scale']))
  a = action / jnp.maximum(1, jnp.abs(action))
  x = jnp.concatenate([emb(W['dynin0'], deter), emb(W['dynin1'], stoch),
                       emb(W['dynin2'], a)], -1)
  x = jnp.repeat(x[:, None, :], g, axis=1)
  x = jnp.concatenate([deter.reshape(B, g, D // g), x], -1).reshape(B, -1)
  w = W['dynhid0']['w']
  x = jnp.einsum('bki,kio->bko', x.reshape(B, g, -1), w).reshape(B, D) + W['dynhid0']['b']
  x = jax.nn.silu(blocks.rms_norm(x, W['dynhid0']['scale']))
  w = W['dyngru']['w']
  x = jnp.einsum('bki,kio->bko', x.reshape(B, g, -1), w).reshape(B, 3 * D) + W['dyngru']['b']
  r, cand, u = jnp.split(x.reshape(B, g, 3 * D // g), 3, -1)
  r, cand, u = (y.reshape(B, D) for y in (r, cand, u))
  r = jax.nn.sigmoid(r)
  cand = jnp.tanh(r * cand)
  u = jax.nn.sigmoid(u - 1)
  return u * cand + (1 - u) * deter


@pytest.fixture(scope='module')
def setup():
  c = config_lib.make_config(size='tiny')
  nets = networks.make_networks(synthetic.WALKER_SPACES, c)
  W = nets.weights(nets.init(jax.random.PRNGKey(0)))
  return c, nets, W


@pytest.mark.parametrize('B', [5, rssm._PER_BLOCK_MIN_ROWS + 3])
def test_core_matches_algorithm_a(setup, B):
  """spec 2.4: the hoisted, block-major core equals Algorithm A literally, with
  the gate update block-major (few rows) and per block (many rows)."""
  c, _, W = setup
  k = jax.random.split(jax.random.PRNGKey(1), 3)
  deter = jax.random.normal(k[0], (B, c.deter))
  stoch = jax.nn.one_hot(jax.random.randint(k[1], (B, c.stoch), 0, c.classes), c.classes)
  action = 2 * jax.random.normal(k[2], (B, 6))
  x2 = rssm.embed_action(W['dyn'], action, jnp.zeros(B, bool), c)
  got = rssm.core(rssm.prepare_core(W['dyn'], c), deter, stoch.reshape(B, -1), x2, c)
  ref = literal_core(W['dyn'], deter, stoch.reshape(B, -1), action, c)
  np.testing.assert_allclose(got, ref, rtol=1e-5, atol=1e-5)


def test_is_first_zeroes_state_and_action(setup):
  """spec 2.2: at is_first, h_t = core(0, 0, 0) whatever the carry and action."""
  c, _, W = setup
  tok = jnp.ones((2, c.hidden))
  noise = jnp.full((2, c.stoch), 0.5)
  first = jnp.array([True, True])
  a = rssm.Latent(jnp.ones((2, c.deter)), jnp.ones((2, c.stoch * c.classes)))
  b = rssm.Latent(-3 * jnp.ones((2, c.deter)), jnp.zeros((2, c.stoch * c.classes)))
  xa = rssm.embed_action(W['dyn'], jnp.full((2, 6), 0.7), first, c)
  xb = rssm.embed_action(W['dyn'], jnp.full((2, 6), -5.0), first, c)
  out_a, _ = rssm.observe_step(rssm.prepare_core(W['dyn'], c), a, tok, xa, first, noise, c)
  out_b, _ = rssm.observe_step(rssm.prepare_core(W['dyn'], c), b, tok, xb, first, noise, c)
  np.testing.assert_array_equal(out_a.deter, out_b.deter)
  zero = rssm.core(rssm.prepare_core(W['dyn'], c), jnp.zeros((2, c.deter)), jnp.zeros((2, c.stoch * c.classes)),
                   rssm.embed_action(W['dyn'], jnp.zeros((2, 6)), first, c), c)
  np.testing.assert_array_equal(out_a.deter, zero)


def test_observe_scan_equals_step_loop(setup):
  """spec 2.7: the scan with hoisted token/action work equals Algorithm B per step."""
  c, nets, W = setup
  B, T = 2, 5
  rng = np.random.default_rng(0)
  obs = {k: jnp.asarray(rng.normal(size=(B, T) + s), jnp.float32)
         for k, s in synthetic.WALKER_SPACES.obs.items()}
  prevact = jnp.asarray(rng.normal(size=(B, T, 6)), jnp.float32)
  is_first = jnp.array([[False, False, True, False, False]] * B)
  start = rssm.Latent(jnp.ones((B, c.deter)) * 0.1,
                      jax.nn.one_hot(jnp.zeros((B, c.stoch), int), c.classes))
  key = jax.random.PRNGKey(3)
  tokens = nets.encode(W, obs)
  deter, stoch, logit = rssm.observe(W['dyn'], start, tokens, prevact, is_first, key, c)
  carry = rssm.Latent(start.deter, start.stoch.reshape(B, -1))
  for t in range(T):
    x = jnp.concatenate([carry.deter, tokens[:, t]], -1)
    # Literal posterior: Linear on the concatenation (no hoisting).
    keep = (~is_first[:, t])[:, None]
    h = literal_core(W['dyn'], carry.deter * keep, carry.stoch * keep,
                     prevact[:, t] * keep, c)
    x = jnp.concatenate([h, tokens[:, t]], -1)
    l = W['dyn']['obs0']
    x = jax.nn.silu(blocks.rms_norm(x @ l['w'] + l['b'], l['scale']))
    lg = (x @ W['dyn']['obslogit']['w'] + W['dyn']['obslogit']['b']).reshape(B, c.stoch, c.classes)
    np.testing.assert_allclose(deter[:, t], h, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(logit[:, t], lg, rtol=1e-4, atol=1e-4)
    carry = rssm.Latent(deter[:, t], stoch[:, t].reshape(B, -1))


def test_size12m_shapes_and_param_counts():
  """spec 2.1 / 2.4: dynhid (8, 1024, 256), dyngru (8, 256, 768), feat 2560."""
  c = config_lib.make_config(size='size12m')
  assert c.feat_dim == 2560 and c.deter == 2048 and c.classes == 16
  spaces = synthetic.WALKER_SPACES
  nets = networks.make_networks(spaces, c)
  shapes = jax.eval_shape(nets.init, jax.random.PRNGKey(0))
  assert shapes['dyn/dynhid0']['w'].shape == (8, 1024, 256)
  assert shapes['dyn/dyngru']['w'].shape == (8, 256, 768)
  count = lambda m: sum(int(np.prod(v.shape)) for k, d in shapes.items()
                        if k.split('/')[0] == m for v in d.values())
  D, H, SC, A, d, F, n = 2048, 256, 512, 6, 256, 2560, 255
  lin = lambda i, o: i * o + o
  ln = lambda i, o: lin(i, o) + o          # Linear + RMSNorm scale
  dyn = (ln(D, H) + ln(SC, H) + ln(A, H) + 8 * 1024 * 256 + 2 * D + 8 * 256 * 768 + 3 * D
         + ln(D + d, H) + lin(H, SC) + ln(D, H) + ln(H, H) + lin(H, SC))
  mlp3 = lambda i: ln(i, d) + 2 * ln(d, d)
  assert count('dyn') == dyn
  assert count('enc') == mlp3(24)
  assert count('dec') == mlp3(F) + lin(d, 14) + lin(d, 1) + lin(d, 9)
  assert count('rew') == ln(F, d) + lin(d, n)
  assert count('con') == ln(F, d) + lin(d, 1)
  assert count('pol') == mlp3(F) + 2 * lin(d, A)
  assert count('val') == mlp3(F) + lin(d, n)


def test_unknown_size_preset():
  with pytest.raises(ValueError, match='size99m'):
    config_lib.make_config(size='size99m')
  with pytest.raises(ValueError, match='bogus'):
    config_lib.make_config(bogus=1)


def test_core_gradients_match_algorithm_a(setup):
  """The core's custom block-matmul VJP gives Algorithm A's gradients."""
  c, _, W = setup
  k = jax.random.split(jax.random.PRNGKey(2), 4)
  deter = jax.random.normal(k[0], (3, c.deter))
  stoch = jax.nn.one_hot(jax.random.randint(k[1], (3, c.stoch), 0, c.classes),
                         c.classes).reshape(3, -1)
  action = jax.random.normal(k[2], (3, 6))
  proj = jax.random.normal(k[3], (3, c.deter))

  def ours(Wd, deter):
    x2 = rssm.embed_action(Wd, action, jnp.zeros(3, bool), c)
    return jnp.sum(rssm.core(rssm.prepare_core(Wd, c), deter, stoch, x2, c) * proj)

  def ref(Wd, deter):
    return jnp.sum(literal_core(Wd, deter, stoch, action, c) * proj)

  # Jitted, as the update runs them (op by op costs more CPU than compiling).
  g_ours = jax.jit(jax.grad(ours, (0, 1)))(W['dyn'], deter)
  g_ref = jax.jit(jax.grad(ref, (0, 1)))(W['dyn'], deter)
  jax.tree_util.tree_map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5),
                         g_ours, g_ref)


@pytest.mark.parametrize('dtype', ['float32', 'bfloat16'])
def test_observe_scan_gradients_match_plain_autodiff(dtype):
  """observe's custom VJP (kernel gradients after the loop) equals autodiff of
  the plain scan: kernels, biases, norm scales, inputs (tokens, actions)."""
  c = config_lib.make_config(size='tiny', compute_dtype=dtype)
  nets = networks.make_networks(synthetic.WALKER_SPACES, c)
  W = nets.weights(nets.init(jax.random.PRNGKey(0)))
  B, T = 3, 6
  k = jax.random.split(jax.random.PRNGKey(5), 4)
  tokens = jax.random.normal(k[0], (B, T, c.units))
  prevact = jax.random.normal(k[1], (B, T, 6))
  is_first = jnp.zeros((B, T), bool).at[1, 3].set(True)
  start = rssm.Latent(jax.random.normal(k[2], (B, c.deter)),
                      jax.nn.one_hot(jnp.zeros((B, c.stoch), int), c.classes))
  proj = jax.random.normal(k[3], (B, T, c.deter))

  def loss(Wd, tokens, prevact, plain):
    if plain:
      with pytest.MonkeyPatch.context() as mp:
        mp.setattr(rssm, '_observe_scan', lambda cfg, K, small, carry, xs:
                   rssm._observe_loop(cfg, K, small, carry, xs))
        deter, stoch, logit = rssm.observe(Wd, start, tokens, prevact, is_first,
                                           jax.random.PRNGKey(1), c)
    else:
      deter, stoch, logit = rssm.observe(Wd, start, tokens, prevact, is_first,
                                         jax.random.PRNGKey(1), c)
    f32 = lambda x: x.astype(jnp.float32)
    return (jnp.sum(f32(deter) * proj) + jnp.sum(f32(logit) ** 2) +
            jnp.sum(f32(stoch) * jnp.arange(c.classes)))

  # Jitted, as the update runs it (op by op costs more CPU than compiling);
  # `plain` is static, so each variant is traced, inside its own patch, once.
  grad = jax.jit(jax.grad(loss, (0, 1, 2)), static_argnums=3)
  ours = grad(W['dyn'], tokens, prevact, False)
  ref = grad(W['dyn'], tokens, prevact, True)
  leaves = jax.tree_util.tree_leaves_with_path(ours)
  refs = jax.tree_util.tree_leaves(ref)
  assert len(leaves) == len(refs)
  for (path, a), b in zip(leaves, refs):
    a, b = np.asarray(a, np.float32), np.asarray(b, np.float32)
    if dtype == 'float32':
      np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5, err_msg=jax.tree_util.keystr(path))
    else:   # bf16: the plain scan accumulates in bf16 per step, ours once in f32
      err = np.linalg.norm(a - b) / max(np.linalg.norm(b), 1e-6)
      assert err < 2e-2, (jax.tree_util.keystr(path), err)
  # Every looped kernel gets a non-zero gradient (nothing silently dropped).
  for name in ('dynin0', 'dynin1', 'dynhid0', 'dyngru', 'obs0', 'obslogit'):
    assert float(jnp.abs(ours[0][name]['w']).sum()) > 0, name
