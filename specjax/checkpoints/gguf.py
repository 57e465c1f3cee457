"""Loads GGUF files (llama.cpp's format) of the Llama lineage into a specjax parameter tree.

    cfg, params = load_gguf(path)   # host numpy arrays, layout of specjax.models.llama

`general.architecture` may be one of ARCHS: llama (Llama 2/3, and Mistral, which llama.cpp
converts as llama), qwen2 (Q/K/V biases), qwen3 (Q/K norms) or gemma3 (Gemma 3's text model).

Every tensor is dequantised with the `gguf` package (Q4_0, Q4_1, Q5_0, Q8_0, K-quants, F16,
BF16, F32, ...). GGUF lists a tensor's dims innermost first, so a linear weight of dims
[in, out] is a numpy (out, in) array; it is transposed to the tree's (in, out). For the llama
architecture only, llama.cpp's converter permutes the rows of Q and K for its interleaved-pair
RoPE; they are permuted back to Hugging Face's half-split ("rotate_half") order, which
`specjax.models.llama` uses (qwen2, qwen3 and gemma3 are stored in that order already).

Gemma 3: llama.cpp's converter stores every norm weight (the four per layer, the Q/K norms
and the final norm) as 1 + w, the scale Gemma's RMSNorm applies. load_gguf subtracts 1 and
keeps `norm_offset=1.0`, so a GGUF Gemma 3 has the same config and tree as one loaded from
Hugging Face (specjax.checkpoints.hf), and computes (1 + w) the way transformers does.
The file does not store Gemma 3's local RoPE base (10000), its layer pattern (every 6th
layer global: layers i with (i + 1) % 6 == 0) nor query_pre_attn_scalar (key_length, except
for the 27B model: d_model / n_heads, as llama.cpp does); these are Gemma 3's constants.
"""

from __future__ import annotations

import os
import pathlib
from collections.abc import Iterator
from typing import Any

import gguf
import numpy as np
import tqdm

# Re-exported: the header reader is gguf.open_reader / read_metadata to the rest of specjax.
from specjax.formats.gguf_file import (  # noqa: F401
  GGUFFile,
  TensorInfo,
  open_reader,
  read_metadata,
)
from specjax.models.llama import LlamaConfig, Params

# Transforms from a dequantised GGUF array (numpy order) to the tree layout.
COPY = 'copy'  # norms [D] and the embedding [V, D]: already in tree layout
LINEAR = 'linear'  # (out, in) -> (in, out)
QUERY = 'query'  # un-permute rows with n_heads, then (out, in) -> (in, out)
KEY = 'key'  # un-permute rows with n_kv_heads, then (out, in) -> (in, out)

NORM = 'norm'  # Gemma 3: stored as 1 + w; minus 1, for the tree's norm_offset=1.0
BIAS = 'bias'  # Qwen2's Q/K/V biases [out]: already in tree layout

# GGUF tensor name -> tree key, transform. `lm_head` only exists when embeddings are untied.
GLOBAL_TENSORS: tuple[tuple[str, str, str], ...] = (
  ('token_embd.weight', 'embed', COPY),
  ('output_norm.weight', 'final_norm', COPY),
  ('output.weight', 'lm_head', LINEAR),
)
# blk.{i}.<name> -> params['layers'][i][key], transform.
LAYER_TENSORS: tuple[tuple[str, str, str], ...] = (
  ('blk.{i}.attn_norm.weight', 'attn_norm', COPY),
  ('blk.{i}.attn_q.weight', 'wq', QUERY),
  ('blk.{i}.attn_k.weight', 'wk', KEY),
  ('blk.{i}.attn_v.weight', 'wv', LINEAR),
  ('blk.{i}.attn_output.weight', 'wo', LINEAR),
  ('blk.{i}.ffn_norm.weight', 'mlp_norm', COPY),
  ('blk.{i}.ffn_gate.weight', 'w_gate', LINEAR),
  ('blk.{i}.ffn_up.weight', 'w_up', LINEAR),
  ('blk.{i}.ffn_down.weight', 'w_down', LINEAR),
)

