"""The image encoder and decoder (spec 2.10) against the official code's own
numbers (tests/data/official_cnn.npz, made by bench/official_cnn.py from
danijar/dreamerv3 at e3f0224 in its own venv), the literal image loss, and
the resolution rule."""

import pathlib

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from agent import cnn, networks
from agent.config import make_config
from agent.types import EnvSpaces, step_spec

GOLDEN = pathlib.Path(__file__).parent / 'data' / 'official_cnn.npz'
IMAGE_KEYS = {'cam': (64, 64, 3), 'depth': (64, 64, 1)}
SPACES = EnvSpaces(obs={**IMAGE_KEYS, 'pos': (5,)}, act_dim=2)


@pytest.fixture(scope='module')
def golden():
  with np.load(GOLDEN) as f:
    return dict(f)


@pytest.fixture(scope='module')
def nets():
  return networks.make_networks(SPACES, make_config(size='size1m'))


def _official_to_ours(g):
  """Our Haiku params' names for the official arrays (same layers)."""
  out = {}
  for i in range(3):
    out[f'enc/linear{i}'] = {'w': g[f'param/enc/mlp{i}/kernel'],
                             'b': g[f'param/enc/mlp{i}/bias']}
    out[f'enc/linear{i}norm'] = {'scale': g[f'param/enc/mlp{i}norm/scale']}
  for i in range(4):
    out[f'enc/cnn{i}'] = {'w': g[f'param/enc/cnn{i}/kernel'],
                          'b': g[f'param/enc/cnn{i}/bias']}
    out[f'enc/cnn{i}norm'] = {'scale': g[f'param/enc/cnn{i}norm/scale']}
  for n in ('sp0', 'sp1', 'sp2', 'conv0', 'conv1', 'conv2', 'imgout'):
    out[f'dec/{n}'] = {'w': g[f'param/dec/{n}/kernel'],
                       'b': g[f'param/dec/{n}/bias']}
  for n in ('sp1norm', 'spnorm', 'conv0norm', 'conv1norm', 'conv2norm'):
    out[f'dec/{n}'] = {'scale': g[f'param/dec/{n}/scale']}
  return out


def _params(nets, golden):
  ours = nets.init(jax.random.PRNGKey(0))
  theirs = _official_to_ours(golden)
  for name, leaves in theirs.items():
    assert name in ours, f'{name} missing from our params {sorted(ours)}'
    for leaf, v in leaves.items():
      assert ours[name][leaf].shape == v.shape, (name, leaf)
  merged = dict(ours)
  merged.update({k: {**ours[k], **v} for k, v in theirs.items()})
  return merged


def _obs(golden):
  return {k: golden[f'in/obs/{k}'] for k in ('cam', 'depth', 'pos')}


def test_encoder_tokens_match_the_official(nets, golden):
  """Vector MLP tokens then the flattened CNN output, to f32 rounding."""
  W = nets.weights(_params(nets, golden))
  tokens = nets.encode(W, _obs(golden))
  want = golden['out/tokens']
  assert tokens.shape == want.shape == (2, 3, 64 + 4 * 4 * 16)
  np.testing.assert_allclose(tokens, want, rtol=1e-4, atol=1e-5)


def test_decoder_means_and_image_loss_match_the_official(nets, golden):
  W = nets.weights(_params(nets, golden))
  recon = nets.decode(W, jnp.asarray(golden['in/deter']),
                      jnp.asarray(golden['in/stoch']))
  for k, shape in IMAGE_KEYS.items():
    assert recon[k].shape == (2, 3) + shape
    np.testing.assert_allclose(recon[k], golden[f'out/mean/{k}'],
                               rtol=1e-4, atol=1e-6)
    loss = cnn.image_loss(recon[k], golden[f'in/obs/{k}'])
    np.testing.assert_allclose(loss, golden[f'out/loss/{k}'], rtol=1e-4)


