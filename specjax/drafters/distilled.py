"""A distilled draft with a reduced output vocabulary, sharing the target's input embeddings.

A draft's step cost is dominated by its V-way output head (49152 x 576 for SmolLM2, ~113 MB
in float32: more than a fifth of the target's weights). This draft keeps the target's
embedding table for its input (a row lookup, free), runs a few decoder layers of the
target's width, and scores only K frequent tokens with its own head [D, K]:

    params = {'embed': [V, D] (the target's, shared, not trained),
              'layers': [...], 'final_norm': [D],
              'head': [D, K], 'vocab_ids': [K] int32 (full-vocabulary id of each column)}

Its distribution over the full vocabulary is the subset's softmax with q = 0 everywhere
else. Verification only needs q over the full vocabulary, so speculative decoding stays
lossless: tokens the draft cannot propose are simply never proposed.

On disk (`save_draft` / `load_draft_dir`) a draft is a folder with draft.json (config,
target, training notes) and draft.safetensors (everything but the shared embedding, in
float16 to keep it small); the target's embedding is attached at load time.
"""

from __future__ import annotations

import dataclasses
import json
import os
import pathlib
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from specjax.decode import sampling as sampling_lib
from specjax.drafters.model import ModelDrafter
from specjax.models import llama
from specjax.models.kv_cache import KVCache

CONFIG_FILE = 'draft.json'
WEIGHTS_FILE = 'draft.safetensors'
TRAINED = ('layers', 'final_norm', 'head')  # the parameter groups distillation updates


def init_from_target(
  target_cfg: llama.LlamaConfig,
  target_params,
  layers: tuple[int, ...],
  vocab_ids: np.ndarray,
  ffn_dim: int | None = None,
):
  """(cfg, params) of a draft initialised from the target.

  The draft's layers are copies of the target's `layers` (in order; the first `ffn_dim`
  hidden units when narrower), its final norm the target's, and its head the target's
  (tied) output rows of `vocab_ids`.
  """
  ffn = ffn_dim or target_cfg.ffn_dim
  cfg = dataclasses.replace(
    target_cfg,
    n_layers=len(layers),
    ffn_dim=ffn,
    tie_embeddings=True,
    name=f'distilled[{len(layers)}L, {len(vocab_ids)} tokens]',
  )
  embed = np.asarray(target_params['embed'])
  new_layers = []
  for i in layers:
    p = {k: np.array(v) for k, v in target_params['layers'][i].items()}
    p['w_gate'], p['w_up'] = p['w_gate'][:, :ffn], p['w_up'][:, :ffn]
    p['w_down'] = p['w_down'][:ffn]
    new_layers.append(p)
  params = {
    'embed': embed,
    'layers': new_layers,
    'final_norm': np.array(target_params['final_norm']),
    'head': np.ascontiguousarray(embed[np.asarray(vocab_ids)].T),
    'vocab_ids': np.asarray(vocab_ids, np.int32),
  }
  return cfg, params


def subset_logits(params, tokens: jax.Array, cache: KVCache, cfg: llama.LlamaConfig):
  """tokens[B, T] -> (float32 logits [B, T, K] over the draft vocabulary, cache)."""
  x, cache = llama.forward_hidden(params, tokens, cache, cfg)
  return (x @ params['head']).astype(jnp.float32), cache


def to_full_vocab(
  values: jax.Array, vocab_ids: jax.Array, vocab_size: int, fill: float = 0.0
) -> jax.Array:
  """[..., K] values over the draft vocabulary -> [..., V], `fill` outside it."""
  out = jnp.full(values.shape[:-1] + (vocab_size,), fill, values.dtype)
  return out.at[..., vocab_ids].set(values)


@dataclasses.dataclass(frozen=True)
class DistilledDrafter(ModelDrafter):
  """ModelDrafter over a reduced output vocabulary (params as in the module docstring).

  `cfg.vocab_size` is the full (target) vocabulary: the input embedding's rows and the
  size of the distributions handed to the verifier.
  """

  label: str = 'distilled draft'

  def _forward(self, params, tokens, cache):
    return subset_logits(params, tokens, cache, self.cfg)  # [B, T, K]: the draft vocabulary

  def propose(self, params, draft_state, state, key, gamma, sampling):
    ids = params['vocab_ids']
    logits, cache = self.first_logits(params, draft_state, state)  # catches up when behind
    tokens, dists = [], []
    for i, k in enumerate(jax.random.split(key, gamma)):
      probs = sampling_lib.probabilities(logits, sampling)  # [B, K]
      token = ids[sampling_lib.sample(logits, k, sampling)]  # [B], full-vocabulary ids
      dists.append(to_full_vocab(probs, ids, self.cfg.vocab_size))
      tokens.append(token)
      if i + 1 < gamma:
        logits, cache = subset_logits(params, token[:, None], cache, self.cfg)
        logits = logits[:, 0]
    return jnp.stack(tokens, 1), jnp.stack(dists, 1), draft_state.replace(cache=cache)


