r"""Exports a trained draft in the layout a serving engine loads: vLLM, SGLang or transformers.

  python -m specjax.export --draft DIR --engine vllm|sglang|hf --out OUTDIR [--target MODEL]
      [--overwrite]

DIR is a draft specjax trained (python -m specjax.train_draft):

* an EAGLE-3 feature head (config.json + model.safetensors, specjax/checkpoints/eagle3.py).
  vllm and sglang get the same tensors, copied byte for byte, and a config.json in each
  engine's convention for the captured layers. hf is refused: transformers has no EAGLE-3
  loader, and its assisted generation takes a full causal LM.
* a DFlash block drafter (config.json with dflash_config + model.safetensors,
  specjax/checkpoints/dflash.py): vllm and sglang get what each one's DFlash loader reads,
  specjax/export/dflash.py (its docstring names the loader source). vllm: the tensors minus
  the mask, which goes to mask_embedding.pt, and dflash_config.mask_token_id (--mask-token-id,
  default the vocabulary's last id). sglang borrows the target's embedding and lm_head, so
  the drafter's head must be the target's and its mask one of the target's embedding rows
  (checked against --target, which loads). hf is refused: z-lab's transformers model is
  remote code from the Hub, not a layout transformers loads.
* a distilled draft (draft.json + draft.safetensors, specjax/checkpoints/draft_dir.py). It is
  an ordinary small causal LM once the target's input embedding (not stored with the draft)
  is attached, so every engine gets the same Hugging Face LlamaForCausalLM directory
  (draft_dir.export_hf: full vocabulary, tokens outside the draft's subset score 0; the
  target's tokenizer files beside it): transformers' `assistant_model`, vLLM's
  `"method": "draft_model"`, SGLang's `--speculative-algorithm STANDALONE`. --target names
  the target whose embedding it takes (default 'smollm2-135m-instruct').

What each engine reads, from its loader's source (GitHub vllm-project/vllm and
sgl-project/sglang):

* Tensor names are the same for both, so one model.safetensors serves both: fc.weight,
  midlayer.* (vLLM renames it to model.layers.0.*, SGLang loads it as model.midlayer.*),
  norm.weight, lm_head.weight [draft_vocab_size, D] and d2t (target id = draft id + d2t);
  both skip t2d. vLLM: vllm/model_executor/models/llama_eagle3.py,
  Eagle3LlamaForCausalLM.load_weights; SGLang: python/sglang/srt/models/llama_eagle3.py,
  LlamaForCausalLMEagle3.load_weights.
* Config keys are the same too: architectures ['LlamaForCausalLMEagle3'] (SGLang's
  EntryClass; vllm/model_executor/models/registry.py maps it to Eagle3LlamaForCausalLM),
  draft_vocab_size (the size of lm_head in both), target_hidden_size and
  eagle_config.use_aux_hidden_state. Both build fc over 3 x target_hidden_size
  (llama_eagle3.py LlamaModel.__init__ in each), so a head must read exactly 3 layers.
* The captured layers differ by one. specjax's capture i is the residual stream entering
  target layer i (Hugging Face hidden_states[i]).
  vLLM reads the top-level `eagle_aux_hidden_state_layer_ids`
  (vllm/v1/worker/gpu/spec_decode/eagle/eagle3_utils.py, get_eagle3_aux_layers_from_config;
  absent, the target's default (2, L // 2, L - 3) from get_eagle3_aux_hidden_state_layers),
  and vllm/model_executor/models/llama.py LlamaModel.forward appends `hidden_states +
  residual` before running layer idx for each idx listed: id i there is specjax's i.
  SGLang reads `eagle_config["eagle_aux_hidden_state_layer_ids"]`
  (python/sglang/srt/model_executor/model_runner.py, ModelRunner.__init__) and passes it to
  set_eagle3_layers_to_capture (python/sglang/srt/models/llama.py, LlamaForCausalLM), which
  captures `val + 1`, appended before layer i in LlamaModel.forward: id i - 1 there is
  specjax's i. So the vllm export writes i (both keys, as eagle3.save does), the sglang
  export i - 1 in eagle_config only, marked `"exported_for": "sglang"` under `specjax` (which
  eagle3.load undoes). Neither engine captures the stream entering layer 0 (its residual
  is still None there): such heads are refused.
* Distilled drafts: vLLM's docs (docs/features/speculative_decoding/draft_model.md:
  speculative_config {"method": "draft_model", "model": ...}) and SGLang's
  (docs/advanced_features/speculative_decoding.md: --speculative-algorithm STANDALONE
  --speculative-draft-model-path ...).

Errors print one line 'error: ...' and exit with status 2: a directory that is no draft, an
unknown engine, an EAGLE-3 head for hf, a non-empty OUTDIR without --overwrite and a head an
engine cannot run before any model loads; a target whose embedding does not fit the draft
once it has loaded. --overwrite replaces the files the export writes and leaves any others.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import shutil
import sys

from specjax.checkpoints import dflash as dflash_ckpt
from specjax.checkpoints import draft_dir, eagle3
from specjax.checkpoints import dspark as dspark_ckpt
from specjax.export import dflash as dflash_export

ENGINES = ('vllm', 'sglang', 'hf')
DEFAULT_TARGET = 'smollm2-135m-instruct'  # the default target (harness/api.py DEFAULT_MODEL)
ENGINE_CAPTURES = 3  # vLLM and SGLang build fc over exactly three captured layers
HUB_NAMES = {  # specjax's pinned assets -> the models the engines load
  'smollm2-135m-instruct': 'HuggingFaceTB/SmolLM2-135M-Instruct',
  'gemma3-270m': 'google/gemma-3-270m',
}
USAGE = (
  'python -m specjax.export --draft DIR --engine vllm|sglang|hf --out OUTDIR '
  '[--target MODEL] [--mask-token-id ID] [--overwrite]'
)
HF_EAGLE3 = (
  "an EAGLE-3 head reads the target's hidden states, and transformers has no EAGLE-3 loader "
  '(its assisted generation takes a full causal LM): export a distilled draft for hf, or '
  'use --engine vllm|sglang'
)


HF_DFLASH = (
  "a DFlash drafter reads the target's hidden states, and transformers has no DFlash loader "
  "(z-lab's model is remote code from the Hub): use --engine vllm|sglang"
)


DSPARK_HEADS = (
  "its DSpark heads (markov_head.*, confidence_head.*) stay behind: neither vLLM's nor "
  "SGLang's loaders have a DSpark model, so the block drafts there as plain DFlash (no "
  'Markov bias, no confidence schedule); specjax runs the whole drafter as dspark:DIR'
)


def draft_kind(path) -> str:
  """'dflash', 'eagle3' or 'distilled': which kind of draft directory `path` is."""
  if dflash_ckpt.is_dflash_dir(path):  # first: its config.json has draft_vocab_size too
    return 'dflash'
  if eagle3.is_head_dir(path):
    return 'eagle3'
  if draft_dir.is_draft_dir(path):
    return 'distilled'
  raise ValueError(
    f'--draft {path}: not a draft specjax saved (neither a DFlash drafter: '
    f'{dflash_ckpt.CONFIG_FILE} with dflash_config; nor an EAGLE-3 head: '
    f'{eagle3.CONFIG_FILE} with draft_vocab_size and {eagle3.WEIGHTS_FILE}; nor a distilled '
    f'draft: {draft_dir.CONFIG_FILE})'
  )


def check_engine(engine: str) -> None:
  if engine not in ENGINES:
    raise ValueError(f'unknown engine {engine!r}: expected vllm, sglang or hf')


def check_out(out, draft, overwrite: bool) -> None:
  """Raises ValueError unless `out` may receive an export of `draft`."""
  out = pathlib.Path(out)
  if out.exists() and not out.is_dir():
    raise ValueError(f'--out {out} is a file, not a directory')
  if out.exists() and out.resolve() == pathlib.Path(draft).resolve():
    raise ValueError(f'--out {out} is the draft itself: write the export to another directory')
  if out.is_dir() and any(out.iterdir()) and not overwrite:
    raise ValueError(f'--out {out} exists and is not empty (pass --overwrite to replace its files)')


def check_head_for_engines(capture: tuple[int, ...]) -> None:
  """Raises ValueError unless vLLM and SGLang can capture the layers a head reads."""
  if len(capture) != ENGINE_CAPTURES:
    raise ValueError(
      f'the head reads {len(capture)} target layers {list(capture)}; vLLM and SGLang build '
      f'EAGLE-3 heads over exactly {ENGINE_CAPTURES} (fc takes 3 x target_hidden_size)'
    )
  if min(capture) < 1:
    raise ValueError(
      f'the head reads the stream entering target layer 0 (layers {list(capture)}), which '
      "vLLM's and SGLang's Llama models do not capture"
    )


def engine_config(cfg, info: dict, engine: str) -> dict:
  """config.json of an EAGLE-3 head with config `cfg` for `engine` ('vllm' or 'sglang')."""
  info = {k: v for k, v in info.items() if k != 'exported_for'}
  if engine == 'vllm':
    return eagle3.hf_config(cfg, info)  # specjax's own layout is vLLM's
  c = eagle3.hf_config(cfg, {**info, 'exported_for': 'sglang'})
  del c['eagle_aux_hidden_state_layer_ids']  # vLLM's key: SGLang reads eagle_config's
  c['eagle_config']['eagle_aux_hidden_state_layer_ids'] = [
    i - eagle3.SGLANG_SHIFT for i in cfg.capture
  ]
  return c


def export_eagle3(draft, engine: str, out) -> dict:
  """Writes the head in `draft` to `out` for `engine`; returns its `specjax` info."""
  cfg, _, info = eagle3.load(draft)  # checks every tensor's name and shape
  check_head_for_engines(cfg.capture)
  out = pathlib.Path(out)
  out.mkdir(parents=True, exist_ok=True)
  tmp = out / (eagle3.WEIGHTS_FILE + '.tmp')
  shutil.copyfile(pathlib.Path(draft) / eagle3.WEIGHTS_FILE, tmp)
  os.replace(tmp, out / eagle3.WEIGHTS_FILE)
  config = engine_config(cfg, info, engine)
  (out / eagle3.CONFIG_FILE).write_text(json.dumps(config, indent=2) + '\n')
  return info


def export_distilled(draft, out, target: str) -> dict:
  """Writes the distilled draft in `draft`, with `target`'s embedding, as a Hugging Face
  LlamaForCausalLM directory in `out`; returns its training info."""
  from specjax.checkpoints import loader

  loader.check_model_spec(target)
  model = loader.load_model(target)
  cfg, params, info = draft_dir.load_draft_dir(draft, model.params['embed'])
  tokenizer = model.tokenizer if hasattr(model.tokenizer, 'save') else None
  draft_dir.export_hf(out, cfg, params, tokenizer)
  return info


def export_dflash(draft, engine: str, out, target: str | None, mask_token_id=None) -> int:
  """Writes the DFlash drafter in `draft` to `out` for `engine` ('vllm' or 'sglang');
  returns the mask token id it wrote. The target loads only for SGLang (or to read an
  SGLang export back)."""
  if engine == 'sglang' and mask_token_id is not None:
    raise ValueError('--mask-token-id is for vllm: SGLang takes the target row the mask is')
  from_sglang = dflash_export.exported_for(draft) == 'sglang'
  loaded = None if from_sglang else dflash_export.load_any(draft)
  if loaded:  # everything checkable without the target, before it loads
    dflash_export.check_for_engines(loaded[0])
    if engine == 'vllm':
      dflash_export.check_mask_token_id(loaded[0], mask_token_id)
  target_params = None
  if engine == 'sglang' or from_sglang:
    from specjax.checkpoints import loader

    loader.check_model_spec(target or DEFAULT_TARGET)
    target_params = loader.load_model(target or DEFAULT_TARGET).params
  loaded = loaded or dflash_export.load_any(draft, target_params)
  if engine == 'vllm':
    return dflash_export.export_vllm(loaded, out, mask_token_id)
  return dflash_export.export_sglang(loaded, out, target_params)


def export(
  draft,
  engine: str,
  out,
  target: str | None = None,
  overwrite: bool = False,
  mask_token_id: int | None = None,
) -> str:
  """Exports the draft in `draft` for `engine` into `out`; returns its kind.

  Raises ValueError (one line) for a directory that is no draft, an unknown engine, an
  EAGLE-3 head or DFlash drafter for 'hf', an `out` that is not empty (unless `overwrite`),
  or a head or target an engine cannot take, before any model loads (an SGLang DFlash export
  checks the drafter against the target once it has loaded).
  """
  check_engine(engine)
  kind = draft_kind(draft)
  if kind == 'eagle3' and engine == 'hf':
    raise ValueError(HF_EAGLE3)
  if kind == 'dflash' and engine == 'hf':
    raise ValueError(HF_DFLASH)
  check_out(out, draft, overwrite)
  if kind == 'eagle3':
    export_eagle3(draft, engine, out)
  elif kind == 'dflash':
    export_dflash(draft, engine, out, target, mask_token_id)
  else:
    export_distilled(draft, out, target or DEFAULT_TARGET)
  return kind


def hub_name(spec: str | None) -> str | None:
  """The name an engine loads for specjax's model spec `spec` (None when unknown)."""
  if not spec:
    return None
  if spec in HUB_NAMES:
    return HUB_NAMES[spec]
  if spec.startswith('hf:') and not spec.endswith('.gguf'):
    return spec[3:].split('@')[0]
  if os.path.isdir(spec):
    return spec
  return None


