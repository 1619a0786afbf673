"""Packed storage of one replay step: one uint8 column per step (spec 5.1).

Reverb keeps, for every item and every signature column, a list of chunk
slices (and chunks and compresses each column separately). With the 11 leaves
of ``agent.types.step_spec`` as columns and one stride-1 65-step item per step,
a size12m step cost ~11.2 KB of server memory against 4,271 B of data. The
tables therefore store each step as one uint8 row of ``StepLayout.width``
bytes; the adder packs and the sampler unpacks, so the public API still takes
and returns the nested layout of ``agent.types`` with its exact dtypes. One
column leaves ~0.95 KB of Reverb bookkeeping per item (bench/replay.py).

Row layout: the leaves in ``tree.flatten`` order (sorted keys), each as its
raw bytes (encoding ``'raw'``), except large multi-byte leaves
(``latent/deter``: bf16 bits in uint16, or f32) which use encoding
``'planes'``: the most significant bit of every element (the float sign),
packed 8 per byte, then the other 7 bits of the most significant byte (the
high exponent bits) of every element, then the remaining byte planes, high to
low. Reverb compresses chunks with Snappy, which finds nothing in interleaved
bf16 bytes but compresses the exponent plane, so a size12m step takes ~3.5 KB
in a chunk instead of ~4.3 KB (~3.8 KB with plain byte planes). The transforms
are lossless (bitwise, NaN payloads included).

The layout is a deterministic function of the step spec, i.e. of
(spaces, config), and is also written into the table signature: the column's
``tf.TensorSpec`` name is ``SIGNATURE_PREFIX`` + a JSON list of
(path, shape, dtype, encoding) per leaf, so ``StepLayout.from_signature``
rebuilds it from ``client.server_info()`` (``step_spec_from_server``).

Unpacking assumes a little-endian host (x86-64, aarch64: every platform
Reverb ships for).
"""

from __future__ import annotations

import json
import sys
from typing import Any, Dict, List, Sequence, Tuple

import numpy as np
import tensorflow as tf
import tree
from dm_env import specs

if sys.byteorder != 'little':  # pragma: no cover
  raise ImportError('reverb_tables.packing assumes a little-endian host')

PACKED_KEY = 'step'
SIGNATURE_PREFIX = 'dreamer_packed_step/v1:'
RAW = 'raw'
PLANES = 'planes'
ENCODINGS = (RAW, PLANES)
# Multi-byte leaves with at least this many elements use the 'planes' encoding.
_PLANE_MIN_ELEMENTS = 256


class PackedField:
  """One leaf of the step: where and how its bytes live in the packed row."""

  __slots__ = ('path', 'name', 'shape', 'dtype', 'size', 'encoding', 'offset',
               'nbytes', '_uint', '_nsign')

  def __init__(self, path: Sequence[str], shape, dtype, encoding: str,
               offset: int):
    self.path = tuple(str(p) for p in path)
    self.name = '/'.join(self.path)
    self.shape = tuple(int(d) for d in shape)
    self.dtype = np.dtype(dtype)
    self.size = int(np.prod(self.shape, dtype=np.int64))
    if encoding not in ENCODINGS:
      raise ValueError(f'field {self.name!r}: encoding must be one of '
                       f'{ENCODINGS}, got {encoding!r}')
    if encoding == PLANES and (self.dtype.itemsize < 2 or
                               self.dtype.kind not in 'uif'):
      raise ValueError(f'field {self.name!r}: {PLANES!r} needs a multi-byte '
                       f'numeric dtype, got {self.dtype}')
    self.encoding = encoding
    self.offset = int(offset)
    self._nsign = (self.size + 7) // 8 if encoding == PLANES else 0
    self.nbytes = self._nsign + self.size * self.dtype.itemsize
    self._uint = (np.dtype(f'<u{self.dtype.itemsize}') if encoding == PLANES
                  else None)

  def write(self, rows: np.ndarray, value: np.ndarray, lead: int) -> None:
    """Writes ``value`` [lead, *shape] into ``rows`` [lead, width]."""
    n = self.size
    raw = np.ascontiguousarray(value).reshape(lead, n).view(np.uint8)
    dst = rows[:, self.offset:self.offset + self.nbytes]
    if self.encoding == RAW:
      dst[...] = raw
      return
    k = self.dtype.itemsize
    planes = raw.reshape(lead, n, k)          # little-endian bytes
    top = planes[..., k - 1]
    s = self._nsign
    dst[:, :s] = np.packbits(top >> 7, axis=-1)
    dst[:, s:s + n] = top & 0x7F
    for i, j in enumerate(range(k - 2, -1, -1)):
      dst[:, s + (i + 1) * n:s + (i + 2) * n] = planes[..., j]

  def read(self, rows: np.ndarray) -> np.ndarray:
    """Reads the field from ``rows`` [..., width] as a C-contiguous array."""
    lead = rows.shape[:-1]
    src = rows[..., self.offset:self.offset + self.nbytes]
    if self.encoding == RAW:
      out = np.ascontiguousarray(src).view(self.dtype)
      return out.reshape(lead + self.shape)
    n, s, k = self.size, self._nsign, self.dtype.itemsize
    top = np.unpackbits(src[..., :s], axis=-1, count=n)
    top <<= 7
    top |= src[..., s:s + n]
    out = top.astype(self._uint)
    for i in range(k - 1):
      out <<= 8
      out |= src[..., s + (i + 1) * n:s + (i + 2) * n]
    return out.view(self.dtype).reshape(lead + self.shape)

  def describe(self) -> list:
    return [list(self.path), list(self.shape), self.dtype.name, self.encoding]


