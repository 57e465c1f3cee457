"""Hugging Face style directories (config.json + *.safetensors) of the Llama lineage.

    export_hf(directory, cfg, params, tokenizer)   # loadable by transformers.LlamaForCausalLM
    cfg, params = load_hf(directory)                # host numpy arrays, specjax tree layout

load_hf reads the model types in HF_ARCHS (Llama 2/3.x, Mistral, Qwen2/2.5, Qwen3 and
Gemma 3's text model) into specjax.models.llama's one decoder; export_hf writes Llama.

Hugging Face stores linear weights as torch (out, in) matrices and Q/K rows in half-split
("rotate_half") order, the order specjax uses, so the only transform is a transpose.
"""

from __future__ import annotations

import contextlib
import json
import os
import pathlib
from typing import Any

import numpy as np
import safetensors
import safetensors.numpy

from specjax.models.llama import LlamaConfig, Params

COPY = 'copy'  # norms [D] and the embedding [V, D]: same layout in both
LINEAR = 'linear'  # torch (out, in) <-> tree (in, out)

# Hugging Face name -> tree key, transform. `lm_head` only exists when embeddings are untied.
GLOBAL_TENSORS: tuple[tuple[str, str, str], ...] = (
  ('model.embed_tokens.weight', 'embed', COPY),
  ('model.norm.weight', 'final_norm', COPY),
  ('lm_head.weight', 'lm_head', LINEAR),
)
# model.layers.{i}.<name> -> params['layers'][i][key], transform.
LAYER_TENSORS: tuple[tuple[str, str, str], ...] = (
  ('model.layers.{i}.input_layernorm.weight', 'attn_norm', COPY),
  ('model.layers.{i}.self_attn.q_proj.weight', 'wq', LINEAR),
  ('model.layers.{i}.self_attn.k_proj.weight', 'wk', LINEAR),
  ('model.layers.{i}.self_attn.v_proj.weight', 'wv', LINEAR),
  ('model.layers.{i}.self_attn.o_proj.weight', 'wo', LINEAR),
  ('model.layers.{i}.post_attention_layernorm.weight', 'mlp_norm', COPY),
  ('model.layers.{i}.mlp.gate_proj.weight', 'w_gate', LINEAR),
  ('model.layers.{i}.mlp.up_proj.weight', 'w_up', LINEAR),
  ('model.layers.{i}.mlp.down_proj.weight', 'w_down', LINEAR),
)
# Per family: the layer tensors beyond Llama's, and Gemma 3's names for its four norms.
EXTRA_LAYER_TENSORS: dict[str, tuple[tuple[str, str, str], ...]] = {
  'qwen2': tuple(
    (f'model.layers.{{i}}.self_attn.{x}_proj.bias', f'b{x}', COPY) for x in ('q', 'k', 'v')
  ),
  'qwen3': (
    ('model.layers.{i}.self_attn.q_norm.weight', 'q_norm', COPY),
    ('model.layers.{i}.self_attn.k_norm.weight', 'k_norm', COPY),
  ),
}
GEMMA_NORMS = {
  'post_attention_layernorm': 'attn_post_norm',  # Gemma: after attention, not before the MLP
  'pre_feedforward_layernorm': 'mlp_norm',
  'post_feedforward_layernorm': 'mlp_post_norm',
}
# Buffers some exporters write that carry no parameters.
IGNORED_SUFFIXES = ('rotary_emb.inv_freq',)

CONFIG_FILE = 'config.json'
WEIGHTS_FILE = 'model.safetensors'


def tensor_table(cfg: LlamaConfig) -> list[tuple[str, tuple[Any, ...], str]]:
  """Every (Hugging Face name, tree path, transform) of a model with config `cfg`."""
  table = [
    (name, (key,), kind)
    for name, key, kind in GLOBAL_TENSORS
    if key != 'lm_head' or not cfg.tie_embeddings
  ]
  layer = list(LAYER_TENSORS) + list(EXTRA_LAYER_TENSORS.get(cfg.arch, ()))
  if cfg.arch == 'gemma3':
    layer = [t for t in layer if t[1] != 'mlp_norm'] + list(EXTRA_LAYER_TENSORS['qwen3'])
    layer += [(f'model.layers.{{i}}.{n}.weight', key, COPY) for n, key in GEMMA_NORMS.items()]
  for i in range(cfg.n_layers):
    table += [(name.format(i=i), ('layers', i, key), kind) for name, key, kind in layer]
  return table