def dflash_snippet(engine: str, out: str, t: str) -> str:
  """How to load a DFlash export: the whole block, block_size - 1 drafted tokens (vLLM's
  num_speculative_tokens; SGLang's num_draft_tokens counts the anchor too)."""
  block = json.loads((pathlib.Path(out) / dflash_ckpt.CONFIG_FILE).read_text())['block_size']
  if engine == 'vllm':
    spec = {'method': 'dflash', 'model': out, 'num_speculative_tokens': block - 1}
    return f'from vllm import LLM\nllm = LLM(model={t!r}, speculative_config={json.dumps(spec)})'
  return (
    f'python -m sglang.launch_server --model {t} --speculative-algorithm DFLASH '
    f'--speculative-draft-model-path {out} --speculative-num-draft-tokens {block}'
  )


def snippet(kind: str, engine: str, out, target: str | None) -> str:
  """How to load the export in `engine`, with the target's name where known."""
  t, out = target or 'TARGET', str(out)
  if engine == 'hf':
    return '\n'.join(
      [
        'from transformers import AutoModelForCausalLM, AutoTokenizer',
        f'model = AutoModelForCausalLM.from_pretrained({t!r})',
        f'tokenizer = AutoTokenizer.from_pretrained({t!r})',
        "inputs = tokenizer('What is the capital of France?', return_tensors='pt')",
        'out = model.generate(**inputs, max_new_tokens=64, '
        f'assistant_model=AutoModelForCausalLM.from_pretrained({out!r}))',
      ]
    )
  if kind == 'dflash':
    return dflash_snippet(engine, out, t)
  if engine == 'vllm':
    method = 'eagle3' if kind == 'eagle3' else 'draft_model'
    spec = {'method': method, 'model': out, 'num_speculative_tokens': 4}
    return f'from vllm import LLM\nllm = LLM(model={t!r}, speculative_config={json.dumps(spec)})'
  algorithm = 'EAGLE3' if kind == 'eagle3' else 'STANDALONE'
  return (
    f'python -m sglang.launch_server --model {t} --speculative-algorithm {algorithm} '
    f'--speculative-draft-model-path {out} --speculative-num-steps 3 '
    '--speculative-eagle-topk 1 --speculative-num-draft-tokens 4'
  )


