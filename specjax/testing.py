"""Tiny deterministic models for fast tests."""

from __future__ import annotations

import jax
import numpy as np

from specjax.core import contract
from specjax.models import llama


def tiny_config(
  vocab_size: int = 64,
  n_layers: int = 2,
  d_model: int = 32,
  n_heads: int = 4,
  n_kv_heads: int = 2,
  head_dim: int = 8,
  ffn_dim: int = 48,
  tie_embeddings: bool = True,
  max_seq_len: int = 256,
) -> llama.LlamaConfig:
  return llama.LlamaConfig(
    vocab_size=vocab_size,
    d_model=d_model,
    n_layers=n_layers,
    n_heads=n_heads,
    n_kv_heads=n_kv_heads,
    head_dim=head_dim,
    ffn_dim=ffn_dim,
    rope_base=10000.0,
    norm_eps=1e-5,
    tie_embeddings=tie_embeddings,
    max_seq_len=max_seq_len,
    name='tiny',
  )


def tiny_model(seed: int = 0, scale: float = 0.2, **overrides):
  """(cfg, params) of a random tiny Llama; a large init scale makes its outputs peaked."""
  cfg = tiny_config(**overrides)
  return cfg, llama.init_params(cfg, jax.random.key(seed), scale=scale)


class ByteTokenizer:
  """A tokenizer for tiny models: UTF-8 bytes are ids 3..258; 0 pad, 1 bos, 2 eos."""

  bos_id, eos_id, offset = 1, 2, 3
  vocab_size = 259
  chat_template = None

  def encode(self, text: str) -> list[int]:
    return [b + self.offset for b in text.encode('utf-8')]

  def encode_chat(self, prompt: str) -> list[int]:
    if not prompt.strip():
      raise ValueError('empty prompt')
    return [self.bos_id] + self.encode(prompt)

  def encode_conversation(self, messages) -> list[int]:
    """BOS, then the messages' contents a blank line apart (one message: `encode_chat`'s)."""
    from specjax.formats.tokenizer import check_conversation

    check_conversation(messages)
    return [self.bos_id] + self.encode('\n\n'.join(m['content'] for m in messages))

  def decode(self, ids, skip_special_tokens: bool = True) -> str:
    data = bytes(i - self.offset for i in ids if self.offset <= i < 256 + self.offset)
    return data.decode('utf-8', errors='replace')


def successor_model(vocab_size: int = 64):
  """(cfg, params) of a model whose greedy next token is always (token + 1) % vocab_size.

  One-hot embeddings (d_model = vocab_size), attention and MLP outputs zeroed, and an
  untied head that maps each one-hot to its successor: predictable by construction.
  """
  cfg = tiny_config(
    vocab_size=vocab_size,
    d_model=vocab_size,
    n_layers=1,
    n_heads=4,
    n_kv_heads=2,
    head_dim=8,
    ffn_dim=16,
    tie_embeddings=False,
  )
  params = llama.init_params(cfg, jax.random.key(0), scale=0.02)
  eye = jax.numpy.eye(vocab_size)
  params['embed'] = eye
  params['lm_head'] = jax.numpy.roll(eye, 1, axis=1)  # row t -> column t + 1
  params['layers'][0]['wo'] = jax.numpy.zeros_like(params['layers'][0]['wo'])
  params['layers'][0]['w_down'] = jax.numpy.zeros_like(params['layers'][0]['w_down'])
  return cfg, params


def _load_tiny(spec: str, dtype):
  del spec
  tok = ByteTokenizer()
  cfg, params = tiny_model(vocab_size=tok.vocab_size, max_seq_len=2048)
  params = jax.tree_util.tree_map(lambda x: np.asarray(x).astype(dtype), params)
  return cfg, params, tok, 'random tiny model (2 layers)'


# The model spec 'tiny' (specjax/registry.py MODEL_SOURCES): a random 2-layer model over bytes.
TINY_SOURCE = contract.ModelSource(
  usage='tiny', matches=lambda spec: spec == 'tiny', load=_load_tiny
)
