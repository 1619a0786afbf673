"""Checkpoint and resume of the replay (spec 5.1 storage, 5.9 latents, 6.1).

Reverb data (items, chunks, rate-limiter state of both tables) is saved by the
server's DefaultCheckpointer (``make_server(..., checkpoint_dir=...)``) when
``client.checkpoint()`` is called; a new server built on the same directory
loads the latest checkpoint, so a resumed run samples the same items.
Reverb writes one timestamped directory per checkpoint; ``checkpoint_server``
keeps only the newest ``keep`` to bound disk.

The small learner-side state that must match it (adder counters = step ids,
train schedule, latent store) is saved by ``save_replay_state`` next to it;
``load_replay_state`` raises when it was saved with another Reverb checkpoint.
"""

from __future__ import annotations

import json
import os
import shutil
from typing import Any, Dict, List, Optional, Sequence

import reverb

from reverb_tables.files import atomic_write
from reverb_tables.tables import make_server

_DONE = 'DONE'
_STATE_FILE = 'replay_state.json'
_LATENT_FILE = 'latents.npz'


def list_checkpoints(checkpoint_dir: str) -> List[str]:
  """Complete Reverb checkpoints (with a DONE marker), oldest first."""
  if not os.path.isdir(checkpoint_dir):
    return []
  paths = [os.path.join(checkpoint_dir, name)
           for name in sorted(os.listdir(checkpoint_dir))]
  return [p for p in paths
          if os.path.isdir(p) and os.path.exists(os.path.join(p, _DONE))]


def latest_checkpoint(checkpoint_dir: str) -> Optional[str]:
  paths = list_checkpoints(checkpoint_dir)
  return paths[-1] if paths else None


def prune_checkpoints(checkpoint_dir: str, keep: int = 1) -> List[str]:
  """Deletes all but the newest ``keep`` complete checkpoints; returns them."""
  if keep < 1:
    raise ValueError(f'keep must be >= 1, got {keep}')
  removed = list_checkpoints(checkpoint_dir)[:-keep]
  for path in removed:
    shutil.rmtree(path, ignore_errors=True)
  return removed


def checkpoint_server(client: reverb.Client, keep: int = 1,
                      adder=None) -> str:
  """Checkpoints the Reverb server; returns the new checkpoint path.

  Args:
    client: client of a server built with ``checkpoint_dir``.
    keep: number of newest checkpoints kept (older ones are deleted).
    adder: optional WindowAdder, flushed first so every created item is in
      the checkpoint.
  """
  if adder is not None:
    adder.flush()
  path = client.checkpoint()
  prune_checkpoints(os.path.dirname(os.path.normpath(path)), keep)
  return path


def restore_server(tables: Sequence[reverb.Table], checkpoint_dir: str,
                   port: Optional[int] = None) -> reverb.Server:
  """Starts a server from the latest checkpoint in ``checkpoint_dir``.

  ``tables`` must be built as for the original server (same names and
  signatures, ``make_replay_tables``). Raises if there is no checkpoint.
  """
  if latest_checkpoint(checkpoint_dir) is None:
    raise FileNotFoundError(f'no Reverb checkpoint in {checkpoint_dir}')
  return make_server(tables, port=port, checkpoint_dir=checkpoint_dir)


def save_replay_state(directory: str, reverb_checkpoint: Optional[str] = None,
                      *, adder=None, schedule=None, latent_store=None,
                      adder_state=None) -> Dict[str, Any]:
  """Saves adder counters, schedule and latent store (atomic writes).

  ``adder_state``: the counters themselves instead of an ``adder`` (the
  merged counters of several actor processes).

  ``reverb_checkpoint`` is the path returned by ``checkpoint_server``; it is
  recorded so ``load_replay_state`` can check the pair belongs together.
  """
  os.makedirs(directory, exist_ok=True)
  if latent_store is not None:
    latent_store.save(os.path.join(directory, _LATENT_FILE))
  state = {
      'reverb_checkpoint': (os.path.basename(os.path.normpath(
          reverb_checkpoint)) if reverb_checkpoint else None),
      'adder': adder.get_state() if adder is not None else adder_state,
      'schedule': schedule.get_state() if schedule is not None else None,
      'latent_store': latent_store is not None,
  }
  atomic_write(os.path.join(directory, _STATE_FILE), json.dumps(state, indent=1))
  return state


def load_replay_state(directory: str, reverb_checkpoint: Optional[str] = None,
                      *, adder=None, schedule=None,
                      latent_store=None) -> Dict[str, Any]:
  """Restores what ``save_replay_state`` wrote into the given objects.

  Raises ValueError if ``reverb_checkpoint`` is given and differs from the
  one recorded at save time (step ids would no longer match the items).
  """
  with open(os.path.join(directory, _STATE_FILE)) as f:
    state = json.load(f)
  if reverb_checkpoint is not None:
    name = os.path.basename(os.path.normpath(reverb_checkpoint))
    if state['reverb_checkpoint'] != name:
      raise ValueError(f'replay state in {directory} belongs to Reverb '
                       f'checkpoint {state["reverb_checkpoint"]}, not {name}')
  if adder is not None and state['adder'] is not None:
    adder.set_state(state['adder'])
  if schedule is not None and state['schedule'] is not None:
    schedule.set_state(state['schedule'])
  if latent_store is not None and state['latent_store']:
    latent_store.restore(os.path.join(directory, _LATENT_FILE))
  return state