def _transform(w: np.ndarray, kind: str) -> np.ndarray:
  """Tree layout <-> Hugging Face layout (the transform is its own inverse)."""
  return w if kind == COPY else w.T


def _get(tree: Any, path: tuple[Any, ...]) -> Any:
  for key in path:
    tree = tree[key]
  return tree


def _set(tree: Params, path: tuple[Any, ...], value: np.ndarray) -> None:
  for key in path[:-1]:
    tree = tree[key]
  tree[path[-1]] = value


def hf_config(cfg: LlamaConfig, dtype: Any = np.float32, tokenizer: Any = None) -> dict[str, Any]:
  """The config.json contents of a LlamaForCausalLM with config `cfg`."""
  config = {
    'architectures': ['LlamaForCausalLM'],
    'model_type': 'llama',
    'vocab_size': cfg.vocab_size,
    'hidden_size': cfg.d_model,
    'intermediate_size': cfg.ffn_dim,
    'num_hidden_layers': cfg.n_layers,
    'num_attention_heads': cfg.n_heads,
    'num_key_value_heads': cfg.n_kv_heads,
    'head_dim': cfg.head_dim,
    'hidden_act': 'silu',
    'max_position_embeddings': cfg.max_seq_len,
    'rms_norm_eps': cfg.norm_eps,
    # transformers < 5 reads rope_theta, transformers >= 5 rope_parameters.
    'rope_theta': cfg.rope_base,
    'rope_parameters': {'rope_type': 'default', 'rope_theta': cfg.rope_base},
    'rope_scaling': None,
    'attention_bias': False,
    'mlp_bias': False,
    'tie_word_embeddings': cfg.tie_embeddings,
    'torch_dtype': np.dtype(dtype).name,
  }
  if tokenizer is not None:
    config['bos_token_id'] = int(tokenizer.bos_id)
    config['eos_token_id'] = int(tokenizer.eos_id)
  return config


def export_hf(
  directory: str | os.PathLike,
  cfg: LlamaConfig,
  params: Params,
  tokenizer: Any = None,
  dtype: Any = np.float32,
) -> pathlib.Path:
  """Writes config.json and model.safetensors (and the tokenizer's files) into `directory`.

  Args:
    directory: created if missing; existing files of the same names are replaced.
    cfg: the model's config.
    params: its parameter tree (numpy or jax arrays, specjax layout).
    tokenizer: optional specjax.formats.tokenizer.Tokenizer; its files and bos/eos ids are
      written too.
    dtype: dtype of the stored weights (and of config.json's torch_dtype).

  Returns:
    The directory, as a Path.
  """
  if cfg.arch != 'llama':
    raise ValueError(f'export_hf writes Llama models only, got a {cfg.arch!r} config')
  directory = pathlib.Path(directory)
  directory.mkdir(parents=True, exist_ok=True)
  tensors, shapes = {}, cfg.param_shapes()
  for name, tree_path, kind in tensor_table(cfg):
    w = np.asarray(_get(params, tree_path))
    want = tuple(_get(shapes, tree_path))
    if w.shape != want:
      raise ValueError(f'params{_keystr(tree_path)} has shape {w.shape}, expected {want}')
    tensors[name] = np.ascontiguousarray(_transform(w, kind), dtype=dtype)
  safetensors.numpy.save_file(tensors, directory / WEIGHTS_FILE, metadata={'format': 'pt'})
  config = hf_config(cfg, dtype, tokenizer)
  (directory / CONFIG_FILE).write_text(json.dumps(config, indent=2) + '\n')
  if tokenizer is not None:
    tokenizer.save(directory)
  return directory


def _keystr(path: tuple[Any, ...]) -> str:
  return ''.join(f'[{k!r}]' for k in path)


HF_ARCHS = {
  'llama': 'llama',
  'mistral': 'mistral',
  'qwen2': 'qwen2',
  'qwen3': 'qwen3',
  'gemma3_text': 'gemma3',
}


def parse_rope(rope: dict[str, Any], base: float, file: pathlib.Path, where: str) -> tuple:
  """(RoPE base, rope_scaling tuple) from a transformers rope_parameters / rope_scaling dict."""
  rope = rope or {}
  kind = rope.get('rope_type', rope.get('type', 'default'))
  base = float(rope.get('rope_theta', base))
  if kind == 'default':
    return base, ()
  if kind == 'linear':
    return base, ('linear', float(rope['factor']))
  if kind == 'llama3':
    keys = ('factor', 'low_freq_factor', 'high_freq_factor', 'original_max_position_embeddings')
    missing = [k for k in keys if k not in rope]
    if missing:
      raise ValueError(f'{file}: {where} of type llama3 lacks {missing}')
    return base, ('llama3', *(float(rope[k]) for k in keys))
  raise ValueError(f'{file}: {where} type {kind!r} is not supported (default, linear or llama3)')


