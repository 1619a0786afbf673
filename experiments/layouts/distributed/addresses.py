"""Which address other hosts reach this machine at (``--bind``).

Used by the learner (``join.json``, the address remote actors join) and by
the learner processes' gloo collectives (``DistributedConfig.gloo_host``).
"""

from __future__ import annotations

import socket


def advertised_host(bind: str) -> str:
  """The host remote actors reach this machine at (``DistributedConfig.bind``):
  '' -> 'localhost', '0.0.0.0' -> the first non-loopback IPv4 address of an
  interface that is up, anything else as given."""
  if not bind:
    return 'localhost'
  if bind != '0.0.0.0':
    return bind
  import psutil
  stats = psutil.net_if_stats()
  for name, addrs in psutil.net_if_addrs().items():
    if name in stats and not stats[name].isup:
      continue
    for a in addrs:
      if a.family == socket.AF_INET and not a.address.startswith('127.'):
        return a.address
  raise ValueError('--bind=0.0.0.0: this machine has no non-loopback IPv4 '
                   'address; pass --bind=HOST (a name or address remote '
                   'actors can reach)')
