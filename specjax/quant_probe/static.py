"""Each tensor of a candidate against the reference's, before running anything.

A tensor's relative error ||c - r|| / ||r|| is judged against what its type predicts:
the reference tensor itself quantised to the candidate's type and back (the gguf
package's quantisers; for types it cannot quantise, from bits per weight). A tensor far
above its prediction is a suspect, and the probe names what it looks like: another
tensor's weights (two exchanged), rows in the other Q/K order (llama.cpp permutes Q and
K rows on conversion), a transposed matrix, 4-bit halves packed in the wrong order,
block scales that are off, or plain noise.
"""

from __future__ import annotations

import dataclasses

import gguf
import numpy as np

from specjax.checkpoints import gguf as gguf_lib
from specjax.checkpoints.gguf import permute_rows, unpermute_rows
from specjax.formats.gguf_file import GGUFFile, TensorInfo
from specjax.quant_probe import files

SUSPECT_RATIO = 3.0  # error over prediction above which a tensor is suspect
ERROR_FLOOR = 1e-3  # below this relative error nothing is suspect (float16 rounding)
MATCH_RATIO = 1.5  # a rearrangement of the reference "explains" c within this of prediction
Q4_TYPES = ('Q4_0', 'Q4_1', 'Q5_0', 'Q5_1')  # 16-byte qs of 32 nibbles: low j, high j + 16


@dataclasses.dataclass
class Finding:
  tensor: str
  type: str
  error: float  # relative error against the reference
  predicted: float  # what its type predicts
  why: str = ''

  @property
  def ratio(self) -> float:
    return self.error / max(self.predicted, 1e-12)

  @property
  def suspect(self) -> bool:
    return self.error > ERROR_FLOOR and self.ratio > SUSPECT_RATIO


def rel(a: np.ndarray, b: np.ndarray) -> float:
  return float(np.linalg.norm(a - b) / max(np.linalg.norm(b), 1e-30))


def predicted_error(r: np.ndarray, t: gguf.GGMLQuantizationType) -> float:
  """The relative error quantising `r` to `t` gives (from bits per weight where the gguf
  package cannot quantise `t`: 2.5 x 2^-bpw fits q8_0 and q4_1)."""
  if t.name == 'F32':
    return 1e-7
  back = files.roundtrip(r, t)
  if back is not None:
    return max(rel(back, r), 1e-7)
  return 2.5 * 2.0 ** -files.bits_per_weight(t)


def _swap_nibbles(t: TensorInfo) -> np.ndarray:
  """A 4/5-bit tensor dequantised with each block's low and high nibbles exchanged."""
  _, size = gguf.GGML_QUANT_SIZES[t.tensor_type]
  raw = np.asarray(t.data).reshape(-1, size).copy()
  qs = raw[:, size - 16 :]
  raw[:, size - 16 :] = (qs >> 4) | (qs << 4)
  info = dataclasses.replace(t, data=raw.reshape(np.asarray(t.data).shape))
  return files.dequantized(info)


def _block_scales(c: np.ndarray, r: np.ndarray, block: int) -> tuple[float, float] | None:
  """(fraction of blocks whose least-squares fit c = a r + b has |a - 1| > 0.1, median a)
  when such fits explain c."""
  if c.shape[-1] % block:
    return None
  cb, rb = c.reshape(-1, block), r.reshape(-1, block)
  rm, cm = rb - rb.mean(1, keepdims=True), cb - cb.mean(1, keepdims=True)
  a = (rm * cm).sum(1) / np.maximum((rm * rm).sum(1), 1e-30)
  fitted = a[:, None] * rm + cb.mean(1, keepdims=True)
  off = np.abs(a - 1) > 0.1
  if not off.any() or rel(fitted, cb) > 0.5 * rel(c, r):
    return None
  return float(off.mean()), float(np.median(a[off]))


def explain(
  name: str, c: np.ndarray, r: np.ndarray, t: TensorInfo, predicted: float, reference: dict, heads
) -> str:
  """What the suspect tensor `name` (candidate c, reference r) looks like."""
  near = MATCH_RATIO * predicted + ERROR_FLOOR
  for other, w in reference.items():
    if other != name and w.shape == c.shape and rel(c, w) < near:
      return f"holds {other.removesuffix('.weight')}'s weights: two tensors exchanged?"
  if heads and c.ndim == 2:
    for fn, order in ((unpermute_rows, 'Hugging Face'), (permute_rows, 'another')):
      try:
        if rel(c, fn(r, heads)) < near:
          return f'rows in {order} order: the Q/K rows were not permuted as llama.cpp stores them'
      except ValueError:
        pass
  if c.ndim == 2 and c.shape[0] == c.shape[1] and rel(c, r.T) < near:
    return 'transposed'
  if t.tensor_type.name in Q4_TYPES and rel(_swap_nibbles(t), r) < near:
    return '4-bit halves packed in the wrong order'
  block = gguf.GGML_QUANT_SIZES[t.tensor_type][0]
  scales = _block_scales(c, r, block) if block > 1 else None
  if scales is not None:
    frac, a = scales
    return f'block scales off (x{a:.2f}) in {100 * frac:.0f}% of blocks'
  return 'noise far above its type'


