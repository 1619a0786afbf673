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
from typing import Any, Dict, Optional, Tuple, Union

import numpy as np

LATENT_STORE_DTYPES = ('float32', 'bfloat16')

# A range rule: (flag, lowest, highest or None, lowest excluded). Defined in
# this lowest layer so that every config (replay, agent, run, program) and
# the flag validators of ``experiments.options`` read the same tables.
Rule = Tuple[str, float, Optional[float], bool]


def rule_ok(rule: Rule, value) -> bool:
  """Whether ``value`` (a number, not a bool) satisfies ``rule``."""
  _, lo, hi, open_lo = rule
  if value is None or isinstance(value, bool):
    return False
  return (value > lo if open_lo else value >= lo) and (hi is None or
                                                       value <= hi)


def rule_text(rule: Rule) -> str:
  """'must be in [1, 1000]' / 'must be > 0'."""
  _, lo, hi, open_lo = rule
  if hi is not None:
    return f'must be in [{lo:g}, {hi:g}]'
  return f'must be {">" if open_lo else ">="} {lo:g}'


def check_rules(rules: Dict[str, Rule], obj) -> None:
  """ValueError naming the flag of the first field of ``obj`` that breaks
  its rule."""
  for field, rule in rules.items():
    value = getattr(obj, field)
    if not rule_ok(rule, value):
      raise ValueError(f'--{rule[0]} {rule_text(rule)}, got {value!r}')


MAX_SEED = 1_000_000   # env seeds are (seed + offsets) * 1000 + i < 2**32

# field: rule -- the one home of the replay's flag ranges. batch_length >= 2:
# one trained step is the context of the next (spec 5.1, 5.8).
REPLAY_RULES: Dict[str, Rule] = {
    'train_ratio': ('train_ratio', 0, None, True),
    'batch_size': ('batch_size', 1, None, False),
    'batch_length': ('batch_length', 2, None, False),
    'replay_capacity': ('replay_capacity', 1, None, False),
    'train_fill': ('train_fill', 0, None, False),
    'seed': ('seed', 0, MAX_SEED - 1, False),
}


def check_latent_store_dtype(name) -> str:
  """``name`` if it is a stored-deter dtype (spec 5.7), else ValueError."""
  if name not in LATENT_STORE_DTYPES:
    raise ValueError(f'latent_store_dtype must be one of {LATENT_STORE_DTYPES},'
                     f' got {name!r}')
  return name


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
    check_rules(REPLAY_RULES, self)
    for name in ('seq_len', 'batch_steps', 'deter', 'stoch', 'classes'):
      if getattr(self, name) <= 0:
        raise ValueError(f'{name} must be positive, got {getattr(self, name)}')
    if self.seq_len <= self.batch_length:
      raise ValueError(
          f'seq_len {self.seq_len} must exceed batch_length '
          f'{self.batch_length} (T + replay context, spec 5.1, 5.8)')
    if self.batch_steps != self.batch_size * self.batch_length:
      raise ValueError(
          f'batch_steps {self.batch_steps} != batch_size * '
          f'batch_length = {self.batch_size * self.batch_length} (spec 6.1)')
    if self.batch_size * self.seq_len > self.replay_capacity:
      # spec 5.1: "A capacity check asserts batch_size*length <= capacity".
      raise ValueError(
          f'--replay_capacity {self.replay_capacity} must be >= batch_size * '
          f'(batch_length + 1) = {self.batch_size * self.seq_len} (spec 5.1 '
          'capacity check)')
    check_latent_store_dtype(self.latent_store_dtype)

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
  check_latent_store_dtype(name)
  return np.uint16 if name == 'bfloat16' else np.float32
