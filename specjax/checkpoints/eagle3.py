"""EAGLE-3 heads on disk, in the layout vLLM and SGLang load (config.json + model.safetensors).

specjax saves its heads in this layout and reads them back from it, so a head trained
here is a vLLM draft as it stands (`speculative_config={"method": "eagle3",
"model": DIR}`); `python -m specjax.export --engine sglang` writes SGLang's form
(specjax/export/engines.py). The names and conventions follow their loaders (vLLM
model_executor/models/llama_eagle3.py, SGLang srt/models/llama_eagle3.py) and EAGLE's
own trainer (eagle/traineagle3/cnets.py):

  fc.weight                                   [D, C * D]   torch layout: (out, in)
  midlayer.input_layernorm.weight             [D]          norm of the token embedding
  midlayer.hidden_norm.weight                 [D]          norm of the fused state
  midlayer.self_attn.{q,k,v}_proj.weight      [N*H | G*H, 2D]  input: [embedding, state]
  midlayer.self_attn.o_proj.weight            [D, N*H]
  midlayer.post_attention_layernorm.weight    [D]
  midlayer.mlp.{gate,up}_proj.weight          [F, D];  midlayer.mlp.down_proj.weight [D, F]
  norm.weight                                 [D]
  lm_head.weight                              [K, D]   the draft vocabulary's rows
  d2t                                         [K] int64: target id - draft id (an offset)
  t2d                                         [V] bool: target ids in the draft vocabulary

The input embedding is the target's and is not stored (vLLM and SGLang then share the
target's). config.json carries `draft_vocab_size`, the head's shape, `rope_theta` and the
layers whose incoming residual stream the head reads, in vLLM's convention (ids as in HF
hidden_states[i]), twice: top-level `eagle_aux_hidden_state_layer_ids`, which vLLM reads
(v1/worker/gpu/spec_decode/eagle/eagle3_utils.py), and
`eagle_config.eagle_aux_hidden_state_layer_ids`, which specjax reads back and SGLang reads
and adds one to (SGLANG_SHIFT): as saved, a head would read one layer late in SGLang, so
the SGLang export writes i - 1 there, marked `"exported_for": "sglang"` in the `specjax`
entry (which otherwise records how the head was trained; load undoes the shift). Weights
are bfloat16 on disk (float32 in memory).
"""

from __future__ import annotations

import json
import os
import pathlib

import ml_dtypes
import numpy as np

from specjax.checkpoints import hf
from specjax.models.eagle import EagleConfig, FeatureConfig, check_params

CONFIG_FILE = 'config.json'
WEIGHTS_FILE = 'model.safetensors'
ARCHITECTURE = 'LlamaForCausalLMEagle3'
SGLANG_SHIFT = 1  # SGLang captures the stream entering layer id + 1 (models/llama.py)

# specjax layer tensor -> its EAGLE-3 name (matrices are transposed: torch stores (out, in))
LAYER_NAMES = {
  'embed_norm': 'midlayer.input_layernorm.weight',
  'hidden_norm': 'midlayer.hidden_norm.weight',
  'wq': 'midlayer.self_attn.q_proj.weight',
  'wk': 'midlayer.self_attn.k_proj.weight',
  'wv': 'midlayer.self_attn.v_proj.weight',
  'wo': 'midlayer.self_attn.o_proj.weight',
  'mlp_norm': 'midlayer.post_attention_layernorm.weight',
  'w_gate': 'midlayer.mlp.gate_proj.weight',
  'w_up': 'midlayer.mlp.up_proj.weight',
  'w_down': 'midlayer.mlp.down_proj.weight',
}


def is_head_dir(path) -> bool:
  p = pathlib.Path(path)
  if not (p / CONFIG_FILE).is_file() or not (p / WEIGHTS_FILE).is_file():
    return False
  try:
    return 'draft_vocab_size' in json.loads((p / CONFIG_FILE).read_text())
  except (OSError, json.JSONDecodeError):
    return False


