"""A DFlash-style block drafter as pure functions (Chen et al. 2026, "DFlash: Block
Diffusion for Flash Speculative Decoding", arXiv 2602.06036).

The drafter fills a whole block of `block_size` positions in one forward pass. Position 0
of the block holds the anchor, the last committed token (whose target features are not
known yet); positions 1 .. block_size - 1 hold a learned mask embedding, and the hidden
state at block position i predicts the token at that position (not the next one), so one
forward drafts block_size - 1 tokens. Its layers read the target through their keys and
values only:

  c_p = hidden_norm(fc(concat(target residual streams entering the captured layers at p)))
  per layer l, for every committed context position p (absorbed once, kept in a KV cache):
      K_l[p] = rope(k_norm(c_p @ wk_l), p);   V_l[p] = c_p @ wv_l
  the block x [T = block_size, D] runs decoder layers (pre-norm, Qwen3-style q/k norms)
  whose queries see every context slot and every block position (bidirectional inside
  the block); the block's own keys and values come from the layer's input as usual:
      y = x + attn(q(x), [K_l[:L]; k(x)], [V_l[:L]; v(x)]);   x' = y + mlp(norm(y))
  logits over the draft vocabulary = norm(x') @ head         [T - 1, K]

So the drafter's KV cache holds, per draft layer, the projections of the fused target
features of the committed context: a function of the features alone, written once per
position when the target commits it (`absorb`), never of the drafter's own guesses, so
rollback is only a length. The drafter is specjax/drafters/dflash.py, the checkpoint
layout (DFlash's, as z-lab's reference model and vLLM's loader name the tensors)
specjax/checkpoints/dflash.py.

Parameters (stored (in, out) like specjax's Llama):

  {'fc': [C * D, D], 'hidden_norm': [D], 'mask': [D] (the mask embedding),
   'layers': L x {'attn_norm': [D], 'wq': [D, N*H], 'wk': [D, G*H], 'wv': [D, G*H],
                  'q_norm': [H], 'k_norm': [H], 'wo': [N*H, D], 'mlp_norm': [D],
                  'w_gate': [D, F], 'w_up': [D, F], 'w_down': [F, D]},
   'norm': [D], 'head': [D, K], 'vocab_ids': [K] int32}

The anchor's input embedding is the target's (frozen, not part of the tree).
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np

from specjax.models import llama, quant
from specjax.models.eagle import FeatureConfig, is_shape, target_head
from specjax.models.kv_cache import KVCache

DEFAULT_BLOCK = 16  # DFlash's released drafters use blocks of 16 (15 drafted tokens)


def default_capture(n_layers: int, count: int = 3) -> tuple[int, ...]:
  """DFlash's choice of target layers, in specjax's convention.

  DFlash reads the outputs of `count` target layers spread evenly over layers 1 .. L - 3
  (the middle one alone for count 1); the output of layer i is the stream entering layer
  i + 1, which is what specjax's `capture` names.
  """
  if count == 1:
    ids = [n_layers // 2]
  else:
    start, end = 1, n_layers - 3
    ids = [int(round(start + i * (end - start) / (count - 1))) for i in range(count)]
  return tuple(sorted({min(max(i + 1, 0), n_layers) for i in ids}))


@dataclasses.dataclass(frozen=True)
class DFlashConfig(FeatureConfig):
  """A block drafter's static shape (hashable: a jit static argument)."""

  n_layers: int = 1
  block_size: int = DEFAULT_BLOCK  # T: the anchor and block_size - 1 drafted positions
  rope_base: float = 10000.0
  norm_eps: float = 1e-5
  rope_scaling: tuple = ()  # the target's (LlamaConfig.rope_scaling)
  embed_scale: float = 1.0  # the target's embedding scale (Gemma: sqrt(D))

  def __post_init__(self):
    if not self.capture:
      raise ValueError('a DFlash drafter needs at least one captured target layer')
    if self.n_heads % self.n_kv_heads or self.n_layers < 1 or self.block_size < 2:
      raise ValueError(f'bad DFlash drafter shape: {self}')

  @classmethod
  def for_target(
    cls, target: llama.LlamaConfig, draft_vocab: int, capture=(), n_layers=1, block_size=16
  ):
    return cls(
      draft_vocab=draft_vocab,
      ffn_dim=target.ffn_dim,
      n_layers=n_layers,
      block_size=block_size,
      embed_scale=float(target.d_model**0.5) if target.scale_embeddings else 1.0,
      **cls.target_fields(target, capture, default_capture),
    )

  def param_shapes(self) -> dict:
    d, f, k, h = self.d_model, self.ffn_dim, self.draft_vocab, self.head_dim
    nh, gh = self.n_heads * h, self.n_kv_heads * h
    layer = {
      'attn_norm': (d,),
      'wq': (d, nh),
      'wk': (d, gh),
      'wv': (d, gh),
      'q_norm': (h,),
      'k_norm': (h,),
      'wo': (nh, d),
      'mlp_norm': (d,),
      'w_gate': (d, f),
      'w_up': (d, f),
      'w_down': (f, d),
    }
    return {
      'fc': (len(self.capture) * d, d),
      'hidden_norm': (d,),
      'mask': (d,),
      'layers': [dict(layer) for _ in range(self.n_layers)],
      'norm': (d,),
      'head': (d, k),
    }