class StepLayout:
  """Byte layout of one packed step (see module doc)."""

  def __init__(self, fields: Sequence[Tuple[Sequence[str], Any, Any, str]]):
    self.fields: List[PackedField] = []
    offset = 0
    for path, shape, dtype, encoding in fields:
      field = PackedField(path, shape, dtype, encoding, offset)
      self.fields.append(field)
      offset += field.nbytes
    self.width = offset
    if not self.fields:
      raise ValueError('StepLayout needs at least one field')
    self._by_name = {f.name: f for f in self.fields}

  # -- construction ----------------------------------------------------------
  @classmethod
  def from_step_spec(cls, step_spec) -> 'StepLayout':
    """Layout of a nested per-step spec (``agent.types.step_spec``)."""
    fields = []
    for path, spec in tree.flatten_with_path(step_spec):
      dtype = np.dtype(_np_dtype(spec.dtype))
      size = int(np.prod(spec.shape, dtype=np.int64))
      encoding = (PLANES if dtype.itemsize > 1 and dtype.kind in 'uif' and
                  size >= _PLANE_MIN_ELEMENTS else RAW)
      fields.append((path, tuple(spec.shape), dtype, encoding))
    return cls(fields)

  @classmethod
  def from_signature(cls, signature, length: int = None) -> 'StepLayout':
    """Layout recorded in a packed table signature (``signature()``).

    Raises ValueError if ``signature`` is not a packed step signature.
    """
    if not (isinstance(signature, dict) and set(signature) == {PACKED_KEY}):
      raise ValueError(
          'table signature is not a packed replay step (expected '
          f"{{'{PACKED_KEY}': uint8 [T, width]}} from "
          f'reverb_tables.tables.make_replay_tables), got {signature}')
    spec = signature[PACKED_KEY]
    name = spec.name or ''
    if not name.startswith(SIGNATURE_PREFIX):
      raise ValueError(f'packed column name {name!r} does not carry a step '
                       f'layout (prefix {SIGNATURE_PREFIX!r})')
    try:
      fields = json.loads(name[len(SIGNATURE_PREFIX):])
      for f in fields:
        if not (isinstance(f[0], list) and f[0] and
                all(isinstance(p, str) for p in f[0])):
          raise ValueError(f'bad field path {f[0]!r}')
      layout = cls([(f[0], f[1], f[2], f[3]) for f in fields])
    except (ValueError, TypeError, IndexError, KeyError) as e:
      raise ValueError(f'cannot parse packed step layout {name!r}: {e}') from e
    shape = tuple(spec.shape)
    if np.dtype(_np_dtype(spec.dtype)) != np.uint8 or len(shape) != 2 or (
        shape[1] != layout.width):
      raise ValueError(f'packed column is {spec.dtype}{list(shape)}, layout '
                       f'needs uint8 [T, {layout.width}]')
    if length is not None and shape[0] != length:
      raise ValueError(f'packed column has {shape[0]} steps, expected {length}')
    return layout

  # -- description -----------------------------------------------------------
  def describe(self) -> str:
    return SIGNATURE_PREFIX + json.dumps([f.describe() for f in self.fields],
                                         separators=(',', ':'))

  def __eq__(self, other) -> bool:
    return (isinstance(other, StepLayout) and
            self.describe() == other.describe())

  def __hash__(self) -> int:
    return hash(self.describe())

  def __repr__(self) -> str:
    return f'StepLayout(width={self.width}, fields={self.describe()})'

  def signature(self, length: int) -> Dict[str, tf.TensorSpec]:
    """Table signature: ``{'step': uint8 [length, width]}`` named by layout."""
    return {PACKED_KEY: tf.TensorSpec((length, self.width), tf.uint8,
                                      name=self.describe())}

  def step_spec(self) -> Dict[str, Any]:
    """The nested per-step dm_env specs (equal to ``agent.types.step_spec``)."""
    out: Dict[str, Any] = {}
    for f in self.fields:
      node = out
      for p in f.path[:-1]:
        node = node.setdefault(p, {})
      node[f.path[-1]] = specs.Array(f.shape, f.dtype, name=f.name)
    return out

  def field(self, name: str) -> PackedField:
    return self._by_name[name]

  # -- conversion ------------------------------------------------------------
  def pack(self, flat_values: Sequence[np.ndarray], lead: int) -> np.ndarray:
    """Flat leaves (``tree.flatten`` order, leading [lead]) -> [lead, width].

    Values must already be validated (shape and dtype of each field).
    """
    if len(flat_values) != len(self.fields):
      raise ValueError(f'pack got {len(flat_values)} leaves, layout has '
                       f'{len(self.fields)}')
    rows = np.empty((lead, self.width), np.uint8)
    for field, value in zip(self.fields, flat_values):
      field.write(rows, value, lead)
    return rows

  def unpack(self, rows: np.ndarray) -> Dict[str, Any]:
    """uint8 [..., width] -> nested dict of C-contiguous [..., *shape]."""
    rows = np.asarray(rows)
    if rows.dtype != np.uint8 or rows.shape[-1:] != (self.width,):
      raise ValueError(f'packed rows are {rows.dtype}{list(rows.shape)}, '
                       f'expected uint8 [..., {self.width}]')
    out: Dict[str, Any] = {}
    for f in self.fields:
      node = out
      for p in f.path[:-1]:
        node = node.setdefault(p, {})
      node[f.path[-1]] = f.read(rows)
    return out


def _np_dtype(dtype):
  return dtype.as_numpy_dtype if isinstance(dtype, tf.dtypes.DType) else dtype
