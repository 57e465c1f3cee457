"""The Llama lineage of decoders as pure functions over a plain parameter pytree: Llama
(2 and 3.x, with Llama-3 RoPE scaling), Mistral (sliding-window attention), Qwen2 / Qwen2.5
(Q, K, V biases), Qwen3 (Q/K norms) and Gemma 3 (interleaved local sliding-window and
global layers with their own RoPE bases, Q/K norms, norms before and after each block
with a (1 + w) scale, scaled embeddings, GeGLU). One decoder with static switches in
`LlamaConfig` serves them all; `cfg.arch` names the family a config belongs to.

It implements the model contract (specjax/core/contract.py; `FAMILY`, reached from a
config as `cfg.family`), shared by drafts and targets:

    forward(params, tokens[B, T], cache, cfg) -> ForwardOut(logits[B, T, V], cache, ...)

`tokens` are written into the cache at each row's own position (`cache.lengths`),
attend to everything before them in that row, and the returned cache has every
row's length advanced by T. Rolling a row back is lowering its length.

Parameter tree (weights stored (in, out), so that a layer is `x @ w`):

    {'embed': [V, D],
     'layers': [{'attn_norm': [D], 'wq': [D, N*H], 'wk': [D, G*H], 'wv': [D, G*H],
                 'wo': [N*H, D], 'mlp_norm': [D],
                 'w_gate': [D, F], 'w_up': [D, F], 'w_down': [F, D],
                 # qkv_bias: 'bq': [N*H], 'bk': [G*H], 'bv': [G*H]
                 # qk_norm: 'q_norm': [H], 'k_norm': [H]
                 # sandwich_norms: 'attn_post_norm': [D], 'mlp_post_norm': [D]
                 }, ...],   # L layers
     'final_norm': [D],
     'lm_head': [D, V]}            # only when embeddings are not tied

Any matrix may instead be a `quant.BlockWeight` standing for that array (GGUF q4_1 or
q8_0 blocks; models/quant.py): the products go through `quant.dense`, the embedding
lookup through `quant.take`.

Q and K rows are in Hugging Face order (half-split "rotate_half" RoPE).
Dimension letters: B batch, T new tokens, S cache slots, V vocabulary, D model
width, F hidden width, N query heads, G kv heads, R = N // G, H head dim.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from specjax.core import contract
from specjax.kernels import cpu
from specjax.models import quant
from specjax.models.kv_cache import KVCache
from specjax.models.quant import dense

Params = dict[str, Any]


@dataclasses.dataclass(frozen=True)
class LlamaConfig:
  """Static, hashable architecture description (usable as a jit static argument)."""

  vocab_size: int
  d_model: int
  n_layers: int
  n_heads: int
  n_kv_heads: int
  head_dim: int
  ffn_dim: int
  rope_base: float = 10000.0
  norm_eps: float = 1e-5
  tie_embeddings: bool = True
  max_seq_len: int = 2048
  name: str = 'llama'
  arch: str = 'llama'  # the family: one of ARCHS
  qkv_bias: bool = False  # Qwen2: biases on the Q, K and V projections
  qk_norm: bool = False  # Qwen3, Gemma 3: RMSNorm over each head's queries and keys
  sandwich_norms: bool = False  # Gemma 3: a norm after attention and after the MLP too
  norm_offset: float = 0.0  # Gemma: norms scale by (offset + w)
  activation: str = 'silu'  # the gated MLP's: 'silu' (SwiGLU) or 'gelu_tanh' (GeGLU)
  scale_embeddings: bool = False  # Gemma: embeddings times sqrt(d_model)
  query_scale: float = 0.0  # attention scores' scale; 0: head_dim ** -0.5
  sliding_window: int = 0  # keys within this many positions of the query; 0: none
  # Per layer, 'sliding' or 'full' (Gemma 3 interleaves them); () with a window: all sliding.
  layer_types: tuple[str, ...] = ()
  rope_local_base: float = 0.0  # sliding layers' RoPE base (Gemma 3); 0: rope_base
  # RoPE scaling of the full layers: () none, ('linear', factor), or ('llama3', factor,
  # low_freq_factor, high_freq_factor, original_max_position_embeddings).
  rope_scaling: tuple = ()

  def __post_init__(self):
    for field in (
      'vocab_size',
      'd_model',
      'n_layers',
      'n_heads',
      'n_kv_heads',
      'head_dim',
      'ffn_dim',
      'max_seq_len',
    ):
      value = getattr(self, field)
      if not isinstance(value, (int, np.integer)) or value <= 0:
        raise ValueError(f'LlamaConfig.{field} must be a positive integer, got {value!r}')
    if self.n_heads % self.n_kv_heads:
      raise ValueError(
        f'LlamaConfig.n_heads ({self.n_heads}) must be a multiple of n_kv_heads ({self.n_kv_heads})'
      )
    if self.head_dim % 2:
      raise ValueError(f'LlamaConfig.head_dim must be even for RoPE, got {self.head_dim}')
    if self.rope_base <= 0 or self.norm_eps <= 0:
      raise ValueError(
        f'LlamaConfig.rope_base and norm_eps must be positive, got '
        f'{self.rope_base} and {self.norm_eps}'
      )
    if self.arch not in ARCHS:
      raise ValueError(f'LlamaConfig.arch must be one of {ARCHS}, got {self.arch!r}')
    if self.activation not in ACTIVATIONS:
      raise ValueError(
        f'LlamaConfig.activation must be one of {tuple(ACTIVATIONS)}, got {self.activation!r}'
      )
    if self.sliding_window < 0 or self.query_scale < 0 or self.rope_local_base < 0:
      raise ValueError('LlamaConfig.sliding_window, query_scale and rope_local_base must be >= 0')
    object.__setattr__(self, 'layer_types', tuple(self.layer_types))
    object.__setattr__(self, 'rope_scaling', tuple(self.rope_scaling))
    if self.layer_types and (
      len(self.layer_types) != self.n_layers
      or any(t not in ('sliding', 'full') for t in self.layer_types)
    ):
      raise ValueError(
        f"LlamaConfig.layer_types needs 'sliding' or 'full' for each of the {self.n_layers} "
        f'layers, got {self.layer_types}'
      )
    if 'sliding' in self.layer_types and not self.sliding_window:
      raise ValueError('LlamaConfig.layer_types has sliding layers but sliding_window is 0')
    kind = self.rope_scaling[0] if self.rope_scaling else None
    if kind not in (None, 'linear', 'llama3') or (
      len(self.rope_scaling) != {None: 0, 'linear': 2, 'llama3': 5}.get(kind, -1)
    ):
      raise ValueError(
        "LlamaConfig.rope_scaling must be (), ('linear', factor) or ('llama3', factor, "
        f'low_freq_factor, high_freq_factor, original_max_position_embeddings), got '
        f'{self.rope_scaling}'
      )

  def is_sliding(self, i: int) -> bool:
    """Whether layer i attends within the sliding window."""
    if not self.sliding_window:
      return False
    return not self.layer_types or self.layer_types[i] == 'sliding'

  @property
  def family(self) -> contract.Family:
    """The functions of this architecture (the model contract, specjax/core/contract.py)."""
    return FAMILY

  @property
  def num_params(self) -> int:
    shapes = jax.tree_util.tree_leaves(self.param_shapes(), is_leaf=lambda x: isinstance(x, tuple))
    return int(sum(np.prod(s) for s in shapes))

  def param_shapes(self) -> Params:
    """Shapes of every parameter, in the layout described in the module docstring."""
    d, f = self.d_model, self.ffn_dim
    nh, gh = self.n_heads * self.head_dim, self.n_kv_heads * self.head_dim
    layer = {
      'attn_norm': (d,),
      'wq': (d, nh),
      'wk': (d, gh),
      'wv': (d, gh),
      'wo': (nh, d),
      'mlp_norm': (d,),
      'w_gate': (d, f),
      'w_up': (d, f),
      'w_down': (f, d),
    }
    if self.qkv_bias:
      layer.update(bq=(nh,), bk=(gh,), bv=(gh,))
    if self.qk_norm:
      layer.update(q_norm=(self.head_dim,), k_norm=(self.head_dim,))
    if self.sandwich_norms:
      layer.update(attn_post_norm=(d,), mlp_post_norm=(d,))
    shapes = {
      'embed': (self.vocab_size, d),
      'layers': [dict(layer) for _ in range(self.n_layers)],
      'final_norm': (d,),
    }
    if not self.tie_embeddings:
      shapes['lm_head'] = (d, self.vocab_size)
    return shapes


def init_params(cfg: LlamaConfig, key: jax.Array, dtype=jnp.float32, scale: float = 0.02) -> Params:
  """Random parameters: normal(0, scale) matrices and biases; norms of weight 1, or for a
  norm offset (Gemma's 1 + w) weight normal(0, scale), so they scale by about 1."""
  shapes = cfg.param_shapes()
  leaves, treedef = jax.tree_util.tree_flatten_with_path(
    shapes, is_leaf=lambda x: isinstance(x, tuple)
  )
  keys = jax.random.split(key, len(leaves))
  out = []
  for k, (path, s) in zip(keys, leaves):
    w = scale * jax.random.normal(k, s, jnp.float32)
    if jax.tree_util.keystr(path).endswith("norm']"):
      w = w if cfg.norm_offset else jnp.ones(s, jnp.float32)
    out.append(w.astype(dtype))
  return jax.tree_util.tree_unflatten(treedef, out)


def check_params(cfg: LlamaConfig, params: Params, source: str = 'params') -> None:
  """Raises ValueError naming the first tensor whose shape disagrees with `cfg`."""
  expected = cfg.param_shapes()
  if set(params) != set(expected):
    raise ValueError(
      f'{source}: parameter groups {sorted(params)} do not match the '
      f'config, expected {sorted(expected)}'
    )
  if len(params['layers']) != cfg.n_layers:
    raise ValueError(f'{source}: {len(params["layers"])} layers, config says {cfg.n_layers}')
  flat = jax.tree_util.tree_flatten_with_path(params, is_leaf=quant.is_block)[0]
  layers = [_as_fused(w, p) for w, p in zip(expected['layers'], params['layers'])]
  expected = {**expected, 'layers': layers}
  want = dict(
    jax.tree_util.tree_flatten_with_path(expected, is_leaf=lambda x: isinstance(x, tuple))[0]
  )
  for path, leaf in flat:
    if path not in want:
      raise ValueError(f'{source}: unexpected parameter {jax.tree_util.keystr(path)}')
    if tuple(leaf.shape) != tuple(want[path]):
      raise ValueError(
        f'{source}: parameter {jax.tree_util.keystr(path)} has shape '
        f'{tuple(leaf.shape)}, expected {tuple(want[path])}'
      )


def _as_fused(shapes: dict, layer: dict) -> dict:
  """A layer's expected shapes with the weights `layer` holds fused (models/quant.fuse)
  joined as it joins them: [in, sum of outs]."""
  shapes = dict(shapes)
  for key, parts in quant.FUSED.items():
    if key in layer and all(p in shapes for p in parts):
      outs = [shapes.pop(p) for p in parts]
      shapes[key] = (outs[0][0], sum(s[1] for s in outs))
  return shapes


def rms_norm(x: jax.Array, weight: jax.Array, eps: float, offset: float = 0.0) -> jax.Array:
  """RMSNorm over the last axis, scaled by (offset + weight), computed in float32."""
  x32 = x.astype(jnp.float32)
  x32 = x32 * jax.lax.rsqrt(jnp.mean(x32 * x32, axis=-1, keepdims=True) + eps)
  return (x32 * (offset + weight.astype(jnp.float32))).astype(x.dtype)


ARCHS = ('llama', 'mistral', 'qwen2', 'qwen3', 'gemma3')
ACTIVATIONS = {'silu': jax.nn.silu, 'gelu_tanh': lambda x: jax.nn.gelu(x, approximate=True)}


def inverse_frequencies(head_dim: int, base: float, scaling: tuple = ()) -> np.ndarray:
  """RoPE's [H/2] inverse frequencies, with Llama-3 or linear scaling (see LlamaConfig)."""
  inv_freq = base ** (-np.arange(0, head_dim, 2, dtype=np.float64) / head_dim)
  if not scaling:
    return inv_freq.astype(np.float32)
  factor = scaling[1]
  if scaling[0] == 'linear':
    return (inv_freq / factor).astype(np.float32)
  _, factor, low, high, original = scaling  # Llama 3.1: long wavelengths slowed by `factor`
  wavelen = 2 * np.pi / inv_freq
  smooth = (original / wavelen - low) / (high - low)
  mixed = (1 - smooth) * inv_freq / factor + smooth * inv_freq
  out = np.where(wavelen > original / low, inv_freq / factor, inv_freq)
  medium = (wavelen <= original / low) & (wavelen >= original / high)
  return np.where(medium, mixed, out).astype(np.float32)


def rope_tables(positions: jax.Array, head_dim: int, base: float, scaling: tuple = ()):
  """cos and sin tables [B, T, 1, H/2] for integer positions [B, T]."""
  inv_freq = jnp.asarray(inverse_frequencies(head_dim, base, scaling))
  angles = positions.astype(jnp.float32)[..., None] * inv_freq  # [B, T, H/2]
  return jnp.cos(angles)[:, :, None, :], jnp.sin(angles)[:, :, None, :]


def apply_rope(x: jax.Array, cos: jax.Array, sin: jax.Array) -> jax.Array:
  """Half-split RoPE on x[B, T, heads, H]."""
  x1, x2 = jnp.split(x.astype(jnp.float32), 2, axis=-1)
  out = jnp.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1)
  return out.astype(x.dtype)