def to_tensors(params) -> dict[str, np.ndarray]:
  """specjax head params -> EAGLE-3 tensors (torch (out, in) layout, bfloat16)."""
  bf16 = lambda a: np.ascontiguousarray(np.asarray(a, np.float32)).astype(ml_dtypes.bfloat16)
  out = {'fc.weight': bf16(np.asarray(params['fc']).T)}
  for name, target in LAYER_NAMES.items():
    a = np.asarray(params['layer'][name])
    out[target] = bf16(a.T if a.ndim == 2 else a)
  out['norm.weight'] = bf16(params['norm'])
  out['lm_head.weight'] = bf16(np.asarray(params['head']).T)
  out['d2t'] = d2t_of(params['vocab_ids'])
  return out


def d2t_of(vocab_ids) -> np.ndarray:
  """d2t [K] int64 (target id - draft id) of the draft vocabulary's target ids."""
  ids = np.asarray(vocab_ids, np.int64)
  return ids - np.arange(len(ids), dtype=np.int64)


def vocab_ids_of(d2t, vocab_size: int) -> np.ndarray | None:
  """The draft vocabulary's target ids [K] int32 of a d2t tensor; None unless they are
  distinct target ids in order."""
  d2t = np.asarray(d2t, np.int64)
  ids = d2t + np.arange(len(d2t))
  if len(ids) and (ids.min() < 0 or ids.max() >= vocab_size or np.any(np.diff(ids) <= 0)):
    return None
  return ids.astype(np.int32)


def from_tensors(tensors, vocab_size: int) -> dict:
  """EAGLE-3 tensors -> specjax head params (float32; vocab_ids from d2t)."""
  f32 = lambda name: np.asarray(tensors[name], np.float32)
  layer = {}
  for name, source in LAYER_NAMES.items():
    a = f32(source)
    layer[name] = np.ascontiguousarray(a.T if a.ndim == 2 else a)
  ids = vocab_ids_of(tensors['d2t'], vocab_size)
  if ids is None:
    raise ValueError('d2t does not map the draft vocabulary to distinct target ids in order')
  return {
    'fc': np.ascontiguousarray(f32('fc.weight').T),
    'layer': layer,
    'norm': f32('norm.weight'),
    'head': np.ascontiguousarray(f32('lm_head.weight').T),
    'vocab_ids': ids,
  }


def rope_scaling_dict(scaling: tuple) -> dict | None:
  """LlamaConfig.rope_scaling as transformers writes it (None: no scaling)."""
  if not scaling:
    return None
  if scaling[0] == 'linear':
    return {'rope_type': 'linear', 'factor': scaling[1]}
  keys = ('factor', 'low_freq_factor', 'high_freq_factor', 'original_max_position_embeddings')
  out = dict(zip(keys, scaling[1:]), rope_type='llama3')
  out['original_max_position_embeddings'] = int(out['original_max_position_embeddings'])
  return out


def shape_entries(cfg: FeatureConfig, n_layers: int) -> dict:
  """config.json's entries of a feature drafter's shape (a head's or a block drafter's)."""
  return {
    'hidden_size': cfg.d_model,
    'target_hidden_size': cfg.d_model,
    'intermediate_size': cfg.ffn_dim,
    'num_attention_heads': cfg.n_heads,
    'num_key_value_heads': cfg.n_kv_heads,
    'head_dim': cfg.head_dim,
    'num_hidden_layers': n_layers,
    'hidden_act': 'silu',
  }


def vocab_entries(cfg: FeatureConfig) -> dict:
  """config.json's entries of a feature drafter's norm, RoPE and vocabularies."""
  return {
    'rms_norm_eps': cfg.norm_eps,
    'rope_theta': cfg.rope_base,
    'rope_scaling': rope_scaling_dict(cfg.rope_scaling),
    'max_position_embeddings': 8192,
    'vocab_size': cfg.vocab_size,
    'draft_vocab_size': cfg.draft_vocab,
  }


