"""DreamerV3 agent (Haiku + Acme).

Importing it (1) sets glibc malloc options that spare XLA:CPU ~80K page faults
per learner update (agent/memory.py; DREAMER_SYSTEM_MALLOC=1 opts out) and
(2) installs the jax compat aliases acme 0.4.0 needs (agent/compat.py) before
anything imports acme."""
from agent import memory as _memory

_memory.tune_malloc()   # before jax creates its thread pool

from agent import compat as _compat  # noqa: F401,E402  (must precede any acme import)
