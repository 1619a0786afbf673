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


_DTYPE_BYTES = {'f32': 4, 'bf16': 2, 'f16': 2, 's32': 4, 'u32': 4, 'pred': 1,
                'f64': 8, 's64': 8, 'u8': 1, 's8': 1, 'u16': 2}


def collective_bytes(text: str) -> dict:
  """Bytes the collectives of a compiled HLO module produce, by kind
  ({'all-reduce': {'ops': n, 'bytes': b, 'in_loops': k}, ...}); an op inside a
  while body (a scan) is counted once and reported in ``in_loops``."""
  comps, entry = computations(text)
  loop_bodies = set()
  for lines in comps.values():
    for line in lines:
      m = re.search(r'while\(.*body=%?([\w.\-]+)', line)
      if m:
        loop_bodies.add(m.group(1))
  out = {}
  for name, lines in comps.items():
    for line in lines:
      m = re.match(r'\s*(?:ROOT )?%\S+ = (.+?) (all-reduce|all-gather|'
                   r'reduce-scatter|all-to-all|collective-permute)'
                   r'(?:-start)?\(', line)
      if not m:
        continue
      shapes = re.findall(r'(\w+)\[([\d,]*)\]', m.group(1))
      nbytes = 0
      for dtype, dims in shapes:
        size = 1
        for d in filter(None, dims.split(',')):
          size *= int(d)
        nbytes += size * _DTYPE_BYTES.get(dtype, 4)
      entry_ = out.setdefault(m.group(2), {'ops': 0, 'bytes': 0, 'in_loops': 0})
      entry_['ops'] += 1
      entry_['bytes'] += nbytes
      entry_['in_loops'] += name in loop_bodies
  return out


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
