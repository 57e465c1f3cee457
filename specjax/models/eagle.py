"""An EAGLE-3-style feature draft head as pure functions (Li et al. 2025, arXiv 2503.01840).

Per position p the head reads x_p = fc(concat(target residual streams entering the
captured layers at p)) [D] and e, the target's input embedding of the token at p + 1, and
runs one decoder layer whose attention sees both:

  h = concat(norm_e(e), norm_x(x_p));   y = x_p + attn(h);   out_p = y + mlp(norm(y))
  logits over the draft vocabulary = norm_out(out_p) @ head     (predicts token p + 2)

Later draft steps feed back `out` in place of x. The drafter is specjax/drafters/eagle.py,
the checkpoint layout (EAGLE-3's, as vLLM and SGLang load it) specjax/checkpoints/eagle3.py.

Parameters (stored (in, out) like specjax's Llama):

  {'fc': [C * D, D],
   'layer': {'embed_norm': [D], 'hidden_norm': [D], 'wq': [2D, N*H], 'wk': [2D, G*H],
             'wv': [2D, G*H], 'wo': [N*H, D], 'mlp_norm': [D],
             'w_gate': [D, F], 'w_up': [D, F], 'w_down': [F, D]},
   'norm': [D], 'head': [D, K], 'vocab_ids': [K] int32}

The input embedding is the target's (frozen, not part of the tree).
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np

from specjax.models import llama
from specjax.models.kv_cache import KVCache


def default_capture(n_layers: int) -> tuple[int, ...]:
  """EAGLE-3's low, middle and high target layers: the stream entering 2, L // 2, L - 3."""
  return tuple(sorted({min(2, n_layers), n_layers // 2, max(n_layers - 3, 0)}))


def is_shape(x) -> bool:
  return isinstance(x, tuple)


@dataclasses.dataclass(frozen=True)
class FeatureConfig:
  """The fields every feature drafter's shape has (EagleConfig here, the block drafter's
  models/dflash.DFlashConfig): the target's vocabulary and attention shape, the layers read."""

  vocab_size: int  # the target's vocabulary (the size of q)
  draft_vocab: int  # K
  d_model: int
  n_heads: int
  n_kv_heads: int
  head_dim: int
  ffn_dim: int
  capture: tuple[int, ...]  # target layers whose incoming stream the drafter reads

  @staticmethod
  def target_fields(target: llama.LlamaConfig, capture, default_capture) -> dict:
    """The fields a drafter for `target` takes from it (all but draft_vocab and ffn_dim),
    capture checked against it (() = default_capture(target.n_layers))."""
    capture = tuple(capture) or default_capture(target.n_layers)
    llama.check_capture(target, capture)
    return dict(
      vocab_size=target.vocab_size,
      d_model=target.d_model,
      n_heads=target.n_heads,
      n_kv_heads=target.n_kv_heads,
      head_dim=target.head_dim,
      capture=capture,
      rope_base=target.rope_base,
      norm_eps=target.norm_eps,
      rope_scaling=target.rope_scaling,
    )

  def param_shapes(self) -> dict:
    raise NotImplementedError

  @property
  def num_params(self) -> int:
    shapes = jax.tree.leaves(self.param_shapes(), is_leaf=is_shape)
    return int(sum(np.prod(s) for s in shapes))


@dataclasses.dataclass(frozen=True)
class EagleConfig(FeatureConfig):
  """A head's static shape (hashable: a jit static argument)."""

  rope_base: float = 10000.0
  norm_eps: float = 1e-5
  n_layers: int = 1  # the head's own KV cache has one layer
  rope_scaling: tuple = ()  # the target's (LlamaConfig.rope_scaling): Llama 3.x heads

  def __post_init__(self):
    if not self.capture:
      raise ValueError('an EAGLE head needs at least one captured target layer')
    if self.n_heads % self.n_kv_heads or self.n_layers != 1:
      raise ValueError(f'bad EAGLE head shape: {self}')

  @classmethod
  def for_target(cls, target: llama.LlamaConfig, draft_vocab: int, capture=(), ffn_dim=0):
    return cls(
      draft_vocab=draft_vocab,
      ffn_dim=ffn_dim or target.ffn_dim,
      **cls.target_fields(target, capture, default_capture),
    )

  def param_shapes(self) -> dict:
    d, f, k = self.d_model, self.ffn_dim, self.draft_vocab
    nh, gh = self.n_heads * self.head_dim, self.n_kv_heads * self.head_dim
    return {
      'fc': (len(self.capture) * d, d),
      'layer': {
        'embed_norm': (d,),
        'hidden_norm': (d,),
        'wq': (2 * d, nh),
        'wk': (2 * d, gh),
        'wv': (2 * d, gh),
        'wo': (nh, d),
        'mlp_norm': (d,),
        'w_gate': (d, f),
        'w_up': (d, f),
        'w_down': (f, d),
      },
      'norm': (d,),
      'head': (d, k),
    }


def init_params(cfg: EagleConfig, key, vocab_ids, target_params=None, init_layer: int = -1):
  """Random head parameters (normal(0, 0.02) matrices, unit norms); the output head starts
  from the target's (tied) embedding rows of `vocab_ids` when `target_params` is given,
  and the MLP from target layer `init_layer` (>= 0)."""
  shapes = cfg.param_shapes()
  leaves, treedef = jax.tree.flatten(shapes, is_leaf=is_shape)
  keys = jax.random.split(key, len(leaves))
  out = [
    np.ones(s, np.float32) if len(s) == 1 else 0.02 * np.asarray(jax.random.normal(k, s))
    for k, s in zip(keys, leaves)
  ]
  params = jax.tree.unflatten(treedef, out)
  if target_params is not None:
    params.update(target_head(target_params, vocab_ids))
    if init_layer >= 0:
      src = target_params['layers'][init_layer]
      for name in ('w_gate', 'w_up', 'w_down', 'mlp_norm', 'wo'):
        params['layer'][name] = np.asarray(src[name], np.float32)
  params['vocab_ids'] = np.asarray(vocab_ids, np.int32)
  return params


def target_head(target_params, vocab_ids) -> dict:
  """{'head', 'norm'} (float32) to start a drafter's output from: the target's head rows of
  `vocab_ids` (its tied embedding's when it has no lm_head) and its final norm."""
  head = target_params.get('lm_head')
  if head is None:
    head = np.asarray(target_params['embed'], np.float32)[np.asarray(vocab_ids)].T
  else:
    head = np.asarray(head, np.float32)[:, np.asarray(vocab_ids)]
  return {
    'head': np.ascontiguousarray(head, np.float32),
    'norm': np.asarray(target_params['final_norm'], np.float32),
  }


def check_params(cfg: FeatureConfig, params, source: str) -> None:
  """Raises ValueError naming the first tensor whose shape disagrees with `cfg` (a head's or
  a block drafter's)."""
  want = {**cfg.param_shapes(), 'vocab_ids': (cfg.draft_vocab,)}
  want = dict(jax.tree_util.tree_flatten_with_path(want, is_leaf=is_shape)[0])
  got = dict(jax.tree_util.tree_flatten_with_path(params)[0])
  for path, shape in want.items():
    if path not in got:
      raise ValueError(f'{source}: missing tensor {jax.tree_util.keystr(path)}')
    if tuple(got[path].shape) != tuple(shape):
      raise ValueError(
        f'{source}: tensor {jax.tree_util.keystr(path)} has shape {tuple(got[path].shape)}, '
        f'expected {tuple(shape)}'
      )


def fuse(params, features: jax.Array) -> jax.Array:
  """Target features [..., C * D] -> the head's input state [..., D]."""
  return features.astype(params['fc'].dtype) @ params['fc']


def layer(p, x, e, cos, sin, cfg: EagleConfig, attend) -> jax.Array:
  """The head's decoder layer: state x[B, T, D] and next-token embeddings e[B, T, D] ->
  output state [B, T, D]; `attend(q, k, v)` as in llama.layer."""
  b, t, _ = x.shape
  n, g, h = cfg.n_heads, cfg.n_kv_heads, cfg.head_dim
  y = jnp.concatenate(
    [
      llama.rms_norm(e, p['embed_norm'], cfg.norm_eps),
      llama.rms_norm(x, p['hidden_norm'], cfg.norm_eps),
    ],
    axis=-1,
  )
  q = llama.apply_rope((y @ p['wq']).reshape(b, t, n, h), cos, sin)
  k = llama.apply_rope((y @ p['wk']).reshape(b, t, g, h), cos, sin)
  v = (y @ p['wv']).reshape(b, t, g, h)
  x = x + attend(q, k, v).reshape(b, t, n * h) @ p['wo']
  y = llama.rms_norm(x, p['mlp_norm'], cfg.norm_eps)
  return x + (jax.nn.silu(y @ p['w_gate']) * (y @ p['w_up'])) @ p['w_down']


def head_logits(params, out: jax.Array, cfg: EagleConfig) -> jax.Array:
  """Output state [..., D] -> float32 logits over the draft vocabulary [..., K]."""
  x = llama.rms_norm(out, params['norm'], cfg.norm_eps)
  return jnp.matmul(x, params['head'], preferred_element_type=jnp.float32)


def cached_step(
  params, embed, x, next_tokens, positions, valid, cache: KVCache, cfg, slots=None, mask=None
):
  """The head at positions[B, T] (each row's own) with its KV cache: writes the entries of
  `valid` positions, attends to slots <= position. Returns (out [B, T, D], cache with its
  lengths unchanged). Token trees give `slots` [B, T] to write at instead (`valid` then
  unused) and the `mask` [B, T, S] of slots each node sees."""
  e = jnp.take(embed, next_tokens, axis=0).astype(x.dtype)
  cos, sin = llama.rope_tables(positions, cfg.head_dim, cfg.rope_base, cfg.rope_scaling)
  writes = jnp.where(valid, positions, cache.cache_size) if slots is None else slots
  if mask is None:
    mask = jnp.arange(cache.cache_size)[None, None, :] <= positions[:, :, None]
  new = {}

  def attend(q, k, v):
    new['k'] = llama.write_slots(cache.k[0], k, writes)
    new['v'] = llama.write_slots(cache.v[0], v, writes)
    return llama.attention(q, new['k'], new['v'], mask)

  out = layer(params['layer'], x, e, cos, sin, cfg, attend)
  return out, cache.replace(k=[new['k']], v=[new['v']])
