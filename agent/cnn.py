"""The image encoder and decoder (spec 2.10, HEAD e3f0224: conv + 2x2 max-pool).

Image keys are the uint8 (H, W, C) observations (``EnvSpaces.image_keys``,
sorted). The encoder concatenates them on channels, scales them to
x / 255 - 0.5 and runs STAGES x [Conv(k5, stride 1, SAME) -> 2x2 max-pool ->
RMSNorm -> SiLU] with depths depth * (2, 3, 4, 4), depth = d / 16 (spec 2.1);
its flattened output is concatenated after the vector MLP's tokens (2.9).

The decoder maps (deter, stoch) to a (H/16, W/16, 4 depth) grid through the
block-linear spatial projection (bspace 8): BlockLinear(deter) rearranged
'(g h w c) -> h w (g c)', plus Linear(2d) -> RMSNorm -> SiLU -> Linear on the
flat stoch; their sum through RMSNorm -> SiLU. Then per stage nearest x2
upsampling and Conv(k5) -> RMSNorm -> SiLU, the last stage a Conv to the
summed channels with the decoder outscale, and a sigmoid: the predicted image
in [0, 1], split back per key. The loss per key is the squared error against
image / 255 summed over H, W, C (``image_loss``).

Parameters are created by ``encoder_weights`` / ``decoder_weights`` inside the
'enc' and 'dec' Haiku modules (names as the official modules': cnn{i},
cnn{i}norm; sp0, sp1, sp1norm, sp2, spnorm, conv{i}, conv{i}norm, imgout) and
consumed by the pure functions below, like the vector blocks (agent.blocks).
The conv is ``jax.lax.conv_general_dilated`` (NHWC, HWIO) and the max-pool a
reshape and max, as in the official code; the decoder's upsample-then-conv
runs as one low-resolution conv per output phase (``_upsample_conv``, the
same sums). The goldens (tests/test_cnn.py) agree to float32 rounding.
"""

from __future__ import annotations

from typing import Dict, Mapping, Sequence, Tuple

import chex
import haiku as hk
import jax
import jax.numpy as jnp
import numpy as np

from agent import blocks

KERNEL = 5                     # spec 2.10
MULTS = (2, 3, 4, 4)           # spec 2.10, HEAD (2411f7d: (1, 2, 3, 4, 4))
STAGES = len(MULTS)
BSPACE = 8                     # decoder spatial projection blocks (spec 2.10)
MINRES = (3, 16)               # the official asserts on the smallest grid side


def depths(depth: int) -> Tuple[int, ...]:
  """Channels per stage, depth * (2, 3, 4, 4) (spec 2.10)."""
  return tuple(depth * m for m in MULTS)


def valid_sides() -> Tuple[int, ...]:
  """Image sides the stages accept: halved STAGES times without remainder to
  a grid side in MINRES (16 * (3..16) = 48, 64, ..., 256)."""
  f = 2 ** STAGES
  return tuple(f * r for r in range(MINRES[0], MINRES[1] + 1))


def image_shape_problem(key: str, shape: Sequence[int]):
  """None if (H, W, C) suits the CNN, else the message that names the key,
  its size and the sizes that work (spec 2.10's 3-16 rule)."""
  shape = tuple(int(s) for s in shape)
  if len(shape) != 3:
    return (f'image {key!r} has shape {shape}: an image is (height, width, '
            'channels), rank 3 (spec 2.10)')
  h, w, c = shape
  sides = valid_sides()
  if h not in sides or w not in sides:
    return (f'image {key!r} is {h}x{w}: each side must be a multiple of '
            f'{2 ** STAGES} from {sides[0]} to {sides[-1]} (after {STAGES} '
            f'halvings the grid side must be {MINRES[0]}-{MINRES[1]}, spec 2.10), '
            f'e.g. 64x64; resize the image')
  if c < 1:
    return f'image {key!r} has {c} channels'
  return None


def grid(shape: Sequence[int]) -> Tuple[int, int]:
  """The smallest grid (H / 16, W / 16) of an image shape."""
  f = 2 ** STAGES
  return int(shape[0]) // f, int(shape[1]) // f


# --- parameters (inside the 'enc' / 'dec' Haiku modules) ----------------------
def _conv_params(name: str, cin: int, cout: int, outscale: float = 1.0):
  """Conv kernel HWIO [k, k, cin, cout] with fan_in k*k*cin (spec 1.5), zero bias."""
  with hk.name_scope(name):
    w = hk.get_parameter('w', (KERNEL, KERNEL, cin, cout), jnp.float32,
                         blocks.kernel_init(KERNEL * KERNEL * cin, outscale))
    b = hk.get_parameter('b', (cout,), jnp.float32, jnp.zeros)
  return {'w': w, 'b': b}


