"""DFlash block drafters on disk (config.json + model.safetensors), in DFlash's layout.

The tensor names are those of z-lab's reference model (z-lab/dflash dflash/model.py,
`DFlashDraftModel`, a Qwen3-style stack) as vLLM's loader reads them
(vllm/model_executor/models/qwen3_dflash.py: it prefixes `model.` to all but lm_head and
d2t):

  fc.weight                                      [D, C * D]   torch layout: (out, in)
  hidden_norm.weight                             [D]          norm of the fused features
  layers.{i}.input_layernorm.weight              [D]
  layers.{i}.self_attn.{q,k,v}_proj.weight       [N*H | G*H, D]
  layers.{i}.self_attn.{q,k}_norm.weight         [H]
  layers.{i}.self_attn.o_proj.weight             [D, N*H]
  layers.{i}.post_attention_layernorm.weight     [D]
  layers.{i}.mlp.{gate,up}_proj.weight           [F, D];  layers.{i}.mlp.down_proj.weight [D, F]
  norm.weight                                    [D]
  lm_head.weight                                 [K, D]   the draft vocabulary's rows
  d2t                                            [K] int64: target id - draft id (an offset)
  mask_embedding                                 [D]      specjax's learned mask input

DFlash's own drafters embed the mask as the target's embedding row of a `mask_token_id`
added to the vocabulary and share the target's lm_head; specjax learns the mask
embedding itself (vLLM takes such a separately trained mask from `mask_embedding.pt`,
which specjax/export/dflash.py writes) and may keep a reduced draft vocabulary (vLLM
reads d2t for it, as for EAGLE-3). config.json carries the shape, `block_size` and
`dflash_config.target_layer_ids` in DFlash's convention: the target layers whose
*output* is read (Hugging Face hidden_states[i + 1]); specjax's `capture` names the
stream entering a layer, so target_layer_ids = capture - 1 (load adds the one back).
Weights are bfloat16 on disk (float32 in memory).
"""

from __future__ import annotations

import json
import os
import pathlib

import ml_dtypes
import numpy as np

from specjax.checkpoints import eagle3
from specjax.models.dflash import DFlashConfig
from specjax.models.eagle import check_params

CONFIG_FILE = 'config.json'
WEIGHTS_FILE = 'model.safetensors'
INDEX_FILE = 'model.safetensors.index.json'  # Hugging Face's sharded layout
ARCHITECTURE = 'DFlashDraftModel'

# specjax layer tensor -> its DFlash name under layers.{i}. (matrices transposed)
LAYER_NAMES = {
  'attn_norm': 'input_layernorm.weight',
  'wq': 'self_attn.q_proj.weight',
  'wk': 'self_attn.k_proj.weight',
  'wv': 'self_attn.v_proj.weight',
  'q_norm': 'self_attn.q_norm.weight',
  'k_norm': 'self_attn.k_norm.weight',
  'wo': 'self_attn.o_proj.weight',
  'mlp_norm': 'post_attention_layernorm.weight',
  'w_gate': 'mlp.gate_proj.weight',
  'w_up': 'mlp.up_proj.weight',
  'w_down': 'mlp.down_proj.weight',
}
# top-level specjax tensor -> its name (fc and head transposed)
TOP_NAMES = {
  'fc': 'fc.weight',
  'hidden_norm': 'hidden_norm.weight',
  'mask': 'mask_embedding',
  'norm': 'norm.weight',
  'head': 'lm_head.weight',
}


def weight_files(directory) -> list[pathlib.Path]:
  """model.safetensors, or the shards its index (model.safetensors.index.json) names;
  [] when neither is there."""
  d = pathlib.Path(directory)
  if (d / WEIGHTS_FILE).is_file():
    return [d / WEIGHTS_FILE]
  shards = _indexed_shards(d) or []
  return [d / f for f in shards] if all((d / f).is_file() for f in shards) else []


def _indexed_shards(d: pathlib.Path) -> list[str] | None:
  """The shard files the directory's index names (None: no readable index)."""
  try:
    return sorted(set(json.loads((d / INDEX_FILE).read_text())['weight_map'].values()))
  except (OSError, json.JSONDecodeError, KeyError, AttributeError, TypeError):
    return None


