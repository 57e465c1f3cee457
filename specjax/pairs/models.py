"""The published draft/target pairs as data: every model's Hugging Face id, its real
LlamaConfig and published size (MODELS), the pairs (PAIRS, BASE_PAIRS), and a pair's run
config with `required:` placeholders for the user's directories (`pair_config`,
`check_paths`). See specjax/pairs/__init__.py."""

from __future__ import annotations

import dataclasses

from specjax.models import llama

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