# Per architecture: the layer tensors beyond (or instead of) llama's.
EXTRA_LAYER_TENSORS: dict[str, tuple[tuple[str, str, str], ...]] = {
  'qwen2': tuple((f'blk.{{i}}.attn_{x}.bias', f'b{x}', BIAS) for x in ('q', 'k', 'v')),
  'qwen3': (
    ('blk.{i}.attn_q_norm.weight', 'q_norm', COPY),
    ('blk.{i}.attn_k_norm.weight', 'k_norm', COPY),
  ),
  # Gemma 3's ffn_norm is the pre-feedforward norm (mlp_norm), as in llama.
  'gemma3': (
    ('blk.{i}.attn_q_norm.weight', 'q_norm', NORM),
    ('blk.{i}.attn_k_norm.weight', 'k_norm', NORM),
    ('blk.{i}.post_attention_norm.weight', 'attn_post_norm', NORM),
    ('blk.{i}.post_ffw_norm.weight', 'mlp_post_norm', NORM),
  ),
}
ARCHS = ('llama', 'qwen2', 'qwen3', 'gemma3')
# Gemma 3's constants that its GGUF files do not store (see the module docstring).
GEMMA3_LOCAL_ROPE_BASE = 10000.0
GEMMA3_PATTERN = 6
_REQUIRED = object()


def tensor_table(cfg: LlamaConfig) -> list[tuple[str, tuple[Any, ...], str]]:
  """Every (GGUF name, tree path, transform) of a model with config `cfg`.

  A tree path is a key sequence into the tree: ('embed',) or ('layers', 3, 'wq').
  """
  gemma = cfg.arch == 'gemma3'
  table = [
    (name, (key,), NORM if gemma and key == 'final_norm' else kind)
    for name, key, kind in GLOBAL_TENSORS
    if key != 'lm_head' or not cfg.tie_embeddings
  ]
  layer = list(LAYER_TENSORS)
  if cfg.arch != 'llama':  # stored in Hugging Face's Q/K row order
    layer = [(name, key, LINEAR if kind in (QUERY, KEY) else kind) for name, key, kind in layer]
  if gemma:
    layer = [(name, key, NORM if kind == COPY else kind) for name, key, kind in layer]
  layer += EXTRA_LAYER_TENSORS.get(cfg.arch, ())
  for i in range(cfg.n_layers):
    table += [(name.format(i=i), ('layers', i, key), kind) for name, key, kind in layer]
  return table


