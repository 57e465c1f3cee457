"""Loads a model and its tokenizer from one spec string (drafts: specjax/registry.py).

Specs: a pinned asset name ('smollm2-135m-instruct', 'gemma3-270m'), a path to a .gguf file, a
Hugging Face style directory (config.json + *.safetensors + tokenizer.json), a model on the
Hugging Face Hub ('hf:<org>/<name>[@<revision>]' or 'hf:<org>/<name>/<file>.gguf', fetched
into the user's cache: specjax/checkpoints/hub.py), or a spec of a
source in specjax/registry.py MODEL_SOURCES: 'tiny' (a random 2-layer model over bytes, for
smoke tests) or 'dry:<name>' (a paper pair's model of specjax/pairs/ shrunk to a tiny
random one over bytes, for dry runs).

Base models (BASE_MODELS: not instruction-tuned, such as Gemma 3 270M) get their prompts as
plain text after BOS, without a chat template (`Tokenizer.use_chat_template` False).
"""

from __future__ import annotations

import dataclasses
import json
import os
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from specjax import registry
from specjax.checkpoints import gguf, hf, hub
from specjax.data import assets
from specjax.models.llama import LlamaConfig

DTYPES = {'float32': jnp.float32, 'bfloat16': jnp.bfloat16, 'float16': jnp.float16}
MODEL_ASSETS = ('smollm2-135m-instruct', 'gemma3-270m')
BASE_MODELS = ('gemma3-270m',)  # prompts as plain text: no chat template


@dataclasses.dataclass
class LoadedModel:
  cfg: LlamaConfig
  params: Any
  tokenizer: Any
  source: str


def parse_dtype(name: str):
  if name not in DTYPES:
    raise ValueError(f'unknown dtype {name!r}; expected one of {sorted(DTYPES)}')
  return DTYPES[name]


def stand_in(spec: str):
  """The registered source (core.contract.ModelSource) whose spec `spec` is, or None."""
  for name in registry.MODEL_SOURCES.names:
    source = registry.MODEL_SOURCES.get(name)
    if source.matches(spec):
      return source
  return None


def check_model_spec(spec: str) -> None:
  """Raises ValueError unless `spec` names a model load_model can read (nothing is read;
  FileNotFoundError for a missing .gguf file)."""
  if spec in MODEL_ASSETS or os.path.isdir(spec) or stand_in(spec) is not None:
    return
  if hub.is_hub(spec):
    hub.parse(spec)  # the syntax only: the Hub is asked when the model loads
    return
  if spec.endswith('.gguf'):
    if not os.path.isfile(spec):
      raise FileNotFoundError(f'GGUF file not found: {spec}')
    return
  raise ValueError(
    f'unknown model {spec!r}: expected one of {list(MODEL_ASSETS)}, a path to a .gguf '
    f'file, a Hugging Face style directory, {hub.USAGE}, or a stand-in: '
    + ' or '.join(repr(registry.MODEL_SOURCES.get(n).usage) for n in registry.MODEL_SOURCES.names)
  )


def peek_config(spec: str) -> LlamaConfig | None:
  """The model's LlamaConfig from its header alone (config.json, or a GGUF file's metadata:
  no weights read), or None where that would need a download (a Hub id, an asset not yet
  fetched) or the spec is a test stand-in."""
  if spec in MODEL_ASSETS:
    path = assets.asset_path(spec)
    return gguf.config_from_reader(gguf.open_reader(path), path) if path.is_file() else None
  if hub.is_hub(spec) or stand_in(spec) is not None:
    return None
  if os.path.isdir(spec):
    file = os.path.join(spec, hf.CONFIG_FILE)
    if not os.path.isfile(file):
      raise FileNotFoundError(f'Hugging Face config not found: {file}')
    with open(file) as f:
      return hf.config_from_hf(json.load(f), file)
  if spec.endswith('.gguf'):
    return gguf.config_from_reader(gguf.open_reader(spec), spec)
  return None


def load_model(spec: str, dtype: str = 'float32') -> LoadedModel:
  """Reads weights (to host numpy in `dtype`) and builds the tokenizer for `spec`."""
  from specjax.formats.tokenizer import (
    Tokenizer,
  )  # heavy imports only when a real model is asked for

  check_model_spec(spec)
  target_dtype = parse_dtype(dtype)
  source = stand_in(spec)
  if source is not None:  # a test stand-in (registry.MODEL_SOURCES)
    return LoadedModel(*source.load(spec, target_dtype))
  local = hub.fetch(spec) if hub.is_hub(spec) else spec
  if spec in MODEL_ASSETS:
    path = assets.fetch(spec)
  elif os.path.isdir(local):
    cfg, params = hf.load_hf(local)
    tok = Tokenizer.from_file(os.path.join(local, 'tokenizer.json'))
    return LoadedModel(cfg, _cast(params, target_dtype), tok, spec)
  else:
    path = local

  cfg, params = gguf.load_gguf(path)
  tok = Tokenizer.from_gguf(path, use_chat_template=spec not in BASE_MODELS)
  return LoadedModel(cfg, _cast(params, target_dtype), tok, str(path))


def _cast(params, dtype):
  return jax.tree_util.tree_map(lambda x: np.asarray(x).astype(dtype), params)
