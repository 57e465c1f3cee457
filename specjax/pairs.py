"""The published draft/target pairs as data, and their dry runs (configs/pairs/).

Every model of a paper pair is one entry of MODELS: its Hugging Face id, its LlamaConfig
written down from the published config.json (the text model's for Gemma 3 4B), and the
parameter count its model card gives. configs/pairs/*.py name the pair; the user gives
the local Hugging Face directories:

    python -m specjax.run --config configs/pairs/qwen2_5.py \
        --config.model=/models/Qwen2.5-7B-Instruct --config.drafts=/models/Qwen2.5-0.5B-Instruct

A pair config leaves its paths as `required:<model>` placeholders, and `check_paths`
(called first thing by run_lib.main) turns any left into one error naming the fields and
what to pass, before anything is loaded.

The `:dry` variant of a pair config runs without weights. `report_shapes` takes the real
shapes (`jax.eval_shape` on `llama.init_params`, nothing allocated), their shardings on
the run's (data, model) mesh (specjax.models.sharding.param_specs), and prints parameters
and bytes per device. The models themselves are `dry:<model>` specs: the loader builds
`tiny_config(name)`, the same architecture shrunk to a tiny width and a few layers (same
family switches, layer-type pattern, RoPE settings, head counts, vocabulary padding) with
random weights over a byte-level tokenizer, and the run shards and decodes it as it would
the real one; `check_dry_run` then insists speculative greedy output equals the target's.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import pathlib
import shutil
import sys
import zlib

import jax
import jax.numpy as jnp
import numpy as np

from specjax.core import contract
from specjax.models import llama
from specjax.models import sharding as sharding_lib

DRY = 'dry:'  # model spec prefix: a random tiny stand-in of a MODELS entry
REQUIRED = 'required:'  # config placeholder: the user must give this model's directory


@dataclasses.dataclass(frozen=True)
class ModelShape:
  """A published model: Hugging Face id, its real LlamaConfig, its model card's size."""

  hf_id: str
  cfg: llama.LlamaConfig
  published_params: float  # as its model card (or paper) gives it
  note: str = ''


def _qwen2(name, d, ffn, layers, heads, kv, vocab, tie, max_pos) -> llama.LlamaConfig:
  # Qwen/Qwen2.5-*/config.json: model_type qwen2, rope_theta 1e6, rms_norm_eps 1e-6,
  # use_sliding_window false (so no window), Q/K/V biases.
  return llama.LlamaConfig(
    vocab_size=vocab,
    d_model=d,
    n_layers=layers,
    n_heads=heads,
    n_kv_heads=kv,
    head_dim=d // heads,
    ffn_dim=ffn,
    rope_base=1e6,
    norm_eps=1e-6,
    tie_embeddings=tie,
    max_seq_len=max_pos,
    name=name,
    arch='qwen2',
    qkv_bias=True,
  )


def _llama3(name, d, ffn, layers, head_dim, tie, factor) -> llama.LlamaConfig:
  # meta-llama/Llama-3.x-*/config.json: 32 heads, 8 kv heads, vocab 128256, rope_theta 5e5,
  # rms_norm_eps 1e-5, max_position_embeddings 131072, rope_scaling llama3 (factor 8 for
  # 3.1-8B, 32 for 3.2-1B; low_freq_factor 1, high_freq_factor 4, original 8192).
  return llama.LlamaConfig(
    vocab_size=128256,
    d_model=d,
    n_layers=layers,
    n_heads=32,
    n_kv_heads=8,
    head_dim=head_dim,
    ffn_dim=ffn,
    rope_base=500000.0,
    norm_eps=1e-5,
    tie_embeddings=tie,
    max_seq_len=131072,
    name=name,
    arch='llama',
    rope_scaling=('llama3', factor, 1.0, 4.0, 8192.0),
  )