def describe(kind: str, engine: str, out, target: str | None) -> str:
  """What was written, and the snippet that loads it."""
  if kind == 'dflash':
    c = json.loads((pathlib.Path(out) / dflash_ckpt.CONFIG_FILE).read_text())
    m = c['dflash_config']['mask_token_id']
    lines = [f'wrote a DFlash drafter for {engine} to {out} (mask_token_id {m})']
    if engine == 'vllm':
      lines.append(
        f'its mask embedding is in {dflash_export.MASK_FILE}; vLLM feeds it wherever the input '
        f'id is {m}, so an anchor token {m} would read as the mask (--mask-token-id picks another)'
      )
    else:
      lines.append("SGLang drafts with the target's embedding and lm_head (checked: the drafter's)")
  elif kind == 'eagle3':
    lines = [f'wrote an EAGLE-3 head for {engine} to {out}']
    if engine == 'sglang':
      lines.append(
        'its captured layer ids are written minus one: SGLang adds one to each (vLLM does not)'
      )
  else:
    lines = [
      f'wrote the distilled draft as a Hugging Face LlamaForCausalLM to {out} '
      f'(with the embedding of {target})'
    ]
    if engine != 'hf':
      lines.append(
        f'{engine} serves a distilled draft as a plain draft model: this is the same '
        'directory --engine hf writes'
      )
  name = hub_name(target)
  if name is None:
    lines.append('TARGET: the Hugging Face model the draft was trained for')
  lines += ['', snippet(kind, engine, out, name)]
  return '\n'.join(lines)


