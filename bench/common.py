"""Helpers shared by the benchmarks: HLO text parsing, the matmul peak."""

from __future__ import annotations

import re
import time

import agent  # noqa: F401  (jax compat first)
import jax
import jax.numpy as jnp

from agent import learning, networks, synthetic
from agent.config import DreamerConfig


def update_hlo(config: DreamerConfig) -> str:
  """The optimised HLO text of one learner update (walker-like spaces), as compiled."""
  spaces = synthetic.WALKER_SPACES
  ts = learning.make_train_step(networks.make_networks(spaces, config))
  state = ts.init(jax.random.PRNGKey(0))
  return ts.update.lower(state, synthetic.make_batch(spaces, config)).compile().as_text()


def computations(text: str):
  """({computation name: its instruction lines}, the ENTRY computation's name)."""
  comps, cur, entry = {}, None, None
  for line in text.splitlines():
    m = re.match(r'^(ENTRY )?%(\S+) ', line)
    if m and line.rstrip().endswith('{'):
      cur = m.group(2)
      comps[cur] = []
      if m.group(1):
        entry = cur
    elif line.startswith('}'):
      cur = None
    elif cur:
      comps[cur].append(line)
  return comps, entry


def matmul_gflops(n: int = 2048, reps: int = 10) -> float:
  """Measured f32 matmul throughput of this machine (XLA CPU)."""
  a = jnp.ones((n, n), jnp.float32)
  f = jax.jit(lambda x: x @ x)
  f(a).block_until_ready()
  t = time.perf_counter()
  for _ in range(reps):
    out = f(a)
  out.block_until_ready()
  return 2 * n ** 3 * reps / (time.perf_counter() - t) / 1e9