def _unsupported(config: dict[str, Any], file: pathlib.Path, checks) -> None:
  """Raises ValueError for the first field set to something but the one value supported."""
  for key, ok in checks:
    if config.get(key) not in (None, ok):
      raise ValueError(f'{file}: {key}={config[key]!r} is not supported (need {ok!r})')


def _gemma3_settings(config: dict, file: pathlib.Path, rope: dict, default_base: float, n_layers):
  """(rope base, rope scaling, LlamaConfig switches) of a Gemma 3 text config: sandwich
  norms, q/k norms, sliding-window layers by layer_types (or the every-6th pattern)."""
  if 'full_attention' in rope:  # transformers 5: one dict per layer type
    base, scaling = parse_rope(rope['full_attention'], default_base, file, 'rope_parameters')
    local, _ = parse_rope(rope.get('sliding_attention'), 10000.0, file, 'rope_parameters')
  else:
    base, scaling = parse_rope(rope, default_base, file, 'rope_scaling')
    local = float(config.get('rope_local_base_freq', 10000.0))
  types = config.get('layer_types')
  if types is None:
    pattern = int(config.get('sliding_window_pattern', 6))
    types = [
      'full_attention' if (i + 1) % pattern == 0 else 'sliding_attention' for i in range(n_layers)
    ]
  names = {'full_attention': 'full', 'sliding_attention': 'sliding'}
  unknown = sorted({str(t) for t in types} - set(names))
  if unknown:
    raise ValueError(
      f'{file}: layer_types has {unknown}; specjax reads full_attention and '
      'sliding_attention layers'
    )
  kwargs = dict(
    qk_norm=True,
    sandwich_norms=True,
    norm_offset=1.0,
    scale_embeddings=True,
    query_scale=float(config.get('query_pre_attn_scalar', 256)) ** -0.5,
    sliding_window=int(config.get('sliding_window') or 4096),
    layer_types=tuple(names[t] for t in types),
    rope_local_base=local,
  )
  return base, scaling, kwargs