def encoder_weights(channels: int, depth: int):
  """[{w, b, scale}] per stage for images of `channels` summed channels."""
  ws, cin = [], channels
  for i, cout in enumerate(depths(depth)):
    layer = _conv_params(f'cnn{i}', cin, cout)
    layer['scale'] = blocks.norm_params(f'cnn{i}norm', cout)
    ws.append(layer)
    cin = cout
  return ws


def decoder_weights(shape: Sequence[int], channels: int, depth: int, deter: int,
                    stoch_flat: int, units: int, outscale: float):
  """The spatial projection, the upsampling stages and imgout (module doc)."""
  ds = depths(depth)
  h, w = grid(shape)
  u = h * w * ds[-1]
  sp0_w, sp0_b = blocks.block_params('sp0', deter, u, BSPACE)
  sp1_w, sp1_b = blocks.dense_params('sp1', stoch_flat, 2 * units)
  sp2_w, sp2_b = blocks.dense_params('sp2', 2 * units, u)
  W = {'sp0': {'w': sp0_w, 'b': sp0_b},
       'sp1': {'w': sp1_w, 'b': sp1_b,
               'scale': blocks.norm_params('sp1norm', 2 * units)},
       'sp2': {'w': sp2_w, 'b': sp2_b},
       'spnorm': blocks.norm_params('spnorm', ds[-1]),
       'convs': []}
  cin = ds[-1]
  for i in reversed(range(STAGES - 1)):
    layer = _conv_params(f'conv{i}', cin, ds[i])
    layer['scale'] = blocks.norm_params(f'conv{i}norm', ds[i])
    W['convs'].append(layer)
    cin = ds[i]
  W['imgout'] = _conv_params('imgout', cin, channels, outscale)
  return W


# --- apply ---------------------------------------------------------------------
def _conv(x, layer):
  """SAME stride-1 conv + bias in x's dtype (NHWC, HWIO)."""
  y = jax.lax.conv_general_dilated(
      x, layer['w'].astype(x.dtype), (1, 1), 'SAME',
      dimension_numbers=('NHWC', 'HWIO', 'NHWC'))
  return y + layer['b'].astype(x.dtype)


def _norm_act(x, scale, eps):
  return jax.nn.silu(blocks.rms_norm(x, scale, eps))


