"""Broken copies of a GGUF file, each with one defect of the kinds real conversions have
had, for testing the probe (and for users checking that it finds what they fear):

  scales     one tensor's block scales multiplied by `factor` (a wrong scale dtype or
             offset in a quantiser)
  exchange   two same-shaped tensors' bytes swapped (a name mapping mistake)
  nibbles    one 4/5-bit tensor's low and high nibbles exchanged (the wrong packing order)
  unpermuted one Q or K matrix stored in Hugging Face's row order, without llama.cpp's
             permutation (a converter that skips it), re-quantised to its own type
  metadata   a metadata value changed (e.g. the RoPE base): every tensor intact
"""

from __future__ import annotations

import pathlib

import gguf
import numpy as np

from specjax.checkpoints.gguf import unpermute_rows
from specjax.formats.gguf_file import open_reader
from specjax.quant_probe import files


def _blocks(t) -> np.ndarray:
  _, size = gguf.GGML_QUANT_SIZES[t.tensor_type]
  return np.asarray(t.data).reshape(-1, size).copy()


def scales(src, dst, tensor: str, factor: float = 2.0) -> pathlib.Path:
  t = files.tensors(open_reader(src))[tensor]
  raw = _blocks(t)
  d = raw[:, :2].copy().view(np.float16)  # every block type here starts with its f16 scale
  raw[:, :2] = (d.astype(np.float32) * factor).astype(np.float16).view(np.uint8)
  return files.patched_copy(src, dst, {tensor: raw})


def exchange(src, dst, a: str, b: str) -> pathlib.Path:
  t = files.tensors(open_reader(src))
  if t[a].shape != t[b].shape or t[a].tensor_type != t[b].tensor_type:
    raise ValueError(f'{a} and {b} differ in shape or type')
  return files.patched_copy(src, dst, {a: t[b].data, b: t[a].data})


def nibbles(src, dst, tensor: str) -> pathlib.Path:
  t = files.tensors(open_reader(src))[tensor]
  raw = _blocks(t)
  qs = raw[:, -16:]
  raw[:, -16:] = (qs >> 4) | (qs << 4)
  return files.patched_copy(src, dst, {tensor: raw})


def unpermuted(src, dst, tensor: str, heads: int) -> pathlib.Path:
  t = files.tensors(open_reader(src))[tensor]
  w = unpermute_rows(files.dequantized(t), heads)
  return files.patched_copy(src, dst, {tensor: files.quantize(w, t.tensor_type)})


def metadata(src, dst, key: str, value: float) -> pathlib.Path:
  """A float32 metadata value rewritten in place (the file's layout unchanged)."""
  field = gguf.GGUFReader(src).get_field(key)
  if field is None or field.types != [gguf.GGUFValueType.FLOAT32]:
    raise ValueError(f'{key}: not a float32 field of {src}')
  data = bytearray(pathlib.Path(src).read_bytes())
  name = key.encode()
  at = data.find(len(name).to_bytes(8, 'little') + name) + 8 + len(name)  # then its type
  data[at + 4 : at + 8] = np.float32(value).tobytes()
  dst = pathlib.Path(dst)
  dst.write_bytes(bytes(data))
  return dst
