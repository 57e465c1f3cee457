r"""DFlash block drafters in the layouts vLLM and SGLang load (python -m specjax.export).

A DFlash directory (specjax/checkpoints/dflash.py: config.json + model.safetensors, z-lab's
tensor names, bfloat16) becomes, per engine, exactly what that engine's loader reads. From
the loaders' source (GitHub vllm-project/vllm and sgl-project/sglang):

vLLM (speculative_config {"method": "dflash", "model": OUT}):
* config.json: architectures ['DFlashDraftModel'] (model_executor/models/registry.py maps it
  to qwen3_dflash.DFlashQwen3ForCausalLM); model_type 'qwen3'; draft_vocab_size (the size of
  its own lm_head); is_causal false (qwen3_dflash._dflash_layer_causal: the block attends both
  ways); dflash_config.target_layer_ids, to which
  v1/worker/gpu/spec_decode/eagle/eagle3_utils.py get_eagle3_aux_layers_from_config adds one
  and the target captures the stream entering that layer: specjax's capture i is id i - 1;
  dflash_config.mask_token_id (v1/worker/gpu/spec_decode/utils.py
  get_parallel_drafting_token_id: required, the id every drafted slot is fed as).
* model.safetensors: DFlashQwen3ForCausalLM.load_weights prefixes `model.` to every name but
  lm_head and d2t and skips t2d, so the names are the bare ones (fc.weight, hidden_norm.weight,
  layers.{i}.*, norm.weight, lm_head.weight [K, D]); d2t [K] int64 (target id = draft id +
  d2t) only when K is below the target's vocabulary: with a full vocabulary the model has no
  draft_id_to_target_id to load it into.
* mask_embedding.pt: load_weights drops an in-file mask tensor unless
  _read_mask_embedding finds this file ({'embedding': [D], 'mask_token_id': id}, torch.load);
  DFlashQwen3Model.embed_input_ids then feeds it wherever the input id is mask_token_id.
  Its embed_tokens is the target's (dflash/utils.py load_dflash_model shares it), unscaled.

SGLang (--speculative-algorithm DFLASH --speculative-draft-model-path OUT):
* python/sglang/srt/models/dflash.py DFlashDraftModel (EntryClass, architectures
  ['DFlashDraftModel']) holds layers.*, fc.weight, hidden_norm.weight and norm.weight only;
  load_weights ignores every other name. Its config is read by
  speculative/dflash_utils.py parse_dflash_draft_config: dflash_config.block_size,
  target_layer_ids (models/qwen3.py set_dflash_layers_to_capture captures before id + 1, as
  vLLM) and mask_token_id.
* speculative/dflash_worker.py DFlashWorker embeds the whole block with the *target's*
  embedding (the mask slots as the row of mask_token_id) and drafts with the *target's*
  lm_head ("DFLASH's draft has no head of its own", dflash_worker_v2.py). So SGLang runs a
  specjax drafter only when its head is the target's head over the full vocabulary and its
  mask embedding is one of the target's embedding rows; the export checks both against
  --target and refuses otherwise.

A DSpark drafter (a DFlash directory with DeepSpec's head tensors, checkpoints/dspark.py)
exports its block: neither engine's loader has a DSpark model, so the Markov and confidence
heads stay behind (the CLI says so) and the block drafts there as DFlash.

Both: the anchor's embedding is not scaled (a drafter for a Gemma target is refused), and
neither captures the stream entering layer 0 (refused). `read` turns an export back into
specjax's tree.
"""

from __future__ import annotations

import json
import os
import pathlib

import ml_dtypes
import numpy as np

from specjax.checkpoints import dflash as ckpt

MASK_FILE = 'mask_embedding.pt'  # vLLM's qwen3_dflash.py MASK_EMBEDDING_FILENAME
VLLM_DROPS = ('mask_embedding',)  # dropped by vLLM's load_weights without MASK_FILE
SGLANG_TOP = ('fc.weight', 'hidden_norm.weight', 'norm.weight')  # DFlashDraftModel's own
ENGINE_FILES = {
  'vllm': (ckpt.CONFIG_FILE, ckpt.WEIGHTS_FILE, MASK_FILE),
  'sglang': (ckpt.CONFIG_FILE, ckpt.WEIGHTS_FILE),
}


def check_for_engines(cfg: ckpt.DFlashConfig) -> None:
  """Raises ValueError (one line) for a drafter neither engine computes as specjax does."""
  if min(cfg.capture) < 1:
    raise ValueError(
      f'the drafter reads the stream entering target layer 0 (layers {list(cfg.capture)}), '
      "which vLLM's and SGLang's targets do not capture"
    )
  if cfg.embed_scale != 1.0:
    raise ValueError(
      f'the drafter scales the anchor embedding by {cfg.embed_scale:g} (a Gemma target); '
      "vLLM's and SGLang's DFlash drafters feed the target's embedding unscaled"
    )