def init_params(cfg: DFlashConfig, key, vocab_ids, target_params=None) -> dict:
  """Random parameters: normal(0, 0.02) matrices and mask embedding, unit norms. With
  `target_params` the output head starts from the target's head rows of `vocab_ids` (its
  tied embedding when it has no lm_head) and `norm` from its final norm."""
  shapes = cfg.param_shapes()
  leaves, treedef = jax.tree_util.tree_flatten_with_path(shapes, is_leaf=is_shape)
  keys = jax.random.split(key, len(leaves))
  out = []
  for k, (path, s) in zip(keys, leaves):
    random = len(s) > 1 or jax.tree_util.keystr(path) == "['mask']"
    out.append(0.02 * np.asarray(jax.random.normal(k, s)) if random else np.ones(s, np.float32))
  params = jax.tree.unflatten(treedef, out)
  if target_params is not None:
    params.update(target_head(target_params, vocab_ids))
  params['vocab_ids'] = np.asarray(vocab_ids, np.int32)
  return params


def fuse(params, features: jax.Array, cfg: DFlashConfig) -> jax.Array:
  """Target features [..., C * D] -> the fused context state c [..., D]."""
  c = features.astype(params['fc'].dtype) @ params['fc']
  return llama.rms_norm(c, params['hidden_norm'], cfg.norm_eps)


def _keys_values(lp, x, cos, sin, cfg: DFlashConfig):
  """A layer's keys (q/k-normed, RoPE applied) and values [B, T, G, H] of states x[B, T, D]."""
  b, t, _ = x.shape
  g, h = cfg.n_kv_heads, cfg.head_dim
  k = llama.rms_norm((x @ lp['wk']).reshape(b, t, g, h), lp['k_norm'], cfg.norm_eps)
  return llama.apply_rope(k, cos, sin), (x @ lp['wv']).reshape(b, t, g, h)


def absorb(params, cache: KVCache, features, positions, valid, cfg: DFlashConfig) -> KVCache:
  """Writes every layer's context keys and values of target features[B, T, C * D] at
  positions[B, T] where `valid` (elsewhere dropped). The cache's lengths are unchanged."""
  c = fuse(params, features, cfg)
  cos, sin = llama.rope_tables(positions, cfg.head_dim, cfg.rope_base, cfg.rope_scaling)
  slots = jnp.where(valid, positions, cache.cache_size)
  new_k, new_v = [], []
  for i, lp in enumerate(params['layers']):
    k, v = _keys_values(lp, c, cos, sin, cfg)
    new_k.append(llama.write_slots(cache.k[i], k, slots))
    new_v.append(llama.write_slots(cache.v[i], v, slots))
  return cache.replace(k=new_k, v=new_v)


