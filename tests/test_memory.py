"""agent/memory.py: with the malloc settings, repeated XLA:CPU runs reuse their
large temporary buffer instead of faulting in fresh pages each time."""
import subprocess
import sys

import pytest

SCRIPT = r'''
import resource, statistics, agent, jax, jax.numpy as jnp
from agent import memory
f = jax.jit(lambda x: jnp.sum(jnp.tanh(x @ x.T) * 2.0))   # ~64 MB temporaries
x = jnp.ones((4096, 64))
faults = []
for _ in range(15):
  r0 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
  f(x).block_until_ready()
  faults.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - r0)
print(memory._applied, statistics.median(faults[3:]))
'''


def _faults(env_extra):
  import os
  env = dict(os.environ, **env_extra)
  out = subprocess.run([sys.executable, '-c', SCRIPT], capture_output=True, text=True,
                       env=env, timeout=300, check=True).stdout.split()
  return out[0] == 'True', float(out[1])


@pytest.mark.slow
def test_tuned_malloc_avoids_page_faults_per_run():
  """The system allocator faults in the ~16K pages of the temporaries on every
  run; the tuned one reuses them (median < 500 faults per run).

  On a busy machine the kernel may reclaim idle heap pages between runs
  (memory-pressure pageout), which shows as faults that have nothing to do
  with the allocator. So the tuned process is measured up to three times and
  its best median counts; the system allocator must fault on every attempt's
  median (it unmaps the buffer after each run, whatever the load).

  Slow: page-fault counts depend on the machine's memory
  pressure, which the default suite cannot control on a shared host."""
  base_applied, base_faults = _faults({'DREAMER_SYSTEM_MALLOC': '1'})
  assert not base_applied
  # 64 MB of temporaries = ~16K pages per run with glibc's defaults. (Median:
  # the tuned heap still grows now and then until its layout settles.)
  assert base_faults > 8000, base_faults
  attempts = []
  for _ in range(3):
    applied, faults = _faults({'DREAMER_SYSTEM_MALLOC': '0'})
    assert applied
    attempts.append(faults)
    if faults < 500:
      break
  assert min(attempts) < 500, attempts
