"""Golden data for the image encoder and decoder from the OFFICIAL code
(danijar/dreamerv3 at e3f0224), run in its own venv (see bench/official.py).

Builds the official ``dreamerv3.rssm.Encoder`` and ``Decoder`` (the configs'
``enc.simple`` / ``dec.simple`` settings at size1m: depth 4, units 64, deter
512, 4 classes) over two image keys and one vector key, in float32, and saves
to --out (npz):

  param/<module>/<name>   the official initial parameters
  in/...                  the inputs: uint8 images, vector obs, deter, one-hot
                          stoch, the token cotangent
  out/tokens              encoder tokens [B, T, F]
  out/mean/<key>          decoder image means [B, T, H, W, C]
  out/loss/<key>          image loss per (b, t): MSE summed over H, W, C
  grad/<module>/<name>    gradients of sum(tokens * cotangent) (encoder) and
                          of the mean over (b, t) of the summed image losses
                          (decoder) w.r.t. the parameters

tests/test_cnn.py loads the file (tests/data/official_cnn.npz), feeds the
same parameters and inputs to ours, and compares. Run:
  /tmp/official/venv/bin/python bench/official_cnn.py --src=/tmp/official/src \
      --out=tests/data/official_cnn.npz
"""

import argparse
import pathlib
import sys

import numpy as np

KEYS = {'cam': (64, 64, 3), 'depth': (64, 64, 1)}   # sorted, as the encoder sorts
VEC = {'pos': (5,)}
B, T = 2, 3
SIZE = dict(depth=4, units=64, deter=512, stoch=32, classes=4)


def main():
  p = argparse.ArgumentParser()
  p.add_argument('--src', required=True)
  p.add_argument('--out', required=True)
  p.add_argument('--seed', type=int, default=0)
  a = p.parse_args()
  sys.path.insert(0, a.src)
  import jax
  import jax.numpy as jnp
  import ninjax as nj
  import elements
  import embodied.jax.nets as nn
  from dreamerv3 import rssm
  nn.COMPUTE_DTYPE = jnp.float32

  space = {k: elements.Space(np.uint8, s) for k, s in KEYS.items()}
  space.update({k: elements.Space(np.float32, s) for k, s in VEC.items()})
  common = dict(depth=SIZE['depth'], mults=(2, 3, 4, 4), layers=3,
                units=SIZE['units'], act='silu', norm='rms',
                winit='trunc_normal_in', outer=False, kernel=5, strided=False)
  enc = rssm.Encoder(space, **common, symlog=True, name='enc')
  dec = rssm.Decoder(space, **common, outscale=1.0, bspace=8, name='dec')

  rng = np.random.default_rng(a.seed)
  obs = {k: rng.integers(0, 256, (B, T) + s, dtype=np.uint8)
         for k, s in KEYS.items()}
  obs.update({k: rng.normal(size=(B, T) + s).astype(np.float32)
              for k, s in VEC.items()})
  deter = rng.normal(size=(B, T, SIZE['deter'])).astype(np.float32)
  idx = rng.integers(0, SIZE['classes'], (B, T, SIZE['stoch']))
  stoch = np.eye(SIZE['classes'], dtype=np.float32)[idx]
  reset = np.zeros((B, T), bool)

  def enc_fn(obs):
    return enc({}, obs, reset, training=True)[2]

  def dec_fn(deter, stoch):
    return dec({}, {'deter': deter, 'stoch': stoch}, reset, training=True)[2]

  seed = jax.random.PRNGKey(a.seed)
  params = nj.init(enc_fn)({}, obs, seed=seed)
  params.update(nj.init(dec_fn)({}, deter, stoch, seed=jax.random.PRNGKey(a.seed + 1)))

  _, tokens = nj.pure(enc_fn)(params, obs)
  tokens = np.asarray(tokens)
  cot = rng.normal(size=tokens.shape).astype(np.float32)

  _, recons = nj.pure(dec_fn)(params, deter, stoch)
  out = {'out/tokens': tokens}
  for k in KEYS:
    out[f'out/mean/{k}'] = np.asarray(recons[k].pred())
    target = obs[k].astype(np.float32) / 255
    out[f'out/loss/{k}'] = np.asarray(recons[k].loss(target))

  enc_keys = [k for k in params if k.startswith('enc/')]
  dec_keys = [k for k in params if k.startswith('dec/') and '/vec/' not in k
              and not k.startswith('dec/mlp')]

  def enc_loss(sub):
    _, t = nj.pure(enc_fn)({**params, **sub}, obs)
    return jnp.sum(t * cot)

  def dec_loss(sub):
    _, rec = nj.pure(dec_fn)({**params, **sub}, deter, stoch)
    total = 0.0
    for k in KEYS:
      target = obs[k].astype(np.float32) / 255
      total = total + rec[k].loss(target).mean()
    return total

  genc = jax.grad(enc_loss)({k: params[k] for k in enc_keys})
  gdec = jax.grad(dec_loss)({k: params[k] for k in dec_keys})
  for k, v in params.items():
    out[f'param/{k}'] = np.asarray(v)
  for k, v in {**genc, **gdec}.items():
    out[f'grad/{k}'] = np.asarray(v)
  out.update({f'in/obs/{k}': v for k, v in obs.items()})
  out['in/deter'] = deter
  out['in/stoch'] = stoch
  out['in/cot'] = cot
  pathlib.Path(a.out).parent.mkdir(parents=True, exist_ok=True)
  np.savez_compressed(a.out, **out)
  print(f'wrote {a.out}: {len(out)} arrays; params:')
  for k in sorted(params):
    print(f'  {k} {tuple(params[k].shape)} std {float(np.std(params[k])):.4g}')


if __name__ == '__main__':
  main()