def shape_fields(c: dict, draft_vocab_optional: bool = False) -> dict:
  """FeatureConfig's fields but `capture` from a parsed config.json (draft_vocab_size
  missing or 0: the target's vocabulary, where optional); raises KeyError/TypeError/
  ValueError when malformed."""
  return {
    'vocab_size': int(c['vocab_size']),
    'draft_vocab': int(
      (c.get('draft_vocab_size') or c['vocab_size'])
      if draft_vocab_optional
      else c['draft_vocab_size']
    ),
    'd_model': int(c['hidden_size']),
    'n_heads': int(c['num_attention_heads']),
    'n_kv_heads': int(c['num_key_value_heads']),
    'head_dim': int(c.get('head_dim') or c['hidden_size'] // c['num_attention_heads']),
    'ffn_dim': int(c['intermediate_size']),
  }


def rope_fields(c: dict, file, norm_eps: float) -> dict:
  """A drafter config's rope_base, norm_eps (default `norm_eps`) and rope_scaling from a
  parsed config.json (`file`, for errors)."""
  return {
    'rope_base': float(c.get('rope_theta', 10000.0)),
    'norm_eps': float(c.get('rms_norm_eps', norm_eps)),
    'rope_scaling': hf.parse_rope(c.get('rope_scaling'), 0.0, file, 'rope_scaling')[1],
  }


def hf_config(cfg: EagleConfig, info: dict | None = None) -> dict:
  return {
    'architectures': [ARCHITECTURE],
    'model_type': 'llama',
    **shape_entries(cfg, 1),
    **vocab_entries(cfg),
    'tie_word_embeddings': False,
    'torch_dtype': 'bfloat16',
    'eagle_aux_hidden_state_layer_ids': list(cfg.capture),
    'eagle_config': {
      'eagle_aux_hidden_state_layer_ids': list(cfg.capture),
      'use_aux_hidden_state': True,
    },
    'specjax': info or {},
  }


def save(directory, cfg: EagleConfig, params, info: dict | None = None) -> None:
  """Writes config.json and model.safetensors (EAGLE-3 layout) to `directory`."""
  import safetensors.numpy

  check_params(cfg, params, 'EAGLE head')
  d = pathlib.Path(directory)
  d.mkdir(parents=True, exist_ok=True)
  tensors = to_tensors(params)
  t2d = np.zeros(cfg.vocab_size, bool)
  t2d[np.asarray(params['vocab_ids'])] = True
  tensors['t2d'] = t2d
  tmp = d / (WEIGHTS_FILE + '.tmp')
  safetensors.numpy.save_file(tensors, str(tmp), metadata={'format': 'pt'})
  os.replace(tmp, d / WEIGHTS_FILE)
  (d / CONFIG_FILE).write_text(json.dumps(hf_config(cfg, info), indent=2) + '\n')


def load(directory) -> tuple[EagleConfig, dict, dict]:
  """(cfg, float32 head params, the `specjax` info) of a head saved in EAGLE-3 layout."""
  import safetensors.numpy

  d = pathlib.Path(directory)
  if not is_head_dir(d):
    raise ValueError(
      f'{d}: not an EAGLE-3 head (needs {CONFIG_FILE} with draft_vocab_size and {WEIGHTS_FILE})'
    )
  c = json.loads((d / CONFIG_FILE).read_text())
  try:
    capture = tuple(int(i) for i in c['eagle_config']['eagle_aux_hidden_state_layer_ids'])
    if isinstance(c.get('specjax'), dict) and c['specjax'].get('exported_for') == 'sglang':
      capture = tuple(i + SGLANG_SHIFT for i in capture)
    cfg = EagleConfig(
      **shape_fields(c), capture=capture, **rope_fields(c, d / CONFIG_FILE, norm_eps=1e-5)
    )
  except (KeyError, TypeError, ValueError) as e:
    raise ValueError(f'{d / CONFIG_FILE}: bad or missing field ({e!r})') from None
  tensors = safetensors.numpy.load_file(str(d / WEIGHTS_FILE))
  missing = [
    n
    for n in ('fc.weight', 'norm.weight', 'lm_head.weight', 'd2t', *LAYER_NAMES.values())
    if n not in tensors
  ]
  if missing:
    raise ValueError(f'{d / WEIGHTS_FILE}: missing tensors {missing}')
  params = from_tensors(tensors, cfg.vocab_size)
  check_params(cfg, params, str(d / WEIGHTS_FILE))
  return cfg, params, c.get('specjax', {})