def engine_config(cfg: ckpt.DFlashConfig, info: dict, engine: str, mask_token_id: int) -> dict:
  """config.json for `engine`: capture only as target_layer_ids (capture - 1), as engines
  read it, plus the mask token id both require."""
  info = {k: v for k, v in info.items() if k != 'exported_for'}
  c = ckpt.hf_config(cfg, {**info, 'exported_for': engine})
  del c['specjax']['capture']  # read back from target_layer_ids, as the engines do
  c['dflash_config']['mask_token_id'] = int(mask_token_id)
  if engine == 'sglang':  # its lm_head is the target's: no head of its own
    del c['draft_vocab_size']
  return c


def _bf16(a) -> np.ndarray:
  return np.ascontiguousarray(np.asarray(a, np.float32)).astype(ml_dtypes.bfloat16)


def vllm_tensors(cfg: ckpt.DFlashConfig, params) -> dict[str, np.ndarray]:
  """The tensors vLLM's DFlashQwen3ForCausalLM.load_weights reads from model.safetensors."""
  t = {k: v for k, v in ckpt.to_tensors(params).items() if k not in VLLM_DROPS}
  if cfg.draft_vocab == cfg.vocab_size:
    del t['d2t']  # no draft_id_to_target_id parameter to take it
  return t


def sglang_tensors(cfg: ckpt.DFlashConfig, params) -> dict[str, np.ndarray]:
  """The tensors SGLang's DFlashDraftModel holds: the layers, fc, hidden_norm, norm."""
  t = ckpt.to_tensors(params)
  return {k: v for k, v in t.items() if k in SGLANG_TOP or k.startswith('layers.')}


def write_mask(path, mask, mask_token_id: int) -> None:
  """mask_embedding.pt as vLLM's _read_mask_embedding reads it (torch.load, weights_only)."""
  try:
    import torch
  except ImportError:
    raise ValueError(f'writing {MASK_FILE} for vLLM needs torch (pip install torch)') from None
  emb = torch.from_numpy(np.asarray(mask, np.float32)).to(torch.bfloat16)
  torch.save({'embedding': emb, 'mask_token_id': int(mask_token_id)}, str(path))


def _write(out, tensors, config: dict) -> None:
  import safetensors.numpy

  out = pathlib.Path(out)
  out.mkdir(parents=True, exist_ok=True)
  tmp = out / (ckpt.WEIGHTS_FILE + '.tmp')
  safetensors.numpy.save_file(tensors, str(tmp), metadata={'format': 'pt'})
  os.replace(tmp, out / ckpt.WEIGHTS_FILE)
  (out / ckpt.CONFIG_FILE).write_text(json.dumps(config, indent=2) + '\n')


def check_mask_token_id(cfg: ckpt.DFlashConfig, mask_token_id) -> int:
  m = cfg.vocab_size - 1 if mask_token_id is None else int(mask_token_id)
  if not 0 <= m < cfg.vocab_size:
    raise ValueError(f'--mask-token-id {m} is outside the vocabulary [0, {cfg.vocab_size})')
  return m


def exported_for(directory) -> str | None:
  """'vllm' or 'sglang' for a DFlash directory this module wrote, else None."""
  try:
    c = json.loads((pathlib.Path(directory) / ckpt.CONFIG_FILE).read_text())
  except (OSError, json.JSONDecodeError):
    return None
  extra = c.get('specjax') if isinstance(c.get('specjax'), dict) else {}
  return extra.get('exported_for') if extra.get('exported_for') in ENGINE_FILES else None


def load_any(draft, target_params=None) -> tuple[ckpt.DFlashConfig, dict, dict]:
  """(cfg, params, info) of a DFlash directory specjax saved or exported (an SGLang export
  takes its head and mask from `target_params`)."""
  if exported_for(draft):
    return read(draft, target_params)
  return ckpt.load(draft)


def export_vllm(loaded, out, mask_token_id=None) -> int:
  """Writes the drafter `loaded` (cfg, params, info) to `out` for vLLM; returns the mask
  token id.

  vLLM feeds every drafted slot as `mask_token_id` and swaps in the learned mask embedding
  where the input id equals it: default the vocabulary's last id, which an anchor should
  never be (a committed anchor equal to it would be embedded as the mask).
  """
  cfg, params, info = loaded
  check_for_engines(cfg)
  m = check_mask_token_id(cfg, mask_token_id)
  out = pathlib.Path(out)
  out.mkdir(parents=True, exist_ok=True)
  write_mask(out / MASK_FILE, params['mask'], m)
  _write(out, vllm_tensors(cfg, params), engine_config(cfg, info, 'vllm', m))
  return m