def _max_pool(x):
  n, h, w, c = x.shape
  return x.reshape((n, h // 2, 2, w // 2, 2, c)).max((2, 4))


def _upsample(x):
  """Nearest x2 upsampling (the official decoder's ``repeat``)."""
  return x.repeat(2, -2).repeat(2, -3)


# Nearest x2 upsampling then a 5-tap SAME conv, per output phase p (even or
# odd row/column): the 5 taps land on 3 low-resolution neighbours (-1, 0, +1).
# Row a of _PHASE_TAPS[p] sums the taps that read neighbour a.
_PHASE_TAPS = np.array([[[1, 1, 0, 0, 0], [0, 0, 1, 1, 0], [0, 0, 0, 0, 1]],
                        [[1, 0, 0, 0, 0], [0, 1, 1, 0, 0], [0, 0, 0, 1, 1]]],
                       np.float32)


def _upsample_conv(x, layer):
  """conv(upsample(x)) computed at the low resolution (spec 2.10's decoder
  stage, the same sums in another order).

  Upsampling by nearest x2 and then convolving with a 5x5 kernel gives, for
  each of the 4 output phases, a 3x3 conv of x with the kernel's taps summed
  per low-resolution neighbour (zero padding maps to zero padding). One 3x3
  conv with the 4 phase kernels stacked on the output channels, then a
  depth-to-space, does 9/25 of the multiply-adds and never materialises the
  upsampled map: on 2 CPU cores the size12m decoder's gradient ran ~3x faster
  than the upsample-then-conv form (bench: 256 frames, 7.9 s -> 2.6 s for
  encoder + decoder). tests/test_cnn.py checks it against the literal form."""
  if layer['w'].shape[:2] != (5, 5):       # _PHASE_TAPS is kernel 5's table
    return _conv(_upsample(x), layer)
  w = layer['w'].astype(x.dtype)                                  # [5, 5, i, o]
  taps = jnp.asarray(_PHASE_TAPS, x.dtype)
  k = jnp.einsum('pad,qbe,deio->abipqo', taps, taps, w)          # [3, 3, i, 2, 2, o]
  cin, cout = w.shape[2], w.shape[3]
  y = jax.lax.conv_general_dilated(
      x, k.reshape(3, 3, cin, 4 * cout), (1, 1), 'SAME',
      dimension_numbers=('NHWC', 'HWIO', 'NHWC'))
  n, h, wd, _ = y.shape
  y = y.reshape(n, h, wd, 2, 2, cout).transpose(0, 1, 3, 2, 4, 5)
  return y.reshape(n, 2 * h, 2 * wd, cout) + layer['b'].astype(x.dtype)


def stack_images(obs: Mapping[str, jnp.ndarray], keys: Sequence[str]):
  """Sorted image keys concatenated on channels (uint8)."""
  return jnp.concatenate([obs[k] for k in sorted(keys)], -1)


def encode(ws, images, eps: float, dtype=jnp.float32):
  """uint8 [..., H, W, C] -> features [..., (H/16) (W/16) 4 depth] (spec 2.10)."""
  chex.assert_type(images, jnp.uint8)
  chex.assert_rank(images, {3, 4, 5})
  lead = images.shape[:-3]
  x = images.astype(dtype) / 255 - 0.5
  x = x.reshape((-1,) + images.shape[-3:])
  for layer in ws:
    x = _norm_act(_max_pool(_conv(x, layer)), layer['scale'], eps)
  h, w = grid(images.shape[-3:])
  chex.assert_shape(x, (x.shape[0], h, w, ws[-1]['w'].shape[-1]))
  return x.reshape(lead + (-1,))


def decode(W, deter, stoch_flat, shape: Sequence[int], eps: float):
  """Predicted images in [0, 1], float32 [..., H, W, C_sum] (spec 2.10).

  deter [..., D] and stoch_flat [..., S*C] in the compute dtype."""
  chex.assert_equal_shape_prefix([deter, stoch_flat], deter.ndim - 1)
  lead = deter.shape[:-1]
  h, w = grid(shape)
  c_last = W['spnorm'].shape[-1]
  x0 = blocks.block_dense(deter.reshape((-1, deter.shape[-1])),
                          W['sp0']['w'], W['sp0']['b'])
  x0 = x0.reshape((-1, BSPACE, h, w, c_last // BSPACE))      # (g h w c)
  x0 = jnp.moveaxis(x0, 1, 3).reshape((-1, h, w, c_last))    # h w (g c)
  x1 = stoch_flat.reshape((-1, stoch_flat.shape[-1]))
  x1 = _norm_act(blocks.dense(x1, W['sp1']['w'], W['sp1']['b']),
                 W['sp1']['scale'], eps)
  x1 = blocks.dense(x1, W['sp2']['w'], W['sp2']['b']).reshape((-1, h, w, c_last))
  x = _norm_act(x0 + x1, W['spnorm'], eps)
  for layer in W['convs']:
    x = _norm_act(_upsample_conv(x, layer), layer['scale'], eps)
  x = jax.nn.sigmoid(_upsample_conv(x, W['imgout']).astype(jnp.float32))
  chex.assert_shape(x, (x.shape[0], shape[0], shape[1], W['imgout']['w'].shape[-1]))
  return x.reshape(lead + x.shape[1:])


def split_images(pred, spaces_obs: Mapping[str, Sequence[int]],
                 keys: Sequence[str]) -> Dict[str, jnp.ndarray]:
  """The decoder's channels back per sorted image key."""
  out, start = {}, 0
  for k in sorted(keys):
    c = int(spaces_obs[k][-1])
    out[k] = pred[..., start:start + c]
    start += c
  return out


def image_loss(pred, image):
  """sum over H, W, C of (pred - image / 255)^2 (spec 2.10; no 1/2, as 2.11).

  pred float32 [..., H, W, C] in [0, 1]; image uint8, the same shape."""
  chex.assert_equal_shape([pred, image])
  target = jax.lax.stop_gradient(image.astype(jnp.float32) / 255)
  return jnp.square(pred - target).sum((-3, -2, -1))


def feature_width(shape: Sequence[int], depth: int) -> int:
  """Width of the flattened encoder output for one stacked image shape."""
  h, w = grid(shape)
  return h * w * depths(depth)[-1]


def stacked_shape(spaces_obs: Mapping[str, Sequence[int]], keys) -> Tuple[int, int, int]:
  """(H, W, summed C) of the sorted image keys; their H, W must agree."""
  keys = sorted(keys)
  hw = {tuple(spaces_obs[k][:2]) for k in keys}
  if len(hw) != 1:
    raise ValueError('image keys must share one height and width to be '
                     'concatenated on channels (spec 2.10), got '
                     + ', '.join(f'{k!r} {tuple(spaces_obs[k])}' for k in keys))
  (h, w), = hw
  return h, w, int(sum(int(spaces_obs[k][-1]) for k in keys))