class _Parser(argparse.ArgumentParser):
  def error(self, message):  # one line, as every other error
    print(f'error: {message} (usage: {USAGE})', file=sys.stderr)
    sys.exit(2)


def main(argv=None) -> int:
  parser = _Parser(prog='python -m specjax.export', description=__doc__.split('\n')[0])
  parser.add_argument(
    '--draft', required=True, help='a directory python -m specjax.train_draft wrote'
  )
  parser.add_argument('--engine', required=True, help='vllm, sglang or hf')
  parser.add_argument('--out', required=True, help='the directory to write')
  parser.add_argument(
    '--target',
    default=None,
    help=f'the target model (a specjax model spec; default {DEFAULT_TARGET} for a distilled '
    'draft, whose embedding it takes)',
  )
  parser.add_argument(
    '--mask-token-id',
    type=int,
    default=None,
    help='DFlash for vllm: the token id the drafted slots are fed as (default the last id)',
  )
  parser.add_argument('--overwrite', action='store_true', help='write into a non-empty --out')
  args = parser.parse_args(argv)
  try:
    kind = export(
      args.draft, args.engine, args.out, args.target, args.overwrite, args.mask_token_id
    )
  except (ValueError, OSError) as e:
    print('error: ' + ' '.join(str(e).split()), file=sys.stderr)
    return 2
  uses_target = kind == 'distilled' or (kind == 'dflash' and args.engine == 'sglang')
  target = args.target or (DEFAULT_TARGET if uses_target else None)
  print(describe(kind, args.engine, args.out, target))
  if kind == 'dflash' and dspark_ckpt.is_dspark_dir(args.draft):
    print(DSPARK_HEADS)
  return 0
