"""Loads a model and its tokenizer from one spec string.

Specs: a pinned asset name ('smollm2-135m-instruct'), a path to a .gguf file, a
Hugging Face style directory (config.json + *.safetensors + tokenizer.json), or
'tiny' (a random 2-layer model over bytes, for smoke tests).
"""

from __future__ import annotations

import dataclasses
import os
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from specjax import assets, testing
from specjax.models.llama import LlamaConfig

DTYPES = {'float32': jnp.float32, 'bfloat16': jnp.bfloat16, 'float16': jnp.float16}
MODEL_ASSETS = ('smollm2-135m-instruct',)


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


def load_model(spec: str, dtype: str = 'float32') -> LoadedModel:
  """Reads weights (to host numpy in `dtype`) and builds the tokenizer for `spec`."""
  from specjax.tokenizer import Tokenizer  # heavy imports only when a real model is asked for

  target_dtype = parse_dtype(dtype)
  if spec == 'tiny':
    tok = testing.ByteTokenizer()
    cfg, params = testing.tiny_model(vocab_size=tok.vocab_size, max_seq_len=2048)
    return LoadedModel(cfg, _cast(params, target_dtype), tok, 'random tiny model (2 layers)')
  if spec in MODEL_ASSETS:
    path = assets.fetch(spec)
  elif os.path.isdir(spec):
    from specjax.checkpoints import hf

    cfg, params = hf.load_hf(spec)
    tok = Tokenizer.from_file(os.path.join(spec, 'tokenizer.json'))
    return LoadedModel(cfg, _cast(params, target_dtype), tok, spec)
  elif spec.endswith('.gguf'):
    path = spec
  else:
    raise ValueError(
      f'unknown model {spec!r}: expected one of {list(MODEL_ASSETS)}, a path to '
      f'a .gguf file, a Hugging Face style directory, or "tiny"'
    )
  from specjax.checkpoints import gguf

  cfg, params = gguf.load_gguf(path)
  return LoadedModel(cfg, _cast(params, target_dtype), Tokenizer.from_gguf(path), str(path))


def _cast(params, dtype):
  return jax.tree_util.tree_map(lambda x: np.asarray(x).astype(dtype), params)


def load_draft(spec: str, target: LoadedModel, dtype: str = 'float32'):
  """(drafter, draft params, description) for a draft spec, checked against the target.

  'ngram' or 'ngram:N' is prompt lookup with n-grams of up to N tokens (default 3), and
  'ngram:M-N' with n-grams of N down to M tokens (shorter matches propose nothing);
  'truncated:K' is the target's first K layers sharing its embeddings (an untrained
  stand-in); 'layers:0-11,20-29' is the target itself running only those layers, with
  its own cache (self-speculative layer skipping); 'distilled' is the draft distilled for
  SmolLM2-135M-Instruct that ships with specjax, 'distilled:DIR' (or DIR itself) one saved
  by `python -m specjax.train_draft` (see drafters/distilled.py); 'consensus:N[,k=4,m=1,n=3]' drafts
  each row from the other rows of its group of N (see drafters/consensus.py); any other
  spec is loaded like a model and must share the target's vocabulary.
  """
  from specjax.drafters import ModelDrafter, NgramDrafter, truncated_target
  from specjax.drafters.model import parse_layers

  if spec == 'distilled' or spec.startswith('distilled:') or _is_distilled_dir(spec):
    return _load_distilled(spec, target)
  if spec.startswith('layers:'):
    layers = parse_layers(spec.split(':', 1)[1], target.cfg.n_layers)
    label = f'target with {len(layers)} of {target.cfg.n_layers} layers ({spec[7:]})'
    return ModelDrafter(target.cfg, label=label, layers=layers), target.params, label
  if spec.startswith('consensus:'):
    from specjax.drafters.consensus import parse_spec

    drafter = parse_spec(spec, target.cfg.vocab_size)
    return drafter, None, f'consensus drafts {drafter.name}'
  if spec == 'ngram' or spec.startswith('ngram:'):
    try:  # ngram:N (n-grams of N down to 1 tokens) or ngram:M-N (N down to M)
      lo, _, hi = spec.split(':', 1)[1].rpartition('-') if ':' in spec else ('', '', '3')
      n_min, n_max = int(lo or 1), int(hi)
    except ValueError:
      raise ValueError(
        f'draft {spec!r}: expected ngram:<longest n-gram> or ngram:<shortest>-<longest>'
      ) from None
    drafter = NgramDrafter(target.cfg.vocab_size, n_max=n_max, n_min=n_min)
    return drafter, None, f'prompt lookup {drafter.name}'
  if spec.startswith('truncated:'):
    try:
      layers = int(spec.split(':', 1)[1])
    except ValueError:
      raise ValueError(f'draft {spec!r}: expected truncated:<number of layers>') from None
    cfg, params = truncated_target(target.cfg, target.params, layers)
    label = f'target truncated to {layers} layers (untrained)'
    return ModelDrafter(cfg, label=label), params, label
  draft = load_model(spec, dtype)
  if draft.cfg.vocab_size != target.cfg.vocab_size:
    raise ValueError(
      f'draft {spec!r} has a vocabulary of {draft.cfg.vocab_size} tokens but the '
      f'target {target.source!r} has {target.cfg.vocab_size}: they must share one'
    )
  probe = 'Hello, world! def f(x): return x ** 2  # 12345'
  if draft.tokenizer.encode(probe) != target.tokenizer.encode(probe):
    raise ValueError(
      f'draft {spec!r} tokenizes text differently from the target '
      f'{target.source!r}: they must share one tokenizer'
    )
  return ModelDrafter(draft.cfg, label=f'draft {spec}'), draft.params, f'draft model {spec}'


DISTILLED_DRAFT = os.path.join(
  os.path.dirname(os.path.dirname(__file__)), 'drafts', 'smollm2-135m-instruct'
)


def _is_distilled_dir(spec: str) -> bool:
  return os.path.isfile(os.path.join(spec, 'draft.json'))


def _load_distilled(spec: str, target: LoadedModel):
  """A reduced-vocabulary distilled draft, sharing the target's input embeddings."""
  from specjax.drafters.distilled import DistilledDrafter, load_draft_dir

  path = DISTILLED_DRAFT if spec == 'distilled' else spec.removeprefix('distilled:')
  if not _is_distilled_dir(path):
    raise ValueError(
      f'draft {spec!r}: no distilled draft at {path} (train one with python -m specjax.train_draft)'
    )
  cfg, params, _ = load_draft_dir(
    path, target.params['embed'], np.asarray(target.params['embed']).dtype
  )
  label = f'distilled draft ({cfg.n_layers} layers, {len(params["vocab_ids"])}-token head)'
  return DistilledDrafter(cfg, label=label), params, label