def save_draft(
  directory: str | os.PathLike,
  cfg: llama.LlamaConfig,
  params,
  info: dict[str, Any] | None = None,
  dtype=np.float16,
) -> pathlib.Path:
  """Writes draft.json and draft.safetensors (all but the shared embedding) to `directory`."""
  import safetensors.numpy

  directory = pathlib.Path(directory)
  directory.mkdir(parents=True, exist_ok=True)
  tensors = {
    'final_norm': np.asarray(params['final_norm'], dtype),
    'head': np.asarray(params['head'], dtype),
    'vocab_ids': np.asarray(params['vocab_ids'], np.int32),
  }
  for i, layer in enumerate(params['layers']):
    for name, w in layer.items():
      tensors[f'layers.{i}.{name}'] = np.ascontiguousarray(np.asarray(w, dtype))
  tmp = directory / (WEIGHTS_FILE + '.tmp')
  safetensors.numpy.save_file(tensors, tmp)
  os.replace(tmp, directory / WEIGHTS_FILE)
  meta = {'config': dataclasses.asdict(cfg), 'info': info or {}}
  (directory / CONFIG_FILE).write_text(json.dumps(meta, indent=2) + '\n')
  return directory


def is_draft_dir(path: str | os.PathLike) -> bool:
  return (pathlib.Path(path) / CONFIG_FILE).is_file()


def load_draft_dir(directory: str | os.PathLike, target_embed, dtype=np.float32):
  """(cfg, params, info) of a saved draft, its input embedding set to `target_embed`."""
  import safetensors.numpy

  directory = pathlib.Path(directory)
  meta = json.loads((directory / CONFIG_FILE).read_text())
  cfg = llama.LlamaConfig(**meta['config'])
  tensors = safetensors.numpy.load_file(directory / WEIGHTS_FILE)
  if tuple(np.shape(target_embed)) != (cfg.vocab_size, cfg.d_model):
    raise ValueError(
      f'draft {directory} needs a target embedding of shape '
      f'{(cfg.vocab_size, cfg.d_model)}, got {tuple(np.shape(target_embed))}'
    )
  layers = [{} for _ in range(cfg.n_layers)]
  for name, w in tensors.items():
    if name.startswith('layers.'):
      _, i, key = name.split('.')
      layers[int(i)][key] = w.astype(dtype)
  params = {
    'embed': np.asarray(target_embed, dtype),
    'layers': layers,
    'final_norm': tensors['final_norm'].astype(dtype),
    'head': tensors['head'].astype(dtype),
    'vocab_ids': tensors['vocab_ids'],
  }
  shapes = cfg.param_shapes()
  for i, layer in enumerate(layers):
    for key, shape in shapes['layers'][i].items():
      if layer.get(key) is None or layer[key].shape != shape:
        raise ValueError(f'draft {directory}: layers.{i}.{key} missing or not of shape {shape}')
  if params['head'].shape != (cfg.d_model, len(params['vocab_ids'])):
    raise ValueError(
      f'draft {directory}: head shape {params["head"].shape} does not match '
      f'{len(params["vocab_ids"])} vocabulary ids'
    )
  return cfg, params, meta.get('info', {})


def full_vocab_model(cfg: llama.LlamaConfig, params):
  """(cfg, params) of an ordinary untied Llama with the same greedy choices, for export.

  Columns outside the draft vocabulary are zero, so those tokens score 0: the exported
  model's argmax is the draft's whenever the draft's best logit is positive (it nearly
  always is). Sampling from it is not the same distribution.
  """
  head = np.zeros((cfg.d_model, cfg.vocab_size), np.float32)
  head[:, np.asarray(params['vocab_ids'])] = np.asarray(params['head'], np.float32)
  out_cfg = dataclasses.replace(cfg, tie_embeddings=False)
  out = {
    'embed': np.asarray(params['embed'], np.float32),
    'layers': [
      {k: np.asarray(v, np.float32) for k, v in layer.items()} for layer in params['layers']
    ],
    'final_norm': np.asarray(params['final_norm'], np.float32),
    'lm_head': head,
  }
  return out_cfg, out


def export_hf(
  directory: str | os.PathLike, cfg: llama.LlamaConfig, params, tokenizer: Any = None
) -> pathlib.Path:
  """Writes the draft as a Hugging Face LlamaForCausalLM directory (see full_vocab_model),
  usable as transformers' `assistant_model` for the same target."""
  from specjax.checkpoints import hf

  out_cfg, out_params = full_vocab_model(cfg, params)
  return hf.export_hf(directory, out_cfg, out_params, tokenizer)