def write_weights(directory, tensors: dict, shard_bytes: int = 0) -> None:
  """Writes `tensors` as model.safetensors, or with shard_bytes > 0 as Hugging Face
  shards of at most shard_bytes each (a larger tensor gets one alone) and their index;
  each file lands whole (written aside, then renamed), the index last."""
  import safetensors.numpy

  d = pathlib.Path(directory)
  groups, size = [[]], 0
  for name, a in tensors.items():
    if shard_bytes and groups[-1] and size + a.nbytes > shard_bytes:
      groups.append([])
      size = 0
    groups[-1].append(name)
    size += a.nbytes
  names = [WEIGHTS_FILE] if not shard_bytes else [
    f'model-{i + 1:05d}-of-{len(groups):05d}.safetensors' for i in range(len(groups))
  ]  # fmt: skip
  for file, group in zip(names, groups):
    tmp = d / (file + '.tmp')
    safetensors.numpy.save_file({n: tensors[n] for n in group}, str(tmp), metadata={'format': 'pt'})
    os.replace(tmp, d / file)
  stale = [INDEX_FILE] if not shard_bytes else [WEIGHTS_FILE]
  for f in stale:
    (d / f).unlink(missing_ok=True)
  if shard_bytes:
    index = {
      'metadata': {'total_size': int(sum(a.nbytes for a in tensors.values()))},
      'weight_map': {n: f for f, group in zip(names, groups) for n in group},
    }
    (d / (INDEX_FILE + '.tmp')).write_text(json.dumps(index, indent=2) + '\n')
    os.replace(d / (INDEX_FILE + '.tmp'), d / INDEX_FILE)


def missing_shards(directory) -> list[str]:
  """The shards a directory's index names that are not there ([] without an index)."""
  d = pathlib.Path(directory)
  return [f for f in _indexed_shards(d) or [] if not (d / f).is_file()]


def is_dflash_dir(path) -> bool:
  """Whether `path` holds a drafter in DFlash layout; ValueError naming the shards its
  index lists that are missing (an interrupted download or copy)."""
  p = pathlib.Path(path)
  if (p / CONFIG_FILE).is_file() and (gone := missing_shards(p)):
    raise ValueError(
      f'{p}: {INDEX_FILE} names {", ".join(gone)}, which {"is" if len(gone) == 1 else "are"} '
      'not in the directory (an incomplete download or copy?)'
    )
  if not (p / CONFIG_FILE).is_file() or not weight_files(p):
    return False
  try:
    return 'dflash_config' in json.loads((p / CONFIG_FILE).read_text())
  except (OSError, json.JSONDecodeError):
    return False


def _bf16(a) -> np.ndarray:
  a = np.asarray(a, np.float32)
  return np.ascontiguousarray(a.T if a.ndim == 2 else a).astype(ml_dtypes.bfloat16)


def to_tensors(params) -> dict[str, np.ndarray]:
  """specjax drafter params -> DFlash tensors (torch (out, in) layout, bfloat16)."""
  out = {name: _bf16(params[key]) for key, name in TOP_NAMES.items()}
  for i, layer in enumerate(params['layers']):
    for key, name in LAYER_NAMES.items():
      out[f'layers.{i}.{name}'] = _bf16(layer[key])
  out['d2t'] = eagle3.d2t_of(params['vocab_ids'])
  return out


def from_tensors(tensors, cfg: DFlashConfig, source: str) -> dict:
  """DFlash tensors -> specjax drafter params (float32; vocab_ids from d2t)."""
  names = [*TOP_NAMES.values(), 'd2t']
  names += [f'layers.{i}.{n}' for i in range(cfg.n_layers) for n in LAYER_NAMES.values()]
  missing = [n for n in names if n not in tensors]
  if missing:
    raise ValueError(f'{source}: missing tensors {missing}')

  def f32(name):
    a = np.asarray(tensors[name], np.float32)
    return np.ascontiguousarray(a.T if a.ndim == 2 else a)

  params = {key: f32(name) for key, name in TOP_NAMES.items()}
  params['layers'] = [
    {key: f32(f'layers.{i}.{name}') for key, name in LAYER_NAMES.items()}
    for i in range(cfg.n_layers)
  ]
  params['vocab_ids'] = eagle3.vocab_ids_of(tensors['d2t'], cfg.vocab_size)
  if params['vocab_ids'] is None:
    raise ValueError(f'{source}: d2t does not map the draft vocabulary to distinct target ids')
  return params


