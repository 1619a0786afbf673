"""Remote actors that join a running program from other hosts.

  service.py  JoinService: the program's node that remote actors talk to,
              and nothing else (authenticated, pickle-free; every step
              checked before the program's adder stores it)
  gate.py     its door: listening, the handshake, the caps on connections
  claims.py   its conversation with one authenticated connection
  storage.py  the steps it stores, the parameters it serves
  remote.py   the remote actor: ``run_dmc.py --distributed --join=...``
  wire.py     the authenticated frames both speak (HMAC-SHA256, JSON
              headers, raw arrays)
  slots.py    the service's book of claims (slots, tokens, caps, tallies)

The run secret they share: ``experiments/layouts/distributed/secret.py``.
"""

# <logdir>/join.json: where the join service listens (``--join=<logdir>``).
JOIN_FILE = 'join.json'
