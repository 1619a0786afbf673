"""Compact, lossless storage of RSSM latents for the replay context (spec 5.7).

stoch z_t is an exact one-hot, so it is stored as uint8 class indices [S].
deter h_t is stored as bf16 bit patterns in uint16 (or float32, config
``latent_store_dtype``). With bf16 compute this is lossless; with f32 compute
bf16 storage rounds the context state (documented in docs/deviations.md §2).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from agent.config import DreamerConfig


def pack(deter: jax.Array, stoch: jax.Array, config: DreamerConfig) -> dict:
  """[..., D] deter and [..., S, C] one-hot stoch -> storage dict (jit-able)."""
  if config.latent_store_dtype == 'bfloat16':
    d = jax.lax.bitcast_convert_type(deter.astype(jnp.bfloat16), jnp.uint16)
  else:
    d = deter.astype(jnp.float32)
  s = jnp.argmax(stoch, -1).astype(jnp.uint8)
  return {'deter': d, 'stoch': s}


def unpack(latent: dict, config: DreamerConfig, dtype=None):
  """Storage dict -> (deter [..., D], stoch one-hot [..., S, C]) in `dtype`."""
  dtype = dtype or config.jnp_compute_dtype
  d = latent['deter']
  if d.dtype == jnp.uint16 or d.dtype == np.uint16:
    d = jax.lax.bitcast_convert_type(jnp.asarray(d), jnp.bfloat16)
  deter = jnp.asarray(d).astype(dtype)
  stoch = jax.nn.one_hot(jnp.asarray(latent['stoch']).astype(jnp.int32),
                         config.classes, dtype=dtype)
  return deter, stoch
