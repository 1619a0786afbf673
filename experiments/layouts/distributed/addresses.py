"""Addresses: the one parser and the one writer of 'HOST:PORT', where an
empty ``--bind`` listens (loopback), and which address other hosts reach
this machine at (``--bind``: ``join.json``, ``learner_peers.json``, the
learner processes' gloo collectives, ``DistributedConfig.gloo_host``).
"""

from __future__ import annotations

import socket
from typing import Tuple


def parse_address(address: str, flag: str = '--join') -> Tuple[str, int]:
  """'HOST:PORT' (or '[v6]:PORT') -> (host, port); ValueError naming the
  flag otherwise (the one home of this rule: flags, the join service and
  its clients, Launchpad's resolved addresses)."""
  host, sep, port = str(address).rpartition(':')
  host = host[1:-1] if host.startswith('[') and host.endswith(']') else host
  if not (sep and host and port.isdigit() and 1 <= int(port) <= 65535):
    raise ValueError(f'{flag} must be HOST:PORT, got {address!r}')
  return host, int(port)


# Where an empty --bind listens and what it advertises: this host only.
LOOPBACK = '127.0.0.1'


def format_address(host: str, port: int) -> str:
  """(host, port) -> 'HOST:PORT' ('[v6]:PORT' for an IPv6 address): what
  ``parse_address`` reads back."""
  host = f'[{host}]' if ':' in str(host) else str(host)
  return f'{host}:{int(port)}'


def listen_host(bind: str) -> str:
  """Where a listener of the run binds: '' -> loopback only; else as given
  ('0.0.0.0': every IPv4 interface)."""
  return bind or LOOPBACK


def advertised_host(bind: str) -> str:
  """The host remote actors reach this machine at (``DistributedConfig.bind``):
  '' -> loopback (where an empty bind listens), '0.0.0.0' -> the first
  non-loopback IPv4 address of an interface that is up, anything else as
  given."""
  if not bind:
    return LOOPBACK
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