def block_attention(q, ctx_k, ctx_v, ctx_mask, k, v) -> jax.Array:
  """Queries q[B, T, N, H] over the context cache ctx_k, ctx_v [B, G, S, H] (the slots
  ctx_mask[B, T, S] allows) and the block's own k, v [B, T, G, H] (all of them: attention
  inside the block is bidirectional), one softmax over both. Returns [B, T, N, H]."""
  b, t, n, h = q.shape
  g = ctx_k.shape[1]
  q = q.reshape(b, t, g, n // g, h) * jnp.asarray(h**-0.5, q.dtype)
  f32 = jnp.float32
  s_ctx = jnp.einsum('BTGRH,BGSH->BGRTS', q, ctx_k, preferred_element_type=f32)
  s_ctx = jnp.where(ctx_mask[:, None, None], s_ctx, -1e30)
  s_blk = jnp.einsum('BTGRH,BUGH->BGRTU', q, k, preferred_element_type=f32)
  probs = jax.nn.softmax(jnp.concatenate([s_ctx, s_blk], axis=-1), axis=-1)
  s = ctx_k.shape[2]
  p_ctx, p_blk = probs[..., :s].astype(v.dtype), probs[..., s:].astype(v.dtype)
  out = jnp.einsum('BGRTS,BGSH->BTGRH', p_ctx, ctx_v) + jnp.einsum('BGRTU,BUGH->BTGRH', p_blk, v)
  return out.reshape(b, t, n, h)


def block_layer(lp, x, ctx_k, ctx_v, ctx_mask, cos, sin, cfg: DFlashConfig) -> jax.Array:
  """One drafter layer on the block x[B, T, D] (RoPE tables of its positions)."""
  b, t, _ = x.shape
  n, h = cfg.n_heads, cfg.head_dim
  y = llama.rms_norm(x, lp['attn_norm'], cfg.norm_eps)
  q = llama.rms_norm((y @ lp['wq']).reshape(b, t, n, h), lp['q_norm'], cfg.norm_eps)
  k, v = _keys_values(lp, y, cos, sin, cfg)
  attn = block_attention(llama.apply_rope(q, cos, sin), ctx_k, ctx_v, ctx_mask, k, v)
  x = x + attn.reshape(b, t, n * h) @ lp['wo']
  y = llama.rms_norm(x, lp['mlp_norm'], cfg.norm_eps)
  return x + (jax.nn.silu(y @ lp['w_gate']) * (y @ lp['w_up'])) @ lp['w_down']


def block_inputs(params, embed, anchor, cfg: DFlashConfig) -> jax.Array:
  """The block's input states [B, T, D]: the anchor's target embedding, then masks."""
  e = quant.take(embed, anchor).astype(params['mask'].dtype) * cfg.embed_scale  # [B, D]
  masks = jnp.broadcast_to(params['mask'], (anchor.shape[0], cfg.block_size - 1, cfg.d_model))
  return jnp.concatenate([e[:, None], masks.astype(e.dtype)], axis=1)


def block_logits(
  params, embed, anchor, cache: KVCache, cfg: DFlashConfig, count: int = 0
) -> jax.Array:
  """The drafter's one forward: anchor[B] (the last committed token, at position
  cache.lengths) and the context in `cache` -> float32 logits over the draft vocabulary
  for the block_size - 1 positions after the anchor [B, T - 1, K]. The whole block runs
  (its positions see each other); `count` (static, 0: all) keeps the first `count`
  positions' logits only."""
  return head_logits(params, block_states(params, embed, anchor, cache, cfg, count))


def head_logits(params, states: jax.Array) -> jax.Array:
  """Float32 logits over the draft vocabulary of final states [..., D]."""
  return jnp.matmul(states, params['head'], preferred_element_type=jnp.float32)


def block_states(
  params, embed, anchor, cache: KVCache, cfg: DFlashConfig, count: int = 0
) -> jax.Array:
  """block_logits' final (normed) states [B, count or T - 1, D], before the head."""
  start = cache.lengths
  positions = start[:, None] + jnp.arange(cfg.block_size, dtype=jnp.int32)  # [B, T]
  cos, sin = llama.rope_tables(positions, cfg.head_dim, cfg.rope_base, cfg.rope_scaling)
  ctx_mask = jnp.arange(cache.cache_size)[None, None, :] < start[:, None, None]  # [B, 1, S]
  x = block_inputs(params, embed, anchor, cfg)
  for i, lp in enumerate(params['layers']):
    x = block_layer(lp, x, cache.k[i], cache.v[i], ctx_mask, cos, sin, cfg)
  return llama.rms_norm(x[:, 1 : 1 + (count or cfg.block_size - 1)], params['norm'], cfg.norm_eps)


def forward(params, embed, features, context_lens, anchor, cfg: DFlashConfig) -> jax.Array:
  """From scratch: the target's features[B, S, C * D] of each row's context (the first
  context_lens[B] positions count) and the anchor[B] at position context_lens -> logits
  [B, T - 1, K] of the block after it. What the drafter in the decoding loop computes
  incrementally (its cache filled position by position as the target commits them)."""
  b, s, _ = features.shape
  cache = KVCache.init(cfg, b, s, params['fc'].dtype)
  positions = jnp.broadcast_to(jnp.arange(s, dtype=jnp.int32), (b, s))
  cache = absorb(params, cache, features, positions, positions < context_lens[:, None], cfg)
  return block_logits(params, embed, anchor, cache.with_lengths(context_lens), cfg)
