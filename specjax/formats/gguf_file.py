"""GGUF files' headers and tensor tables, read without the model code.

A reader of its own rather than gguf.GGUFReader, which takes over ten seconds on a vocabulary
of 262k tokens (it builds a numpy view of every value of every field). Used by the tokenizer
(its `tokenizer.*` metadata) and by checkpoints/gguf.py (the weights). Imports only numpy and
the gguf package's constants; nothing else in specjax.
"""

from __future__ import annotations

import dataclasses
import os
import pathlib
import struct
from typing import Any

import gguf
import numpy as np


@dataclasses.dataclass(frozen=True)
class TensorInfo:
  """One tensor of a GGUF file, laid out as gguf.GGUFReader lays it out.

  Attributes:
    name: its GGUF name, e.g. 'blk.0.attn_q.weight'.
    shape: its GGUF dims, innermost first.
    tensor_type: its gguf.GGMLQuantizationType.
    n_bytes: its size in the file.
    data_offset: where its bytes start in the file.
    data: a read-only memory map of its bytes: float and int types as numpy arrays of numpy
      dims (GGUF dims reversed), quantised types as uint8 rows of blocks.
  """

  name: str
  shape: tuple[int, ...]
  tensor_type: gguf.GGMLQuantizationType
  n_bytes: int
  data_offset: int
  data: np.ndarray


@dataclasses.dataclass(frozen=True)
class GGUFFile:
  """A GGUF file's metadata (`fields`: key -> Python value, arrays as lists) and tensors."""

  path: pathlib.Path
  fields: dict[str, Any]
  tensors: list[TensorInfo]


_PLAIN_TYPES = {
  gguf.GGMLQuantizationType.F32: np.float32,
  gguf.GGMLQuantizationType.F16: np.float16,
  gguf.GGMLQuantizationType.F64: np.float64,
  gguf.GGMLQuantizationType.I8: np.int8,
  gguf.GGMLQuantizationType.I16: np.int16,
  gguf.GGMLQuantizationType.I32: np.int32,
  gguf.GGMLQuantizationType.I64: np.int64,
}


def _corrupt(path: pathlib.Path, problem: str) -> ValueError:
  return ValueError(
    f'{path} is not a readable GGUF file (truncated or corrupt: {problem}); '
    'delete it and fetch it again'
  )


def open_reader(path: str | os.PathLike) -> GGUFFile:
  """The metadata and tensors of a GGUF file, with clear errors for missing, truncated and
  corrupt files. Tensor data are memory-mapped, not read.

  A reader of its own rather than gguf.GGUFReader, which takes over ten seconds on a
  vocabulary of 262k tokens (it builds a numpy view of every value of every field).

  Raises:
    FileNotFoundError: no file at `path`.
    ValueError: a truncated or corrupt file (the message says to fetch it again).
  """
  path = pathlib.Path(path)
  if not path.exists():
    raise FileNotFoundError(f'GGUF file not found: {path}')
  fields, infos, data_start = _read_header(path, '', tensors=True)
  size = path.stat().st_size
  memory = np.memmap(path, dtype=np.uint8, mode='r')
  tensors, names = [], set()
  for name, dims, raw_type, offset in infos:
    if name in names:
      raise _corrupt(path, f'tensor {name!r} is listed twice')
    names.add(name)
    try:
      qtype = gguf.GGMLQuantizationType(raw_type)
      block, type_size = gguf.GGML_QUANT_SIZES[qtype]
    except (ValueError, KeyError) as e:
      raise _corrupt(path, f'tensor {name!r} has unknown type {raw_type}') from e
    np_dims = tuple(reversed(dims))
    n_bytes = int(np.prod(dims, dtype=np.int64)) * type_size // block
    start = data_start + offset
    if start + n_bytes > size:
      raise _corrupt(
        path, f'tensor {name!r} needs bytes up to {start + n_bytes}, the file has {size}'
      )
    raw = memory[start : start + n_bytes]
    if qtype in _PLAIN_TYPES:
      data = raw.view(_PLAIN_TYPES[qtype]).reshape(np_dims)
    else:
      data = raw.reshape(gguf.quants.quant_shape_to_byte_shape(np_dims, qtype))
    tensors.append(TensorInfo(name, tuple(dims), qtype, n_bytes, start, data))
  return GGUFFile(path, fields, tensors)