def target_head(target_params) -> np.ndarray:
  """The target's output head [D, V] (its tied embedding when it has no lm_head)."""
  head = target_params.get('lm_head')
  if head is None:
    return np.asarray(target_params['embed'], np.float32).T
  return np.asarray(head, np.float32)


def sglang_mask_id(cfg: ckpt.DFlashConfig, params, target_params) -> int:
  """The target token whose embedding row is the drafter's mask (compared in bfloat16);
  raises ValueError unless SGLang's borrowed embedding and head reproduce the drafter."""
  if cfg.draft_vocab != cfg.vocab_size:
    raise ValueError(
      f'the drafter keeps {cfg.draft_vocab} of {cfg.vocab_size} tokens; SGLang drafts with the '
      "target's full lm_head (no d2t): export for vllm"
    )
  head = target_head(target_params)
  if head.shape != np.shape(params['head']) or not np.array_equal(
    _bf16(head), _bf16(params['head'])
  ):
    raise ValueError(
      "the drafter's head is not the target's lm_head, which SGLang drafts with: export for vllm"
    )
  embed = _bf16(np.asarray(target_params['embed'], np.float32))
  rows = np.flatnonzero((embed == _bf16(params['mask'])[None]).all(-1))
  if not len(rows):
    raise ValueError(
      "the drafter's learned mask embedding is no row of the target's embedding, which "
      'SGLang feeds the mask slots from (the row of mask_token_id): export for vllm'
    )
  return int(rows[0])


def check_target(cfg: ckpt.DFlashConfig, target_params) -> None:
  embed = np.shape(target_params['embed'])
  if embed != (cfg.vocab_size, cfg.d_model):
    raise ValueError(
      f'the target embedding is {embed}, the drafter was made for '
      f'({cfg.vocab_size}, {cfg.d_model}): pass the --target it was trained for'
    )


def export_sglang(loaded, out, target_params) -> int:
  """Writes the drafter `loaded` (cfg, params, info) to `out` for SGLang, checked against
  the target's params; returns the mask token id."""
  cfg, params, info = loaded
  check_for_engines(cfg)
  check_target(cfg, target_params)
  m = sglang_mask_id(cfg, params, target_params)
  _write(out, sglang_tensors(cfg, params), engine_config(cfg, info, 'sglang', m))
  return m


def _read_mask(path, mask_token_id: int) -> np.ndarray:
  import torch

  state = torch.load(str(path), weights_only=True)
  if isinstance(state, dict):
    if state.get('mask_token_id', mask_token_id) != mask_token_id:
      raise ValueError(f'{path}: mask_token_id differs from dflash_config.mask_token_id')
    state = state['embedding']
  return state.float().reshape(-1).numpy()


def read(directory, target_params=None) -> tuple[ckpt.DFlashConfig, dict, dict]:
  """(cfg, float32 params, info) of an export, read as its engine reads it: capture from
  target_layer_ids + 1; for vLLM the mask from mask_embedding.pt and d2t (absent: the
  identity); for SGLang the head and the mask row from `target_params`."""
  import safetensors.numpy

  d = pathlib.Path(directory)
  c = json.loads((d / ckpt.CONFIG_FILE).read_text())
  engine = (c.get('specjax') or {}).get('exported_for')
  if engine not in ENGINE_FILES:
    raise ValueError(f'{d}: not a DFlash export for vllm or sglang')
  c.setdefault('draft_vocab_size', c['vocab_size'])
  cfg = ckpt.config_from_dict(c, d / ckpt.CONFIG_FILE)
  t = dict(safetensors.numpy.load_file(str(d / ckpt.WEIGHTS_FILE)))
  m = int(c['dflash_config']['mask_token_id'])
  if engine == 'vllm':
    t['mask_embedding'] = _read_mask(d / MASK_FILE, m)
    t.setdefault('d2t', np.zeros(cfg.draft_vocab, np.int64))
  else:
    if target_params is None:
      raise ValueError(f'{d}: an SGLang export takes its head and mask from the target')
    check_target(cfg, target_params)
    t['mask_embedding'] = _bf16(np.asarray(target_params['embed'], np.float32)[m])
    t['lm_head.weight'] = _bf16(target_head(target_params).T)
    t['d2t'] = np.zeros(cfg.vocab_size, np.int64)
  params = ckpt.from_tensors(t, cfg, str(d))
  ckpt.check_params(cfg, params, str(d))
  return cfg, params, dict(c.get('specjax') or {})
