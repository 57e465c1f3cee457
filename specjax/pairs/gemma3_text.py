"""Gemma 3 4B: its multimodal checkpoint's text model as a directory of its own
(`python -m specjax.pairs gemma3-text SRC DST`)."""

from __future__ import annotations

import json
import os
import pathlib
import shutil
import sys

# Gemma3TextConfig's defaults (transformers), for the fields a multimodal config.json's
# text_config leaves out; specjax.checkpoints.hf.config_from_hf reads them explicitly.
GEMMA3_TEXT_DEFAULTS = {
  'vocab_size': 262208,
  'num_attention_heads': 8,
  'num_key_value_heads': 4,
  'head_dim': 256,
  'hidden_activation': 'gelu_pytorch_tanh',
  'max_position_embeddings': 131072,
  'rms_norm_eps': 1e-6,
  'rope_theta': 1e6,
  'rope_local_base_freq': 10000.0,
  'query_pre_attn_scalar': 256,
  'sliding_window': 4096,
  'sliding_window_pattern': 6,
  'tie_word_embeddings': True,
}
TEXT_PREFIXES = ('language_model.model.', 'model.language_model.')  # older, newer layouts


def _read_header(file) -> tuple[dict, int]:
  """A safetensors file's header and where its data starts, checked against the file's
  size: a truncated file (or one that is not safetensors) is an error naming it."""
  size = os.path.getsize(file)
  with open(file, 'rb') as f:
    n = int.from_bytes(f.read(8), 'little')
    if size < 8 or 8 + n > size:
      raise ValueError(
        f'{file}: truncated or not a safetensors file (header of {n} bytes, file {size})'
      )
    try:
      header = json.loads(f.read(n))
    except ValueError:
      raise ValueError(f'{file}: its safetensors header is not JSON (a damaged file?)') from None
  for name, info in header.items():
    if name != '__metadata__' and 8 + n + info['data_offsets'][1] > size:
      raise ValueError(
        f'{file}: truncated: tensor {name} ends at byte {8 + n + info["data_offsets"][1]}, '
        f'the file has {size}'
      )
  return header, 8 + n


def _copy_tensors(file, out, blob: bytes, header: dict, start: int, names) -> None:
  """Writes `blob` (a safetensors header) and then the bytes of `names` from `file`."""
  with open(file, 'rb') as f, open(out, 'wb') as g:
    g.write(len(blob).to_bytes(8, 'little') + blob)
    for name in names:
      begin, end = header[name]['data_offsets']
      f.seek(start + begin)
      remaining = end - begin
      while remaining:
        chunk = f.read(min(remaining, 1 << 26))
        if not chunk:
          raise ValueError(f'{file}: truncated while reading {name}')
        g.write(chunk)
        remaining -= len(chunk)


def gemma3_text_model(src, dst) -> pathlib.Path:
  """Writes the text model of a Gemma 3 multimodal directory (google/gemma-3-4b-it: model
  type gemma3, weights under language_model.*) to `dst` as a gemma3_text directory that
  specjax.checkpoints.hf reads: config.json from text_config (defaults filled in), the
  text tensors renamed to model.* (bytes copied as stored, file by file; the vision tower
  and projector left out), and the tokenizer files. Returns `dst`."""
  src, dst = pathlib.Path(src), pathlib.Path(dst)
  if dst.exists() and dst.resolve() == src.resolve():
    raise ValueError(f'SRC and DST are the same directory ({src}): pass a new DST_DIR')
  config_file = src / 'config.json'
  if not config_file.is_file():
    raise FileNotFoundError(f'{config_file} not found')
  config = json.loads(config_file.read_text())
  if config.get('model_type') != 'gemma3' or 'text_config' not in config:
    raise ValueError(
      f'{config_file}: model_type = {config.get("model_type")!r}: expected a Gemma 3 '
      'multimodal config (model_type gemma3 with a text_config)'
    )
  text = {**GEMMA3_TEXT_DEFAULTS, **config['text_config'], 'model_type': 'gemma3_text'}
  text['architectures'] = ['Gemma3ForCausalLM']
  text.setdefault('torch_dtype', config.get('torch_dtype', 'bfloat16'))
  files = sorted(src.glob('*.safetensors'))
  if not files:
    raise FileNotFoundError(f'no *.safetensors files in {src}')
  headers = {file: _read_header(file) for file in files}  # every shard checked first
  dst.mkdir(parents=True, exist_ok=True)
  (dst / 'config.json').write_text(json.dumps(text, indent=2) + '\n')
  kept = 0
  for file in files:
    header, start = headers[file]
    names = {}
    for name in header:
      for prefix in TEXT_PREFIXES:
        if name.startswith(prefix):
          names[name] = 'model.' + name[len(prefix) :]
    if not names:
      continue
    out, offset = {}, 0
    for name, new in names.items():
      begin, end = header[name]['data_offsets']
      out[new] = dict(header[name], data_offsets=[offset, offset + end - begin])
      offset += end - begin
    out['__metadata__'] = {'format': 'pt'}
    blob = json.dumps(out).encode()
    blob += b' ' * (-len(blob) % 8)
    partial = dst / (file.name + '.partial')  # renamed once whole: never a cut file
    try:
      _copy_tensors(file, partial, blob, header, start, names)
    except BaseException:
      partial.unlink(missing_ok=True)
      raise
    os.replace(partial, dst / file.name)
    kept += len(names)

  if not kept:
    raise ValueError(f'{src}: no tensors under {" or ".join(TEXT_PREFIXES)}')
  for name in ('tokenizer.json', 'tokenizer.model', 'special_tokens_map.json'):
    if (src / name).is_file():
      shutil.copy(src / name, dst / name)
  tok_config = src / 'tokenizer_config.json'
  settings = json.loads(tok_config.read_text()) if tok_config.is_file() else {}
  template = src / 'chat_template.json'
  if 'chat_template' not in settings and template.is_file():
    settings['chat_template'] = json.loads(template.read_text())['chat_template']
  (dst / 'tokenizer_config.json').write_text(json.dumps(settings, indent=2) + '\n')
  return dst


USAGE = 'python -m specjax.pairs gemma3-text SRC_DIR DST_DIR'


def main(argv) -> None:
  if len(argv) != 4 or argv[1] != 'gemma3-text':
    sys.exit(f'usage: {USAGE}')
  try:
    print(f'wrote {gemma3_text_model(argv[2], argv[3])}')
  except (ValueError, FileNotFoundError) as e:
    sys.exit(f'error: {e}')
