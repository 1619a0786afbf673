"""Restores the few jax names that dm-acme 0.4.0 still uses (stack notes in README).

Acme 0.4.0 (the last release on PyPI) was written against jax 0.3.x. It refers
to names that later jax releases removed:

  * ``jax.xla.Device`` and ``jax.xla.DeviceArray``
  * ``jnp.DeviceArray``
  * ``jax.pxla.ShardedDeviceArray``
  * ``jax.tree_map``, ``jax.tree_multimap``, ``jax.tree_flatten`` (and the
    other ``jax.tree_*`` aliases of ``jax.tree_util``)

Import this module before ``import acme`` (``import agent`` does so); every
Launchpad node runs it through its ``init_file`` (see ``experiments/layouts/distributed/lp_init.py``).
``install()`` adds exactly these aliases, never overrides a name jax still has,
and is idempotent.
"""

from __future__ import annotations

import types

import jax
import jax.numpy as jnp

# Names restored; the tests check each one of them.
TREE_ALIASES = {
    "tree_map": "tree_map",
    "tree_multimap": "tree_map",  # tree_multimap was merged into tree_map.
    "tree_flatten": "tree_flatten",
    "tree_unflatten": "tree_unflatten",
    "tree_leaves": "tree_leaves",
    "tree_structure": "tree_structure",
}


def _set_if_missing(obj, name, value) -> bool:
    if not hasattr(obj, name):
        setattr(obj, name, value)
        return True
    return False


def install() -> list[str]:
    """Adds the removed aliases acme 0.4.0 needs; returns the names it added."""
    added = []
    array_type = jax.Array
    if _set_if_missing(jax, "xla", types.SimpleNamespace()):
        added.append("jax.xla")
    xla = jax.xla
    for name, value in (("Device", jax.Device), ("DeviceArray", array_type)):
        if _set_if_missing(xla, name, value):
            added.append(f"jax.xla.{name}")
    if _set_if_missing(jax, "pxla", types.SimpleNamespace()):
        added.append("jax.pxla")
    if _set_if_missing(jax.pxla, "ShardedDeviceArray", array_type):
        added.append("jax.pxla.ShardedDeviceArray")
    if _set_if_missing(jnp, "DeviceArray", array_type):
        added.append("jnp.DeviceArray")
    for alias, target in TREE_ALIASES.items():
        if _set_if_missing(jax, alias, getattr(jax.tree_util, target)):
            added.append(f"jax.{alias}")
    return added


def quiet_gym_notice() -> None:
    """gym 0.26 prints a four-line 'unmaintained' notice when it is imported
    (from the ``gym_notices`` package), and acme imports gym, so every run
    command printed it. It is dropped for the installed gym version before
    gym is imported (a gym imported elsewhere first still prints it)."""
    try:
        from importlib import metadata

        import gym_notices.notices as notices
        notices.notices.pop(metadata.version("gym"), None)
    except Exception:  # noqa: BLE001  (no gym or no notices: nothing to quiet)
        pass


install()
quiet_gym_notice()
