"""``--config_overrides``: extra DreamerConfig fields as name=value, each
checked against its field's type before anything is built or written.

``ast.literal_eval`` reads the values (Python literals, as the flag's help
says); absl has no typed multi-value flag for arbitrary dataclass fields.
"""

from __future__ import annotations

import ast
import dataclasses

from agent.config import DreamerConfig


def _field_types():
  """{DreamerConfig field: the Python type of its default} (None: Optional)."""
  return {f.name: type(f.default) for f in dataclasses.fields(DreamerConfig)}


def _is_int(v) -> bool:
  return isinstance(v, int) and not isinstance(v, bool)


# field type -> (accepts, converts, what to ask for)
_TYPE_RULES = {
    type(None): (lambda v: v is None or _is_int(v), lambda v: v,
                 'an integer or None'),        # Optional[int] (units_override)
    bool: (lambda v: isinstance(v, bool), bool, 'a bool (True or False)'),
    int: (lambda v: _is_int(v) or (isinstance(v, float) and v.is_integer()),
          int, 'an integer'),
    float: (lambda v: _is_int(v) or isinstance(v, float), float, 'a number'),
    str: (lambda v: isinstance(v, str), str, 'a string'),
    tuple: (lambda v: isinstance(v, (tuple, list)), tuple, 'a tuple'),
}


def _typed(name: str, value, kind):
  """``value`` as field ``name``'s type ``kind``; ValueError naming both."""
  if kind not in _TYPE_RULES:
    return value
  accepts, convert, want = _TYPE_RULES[kind]
  if accepts(value):
    return convert(value)
  raise ValueError(f'--config_overrides: {name}={value!r} must be {want} '
                   f'(DreamerConfig.{name} is {kind.__name__})')


def parse_overrides(entries, flagged=()) -> dict:
  """['lr=1e-4', 'online_queue=False'] -> {'lr': 1e-4, 'online_queue': False}.

  Each value is checked against the DreamerConfig field's type before
  anything is built or written (ValueError naming the field); a field in
  ``flagged`` has its own flag and is refused here
  (``experiments.options.FLAGGED_FIELDS``)."""
  types = _field_types()
  out = {}
  for entry in entries or []:
    if '=' not in entry:
      raise ValueError(f'--config_overrides entry {entry!r} is not name=value')
    name, raw = entry.split('=', 1)
    name = name.strip()
    if name not in types:
      raise ValueError(f'--config_overrides: unknown DreamerConfig field {name!r}')
    if name in flagged:
      raise ValueError(f'--config_overrides: set {name!r} with --{name}')
    try:
      value = ast.literal_eval(raw.strip())
    except (ValueError, SyntaxError):
      value = raw.strip()            # bare strings, e.g. latent_store_dtype=float32
    out[name] = _typed(name, value, types[name])
  return out