def _cache_scores(q: jax.Array, k: jax.Array) -> jax.Array:
  """q[B, T, G, R, H] . k[B, G, S, H] -> float32 scores [B, G, R, T, S], as one batched
  matmul per (row, KV head): the head-major cache needs no transpose (~1.7x faster on CPU
  than contracting a [B, S, G, H] cache)."""
  b, t, g, r, h = q.shape
  q = q.transpose(0, 2, 3, 1, 4).reshape(b, g, r * t, h)
  scores = jnp.einsum('BGQH,BGSH->BGQS', q, k, preferred_element_type=jnp.float32)
  return scores.reshape(b, g, r, t, k.shape[2])


def _cache_values(probs: jax.Array, v: jax.Array) -> jax.Array:
  """probs[B, G, R, T, S] . v[B, G, S, H] -> [B, T, G, R, H]."""
  b, g, r, t, s = probs.shape
  out = jnp.einsum('BGQS,BGSH->BGQH', probs.reshape(b, g, r * t, s).astype(v.dtype), v)
  return out.reshape(b, g, r, t, v.shape[-1]).transpose(0, 3, 1, 2, 4)


def attention(
  q: jax.Array, k: jax.Array, v: jax.Array, mask: jax.Array, scale: float = 0.0
) -> jax.Array:
  """Grouped-query attention.

  q[B, T, N, H] against the whole cache k, v[B, G, S, H] (head-major, as KVCache stores
  them); mask[B, T, S] says which slots each query sees; scores are scaled by `scale`
  (0: H ** -0.5). Returns [B, T, N, H].
  """
  scale = scale or q.shape[-1] ** -0.5
  out = cpu.attention(q, k, v, mask, scale, xla_attention)  # None: XLA's is faster here
  return xla_attention(q, k, v, mask, scale) if out is None else out


