"""Block-quantized weights (GGUF's q4_1 and q8_0) that the model functions run directly.

A `BlockWeight` keeps a matrix as llama.cpp stores it: rows of blocks of 32 values along
the contracting dimension, each block with a float16 scale `d` (and an offset `m` for
q4_1), as GGUF stores them. Read from a GGUF file (`checkpoints.gguf.load_gguf_blocks`)
it holds exactly the file's weights: SmolLM2-135M-Instruct's file is q4_1 (linear layers) and q8_0
(embeddings), so its float32 parameter tree is these blocks expanded (538 MB; the
blocks are 98 MB). `quantize_params` rounds any float32 tree to q8_0 instead.

The Llama functions multiply through `dense` (x @ w, w a tree-layout (in, out) weight),
`dense_rows` (x @ w.T, w [rows, in], a tied embedding head) and `take` (embedding
rows). For float32 arrays these are specjax's CPU kernels where they beat XLA on this
machine (kernels/cpu.py decides by measurement), else the usual jnp operations. For a
BlockWeight on XLA:CPU, with at most `kernels.cpu.MAX_ROWS` rows of x, they run
specjax/kernels/cpu_blocks.cc where it is faster than expanding the weights, which also
rounds x to 8 bits per block (as llama.cpp does for these formats): a model in blocks
is then a cheap approximation of its float32 self, for use as a draft
(drafters/model.py: `quantized`). Elsewhere (other backends, long prefills) the
weights are expanded and multiplied in float32.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct

from specjax.kernels import cpu as cpu_kernels

FORMATS = {'q4_1': 16, 'q8_0': 32}  # format -> bytes of q per block of 32 values
BLOCK = 32


@struct.dataclass
class BlockWeight:
  """A [rows, K] matrix in blocks of 32 along K (K % 32 == 0).

  qs: uint8 [rows, K/32, 16] for q4_1 (low nibble: value j, high nibble: value j + 16)
    or [rows, K/32, 32] for q8_0 (the int8 value + 128, so every byte is unsigned for
    the kernel's integer dots); d, m: float16 [rows, K/32] as GGUF stores them (m is zero
    for q8_0). `transposed`: the parameter tree's array is the
    transpose (K, rows), as for a layer weight stored (in, out); False for an embedding.
  """

  qs: jax.Array
  d: jax.Array
  m: jax.Array
  fmt: str = struct.field(pytree_node=False)
  transposed: bool = struct.field(pytree_node=False, default=True)
  rows8: bool = struct.field(pytree_node=False, default=False)  # interleave_rows8's layout

  @property
  def kind(self) -> str:
    """The block kernel that takes this layout (a kind of kernels/cpu.py TARGETS)."""
    return 'q4_1r8' if self.rows8 else self.fmt

  @property
  def rows_shape(self) -> tuple[int, int]:
    return (int(self.qs.shape[0]), int(self.qs.shape[1]) * BLOCK)

  @property
  def shape(self) -> tuple[int, int]:
    """The shape of the array it stands for in the parameter tree."""
    r, k = self.rows_shape
    return (k, r) if self.transposed else (r, k)

  @property
  def dtype(self):
    return jnp.float32

  @property
  def nbytes(self) -> int:
    return sum(
      int(np.prod(a.shape)) * np.dtype(a.dtype).itemsize for a in (self.qs, self.d, self.m)
    )

  def expand_rows(self, rows: jax.Array | None = None) -> jax.Array:
    """float32 [rows, K] (or the selected rows [..., K]): d * q + m, block by block."""
    return cpu_kernels.expand_blocks(self.kind, self.qs, self.d, self.m, rows)

  def expand(self) -> jax.Array:
    """The float32 array it stands for in the parameter tree."""
    w = self.expand_rows()
    return w.T if self.transposed else w


def is_block(x: Any) -> bool:
  return isinstance(x, BlockWeight)


def interleave_rows8(w: BlockWeight) -> BlockWeight:
  """w's q4_1 blocks in groups of 8 rows, the layout the 'q4_1r8' kernel reads
  (kernels/cpu_blocks.cc): for each group and block, 4 chunks of the 8 rows' bytes 4c..4c+3,
  then the 8 rows' scales and offsets side by side. The same arrays' shapes and bytes, so
  nothing else changes (sharding the rows splits whole groups where a shard holds a
  multiple of 8 rows); expand_rows reads it back in row order. Other weights, q4_1 with a
  row count that is not a multiple of 8, and embeddings (transposed=False: their rows are
  gathered one by one, which this layout would make a pass over the whole table) are
  returned as they are."""
  if not is_block(w) or w.fmt != 'q4_1' or w.rows8 or not w.transposed or w.rows_shape[0] % 8:
    return w
  n, nb = w.d.shape
  qs = np.asarray(w.qs).reshape(n // 8, 8, nb, 4, 4).transpose(0, 2, 3, 1, 4).reshape(n, nb, 16)
  rows = lambda a: np.asarray(a).reshape(n // 8, 8, nb).transpose(0, 2, 1).reshape(n, nb)
  return w.replace(
    qs=jnp.asarray(qs), d=jnp.asarray(rows(w.d)), m=jnp.asarray(rows(w.m)), rows8=True
  )


def for_kernels(params: dict, rows8: bool = True) -> dict:
  """A block-quantized tree as the quantized draft holds it for its kernels: `fuse`d, and
  with `rows8` its q4_1 layer weights in interleave_rows8's layout."""
  params = fuse(params)
  if rows8:
    params = jax.tree_util.tree_map(interleave_rows8, params, is_leaf=is_block)
  return params