def test_gradients_match_the_official(nets, golden):
  """d sum(tokens * cot) / d enc, d mean(image losses) / d dec."""
  params = _params(nets, golden)
  obs = _obs(golden)
  cot = jnp.asarray(golden['in/cot'])
  deter, stoch = jnp.asarray(golden['in/deter']), jnp.asarray(golden['in/stoch'])

  def enc_loss(p):
    return jnp.sum(nets.encode(nets.weights(p), obs) * cot)

  def dec_loss(p):
    recon = nets.decode(nets.weights(p), deter, stoch)
    return sum(cnn.image_loss(recon[k], obs[k]).mean() for k in IMAGE_KEYS)

  genc, gdec = jax.grad(enc_loss)(params), jax.grad(dec_loss)(params)
  names = {'w': 'kernel', 'b': 'bias', 'scale': 'scale'}
  checked = 0
  for ours, grads in (('enc', genc), ('dec', gdec)):
    for name, leaves in _official_to_ours(golden).items():
      if not name.startswith(ours + '/'):
        continue
      for leaf in leaves:
        official = name.replace('enc/linear', 'enc/mlp')
        key = f'grad/{official}/{names[leaf]}'
        want = golden[key]
        scale = float(np.abs(want).max()) or 1.0
        np.testing.assert_allclose(grads[name][leaf], want, rtol=2e-3,
                                   atol=2e-5 * scale, err_msg=key)
        checked += 1
  assert checked == 3 * 3 + 4 * 3 + 7 * 2 + 5


def test_init_fans_and_outscale_as_the_official(nets, golden):
  """spec 1.5: conv HWIO fan_in = k*k*cin, BlockLinear fan_in = the total
  width; imgout at outscale 1. Our init's stds against the official init's."""
  ours = nets.init(jax.random.PRNGKey(1))
  for name, leaves in _official_to_ours(golden).items():
    if 'cnn' not in name and not name.startswith('dec/'):
      continue
    for leaf, v in leaves.items():
      mine = np.asarray(ours[name][leaf])
      if leaf == 'b':
        assert not mine.any(), name
      elif leaf == 'scale':
        assert (mine == 1).all(), name
      else:
        expect = 1.0 / np.sqrt(np.prod(v.shape[:-1]))        # fan_in (1.5)
        assert abs(mine.std() / expect - 1) < 0.15, (name, mine.std(), expect)
        assert abs(mine.std() / v.std() - 1) < 0.2, (name, mine.std(), v.std())


def test_image_loss_and_gradient_literal():
  """sum_{h,w,c} (p - x/255)^2 and its gradient 2 (p - x/255), written out."""
  rng = np.random.default_rng(0)
  pred = rng.uniform(0, 1, (2, 3, 48, 48, 2)).astype(np.float32)
  img = rng.integers(0, 256, (2, 3, 48, 48, 2), dtype=np.uint8)
  want = np.zeros((2, 3))
  for b in range(2):
    for t in range(3):
      d = pred[b, t].astype(np.float64) - img[b, t].astype(np.float64) / 255.0
      want[b, t] = float((d * d).sum())
  np.testing.assert_allclose(cnn.image_loss(jnp.asarray(pred), img), want, rtol=1e-5)
  grad = jax.grad(lambda p: cnn.image_loss(p, img).mean())(jnp.asarray(pred))
  want_grad = 2 * (pred.astype(np.float64) - img / 255.0) / 6
  np.testing.assert_allclose(grad, want_grad, rtol=1e-4, atol=1e-7)


def test_encoder_shapes_and_depths():
  """spec 2.10 / 2.1: depths d/16 * (2, 3, 4, 4); 64x64 -> a 4x4 grid."""
  c = make_config(size='size12m')
  assert c.cnn_depth == 16 and cnn.depths(c.cnn_depth) == (32, 48, 64, 64)
  assert make_config(size='size1m').cnn_depth == 4
  sp = EnvSpaces(obs={'image': (64, 64, 3)}, act_dim=6)
  assert networks.token_dim(sp, c) == 4 * 4 * 64
  spec = step_spec(sp, c)
  assert spec['observation']['image'].dtype == np.uint8


@pytest.mark.parametrize('shape', [(8, 8, 3), (32, 32, 3), (40, 64, 3),
                                   (272, 272, 3), (64, 64)])
def test_sizes_outside_the_resolution_rule_are_refused_by_name(shape):
  if len(shape) == 2:
    sp = EnvSpaces(obs={'frame': shape}, act_dim=2)        # a rank-2 vector
    assert sp.image_keys == ()
    return
  with pytest.raises(ValueError, match=r"image 'frame' is \d+x\d+.*48 to 256"):
    EnvSpaces(obs={'frame': shape}, act_dim=2)


def test_image_keys_of_different_sides_are_refused():
  with pytest.raises(ValueError, match='share one height and width'):
    EnvSpaces(obs={'a': (64, 64, 3), 'b': (48, 48, 3)}, act_dim=2)