def config_from_hf(config: dict[str, Any], file: str | os.PathLike = CONFIG_FILE) -> LlamaConfig:
  """A LlamaConfig from config.json contents; missing fields take transformers' defaults.

  Raises ValueError naming the file and field of an unsupported architecture or setting.
  """
  file = pathlib.Path(file)
  model_type = config.get('model_type')
  if model_type not in HF_ARCHS:
    raise ValueError(
      f'{file}: model_type {model_type!r} is not supported (load_hf reads {sorted(HF_ARCHS)}'
      + (
        "; for Gemma 3's multimodal checkpoints give the text model, gemma3_text)"
        if model_type == 'gemma3'
        else ')'
      )
    )
  arch = HF_ARCHS[model_type]
  gemma = arch == 'gemma3'
  act_key = 'hidden_activation' if gemma else 'hidden_act'
  act = config.get(act_key) or ('gelu_pytorch_tanh' if gemma else 'silu')
  activation = {'silu': 'silu', 'gelu_pytorch_tanh': 'gelu_tanh'}.get(act)
  if activation is None:
    raise ValueError(
      f"{file}: {act_key}={act!r} is not supported (need 'silu' or 'gelu_pytorch_tanh')"
    )
  checks = [('mlp_bias', False)]
  if arch != 'qwen2':
    checks.append(('attention_bias', False))
  if arch in ('qwen2', 'qwen3'):
    checks.append(('use_sliding_window', False))
  if gemma:
    checks += [
      ('final_logit_softcapping', None),
      ('attn_logit_softcapping', None),
      ('use_bidirectional_attention', False),
    ]
  _unsupported(config, file, checks)
  try:
    d_model, n_heads = int(config['hidden_size']), int(config['num_attention_heads'])
    n_layers = int(config['num_hidden_layers'])
    rope = config.get('rope_parameters') or config.get('rope_scaling') or {}
    default_base = float(config.get('rope_theta', 10000.0))
    kwargs: dict[str, Any] = {}
    if gemma:
      base, scaling, kwargs = _gemma3_settings(config, file, rope, default_base, n_layers)
    else:
      base, scaling = parse_rope(rope, default_base, file, 'rope_parameters')
      kwargs = dict(qkv_bias=arch == 'qwen2', qk_norm=arch == 'qwen3')
      if arch == 'mistral' and config.get('sliding_window'):
        kwargs['sliding_window'] = int(config['sliding_window'])
    return LlamaConfig(
      vocab_size=int(config['vocab_size']),
      d_model=d_model,
      n_layers=n_layers,
      n_heads=n_heads,
      n_kv_heads=int(config.get('num_key_value_heads') or n_heads),
      head_dim=int(config.get('head_dim') or d_model // n_heads),
      ffn_dim=int(config['intermediate_size']),
      rope_base=base,
      norm_eps=float(config.get('rms_norm_eps', 1e-6)),
      tie_embeddings=bool(config.get('tie_word_embeddings', gemma)),
      max_seq_len=int(config.get('max_position_embeddings', 2048)),
      name=model_type,
      arch=arch,
      activation=activation,
      rope_scaling=scaling,
      **kwargs,
    )
  except KeyError as e:
    raise ValueError(f'{file}: required field {e.args[0]!r} is missing') from e


def _open_shards(
  directory: pathlib.Path, stack: contextlib.ExitStack
) -> dict[str, tuple[pathlib.Path, Any]]:
  """Tensor name -> (file, open safetensors handle), over every *.safetensors file."""
  files = sorted(directory.glob('*.safetensors'))
  if not files:
    raise FileNotFoundError(f'no *.safetensors files in {directory}')
  names: dict[str, tuple[pathlib.Path, Any]] = {}
  for file in files:
    handle = stack.enter_context(safetensors.safe_open(file, framework='numpy'))
    for name in handle.keys():
      if name in names:
        raise ValueError(f'tensor {name!r} is in both {names[name][0]} and {file}')
      names[name] = (file, handle)
  return names


def _check_names(directory: pathlib.Path, cfg: LlamaConfig, table: list, names: dict) -> None:
  missing = [name for name, _, _ in table if name not in names]
  if missing:
    raise ValueError(f'{directory}: missing tensors {missing}')
  expected = {name for name, _, _ in table}
  if cfg.tie_embeddings:  # transformers ties a stored lm_head to the embedding anyway
    expected.add('lm_head.weight')
  unexpected = sorted(n for n in set(names) - expected if not n.endswith(IGNORED_SUFFIXES))
  if unexpected:
    raise ValueError(f'{directory}: unexpected tensors {unexpected}')


def load_hf(directory: str | os.PathLike, dtype: Any = np.float32) -> tuple[LlamaConfig, Params]:
  """Reads a Hugging Face directory (a model type of HF_ARCHS) into (config, tree of host
  numpy arrays in `dtype`).

  Reads every *.safetensors file (sharded checkpoints too); bf16 and f16 weights are converted.

  Raises:
    FileNotFoundError: no config.json or no *.safetensors file in `directory`.
    ValueError: another architecture, or tensors missing, unexpected or of the wrong shape (the
      message names the tensor and both shapes).
  """
  directory = pathlib.Path(directory)
  config_file = directory / CONFIG_FILE
  if not config_file.is_file():
    raise FileNotFoundError(f'Hugging Face config not found: {config_file}')
  cfg = config_from_hf(json.loads(config_file.read_text()), config_file)
  with contextlib.ExitStack() as stack:
    names = _open_shards(directory, stack)
    table = tensor_table(cfg)
    _check_names(directory, cfg, table, names)
    params: Params = {'layers': [{} for _ in range(cfg.n_layers)]}
    shapes = cfg.param_shapes()
    for name, tree_path, kind in table:
      _set(params, tree_path, _read(names[name], name, _get(shapes, tree_path), kind, dtype))
  return cfg, params


def _read(
  source: tuple[pathlib.Path, Any], name: str, shape: tuple[int, ...], kind: str, dtype: Any
) -> np.ndarray:
  """One tensor, checked to become a leaf of tree shape `shape`, in tree layout and `dtype`."""
  file, handle = source
  have = tuple(handle.get_slice(name).get_shape())
  want = tuple(reversed(shape)) if kind == LINEAR else tuple(shape)
  if have != want:
    raise ValueError(f'{file}: tensor {name!r} has shape {have}, expected {want} from the config')
  return np.array(_transform(handle.get_tensor(name), kind), dtype=dtype, order='C')