def kernel_applies(x: jax.Array, w: BlockWeight) -> bool:
  """Whether a product of x with w runs a block kernel (trace-time decision, measured)."""
  return cpu_kernels.blocks_path(w.kind, x, w.qs, w.d, w.m) is not None


def _rows_product(x: jax.Array, w: BlockWeight) -> jax.Array:
  """x[..., K] @ rows[N, K].T: the block kernel where it beats XLA, else expanded weights."""
  out = cpu_kernels.blocks_product(w.kind, x, w.qs, w.d, w.m)
  if out is not None:
    return out
  return jnp.einsum('...K,NK->...N', x.astype(jnp.float32), w.expand_rows())


def dense(x: jax.Array, w: Any) -> jax.Array:
  """x @ w for a parameter-tree weight w[in, out] (an array or a transposed BlockWeight)."""
  if is_block(w):
    if not w.transposed:
      raise ValueError('dense() needs an (in, out) weight; dense_rows() takes an embedding')
    return _rows_product(x, w)
  return cpu_kernels.dense_product(x, w)


def dense_rows(x: jax.Array, w: Any) -> jax.Array:
  """x @ w.T for a [rows, in] matrix w, such as a tied embedding head (float32 result)."""
  if is_block(w):
    if w.transposed:
      raise ValueError('dense_rows() needs a [rows, in] matrix; dense() takes a layer weight')
    return _rows_product(x, w)
  return cpu_kernels.rows_product(x, w)


def take(w: Any, ids: jax.Array) -> jax.Array:
  """Rows `ids` of an embedding w[V, D] (an array or a BlockWeight)."""
  if is_block(w):
    return w.expand_rows(ids)
  return jnp.take(w, ids, axis=0)


