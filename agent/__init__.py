"""DreamerV3 agent (Haiku + Acme).

Importing it (1) sets glibc malloc options that spare XLA:CPU ~80K page faults
per learner update (agent/memory.py; DREAMER_SYSTEM_MALLOC=1 opts out),
(2) installs the jax compat aliases acme 0.4.0 needs (agent/compat.py) before
anything imports acme, and (3) sets the log level of jax's backend probe to
WARNING: its INFO line "Unable to initialize backend 'tpu'" says only that
this machine has no TPU, and absl's INFO verbosity would print it (twice)
in every run."""
from agent import memory as _memory

_memory.tune_malloc()   # before jax creates its thread pool

from agent import compat as _compat  # noqa: F401,E402  (must precede any acme import)

import logging as _logging  # noqa: E402

# The logger of jax's backend probe (jax._src.xla_bridge): a failed optional
# backend is an INFO record there; a failure that matters is raised.
_logging.getLogger('jax._src.xla_bridge').setLevel(_logging.WARNING)