def _gemma3(name, d, ffn, layers, heads, kv, vocab, window, max_pos, scaling) -> llama.LlamaConfig:
  # google/gemma-3-*/config.json (gemma3_text; for 4B the text_config with Gemma3TextConfig's
  # defaults): head_dim 256, query_pre_attn_scalar 256, rms_norm_eps 1e-6, rope_theta 1e6 for
  # the full layers and rope_local_base_freq 1e4 for the sliding ones, every 6th layer full
  # (sliding_window_pattern 6), GeGLU, tied embeddings scaled by sqrt(hidden_size).
  return llama.LlamaConfig(
    vocab_size=vocab,
    d_model=d,
    n_layers=layers,
    n_heads=heads,
    n_kv_heads=kv,
    head_dim=256,
    ffn_dim=ffn,
    rope_base=1e6,
    norm_eps=1e-6,
    tie_embeddings=True,
    max_seq_len=max_pos,
    name=name,
    arch='gemma3',
    qk_norm=True,
    sandwich_norms=True,
    norm_offset=1.0,
    activation='gelu_tanh',
    scale_embeddings=True,
    query_scale=256**-0.5,
    sliding_window=window,
    layer_types=tuple('full' if (i + 1) % 6 == 0 else 'sliding' for i in range(layers)),
    rope_local_base=10000.0,
    rope_scaling=scaling,
  )


def _vicuna(name, d, ffn, layers, heads) -> llama.LlamaConfig:
  # lmsys/vicuna-7b-v1.3 and double7/vicuna-68m config.json: LLaMA-1 shapes, vocab 32000,
  # rms_norm_eps 1e-6, rope_theta 1e4, max_position_embeddings 2048, untied head, no GQA.
  return llama.LlamaConfig(
    vocab_size=32000,
    d_model=d,
    n_layers=layers,
    n_heads=heads,
    n_kv_heads=heads,
    head_dim=d // heads,
    ffn_dim=ffn,
    rope_base=10000.0,
    norm_eps=1e-6,
    tie_embeddings=False,
    max_seq_len=2048,
    name=name,
    arch='llama',
  )


def _models() -> dict[str, ModelShape]:
  m = {}
  for suffix, hf in (('', ''), ('-instruct', '-Instruct')):
    m[f'qwen2.5-0.5b{suffix}'] = ModelShape(
      f'Qwen/Qwen2.5-0.5B{hf}',
      _qwen2('qwen2.5-0.5b', 896, 4864, 24, 14, 2, 151936, True, 32768),
      0.49e9,
    )
    m[f'qwen2.5-7b{suffix}'] = ModelShape(
      f'Qwen/Qwen2.5-7B{hf}',
      # the base model's max_position_embeddings is 131072, the instruct one's 32768
      _qwen2('qwen2.5-7b', 3584, 18944, 28, 28, 4, 152064, False, 32768 if suffix else 131072),
      7.61e9,
      'vocabulary 152064 rows against the 0.5B draft 151936: the same tokenizer, padded',
    )
    m[f'llama-3.2-1b{suffix}'] = ModelShape(
      f'meta-llama/Llama-3.2-1B{hf}',
      _llama3('llama-3.2-1b', 2048, 8192, 16, 64, True, 32.0),
      1.24e9,
    )
    m[f'llama-3.1-8b{suffix}'] = ModelShape(
      f'meta-llama/Llama-3.1-8B{hf}',
      _llama3('llama-3.1-8b', 4096, 14336, 32, 128, False, 8.0),
      8.03e9,
    )
  for suffix in ('', '-it'):
    m[f'gemma-3-270m{suffix}'] = ModelShape(
      f'google/gemma-3-270m{suffix}',
      _gemma3('gemma-3-270m', 640, 2048, 18, 4, 1, 262144, 512, 32768, ()),
      0.268e9,
    )
  for suffix in ('-pt', '-it'):
    m[f'gemma-3-4b{suffix}'] = ModelShape(
      f'google/gemma-3-4b{suffix}',
      _gemma3('gemma-3-4b', 2560, 10240, 34, 8, 4, 262208, 1024, 131072, ('linear', 8.0)),
      3.88e9,
      'the text model of a multimodal checkpoint (4.3B with the SigLIP vision tower); '
      'vocabulary 262208 rows against the 270M draft 262144',
    )
  m['vicuna-7b-v1.3'] = ModelShape(
    'lmsys/vicuna-7b-v1.3', _vicuna('vicuna-7b-v1.3', 4096, 11008, 32, 32), 6.74e9
  )
  m['vicuna-68m'] = ModelShape('double7/vicuna-68m', _vicuna('vicuna-68m', 768, 3072, 2, 12), 68e6)
  return m