def from_gguf(
  data: np.ndarray, fmt: str, k: int, transposed: bool, row_order: np.ndarray | None = None
) -> BlockWeight:
  """A BlockWeight from a GGUF tensor's bytes (uint8 [rows, bytes per row]), rows reordered
  by `row_order` (llama.cpp's Q/K permutation undone) when given."""
  if fmt not in FORMATS:
    raise ValueError(f'block format {fmt!r} is not one of {sorted(FORMATS)}')
  if k % BLOCK:
    raise ValueError(f'a {fmt} tensor needs K % 32 == 0, got K = {k}')
  header = 4 if fmt == 'q4_1' else 2
  blocks = np.ascontiguousarray(data).reshape(data.shape[0], k // BLOCK, header + FORMATS[fmt])
  if row_order is not None:
    blocks = blocks[row_order]
  d = blocks[..., 0:2].copy().view(np.float16)[..., 0]
  if fmt == 'q4_1':
    m = blocks[..., 2:4].copy().view(np.float16)[..., 0]
    qs = np.ascontiguousarray(blocks[..., header:])
  else:
    m = np.zeros_like(d)
    qs = np.ascontiguousarray(blocks[..., header:]) ^ np.uint8(0x80)  # int8 bytes -> q + 128
  return BlockWeight(qs=qs, d=d, m=m, fmt=fmt, transposed=transposed)


def quantize_q8_0(w: Any, transposed: bool = True) -> BlockWeight:
  """Rounds a float matrix in tree layout ((in, out) when `transposed`, else [rows, in])
  to q8_0: blocks of 32 along the contracting dimension, d = max |w| / 127 (float16)."""
  rows = np.asarray(w, np.float32)
  rows = rows.T if transposed else rows
  n, k = rows.shape
  if k % BLOCK:
    raise ValueError(f'q8_0 needs the contracting dimension to be a multiple of 32, got {k}')
  blocks = rows.reshape(n, k // BLOCK, BLOCK)
  d = (np.abs(blocks).max(-1) / 127.0).astype(np.float16)
  safe = np.where(d > 0, d.astype(np.float32), 1.0)[..., None]
  qs = (np.clip(np.round(blocks / safe), -127, 127) + 128).astype(np.uint8)
  return BlockWeight(qs=qs, d=d, m=np.zeros_like(d), fmt='q8_0', transposed=transposed)


def quantize_params(params: dict, keep: dict | None = None) -> dict:
  """A Llama parameter tree with every matrix rounded to q8_0 (norms stay float32).

  `keep` ({tree path: BlockWeight}, e.g. from checkpoints.gguf.load_gguf_blocks) supplies
  matrices as they are stored instead of rounding them.
  """
  keep = keep or {}

  def convert(path, leaf):
    key = tuple(getattr(k, 'key', getattr(k, 'idx', None)) for k in path)
    if key in keep:
      return keep[key]
    if np.ndim(leaf) != 2:
      return leaf
    return quantize_q8_0(leaf, transposed=key != ('embed',))

  return jax.tree_util.tree_map_with_path(convert, params)


# Products of one layer that read the same input, and the key of their fused weight.
FUSED = {'wqkv': ('wq', 'wk', 'wv'), 'w_gate_up': ('w_gate', 'w_up')}
FUSED_FLOAT = ('wqkv',)  # of those, what `fuse` joins for float matrices too


def fuse(params: dict) -> dict:
  """The tree with each layer's q, k, v weights as one `wqkv` (and, for block weights,
  gate, up as `w_gate_up`), so one product computes what three (two) did. Block weights (a
  quantized draft's) have their rows stacked; float matrices [in, out] (a target's) their
  columns joined. Each output is the same dot product either way: the kernels' sums do
  not depend on the other columns (kernels/cpu_linear.cc), so on their paths the results
  are bitwise the same.

  Why: in a one-row draft step a call's hand-off costs about as much as a small product,
  and a wider product splits better over threads; the float32 k and v products (N = 192)
  ran at half the bandwidth of the wider ones. A float32 gate|up made whole 5- and 9-row
  target forwards slower on the Xeon of BENCHMARKS.md (by 1.5-2.9 ms on the AVX2 path,
  up to 1 ms on AVX-512), so float gate and up stay apart. Layers whose parts differ in
  kind, format, row layout or dtype are left as they are. The Llama layer (models/llama.py) and
  `check_params` take either form."""

  def joined(key, ws):
    blocks = all(is_block(w) and w.transposed for w in ws)
    if blocks and len({(w.fmt, w.rows8) for w in ws}) == 1:
      stack = lambda name: np.concatenate([np.asarray(getattr(w, name)) for w in ws])
      return BlockWeight(
        qs=stack('qs'), d=stack('d'), m=stack('m'), fmt=ws[0].fmt, rows8=ws[0].rows8
      )
    plain = all(w is not None and not is_block(w) and np.ndim(w) == 2 for w in ws)
    if plain and key in FUSED_FLOAT and len({(w.shape[0], np.dtype(w.dtype)) for w in ws}) == 1:
      return np.concatenate([np.asarray(w) for w in ws], axis=1)
    return None

  def fuse_layer(layer: dict) -> dict:
    out = dict(layer)
    for key, parts in FUSED.items():
      w = joined(key, [layer.get(p) for p in parts])
      if w is not None:
        out[key] = w
        for p in parts:
          del out[p]
    return out

  return {**params, 'layers': [fuse_layer(layer) for layer in params['layers']]}


def is_fused(params: dict) -> bool:
  """Whether `fuse` has joined any layer's weights."""
  return any(key in layer for layer in params.get('layers', ()) for key in FUSED)


def nbytes(params) -> int:
  """Bytes of a parameter tree, BlockWeights counted as stored."""
  leaves = jax.tree_util.tree_leaves(params, is_leaf=is_block)
  return sum(
    x.nbytes if is_block(x) else int(np.prod(x.shape)) * np.dtype(x.dtype).itemsize for x in leaves
  )
