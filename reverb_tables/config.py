"""The replay's own configuration: the fields ``reverb_tables`` reads.

Layering is one-way: ``agent`` (and ``experiments``) may import
``reverb_tables``, but ``reverb_tables`` never imports ``agent``
(tests/test_layering.py). Every ``reverb_tables`` class and function that takes
a ``config`` accepts a ``ReplayConfig`` or any object with its fields (such as
``agent.config.DreamerConfig``) and converts it with ``ReplayConfig.of``.

This module imports only numpy and dataclasses (no jax, TensorFlow or Reverb),
so ``agent.config`` can import it cheaply.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Union

import numpy as np

LATENT_STORE_DTYPES = ('float32', 'bfloat16')


@dataclasses.dataclass(frozen=True)
class ReplayConfig:
  """Replay hyperparameters (spec 5.1, 5.4, 5.7, 6.1, 6.2).

  Fields (the values of ``agent.config.DreamerConfig`` by default):

    seq_len             item length L = T + replay_context = 65 (spec 5.1, 5.8)
    batch_size          B rows per training batch (spec 5.3)
    batch_length        T trained steps per row (spec 5.1)
    replay_capacity     FIFO capacity in items (spec 5.1)
    online_queue        use the ``online`` FIFO queue (spec 5.4)
    train_ratio         replayed steps per env step (spec 6.1)
    train_fill          items before training starts (spec 6.2 gate)
    batch_steps         B*T, the train-ratio denominator (spec 6.1)
    deter               stored deterministic-state width D (spec 5.7)
    stoch               stored stochastic latents S (class indices, spec 5.7)
    classes             classes C of each latent: stored indices are < C
                        (spec 2.1, 5.7; ``reverb_tables.step_checks``)
    latent_store_dtype  stored deter dtype, 'bfloat16' or 'float32' (spec 5.7)
    seed                run seed (spec 6.5; see ``reverb_tables.sampler``)
  """

  seq_len: int
  batch_size: int
  batch_length: int
  replay_capacity: int
  online_queue: bool
  train_ratio: float
  train_fill: int
  batch_steps: int
  deter: int
  stoch: int
  classes: int
  latent_store_dtype: str
  seed: int

  def __post_init__(self):
    for name in ('seq_len', 'batch_size', 'batch_length', 'replay_capacity',
                 'batch_steps', 'deter', 'stoch', 'classes'):
      if getattr(self, name) <= 0:
        raise ValueError(f'ReplayConfig.{name} must be positive, got '
                         f'{getattr(self, name)}')
    if self.train_ratio <= 0:
      raise ValueError(
          f'ReplayConfig.train_ratio must be positive, got {self.train_ratio}')
    if self.train_fill < 0:
      raise ValueError(
          f'ReplayConfig.train_fill must be >= 0, got {self.train_fill}')
    if self.seq_len <= self.batch_length:
      raise ValueError(
          f'ReplayConfig.seq_len {self.seq_len} must exceed batch_length '
          f'{self.batch_length} (T + replay context, spec 5.1, 5.8)')
    if self.batch_steps != self.batch_size * self.batch_length:
      raise ValueError(
          f'ReplayConfig.batch_steps {self.batch_steps} != batch_size * '
          f'batch_length = {self.batch_size * self.batch_length} (spec 6.1)')
    if self.latent_store_dtype not in LATENT_STORE_DTYPES:
      raise ValueError(
          f'ReplayConfig.latent_store_dtype must be one of '
          f'{LATENT_STORE_DTYPES}, got {self.latent_store_dtype!r}')

  @classmethod
  def of(cls, obj: Any) -> 'ReplayConfig':
    """``obj`` if it is a ReplayConfig, else one read from its attributes.

    ``obj`` may be any object with every field as an attribute or property
    (``agent.config.DreamerConfig`` has ``seq_len``, ``batch_steps`` and
    ``deter`` as properties). Raises TypeError naming the missing attributes.
    """
    if isinstance(obj, cls):
      return obj
    values = {}
    missing = []
    for field in dataclasses.fields(cls):
      try:
        values[field.name] = getattr(obj, field.name)
      except AttributeError:
        missing.append(field.name)
    if missing:
      raise TypeError(
          f'{type(obj).__name__} is not a replay config: it has no attribute(s) '
          f'{missing} (reverb_tables needs a ReplayConfig or an object with '
          f'the fields {[f.name for f in dataclasses.fields(cls)]})')
    return cls(
        seq_len=int(values['seq_len']),
        batch_size=int(values['batch_size']),
        batch_length=int(values['batch_length']),
        replay_capacity=int(values['replay_capacity']),
        online_queue=bool(values['online_queue']),
        train_ratio=float(values['train_ratio']),
        train_fill=int(values['train_fill']),
        batch_steps=int(values['batch_steps']),
        deter=int(values['deter']),
        stoch=int(values['stoch']),
        classes=int(values['classes']),
        latent_store_dtype=str(values['latent_store_dtype']),
        seed=int(values['seed']))

  def replace(self, **kwargs) -> 'ReplayConfig':
    return dataclasses.replace(self, **kwargs)


def latent_store_np_dtype(config: Union[str, Any]):
  """Numpy dtype of the stored deter (spec 5.7): uint16 bf16 bits or float32.

  ``config`` is the dtype name ('bfloat16' or 'float32'), a ReplayConfig, or
  any object with a ``latent_store_dtype`` attribute.
  """
  name = config if isinstance(config, str) else getattr(
      config, 'latent_store_dtype', None)
  if name not in LATENT_STORE_DTYPES:
    raise ValueError(f'latent_store_dtype must be one of {LATENT_STORE_DTYPES},'
                     f' got {name!r} (from {type(config).__name__})')
  return np.uint16 if name == 'bfloat16' else np.float32
