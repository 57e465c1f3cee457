"""A distilled draft on disk: a folder with draft.json and draft.safetensors.

draft.json holds the draft's config (a LlamaConfig), the target it was distilled for and
training notes; draft.safetensors every tensor but the shared input embedding (float16
to keep it small): 'final_norm', 'head' [D, K], 'vocab_ids' [K] int32 and
'layers.<i>.<name>'. The target's embedding is attached at load time, and every shape is
checked by name. `export_hf` writes an ordinary Hugging Face Llama directory instead.
The draft itself is specjax/drafters/distilled.py.
"""

from __future__ import annotations

import dataclasses
import json
import os
import pathlib
from typing import Any

import numpy as np

from specjax.checkpoints import hf
from specjax.models import llama

CONFIG_FILE = 'draft.json'
WEIGHTS_FILE = 'draft.safetensors'


def is_draft_dir(path: str | os.PathLike) -> bool:
  """Does `path` hold a saved distilled draft (its draft.json)."""
  return (pathlib.Path(path) / CONFIG_FILE).is_file()


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
  ids = np.asarray(params['vocab_ids'])
  if ids.ndim != 1 or not len(ids) or ids.min() < 0 or ids.max() >= cfg.vocab_size:
    raise ValueError(
      f'draft {directory}: vocab_ids must be target token ids in [0, {cfg.vocab_size}), '
      f'got {ids.size} ids' + (f' in [{ids.min()}, {ids.max()}]' if ids.size else '')
    )
  if len(np.unique(ids)) != len(ids):
    raise ValueError(
      f'draft {directory}: vocab_ids repeat {len(ids) - len(np.unique(ids))} target ids '
      '(each draft column must stand for a distinct token, or its q is wrong)'
    )
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
  out_cfg, out_params = full_vocab_model(cfg, params)
  return hf.export_hf(directory, out_cfg, out_params, tokenizer)