def read_metadata(path: str | os.PathLike, prefix: str = '') -> dict[str, Any]:
  """The metadata whose keys start with `prefix`, as Python values (arrays as lists); the
  tensors are not read.

  Raises:
    FileNotFoundError: no file at `path`.
    ValueError: not a GGUF file of version 2 or 3, or truncated; the message names the file.
  """
  path = pathlib.Path(path)
  if not path.exists():
    raise FileNotFoundError(f'GGUF file not found: {path}')
  return _read_header(path, prefix, tensors=False)[0]


# GGUF metadata value types (gguf.GGUFValueType): struct formats of the fixed-size ones.
_SCALARS = {
  0: 'B',
  1: 'b',
  2: 'H',
  3: 'h',
  4: 'I',
  5: 'i',
  6: 'f',
  7: '?',
  10: 'Q',
  11: 'q',
  12: 'd',
}
_STRING, _ARRAY = 8, 9
_MAX_DIMS = 4  # GGML_MAX_DIMS


def _read_header(path: pathlib.Path, prefix: str, tensors: bool):
  """(metadata whose keys start with `prefix`, [(name, dims, type, offset)] of the tensors when
  `tensors`, the file offset where tensor data start)."""
  with open(path, 'rb') as f:
    reader = _KVReader(f, path)
    try:
      magic, version = bytes(reader.take(4)), reader.unpack('<I')
      if magic != b'GGUF' or version not in (2, 3):
        raise _corrupt(path, f'no GGUF header of version 2 or 3 (starts with {magic!r})')
      n_tensors, n_kv = reader.unpack('<Q'), reader.unpack('<Q')
      fields, alignment = {}, gguf.GGUF_DEFAULT_ALIGNMENT
      for _ in range(n_kv):
        key = reader.string()
        kind = reader.unpack('<I')
        wanted = key.startswith(prefix)
        value = reader.value(kind, keep=wanted or key == 'general.alignment')
        if key == 'general.alignment':
          alignment = int(value)
        if wanted:
          fields[key] = value
      infos = []
      for _ in range(n_tensors if tensors else 0):
        name = reader.string()
        n_dims = reader.unpack('<I')
        if n_dims > _MAX_DIMS:
          raise _corrupt(path, f'tensor {name!r} has {n_dims} dims')
        dims = [reader.unpack('<Q') for _ in range(n_dims)]
        infos.append((name, dims, reader.unpack('<I'), reader.unpack('<Q')))
    except UnicodeDecodeError as e:
      raise _corrupt(path, f'a name or string is not UTF-8 ({e})') from e
    if alignment <= 0 or alignment & (alignment - 1):
      raise _corrupt(path, f'general.alignment {alignment} is not a power of two')
    return fields, infos, -(-reader.offset // alignment) * alignment


class _KVReader:
  """Sequential little-endian reads of GGUF header values from a file, buffered."""

  def __init__(self, f, path: pathlib.Path):
    self.f, self.path, self.size = f, path, os.fstat(f.fileno()).st_size
    self.buf, self.pos, self.start = b'', 0, 0  # self.buf begins at file offset self.start

  @property
  def offset(self) -> int:
    """The file offset of the next value."""
    return self.start + self.pos

  def take(self, n: int) -> memoryview:
    if self.offset + n > self.size:
      raise _corrupt(self.path, f'the header ends early: {n} bytes wanted at byte {self.offset}')
    if self.pos + n > len(self.buf):
      self.start += self.pos
      self.buf = self.buf[self.pos :] + self.f.read(max(n, 1 << 22))
      self.pos = 0
    view = memoryview(self.buf)[self.pos : self.pos + n]
    self.pos += n
    return view

  def unpack(self, fmt: str):
    return struct.unpack(fmt, self.take(struct.calcsize(fmt)))[0]

  def string(self) -> str:
    return str(self.take(self.unpack('<Q')), 'utf-8')

  def value(self, kind: int, keep: bool = True) -> Any:
    if kind in _SCALARS:
      return self.unpack('<' + _SCALARS[kind])
    if kind == _STRING:
      return self.string()
    if kind != _ARRAY:
      raise _corrupt(self.path, f'unknown metadata value type {kind}')
    item, count = self.unpack('<I'), self.unpack('<Q')
    if item in _SCALARS:
      data = self.take(struct.calcsize(_SCALARS[item]) * count)
      return np.frombuffer(data, '<' + _SCALARS[item]).tolist() if keep else None
    values = [self.value(item, keep) for _ in range(count)]
    return values if keep else None