@dataclasses.dataclass
class Reference:
  """The reference's tensors by GGUF name, as float32 in GGUF's layout (numpy order), and
  its GGUF metadata (None for a Hugging Face directory: then its config is compared)."""

  arrays: dict[str, np.ndarray]
  fields: dict | None
  cfg: object  # its LlamaConfig


def gguf_reference(file: GGUFFile, cfg) -> Reference:
  return Reference({t.name: files.dequantized(t) for t in file.tensors}, file.fields, cfg)


def tree_reference(cfg, params) -> Reference:
  """A reference loaded into specjax's tree (a Hugging Face directory) in GGUF's names and
  layout: matrices (out, in), Q/K rows permuted as llama.cpp stores them, Gemma 3's norms
  as 1 + w."""
  arrays = {}
  for name, path, kind in gguf_lib.tensor_table(cfg):
    w = params
    for key in path:
      w = w[key]
    w = np.asarray(w, np.float32)
    if kind == gguf_lib.NORM:
      w = w + np.float32(1.0)
    elif kind == gguf_lib.QUERY:
      w = permute_rows(w.T, cfg.n_heads)
    elif kind == gguf_lib.KEY:
      w = permute_rows(w.T, cfg.n_kv_heads)
    elif kind == gguf_lib.LINEAR:
      w = w.T
    arrays[name] = np.ascontiguousarray(w)
  return Reference(arrays, None, cfg)


def compare_files(
  reference: Reference, candidate: GGUFFile, heads: dict[str, int]
) -> list[Finding]:
  """A Finding per tensor (float vectors included), then per differing metadata key (or
  config field); `heads` maps Q/K tensor names to their head counts (for the row-order
  check). Shape mismatches and missing tensors are findings too."""
  ref_w = reference.arrays
  out = []
  for t in candidate.tensors:
    r = ref_w.get(t.name)
    if r is None:
      if reference.fields is not None:  # (a tree reference holds only what the model reads)
        out.append(Finding(t.name, t.tensor_type.name, 1.0, 0.0, 'not in the reference'))
      continue
    c = files.dequantized(t)
    if c.shape != r.shape:
      why = f'shape {c.shape}, the reference has {r.shape}'
      out.append(Finding(t.name, t.tensor_type.name, 1.0, 0.0, why))
      continue
    predicted = predicted_error(r, t.tensor_type)
    f = Finding(t.name, t.tensor_type.name, rel(c, r), predicted)
    if f.suspect:
      f.why = explain(t.name, c, r, t, predicted, ref_w, heads.get(t.name))
    out.append(f)
  missing = set(ref_w) - {t.name for t in candidate.tensors}
  out += [Finding(n, '-', 1.0, 0.0, 'missing from the candidate') for n in sorted(missing)]
  if reference.fields is not None:
    return out + compare_metadata(reference.fields, candidate.fields)
  cand_cfg = gguf_lib.config_from_reader(candidate, candidate.path)
  return out + compare_configs(reference.cfg, cand_cfg)


def compare_configs(reference, candidate) -> list[Finding]:
  """A suspect Finding per model setting (LlamaConfig field but its name) that differs."""
  out = []
  for field in dataclasses.fields(reference):
    r, c = getattr(reference, field.name), getattr(candidate, field.name)
    if field.name != 'name' and r != c:
      why = f'{c!r} where the reference has {r!r}'
      out.append(Finding(f'config {field.name}', '-', 1.0, 0.0, why))
  return out


IGNORED_METADATA = ('general.',)  # names, licences, file type: free to differ


def compare_metadata(reference: dict, candidate: dict) -> list[Finding]:
  """A suspect Finding per metadata key (outside general.*) whose value differs from the
  reference's, or that one of them lacks: the architecture's settings and the tokenizer."""
  out = []
  for key in sorted(set(reference) | set(candidate)):
    if key.startswith(IGNORED_METADATA):
      continue
    r, c = reference.get(key), candidate.get(key)
    if r != c:
      show = lambda v: repr(v) if not isinstance(v, list) else f'a list of {len(v)}'  # noqa: E731
      why = f'{show(c)} where the reference has {show(r)}'
      out.append(Finding(f'metadata {key}', '-', 1.0, 0.0, why))
  return out


def qk_heads(cfg) -> dict[str, int]:
  """GGUF names of the Q and K matrices -> their head counts (llama architecture only:
  the others store Hugging Face's order)."""
  if cfg.arch != 'llama':
    return {}
  out = {}
  for i in range(cfg.n_layers):
    out[f'blk.{i}.attn_q.weight'] = cfg.n_heads
    out[f'blk.{i}.attn_k.weight'] = cfg.n_kv_heads
  return out