def unpermute_rows(w: np.ndarray, n_head: int) -> np.ndarray:
  """Undoes llama.cpp's Q/K row permutation of an (out, in) weight (interleaved -> half-split)."""
  out, inp = w.shape
  return w.reshape(n_head, out // n_head // 2, 2, inp).swapaxes(1, 2).reshape(out, inp)


def permute_rows(w: np.ndarray, n_head: int) -> np.ndarray:
  """llama.cpp's Q/K row permutation of an (out, in) weight (half-split -> interleaved)."""
  out, inp = w.shape
  return w.reshape(n_head, 2, out // n_head // 2, inp).swapaxes(1, 2).reshape(out, inp)


def to_tree_layout(w: np.ndarray, kind: str, cfg: LlamaConfig) -> np.ndarray:
  """A dequantised GGUF array (numpy order) in the tree layout, per its transform `kind`."""
  if kind in (COPY, BIAS):
    return w
  if kind == NORM:
    return w.astype(np.float32) - np.float32(1.0)
  if kind == QUERY:
    w = unpermute_rows(w, cfg.n_heads)
  elif kind == KEY:
    w = unpermute_rows(w, cfg.n_kv_heads)
  return w.T


def _source_shape(tree_shape: tuple[int, ...], kind: str) -> tuple[int, ...]:
  """The numpy shape a GGUF tensor must have to become a tree leaf of `tree_shape`."""
  return tree_shape if kind in (COPY, NORM, BIAS) else tuple(reversed(tree_shape))


def _field(reader: GGUFFile, path: pathlib.Path, key: str, default: Any = _REQUIRED):
  if key not in reader.fields:
    if default is _REQUIRED:
      raise ValueError(f'{path}: GGUF metadata key {key!r} is missing')
    return default
  return reader.fields[key]


def config_from_reader(reader: GGUFFile, path: str | os.PathLike) -> LlamaConfig:
  """The LlamaConfig described by a GGUF file's metadata (an architecture of ARCHS)."""
  path = pathlib.Path(path)
  arch = _field(reader, path, 'general.architecture')
  if arch not in ARCHS:
    raise ValueError(
      f'{path}: general.architecture {arch!r} is not supported (load_gguf reads {list(ARCHS)})'
    )
  get = lambda key, default=_REQUIRED: _field(reader, path, f'{arch}.{key}', default)
  d_model, n_heads = int(get('embedding_length')), int(get('attention.head_count'))
  n_layers = int(get('block_count'))
  head_dim = int(get('attention.key_length', d_model // n_heads))
  value_dim = int(get('attention.value_length', head_dim))
  if value_dim != head_dim:
    raise ValueError(
      f'{path}: {arch}.attention.value_length={value_dim} differs from key_length={head_dim} '
      '(not supported)'
    )
  rope_dims = int(get('rope.dimension_count', head_dim))
  if rope_dims != head_dim:
    raise ValueError(f'{path}: RoPE over {rope_dims} of {head_dim} head dims is not supported')
  scaling = get('rope.scaling.type', 'none')
  if scaling == 'linear':
    rope_scaling: tuple = ('linear', _float32(get('rope.scaling.factor')))
  elif scaling in ('none', ''):
    rope_scaling = ()
  else:
    raise ValueError(
      f"{path}: {arch}.rope.scaling.type={scaling!r} is not supported (need 'none' or 'linear')"
    )
  names = {t.name: t for t in reader.tensors}
  kwargs: dict[str, Any] = dict(qkv_bias=arch == 'qwen2', qk_norm=arch == 'qwen3')
  if arch == 'gemma3':
    # The 27B model scales queries by (d_model / n_heads) ** -0.5, the others by head_dim's.
    scalar = d_model // n_heads if (n_layers, d_model) == (62, 5376) else head_dim
    kwargs = dict(
      qk_norm=True,
      sandwich_norms=True,
      norm_offset=1.0,
      activation='gelu_tanh',
      scale_embeddings=True,
      query_scale=float(scalar) ** -0.5,
      sliding_window=int(get('attention.sliding_window')),
      layer_types=_gemma3_layer_types(get('attention.sliding_window_pattern', None), n_layers),
      rope_local_base=GEMMA3_LOCAL_ROPE_BASE,
    )
  return LlamaConfig(
    vocab_size=_vocab_size(reader, path, names, arch),
    d_model=d_model,
    n_layers=n_layers,
    n_heads=n_heads,
    n_kv_heads=int(get('attention.head_count_kv', n_heads)),
    head_dim=head_dim,
    ffn_dim=int(get('feed_forward_length')),
    rope_base=_float32(get('rope.freq_base', 10000.0)),
    norm_eps=_float32(get('attention.layer_norm_rms_epsilon')),
    tie_embeddings='output.weight' not in names,
    max_seq_len=int(get('context_length')),
    name=arch,
    arch=arch,
    rope_scaling=rope_scaling,
    **kwargs,
  )


def _gemma3_layer_types(pattern: Any, n_layers: int) -> tuple[str, ...]:
  """'sliding'/'full' per layer: from a per-layer list of booleans (True: sliding), an
  integer period, or Gemma 3's default (every 6th layer full)."""
  if isinstance(pattern, list):
    if len(pattern) != n_layers:
      raise ValueError(
        f'attention.sliding_window_pattern has {len(pattern)} entries, expected {n_layers}'
      )
    return tuple('sliding' if p else 'full' for p in pattern)
  period = int(pattern) if pattern else GEMMA3_PATTERN
  return tuple('full' if (i + 1) % period == 0 else 'sliding' for i in range(n_layers))


def _float32(value: float) -> float:
  """A float32 metadata value as the shortest decimal that rounds to it (1e-05, not 9.99e-06)."""
  return float(str(np.float32(value)))


def _vocab_size(reader: GGUFFile, path: pathlib.Path, names: dict, arch: str) -> int:
  """Number of tokens: the token list as llama.cpp does, else metadata, else the embedding."""
  tokens = reader.fields.get('tokenizer.ggml.tokens')
  if tokens is not None:
    return len(tokens)
  size = _field(reader, path, f'{arch}.vocab_size', None)
  if size is not None:
    return int(size)
  if 'token_embd.weight' not in names:
    raise ValueError(f'{path}: no token list, vocab_size or token_embd.weight to size the vocab')
  return int(names['token_embd.weight'].shape[-1])


def _dequantize(t: Any, path: pathlib.Path) -> np.ndarray:
  """A reader tensor as a float numpy array in numpy dim order (GGUF dims reversed)."""
  shape = tuple(reversed([int(d) for d in t.shape]))
  try:
    w = gguf.quants.dequantize(t.data, t.tensor_type)
  except NotImplementedError as e:
    raise ValueError(
      f'{path}: tensor {t.name!r} has type {t.tensor_type.name}, which the gguf '
      'package cannot dequantise'
    ) from e
  return w.reshape(shape)


def _set(tree: Params, path: tuple[Any, ...], value: np.ndarray) -> None:
  for key in path[:-1]:
    tree = tree[key]
  tree[path[-1]] = value


def _get(tree: Params, path: tuple[Any, ...]) -> Any:
  for key in path:
    tree = tree[key]
  return tree


def _check_names(path: pathlib.Path, table: list, tensors: dict) -> None:
  expected = {name for name, _, _ in table}
  missing = [name for name, _, _ in table if name not in tensors]
  if missing:
    raise ValueError(f'{path}: missing tensors {missing}')
  unexpected = sorted(set(tensors) - expected)
  if unexpected:
    raise ValueError(
      f'{path}: unexpected tensors {unexpected} (not part of the model the metadata '
      'describes; e.g. rope_freqs.weight means llama3 RoPE scaling, unsupported)'
    )


def _iter_leaves(
  reader: GGUFFile, cfg: LlamaConfig, path: pathlib.Path, progress: bool
) -> Iterator[tuple[tuple[Any, ...], np.ndarray, str]]:
  """Yields (tree path, source array, transform) for every tensor, shape-checked."""
  tensors = {t.name: t for t in reader.tensors}
  table = tensor_table(cfg)
  _check_names(path, table, tensors)
  shapes = cfg.param_shapes()
  for name, tree_path, kind in tqdm.tqdm(
    table, desc=f'loading {path.name}', unit='tensor', disable=not progress
  ):
    t = tensors[name]
    have = tuple(reversed([int(d) for d in t.shape]))
    want = _source_shape(tuple(_get(shapes, tree_path)), kind)
    if have != want:
      raise ValueError(
        f'{path}: tensor {name!r} has shape {have}, expected {want} from the '
        f'config (numpy order, GGUF dims reversed)'
      )
    yield tree_path, _dequantize(t, path), kind


def load_gguf(
  path: str | os.PathLike, dtype: Any = np.float32, progress: bool = True
) -> tuple[LlamaConfig, Params]:
  """Reads a GGUF file (an architecture of ARCHS) into (config, parameter tree of host numpy
  arrays in `dtype`).

  Raises:
    FileNotFoundError: no file at `path`.
    ValueError: a truncated or corrupt file, another architecture, an unsupported tensor type,
      or tensors missing, unexpected or of the wrong shape; the message names the file and the
      tensor.
  """
  path = pathlib.Path(path)
  reader = open_reader(path)
  cfg = config_from_reader(reader, path)
  params: Params = {'layers': [{} for _ in range(cfg.n_layers)]}
  for tree_path, w, kind in _iter_leaves(reader, cfg, path, progress):
    _set(params, tree_path, np.array(to_tree_layout(w, kind, cfg), dtype=dtype, order='C'))
  return cfg, params


def load_gguf_blocks(path: str | os.PathLike, cfg: LlamaConfig) -> dict[tuple[Any, ...], Any]:
  """The q4_1 and q8_0 matrices of a GGUF file as `quant.BlockWeight`s, as stored.

  Returns {tree path: BlockWeight} (see tensor_table) for every matrix of those types,
  with llama.cpp's Q/K row permutation (llama architecture) undone; other tensors are left
  out.
  """
  from specjax.models import quant

  path = pathlib.Path(path)
  reader = open_reader(path)
  tensors = {t.name: t for t in reader.tensors}
  out = {}
  for name, tree_path, kind in tensor_table(cfg):
    t = tensors.get(name)
    fmt = {'Q4_1': 'q4_1', 'Q8_0': 'q8_0'}.get(t.tensor_type.name) if t is not None else None
    if fmt is None or len(t.shape) != 2:
      continue
    rows, k = int(t.shape[1]), int(t.shape[0])
    order = None
    if kind in (QUERY, KEY):
      heads = cfg.n_heads if kind == QUERY else cfg.n_kv_heads
      order = unpermute_rows(np.arange(rows)[:, None], heads)[:, 0]
    embedding = tree_path == ('embed',)
    out[tree_path] = quant.from_gguf(
      np.asarray(t.data), fmt, k, transposed=not embedding, row_order=order
    )
  return out
