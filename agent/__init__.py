"""DreamerV3 agent (Haiku + Acme). Importing it installs the jax compat aliases
acme 0.4.0 needs (agent/compat.py) before anything imports acme."""
from agent import compat as _compat  # noqa: F401  (must precede any acme import)