def xla_attention(q: jax.Array, k: jax.Array, v: jax.Array, mask: jax.Array, scale: float):
  """`attention` in XLA's operations (the reference the CPU kernel must equal)."""
  b, t, n, h = q.shape
  g = k.shape[1]
  scores = _cache_scores(q.reshape(b, t, g, n // g, h), k) * scale
  scores = jnp.where(mask[:, None, None], scores, -1e30)
  probs = jax.nn.softmax(scores, axis=-1)
  return _cache_values(probs, v).reshape(b, t, n, h)


def write_slots(buffer: jax.Array, new: jax.Array, positions: jax.Array) -> jax.Array:
  """buffer[b, :, positions[b, t]] = new[b, t] for a head-major buffer [B, G, S, H] and
  new[B, T, G, H]; writes past the end are dropped.

  The scatter goes through a [B * G, S, H] view, so each update is one contiguous H-vector:
  scattering into [B, G, S, H] directly made XLA:CPU's decode step ~1.5x slower.
  """
  b, g, s, h = buffer.shape
  flat = buffer.reshape(b * g, s, h)  # row-major: a free view
  heads = (jnp.arange(b)[:, None] * g + jnp.arange(g)[None])[:, :, None]  # [B, G, 1]
  slots = jnp.broadcast_to(positions[:, None, :], (b, g, positions.shape[1]))  # [B, G, T]
  flat = flat.at[jnp.broadcast_to(heads, slots.shape), slots].set(
    new.transpose(0, 2, 1, 3).astype(buffer.dtype), mode='drop'
  )
  return flat.reshape(b, g, s, h)


def layer(
  p: Params,
  x: jax.Array,
  cos: jax.Array,
  sin: jax.Array,
  cfg: LlamaConfig,
  attend,
) -> jax.Array:
  """One decoder layer on x[B, T, D] with weights `p`; attention is left to
  `attend(q[B, T, N, H], k[B, T, G, H], v[B, T, G, H]) -> [B, T, N, H]` (RoPE applied)."""
  b, t, _ = x.shape
  n, g, h = cfg.n_heads, cfg.n_kv_heads, cfg.head_dim
  norm = lambda y, w: rms_norm(y, w, cfg.norm_eps, cfg.norm_offset)
  y = norm(x, p['attn_norm'])
  if 'wqkv' in p:  # one product for the three (models/quant.fuse)
    q, k, v = jnp.split(dense(y, p['wqkv']), (n * h, (n + g) * h), axis=-1)
  else:
    q, k, v = dense(y, p['wq']), dense(y, p['wk']), dense(y, p['wv'])
  if cfg.qkv_bias:
    q, k, v = q + p['bq'].astype(q.dtype), k + p['bk'].astype(k.dtype), v + p['bv'].astype(v.dtype)
  q, k, v = q.reshape(b, t, n, h), k.reshape(b, t, g, h), v.reshape(b, t, g, h)
  if cfg.qk_norm:
    q, k = norm(q, p['q_norm']), norm(k, p['k_norm'])
  q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
  y = dense(attend(q, k, v).reshape(b, t, n * h), p['wo'])
  x = x + (norm(y, p['attn_post_norm']) if cfg.sandwich_norms else y)
  y = norm(x, p['mlp_norm'])
  act = ACTIVATIONS[cfg.activation]
  if 'w_gate_up' in p:
    gate, up = jnp.split(dense(y, p['w_gate_up']), 2, axis=-1)
  else:
    gate, up = dense(y, p['w_gate']), dense(y, p['w_up'])
  y = dense(act(gate) * up, p['w_down'])
  return x + (norm(y, p['mlp_post_norm']) if cfg.sandwich_norms else y)


def _decoder(
  params: Params,
  tokens: jax.Array,
  positions: jax.Array,
  cfg: LlamaConfig,
  layers: tuple[int, ...] | None,
  attend,
  capture: tuple[int, ...] = (),
):
  """The decoder stack with attention left to `attend(i, q, k, v) -> [B, T, N, H]` (layer i's
  queries and new keys/values, RoPE applied); returns final-normed hidden states [B, T, D].

  With `capture` (static layer indices in [0, n_layers]) it returns (hidden, features):
  the residual stream entering each captured layer (n_layers: the stack's output before
  the final norm; Hugging Face's hidden_states[i]), concatenated to [B, T, len(capture) * D].
  """
  full = rope_tables(positions, cfg.head_dim, cfg.rope_base, cfg.rope_scaling)
  local = full
  if cfg.rope_local_base and any(cfg.is_sliding(i) for i in range(cfg.n_layers)):
    local = rope_tables(positions, cfg.head_dim, cfg.rope_local_base)
  x = quant.take(params['embed'], tokens)  # [B, T, D]
  if cfg.scale_embeddings:  # in the embedding's dtype, as Gemma does
    x = x * jnp.asarray(cfg.d_model**0.5, x.dtype)
  taken = {}
  for i in range(cfg.n_layers) if layers is None else layers:
    if i in capture:
      taken[i] = x
    cos, sin = local if cfg.is_sliding(i) else full
    x = layer(params['layers'][i], x, cos, sin, cfg, lambda q, k, v, i=i: attend(i, q, k, v))
  taken[cfg.n_layers] = x
  out = rms_norm(x, params['final_norm'], cfg.norm_eps, cfg.norm_offset)
  if not capture:
    return out
  return out, jnp.concatenate([taken[i] for i in capture], axis=-1)


def check_capture(cfg: LlamaConfig, capture: tuple[int, ...]) -> None:
  """Raises ValueError unless `capture` names distinct layer indices in [0, n_layers]."""
  if len(set(capture)) != len(capture) or any(
    not isinstance(i, int) or not 0 <= i <= cfg.n_layers for i in capture
  ):
    raise ValueError(
      f'captured layers must be distinct indices in [0, {cfg.n_layers}] (the residual stream '
      f'entering that layer), got {capture}'
    )


def _forward_at(params, tokens, cache, cfg, positions, slots, mask, layers, capture):
  """The decoder with tokens[B, T] at RoPE `positions`, their keys and values written at
  cache `slots` [B, T] (past the end: dropped), attending to the slots mask[B, T, S]
  allows after the write. Returns (hidden, cache with lengths unchanged[, features])."""
  new_k, new_v = list(cache.k), list(cache.v)
  windowed = mask
  if cfg.sliding_window:  # keys at positions > the query's - window (slot = position in context)
    near = jnp.arange(mask.shape[-1])[None, None, :] > positions[:, :, None] - cfg.sliding_window
    windowed = mask & near

  def attend(i, q, k, v):
    new_k[i] = write_slots(cache.k[i], k, slots)
    new_v[i] = write_slots(cache.v[i], v, slots)
    return attention(
      q, new_k[i], new_v[i], windowed if cfg.is_sliding(i) else mask, cfg.query_scale
    )

  out = _decoder(params, tokens, positions, cfg, layers, attend, capture)
  cache = KVCache(k=new_k, v=new_v, lengths=cache.lengths)
  return (out, cache) if not capture else (out[0], cache, out[1])


def move_slots(cache: KVCache, src: jax.Array, dst: jax.Array) -> KVCache:
  """Copies every layer's slot src[b, k] to dst[b, k] (all read before any write; writes
  past the end are dropped): an accepted tree path made contiguous."""

  def move(buffer):
    b, g, s, h = buffer.shape
    flat = buffer.reshape(b * g, s, h)
    heads = (jnp.arange(b)[:, None] * g + jnp.arange(g)[None])[:, :, None]  # [B, G, 1]
    take = lambda pos: jnp.broadcast_to(pos[:, None, :], (b, g, pos.shape[1]))
    rows = jnp.broadcast_to(heads, take(src).shape)
    moved = flat[rows, jnp.clip(take(src), 0, s - 1)]  # [B, G, K, H]
    return flat.at[rows, take(dst)].set(moved, mode='drop').reshape(b, g, s, h)

  return cache.replace(k=[move(k) for k in cache.k], v=[move(v) for v in cache.v])


def logits_from_hidden(params: Params, x: jax.Array, cfg: LlamaConfig) -> jax.Array:
  """Output head: hidden [..., D] -> float32 logits [..., V].

  A tied head of a 2-4 row forward runs specjax's CPU kernel on XLA:CPU (a tenth of a
  2-token verification forward; specjax/kernels/cpu.py).
  """
  w = params['embed'] if cfg.tie_embeddings else params['lm_head']
  if not quant.is_block(w) and w.dtype != jnp.float32:  # bfloat16: accumulate in float32
    rows = 'VD' if cfg.tie_embeddings else 'DV'
    return jnp.einsum(f'...D,{rows}->...V', x, w, preferred_element_type=jnp.float32)
  if cfg.tie_embeddings:
    logits = quant.dense_rows(x, w)
  else:
    logits = dense(x, w)
  return logits.astype(jnp.float32)


def forward(
  params: Params,
  tokens: jax.Array,
  cache: KVCache,
  cfg: LlamaConfig,
  layers: tuple[int, ...] | None = None,
  *,
  capture: tuple[int, ...] = (),
  at: contract.At | None = None,
  head: bool = True,
) -> contract.ForwardOut:
  """The model contract's forward (specjax/core/contract.py): tokens[B, T] written at each
  row's length (the cache advanced by T), or where `at` says (token trees: the lengths left
  as they were). `layers` (static) runs a subset, in order, for self-speculative drafts;
  skipped layers keep their cache untouched. `capture` also returns the residual stream
  entering those layers (see _decoder); head=False skips the output head.
  """
  lengths = None if at is not None else cache.lengths + tokens.shape[1]
  if at is None:
    positions = cache.lengths[:, None] + jnp.arange(tokens.shape[1], dtype=jnp.int32)  # [B, T]
    mask = jnp.arange(cache.cache_size)[None, None, :] <= positions[:, :, None]  # [B, T, S]
    at = contract.At(positions, positions, mask)
  out = _forward_at(params, tokens, cache, cfg, at.positions, at.slots, at.mask, layers, capture)
  hidden, cache = out[:2]
  if lengths is not None:
    cache = cache.with_lengths(lengths)
  logits = logits_from_hidden(params, hidden, cfg) if head else None
  return contract.ForwardOut(logits, cache, out[2] if capture else None, hidden)


def init_cache(cfg: LlamaConfig, batch: int, cache_size: int, dtype=jnp.float32) -> KVCache:
  """An empty cache of `cache_size` slots per row."""
  return KVCache.init(cfg, batch, cache_size, dtype)


FAMILY = contract.Family(
  name='llama',
  forward=forward,
  logits=logits_from_hidden,
  init_cache=init_cache,
  check_params=check_params,
  move_slots=move_slots,
  fuse=quant.fuse,
)
