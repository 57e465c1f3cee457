"""Dry runs: a pair's models as `dry:<name>` specs, the architecture shrunk to a tiny
width with random weights over bytes, and the check that speculative greedy output equals
the target's."""

from __future__ import annotations

import dataclasses
import zlib

import jax
import numpy as np

from specjax.core import contract
from specjax.models import llama
from specjax.pairs.models import BASE_PAIRS, DRY, MODELS, PAIRS, lookup

TINY_VOCAB = 264  # the byte tokenizer's 259 ids, padded to a multiple of 8 (shardable)
TINY = dict(d_model=64, ffn_dim=128, head_dim=8, window=8)


def tiny_config(name: str) -> llama.LlamaConfig:
  """MODELS[name] at a tiny width: same family switches, RoPE settings (bases, scaling),
  head and kv-head counts, tied or untied head and query scale; head_dim 8 (16 for Gemma's
  256), a window of 8, 2 layers for a draft and 3 for a target (Gemma's 5:1 pattern: 6 and
  7, one full layer in each), and the byte vocabulary (TINY_VOCAB rows), 8 rows more where
  the real target's is padded beyond its draft's (Qwen2.5-7B, Gemma 3 4B)."""
  real = lookup(name, 'dry model').cfg
  targets = {p.target for p in (*PAIRS.values(), *BASE_PAIRS.values())}
  layers = (6 if real.layer_types else 2) + (name in targets)  # a target one layer deeper
  pad = {'qwen2.5-7b': 8, 'gemma-3-4b': 8}.get(real.name, 0)
  return dataclasses.replace(
    real,
    vocab_size=TINY_VOCAB + pad,
    d_model=TINY['d_model'],
    ffn_dim=TINY['ffn_dim'],
    head_dim=16 if real.arch == 'gemma3' else TINY['head_dim'],
    n_layers=layers,
    sliding_window=TINY['window'] if real.sliding_window else 0,
    layer_types=real.layer_types[:layers],
    name=f'{real.name} (dry: tiny random)',
  )


def dry_params(cfg: llama.LlamaConfig, layer_scale: float = 2.0):
  """Random numpy parameters for `cfg` (llama.init_params' layout; numpy, so no compile).

  Each tensor is the leading block of one random table per parameter path, so a dry draft
  is part of its dry target: the embedding rows they both have, the first heads of each
  layer's attention, its MLP, layer by layer (the target has one more layer, and more heads
  where the real one has). It then agrees with the target on part of its tokens, as a real
  pair does, and speculative decoding both accepts and rejects drafts.
  """

  def leaf(path, shape):
    key = jax.tree_util.keystr(path)
    if key.endswith("norm']") and not cfg.norm_offset:
      return np.ones(shape)
    if key in ("['embed']", "['lm_head']"):  # rows (columns) of one table
      table = np.random.default_rng(0).normal(0, 1, (2 * TINY_VOCAB, cfg.d_model))
      return table[: cfg.vocab_size] if key == "['embed']" else table[: cfg.vocab_size].T
    rng = np.random.default_rng(zlib.crc32(key.encode()))
    table = rng.normal(0, 1, tuple(max(512, d) for d in shape))
    block = table[tuple(slice(0, d) for d in shape)]
    if key.endswith("post_norm']"):  # Gemma: 1 + w, large enough for the layers to count
      return 4.0 + block  # against embeddings scaled by sqrt(d_model)
    if key.endswith("norm']"):
      return 0.1 * block
    return block * layer_scale / np.sqrt(shape[0] if len(shape) > 1 else 1)

  return jax.tree_util.tree_map_with_path(
    leaf,
    cfg.param_shapes(),
    is_leaf=lambda x: isinstance(x, tuple) and all(isinstance(d, int) for d in x),
  )


def dry_model(spec: str, dtype):
  """(cfg, params, tokenizer, source) for the loader's `dry:<name>` spec."""
  from specjax import testing

  name = spec[len(DRY) :]
  cfg = tiny_config(name)
  params = jax.tree_util.tree_map(
    lambda x: np.asarray(x, np.float32).astype(dtype), dry_params(cfg)
  )
  source = f'dry run of {MODELS[name].hf_id} (random, {cfg.n_layers} layers, width {cfg.d_model})'
  return cfg, params, testing.ByteTokenizer(), source


def check_model_spec(spec: str) -> bool:
  """Whether `spec` is a dry spec (raising ValueError for an unknown name in one)."""
  if not spec.startswith(DRY):
    return False
  lookup(spec[len(DRY) :], f'model spec {spec!r}:')
  return True


# The model spec 'dry:<name>' (specjax/registry.py MODEL_SOURCES).
DRY_SOURCE = contract.ModelSource(
  usage='dry:<a model of specjax/pairs/models.py>', matches=check_model_spec, load=dry_model
)


def check_dry_run(config, summary: dict, say=print) -> None:
  """After a dry run: every speculative method's greedy output equals autoregressive
  decoding's (ValueError otherwise); a no-op for other runs."""
  if not config.model.startswith(DRY):
    return
  bad = {
    name: m['greedy_mismatches']
    for name, m in summary['methods'].items()
    if m.get('greedy_mismatches')
  }
  if bad:
    raise ValueError(f'dry run {config.model}: speculative output differs from greedy: {bad}')
  say(f'dry run {config.model}: speculative greedy output equals the target-only output')
