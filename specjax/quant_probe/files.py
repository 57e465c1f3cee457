"""GGUF files for the probe: a copy with some tensors' bytes replaced, the reference
re-quantised to another type (the calibration files of --config.make), and the raw and
dequantised tensors of a file in GGUF's own layout (numpy order: GGUF dims reversed)."""

from __future__ import annotations

import pathlib
import shutil

import gguf
import numpy as np

from specjax.formats.gguf_file import GGUFFile, TensorInfo, open_reader

# --config.make's names -> the types the gguf package quantises (K-quants it cannot).
MAKE_TYPES = {
  'q8_0': gguf.GGMLQuantizationType.Q8_0,
  'q4_0': gguf.GGMLQuantizationType.Q4_0,
  'q4_1': gguf.GGMLQuantizationType.Q4_1,
  'q5_0': gguf.GGMLQuantizationType.Q5_0,
  'q5_1': gguf.GGMLQuantizationType.Q5_1,
  'f16': gguf.GGMLQuantizationType.F16,
}
FLOAT_TYPES = ('F32', 'F16', 'BF16', 'F64')
# Kept at 8 bits or more when re-quantising below that, as llama.cpp's quantize keeps the
# output head (and a tied embedding, which is the head) at high precision.
KEEP_8_BITS = ('token_embd.weight', 'output.weight')


def bits_per_weight(t: gguf.GGMLQuantizationType) -> float:
  block, size = gguf.GGML_QUANT_SIZES[t]
  return 8.0 * size / block


def dequantized(t: TensorInfo) -> np.ndarray:
  """The tensor as float32 in numpy order (GGUF dims reversed)."""
  shape = tuple(reversed([int(d) for d in t.shape]))
  return np.asarray(gguf.quants.dequantize(np.asarray(t.data), t.tensor_type), np.float32).reshape(
    shape
  )


def tensors(file: GGUFFile) -> dict[str, TensorInfo]:
  return {t.name: t for t in file.tensors}


def patched_copy(src, dst, raw: dict[str, np.ndarray]) -> pathlib.Path:
  """Copies GGUF file `src` to `dst` with the named tensors' stored bytes replaced by
  `raw[name]` (the same number of bytes: the same type and shape)."""
  src, dst = pathlib.Path(src), pathlib.Path(dst)
  shutil.copyfile(src, dst)
  infos = tensors(open_reader(src))
  with open(dst, 'r+b') as f:
    for name, data in raw.items():
      t = infos[name]
      data = np.ascontiguousarray(data).view(np.uint8).ravel()
      if data.size != t.n_bytes:
        raise ValueError(f'{name}: {data.size} bytes for a tensor of {t.n_bytes}')
      f.seek(t.data_offset)
      f.write(data.tobytes())
  return dst


def quantize(w: np.ndarray, qtype: gguf.GGMLQuantizationType) -> np.ndarray:
  """`w` (numpy order) in `qtype`'s stored form (uint8 blocks; float arrays for F16/F32)."""
  if qtype == gguf.GGMLQuantizationType.F32:
    return np.asarray(w, np.float32)
  if qtype == gguf.GGMLQuantizationType.F16:
    return np.asarray(w, np.float16)
  return gguf.quants.quantize(np.asarray(w, np.float32), qtype)


def roundtrip(w: np.ndarray, qtype: gguf.GGMLQuantizationType) -> np.ndarray | None:
  """`w` quantised to `qtype` and back (None where the gguf package cannot quantise it)."""
  try:
    return np.asarray(gguf.quants.dequantize(quantize(w, qtype), qtype), np.float32).reshape(
      w.shape
    )
  except (NotImplementedError, ValueError, AssertionError):
    return None


def requantize(src, dst, name: str) -> pathlib.Path:
  """Writes `src` re-quantised: every matrix (2-D tensor whose rows fill whole blocks) in
  MAKE_TYPES[name] (the embedding and output head in q8_0 below 8 bits), the rest as
  stored; metadata copied (with gguf.GGUFReader, which keeps every field's type)."""
  qtype = MAKE_TYPES[name]
  src, dst = pathlib.Path(src), pathlib.Path(dst)
  reader = gguf.GGUFReader(src)
  arch = reader.get_field('general.architecture').contents()
  writer = gguf.GGUFWriter(dst, arch)
  for field in reader.fields.values():
    if field.name.startswith('GGUF.') or field.name == 'general.architecture':
      continue
    sub = field.types[1] if len(field.types) > 1 else None
    writer.add_key_value(field.name, field.contents(), field.types[0], sub_type=sub)
  for t in open_reader(src).tensors:
    w = dequantized(t)
    kind = qtype
    if t.name in KEEP_8_BITS and bits_per_weight(qtype) < 8:
      kind = gguf.GGMLQuantizationType.Q8_0
    if w.ndim == 2 and w.shape[-1] % gguf.GGML_QUANT_SIZES[kind][0] == 0:
      data = quantize(w, kind)
      raw = None if kind.name in FLOAT_TYPES else kind
      writer.add_tensor(t.name, data, raw_shape=None if raw is None else data.shape, raw_dtype=raw)
    else:
      writer.add_tensor(t.name, np.asarray(t.data).reshape(w.shape).copy())
  writer.write_header_to_file()
  writer.write_kv_data_to_file()
  writer.write_tensors_to_file()
  writer.close()
  return dst