def hf_config(cfg: DFlashConfig, info: dict | None = None) -> dict:
  return {
    'architectures': [ARCHITECTURE],
    'model_type': 'qwen3',
    **eagle3.shape_entries(cfg, cfg.n_layers),
    'attention_bias': False,
    'is_causal': False,
    **eagle3.vocab_entries(cfg),
    'block_size': cfg.block_size,
    'tie_word_embeddings': False,
    'torch_dtype': 'bfloat16',
    'dflash_config': {
      'block_size': cfg.block_size,
      'target_layer_ids': [i - 1 for i in cfg.capture],
      'input_embedding_scale': cfg.embed_scale,
    },
    'specjax': {**(info or {}), 'capture': list(cfg.capture)},
  }


def save(
  directory,
  cfg: DFlashConfig,
  params,
  info: dict | None = None,
  extra=None,
  config_extra=None,
  shard_bytes: int = 0,
) -> None:
  """Writes config.json and model.safetensors (DFlash layout; Hugging Face shards of at
  most shard_bytes when > 0) to `directory`; `extra` tensors (name -> array, written as
  given) and `config_extra` keys join them (the DSpark heads, checkpoints/dspark.py)."""
  check_params(cfg, params, 'DFlash drafter')
  d = pathlib.Path(directory)
  d.mkdir(parents=True, exist_ok=True)
  write_weights(d, {**to_tensors(params), **(extra or {})}, shard_bytes)
  config = {**hf_config(cfg, info), **(config_extra or {})}
  (d / CONFIG_FILE).write_text(json.dumps(config, indent=2) + '\n')


def config_from_dict(c: dict, file: pathlib.Path) -> DFlashConfig:
  """The DFlashConfig of a parsed config.json (capture from `specjax.capture`, else
  dflash_config.target_layer_ids + 1); raises KeyError/TypeError/ValueError when malformed."""
  dc = c['dflash_config']
  extra = c.get('specjax') if isinstance(c.get('specjax'), dict) else {}
  capture = extra.get('capture') or [int(i) + 1 for i in dc['target_layer_ids']]
  return DFlashConfig(
    **eagle3.shape_fields(c, draft_vocab_optional=True),
    capture=tuple(int(i) for i in capture),
    n_layers=int(c['num_hidden_layers']),
    block_size=int(dc.get('block_size', c.get('block_size', 16))),
    **eagle3.rope_fields(c, file, norm_eps=1e-6),
    embed_scale=float(dc.get('input_embedding_scale', 1.0)),
  )


def read(directory) -> tuple[dict, DFlashConfig, dict[str, np.ndarray]]:
  """(the parsed config.json, its DFlashConfig, every tensor as stored) of a drafter saved
  in DFlash layout; raises ValueError for anything else (an engine export included)."""
  import safetensors.numpy

  d = pathlib.Path(directory)
  if not is_dflash_dir(d):
    raise ValueError(
      f'{d}: not a DFlash drafter (needs {CONFIG_FILE} with dflash_config and {WEIGHTS_FILE} '
      f'or {INDEX_FILE} and its shards)'
    )
  c = json.loads((d / CONFIG_FILE).read_text())
  engine = c['specjax'].get('exported_for') if isinstance(c.get('specjax'), dict) else None
  if engine:
    raise ValueError(
      f'{d}: an export for {engine}, which leaves tensors to the engine (read it with '
      'specjax.export.dflash.read)'
    )
  try:
    cfg = config_from_dict(c, d / CONFIG_FILE)
  except (KeyError, TypeError, ValueError) as e:
    raise ValueError(f'{d / CONFIG_FILE}: bad or missing field ({e!r})') from None
  tensors = {}
  for file in weight_files(d):
    tensors.update(safetensors.numpy.load_file(str(file)))
  return c, cfg, tensors


def load(directory) -> tuple[DFlashConfig, dict, dict]:
  """(cfg, float32 drafter params, the `specjax` info) of a drafter saved in DFlash layout
  (tensors it does not know, such as DSpark's heads, are left out)."""
  d = pathlib.Path(directory)
  c, cfg, tensors = read(d)
  params = from_tensors(tensors, cfg, str(d))
  check_params(cfg, params, str(d / WEIGHTS_FILE))
  info = dict(c.get('specjax') or {})
  info.pop('capture', None)
  return cfg, params, info