MODELS: dict[str, ModelShape] = _models()


@dataclasses.dataclass(frozen=True)
class Pair:
  """A published draft -> target pair: MODELS names, and where it was measured."""

  target: str
  draft: str
  source: str


# configs/pairs/<name>.py -> the pair (instruct models by default; `base` in the config's
# argument swaps in BASE_PAIRS' models where the pair has base variants).
PAIRS = {
  'qwen2_5': Pair('qwen2.5-7b-instruct', 'qwen2.5-0.5b-instruct', 'EAGLE-3 / HASS / SpS baselines'),
  'llama3': Pair('llama-3.1-8b-instruct', 'llama-3.2-1b-instruct', 'EAGLE-3 / SpS baselines'),
  'gemma3': Pair('gemma-3-4b-it', 'gemma-3-270m-it', 'Gemma 3 family SpS'),
  'vicuna': Pair('vicuna-7b-v1.3', 'vicuna-68m', 'Spec-Bench (Xia et al. 2024), SpS'),
}
BASE_PAIRS = {
  'qwen2_5': Pair('qwen2.5-7b', 'qwen2.5-0.5b', PAIRS['qwen2_5'].source),
  'llama3': Pair('llama-3.1-8b', 'llama-3.2-1b', PAIRS['llama3'].source),
  'gemma3': Pair('gemma-3-4b-pt', 'gemma-3-270m', PAIRS['gemma3'].source),
  'vicuna': PAIRS['vicuna'],
}


def lookup(name: str, where: str = 'model') -> ModelShape:
  if name not in MODELS:
    raise ValueError(f'{where} {name!r}: not a paper-pair model; expected one of {sorted(MODELS)}')
  return MODELS[name]


# ---- the config side: placeholders and the error for a missing path ----


def pair_config(
  config, name: str, dry: bool, base: bool = False, target: str = '', draft: str = ''
):
  """Fills a run config (configs/smollm2.py's fields) for the pair `name`: placeholders
  (or `target` / `draft` directories), or the dry run's tiny stand-ins and settings."""
  pair = (BASE_PAIRS if base else PAIRS)[name]
  if dry:
    config.model = DRY + pair.target
    config.drafts = (DRY + pair.draft,)
    config.dtype = 'float32'
    config.prompt = 'def fib(n):\n  return n if n < 2 else fib(n - 1) + fib(n - 2)\n'
    config.max_new_tokens = 24
    config.cache_size = 128
    config.verifier = 'greedy'
    config.gammas = (3,)
    config.adaptive_gammas = ()
    config.measure_costs = False
  else:
    config.model = target or REQUIRED + pair.target
    config.drafts = (draft or REQUIRED + pair.draft,)
    config.dtype = 'bfloat16'  # the pairs are for accelerators
    config.gammas = (3, 5)  # the published SpS settings for 0.5-1B drafts
  config.quick = False  # a pair is compared on every method, even for one prompt
  config.quick_method = f'{config.drafts[0]}@3'
  return config


def _missing(spec: str, field: str) -> str:
  shape = MODELS[spec[len(REQUIRED) :]]
  local = shape.hf_id.split('/')[-1]
  return (
    f'config.{field} = {spec!r}: expected the local Hugging Face directory of {shape.hf_id} '
    f'(hf download {shape.hf_id} --local-dir /models/{local}; then '
    f'--config.{field}=/models/{local})'
  )


