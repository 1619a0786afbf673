"""Synthetic replay batches in the agent/types.py layout (tests and benchmarks)."""

from __future__ import annotations

import numpy as np

from agent.config import DreamerConfig, latent_store_np_dtype
from agent.types import EnvSpaces

# Walker-like observation spaces (dm_control walker: 14 + 1 + 9 features).
WALKER_SPACES = EnvSpaces(obs={'orientations': (14,), 'height': (1,), 'velocity': (9,)},
                          act_dim=6)
# DMC vision (spec 2.10): one 64x64 RGB frame, walker's 6 actions.
IMAGE_SPACES = EnvSpaces(obs={'image': (64, 64, 3)}, act_dim=6)


def make_batch(spaces: EnvSpaces, config: DreamerConfig, seed: int = 0,
               batch_size: int = None, length: int = None, episode_len: int = 40):
  """A [B, T+1] batch with episode boundaries every `episode_len` steps."""
  rng = np.random.default_rng(seed)
  B = batch_size or config.batch_size
  L = length or config.seq_len
  idx = np.arange(L)[None] + rng.integers(0, episode_len, (B, 1))
  is_first = (idx % episode_len) == 0
  is_last = (idx % episode_len) == episode_len - 1
  obs = {k: (rng.integers(0, 256, (B, L) + tuple(s), dtype=np.uint8)
             if k in spaces.image_keys else
             rng.normal(size=(B, L) + tuple(s)).astype(np.float32))
         for k, s in spaces.obs.items()}
  if spaces.discrete:
    action = np.eye(spaces.act_dim, dtype=np.float32)[
        rng.integers(0, spaces.act_dim, (B, L))]
  else:
    action = rng.normal(size=(B, L, spaces.act_dim)).astype(np.float32)
  action[is_last] = 0.0
  reward = rng.uniform(0, 1, (B, L)).astype(np.float32)
  reward[is_first] = 0.0
  deter = rng.normal(size=(B, L, config.deter)).astype(np.float32)
  if latent_store_np_dtype(config) == np.uint16:
    import ml_dtypes
    deter = deter.astype(ml_dtypes.bfloat16).view(np.uint16)
  return {
      'observation': obs,
      'action': action,
      'reward': reward,
      'is_first': is_first,
      'is_last': is_last,
      'is_terminal': np.zeros((B, L), bool),
      'latent': {'deter': deter,
                 'stoch': rng.integers(0, config.classes, (B, L, config.stoch)
                                       ).astype(np.uint8)},
      'step_id': np.stack(np.broadcast_arrays(
          np.arange(B)[:, None], np.arange(L)[None]), -1).astype(np.int64),
  }