def check_paths(config) -> None:
  """Raises ValueError naming every `required:` placeholder still in config.model or
  config.drafts, and what to pass; a no-op for configs without placeholders."""
  wanted = []
  if isinstance(config.get('model'), str) and config.model.startswith(REQUIRED):
    wanted.append(_missing(config.model, 'model'))
  drafts = [d for d in config.get('drafts', ()) if isinstance(d, str) and d.startswith(REQUIRED)]
  wanted += [_missing(d, 'drafts') for d in drafts]
  if wanted:
    raise ValueError(
      'a paper pair needs its model directories: '
      + '; '.join(wanted)
      + ' (or run the pair config with :dry, no weights needed)'
    )


# ---- real shapes: parameters and bytes per device on a mesh, nothing allocated ----


def real_shapes(cfg: llama.LlamaConfig, dtype=jnp.bfloat16):
  """The parameter tree's ShapeDtypeStructs, by `jax.eval_shape` on llama.init_params."""
  return jax.eval_shape(lambda k: llama.init_params(cfg, k, dtype), jax.random.key(0))


def per_device(cfg: llama.LlamaConfig, data: int, model: int, dtype=jnp.bfloat16) -> dict:
  """Parameters of `cfg` in total and per device on a (data, model) mesh with the default
  partition rules, their bytes in `dtype`, and the KV cache's bytes per token per device."""
  shapes = real_shapes(cfg, dtype)
  mesh = jax.sharding.AbstractMesh((data, model), sharding_lib.AXES)
  specs = sharding_lib.param_specs(shapes, mesh)
  total = local = 0
  for leaf, spec in zip(jax.tree_util.tree_leaves(shapes), jax.tree_util.tree_leaves(specs)):
    n = math.prod(leaf.shape)
    axes = [a for entry in tuple(spec) if entry is not None for a in np.atleast_1d(entry)]
    split = math.prod(mesh.shape[a] for a in axes)
    total += n
    local += n // split
  item = jnp.dtype(dtype).itemsize
  kv_split = model if cfg.n_kv_heads % model == 0 else 1  # constrain_cache's kv-head split
  kv = 2 * cfg.n_layers * cfg.n_kv_heads * cfg.head_dim * item // kv_split
  return {
    'params': total,
    'params_per_device': local,
    'bytes_per_device': local * item,
    'kv_bytes_per_token_per_device': kv,
  }


def _gib(n: float) -> str:
  return f'{n / 2**30:.2f} GiB'


def report_shapes(config, say=print) -> dict:
  """For `dry:` specs in the config: the real models' parameters and bfloat16 bytes per
  device on config.mesh, printed and returned ({} without dry specs)."""
  names = [s[len(DRY) :] for s in (config.model, *config.drafts) if s.startswith(DRY)]
  data, model = config.mesh.data, config.mesh.model
  out = {}
  for name in names:
    shape = lookup(name, 'dry model')
    r = per_device(shape.cfg, data, model)
    out[name] = dict(r, hf_id=shape.hf_id, published_params=shape.published_params)
    say(
      f'{shape.hf_id} real shapes on a (data {data}, model {model}) mesh: '
      f'{r["params"] / 1e9:.3f} B parameters (published {shape.published_params / 1e9:.3g} B), '
      f'{r["params_per_device"] / 1e6:.1f} M per device = {_gib(r["bytes_per_device"])} '
      f'in bfloat16; KV cache {r["kv_bytes_per_token_per_device"] / 1024:.0f} KiB per token '
      'per device'
    )
  return out


# ---- dry models: the architecture shrunk, random weights, byte tokenizer ----

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
  usage='dry:<a model of specjax/pairs.py>', matches=check_model_spec, load=dry_model
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


# ---- Gemma 3 4B: its multimodal checkpoint's text model as a directory of its own ----

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

if __name__ == '__main__':
  if len(sys.argv) != 4 or sys.argv[1] != 'gemma3-text':
    sys.exit(f'usage: {USAGE}')
  try:
    print(f'wrote {gemma3_text_model(sys.argv[2], sys.argv[3])}')
  except (ValueError, FileNotFoundError) as e:
    sys.exit(f'error: {e}')
