"""Tests for specjax.checkpoints: GGUF loading, Hugging Face export/load, orbax save/restore."""

from __future__ import annotations

import dataclasses
import importlib
import json
import pathlib

import gguf
import jax
import jax.numpy as jnp
import numpy as np
import pytest
import safetensors.numpy
from gguf import GGMLQuantizationType as QType

from specjax import testing
from specjax.checkpoints import gguf as gguf_io
from specjax.checkpoints import hf, orbax_io
from specjax.models.kv_cache import KVCache
from specjax.models.llama import LlamaConfig, forward, init_params

TOKENS = np.array([[1, 5, 9, 3, 7, 2, 11, 60], [4, 4, 4, 8, 1, 0, 63, 17]], np.int32)


def tiny(**overrides) -> tuple[LlamaConfig, dict]:
  """A random tiny Llama as numpy arrays: vocab 64, d 32, 2 layers, 4/2 heads, ffn 48."""
  cfg, params = testing.tiny_model(seed=0, scale=0.2, **overrides)
  return cfg, jax.tree.map(np.asarray, params)


def logits(cfg: LlamaConfig, params: dict, tokens: np.ndarray = TOKENS) -> np.ndarray:
  cache = KVCache.init(cfg, tokens.shape[0], tokens.shape[1])
  out, _ = forward(jax.tree.map(jnp.asarray, params), jnp.asarray(tokens), cache, cfg)[:2]
  return np.asarray(out)


def assert_trees_equal(a, b) -> None:
  assert jax.tree.structure(a) == jax.tree.structure(b)
  for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b), strict=True):
    assert x.dtype == y.dtype and x.shape == y.shape
    np.testing.assert_array_equal(np.asarray(x), np.asarray(y))


def same_config(loaded: LlamaConfig, cfg: LlamaConfig) -> bool:
  """Equality up to the name, which the file formats do not carry."""
  return dataclasses.replace(loaded, name=cfg.name) == cfg


# ----------------------------------------------------------------------------------------------
# GGUF


def llama_cpp_permute(weights: np.ndarray, n_head: int) -> np.ndarray:
  """Verbatim from llama.cpp's convert_hf_to_gguf.py (LlamaModel.permute), for HF (out, in)."""
  return (
    weights.reshape(n_head, 2, weights.shape[0] // n_head // 2, *weights.shape[1:])
    .swapaxes(1, 2)
    .reshape(weights.shape)
  )


def gguf_array(w: np.ndarray, kind: str, cfg: LlamaConfig) -> np.ndarray:
  """A tree leaf as llama.cpp's converter stores it (numpy order = GGUF dims reversed)."""
  if kind in (gguf_io.COPY, gguf_io.BIAS):
    return w
  if kind == gguf_io.NORM:  # Gemma 3: llama.cpp stores 1 + w
    return w + np.float32(1.0)
  if kind == gguf_io.QUERY:
    return llama_cpp_permute(w.T, cfg.n_heads)
  if kind == gguf_io.KEY:
    return llama_cpp_permute(w.T, cfg.n_kv_heads)
  return w.T


def encode(w: np.ndarray, qtype: QType) -> tuple[np.ndarray, QType]:
  """`w` stored as `qtype` when its rows fit the blocks, else as F16 (as llama.cpp falls back)."""
  w = np.ascontiguousarray(w, np.float32)
  if w.ndim == 1 or qtype == QType.F32:
    return w, QType.F32
  block, _ = gguf.GGML_QUANT_SIZES[qtype]
  if w.shape[-1] % block:
    return w.astype(np.float16), QType.F16
  return gguf.quants.quantize(w, qtype), qtype


def write_gguf(
  path: pathlib.Path,
  cfg: LlamaConfig,
  params: dict,
  qtype: QType = QType.F32,
  arch: str = 'llama',
  key_length: bool = False,
  tensors: dict | None = None,
  extra: dict | None = None,
) -> pathlib.Path:
  """Writes a tiny llama GGUF as llama.cpp's converter would.

  `tensors` adds or replaces tensors: name -> array, (raw bytes, type), or None to leave it out.
  """
  writer = gguf.GGUFWriter(str(path), arch)
  writer.add_name('tiny test model')
  writer.add_block_count(cfg.n_layers)
  writer.add_context_length(cfg.max_seq_len)
  writer.add_embedding_length(cfg.d_model)
  writer.add_feed_forward_length(cfg.ffn_dim)
  writer.add_head_count(cfg.n_heads)
  writer.add_head_count_kv(cfg.n_kv_heads)
  writer.add_rope_freq_base(cfg.rope_base)
  writer.add_layer_norm_rms_eps(cfg.norm_eps)
  writer.add_rope_dimension_count(cfg.head_dim)
  if key_length:
    writer.add_key_length(cfg.head_dim)
    writer.add_value_length(cfg.head_dim)
  for key, value in (extra or {}).items():  # more metadata: '{arch}.key' -> value
    key = key.format(arch=arch)
    if isinstance(value, float):
      writer.add_float32(key, value)
    elif isinstance(value, str):
      writer.add_string(key, value)
    else:
      writer.add_uint32(key, value)
  writer.add_token_list([f'<t{i}>' for i in range(cfg.vocab_size)])
  arrays = {
    name: gguf_array(gguf_io._get(params, tree_path), kind, cfg)
    for name, tree_path, kind in gguf_io.tensor_table(cfg)
  }
  arrays.update(tensors or {})
  for name, w in arrays.items():
    if w is None:
      continue
    if isinstance(w, tuple):  # raw (bytes, type)
      writer.add_tensor(name, w[0], raw_dtype=w[1])
      continue
    data, dtype = encode(w, qtype)
    writer.add_tensor(name, data, raw_dtype=dtype if dtype not in (QType.F32, QType.F16) else None)
  writer.write_header_to_file()
  writer.write_kv_data_to_file()
  writer.write_tensors_to_file()
  writer.close()
  return path


def test_permutation_is_llama_cpps_and_inverted():
  w = np.random.default_rng(0).normal(size=(6 * 8, 5)).astype(np.float32)
  for n_head in (1, 3, 6):
    np.testing.assert_array_equal(gguf_io.permute_rows(w, n_head), llama_cpp_permute(w, n_head))
    np.testing.assert_array_equal(gguf_io.unpermute_rows(llama_cpp_permute(w, n_head), n_head), w)


@pytest.mark.parametrize(
  'overrides,key_length',
  [
    ({}, False),
    ({'tie_embeddings': False}, False),
    ({'head_dim': 16, 'n_kv_heads': 1, 'tie_embeddings': False}, True),  # head_dim != d / heads
  ],
)
def test_load_gguf_f32_recovers_params(tmp_path, overrides, key_length):
  cfg, params = tiny(**overrides)
  path = write_gguf(tmp_path / 'tiny.gguf', cfg, params, key_length=key_length)
  loaded_cfg, loaded = gguf_io.load_gguf(path, progress=False)
  assert same_config(loaded_cfg, cfg), loaded_cfg
  assert_trees_equal(loaded, params)
  np.testing.assert_array_equal(logits(loaded_cfg, loaded), logits(cfg, params))


def test_load_gguf_q8_0_matches_gguf_dequantisation(tmp_path):
  cfg, params = tiny(tie_embeddings=False)
  path = write_gguf(tmp_path / 'tiny-q8.gguf', cfg, params, qtype=QType.Q8_0)
  reader = gguf.GGUFReader(path)
  types = {t.name: t.tensor_type for t in reader.tensors}
  assert types['blk.0.attn_q.weight'] == QType.Q8_0 and types['token_embd.weight'] == QType.Q8_0
  assert types['blk.0.ffn_down.weight'] == QType.F16  # rows of 48 do not fit 32-blocks
  loaded_cfg, loaded = gguf_io.load_gguf(path, progress=False)
  assert same_config(loaded_cfg, cfg)
  for name, tree_path, kind in gguf_io.tensor_table(cfg):
    original = gguf_io._get(params, tree_path)
    data, qtype = encode(gguf_array(original, kind, cfg), QType.Q8_0)
    expected = gguf_io.to_tree_layout(gguf.quants.dequantize(data, qtype), kind, cfg)
    np.testing.assert_array_equal(gguf_io._get(loaded, tree_path), expected, err_msg=name)
    np.testing.assert_allclose(gguf_io._get(loaded, tree_path), original, atol=0.01, err_msg=name)
  reference = logits(cfg, params)  # Q8_0 keeps ~2-3 significant digits per weight
  np.testing.assert_allclose(
    logits(loaded_cfg, loaded), reference, atol=0.05 * np.abs(reference).max()
  )


def test_load_gguf_dtype(tmp_path):
  cfg, params = tiny()
  path = write_gguf(tmp_path / 'tiny.gguf', cfg, params)
  _, loaded = gguf_io.load_gguf(path, dtype=jnp.bfloat16, progress=False)
  assert {x.dtype for x in jax.tree.leaves(loaded)} == {np.dtype(jnp.bfloat16)}
  assert all(isinstance(x, np.ndarray) for x in jax.tree.leaves(loaded))


def test_load_gguf_missing_file(tmp_path):
  path = tmp_path / 'nope.gguf'
  with pytest.raises(FileNotFoundError, match='nope.gguf'):
    gguf_io.load_gguf(path, progress=False)


@pytest.mark.parametrize('damage', ['half', 'tail', 'garbage', 'empty', 'header'])
def test_load_gguf_corrupt_file(tmp_path, damage):
  cfg, params = tiny()
  path = write_gguf(tmp_path / 'bad.gguf', cfg, params)
  data = path.read_bytes()
  path.write_bytes(
    {
      'half': data[: len(data) // 2],
      'tail': data[:-10],
      'empty': b'',
      'garbage': np.random.default_rng(0).bytes(4096),
      'header': data[:40],
    }[damage]
  )
  with pytest.raises(ValueError, match=r'bad\.gguf.*truncated or corrupt.*fetch it again'):
    gguf_io.load_gguf(path, progress=False)


def test_load_gguf_other_architecture(tmp_path):
  cfg, params = tiny()
  path = write_gguf(tmp_path / 'falcon.gguf', cfg, params, arch='falcon')
  with pytest.raises(
    ValueError,
    match=r"falcon\.gguf: general\.architecture 'falcon' is not supported "
    r"\(load_gguf reads \['llama', 'qwen2', 'qwen3', 'gemma3'\]\)",
  ):
    gguf_io.load_gguf(path, progress=False)


GEMMA3 = dict(
  arch='gemma3',
  qk_norm=True,
  sandwich_norms=True,
  norm_offset=1.0,
  activation='gelu_tanh',
  scale_embeddings=True,
  head_dim=16,  # != d_model / n_heads, as in Gemma 3 270M (256 vs 160)
  query_scale=0.25,  # head_dim ** -0.5: the file's key_length
  sliding_window=4,
  rope_local_base=10000.0,
  rope_base=1e6,
  norm_eps=1e-6,
)
# family -> (LlamaConfig overrides, extra GGUF metadata), as llama.cpp writes them.
GGUF_FAMILIES = {
  'qwen2': (dict(arch='qwen2', qkv_bias=True), {}),
  'qwen3': (dict(arch='qwen3', qk_norm=True, tie_embeddings=False), {}),
  'gemma3': (
    dict(GEMMA3, n_layers=7, layer_types=('sliding',) * 5 + ('full', 'sliding')),
    {'{arch}.attention.sliding_window': 4},
  ),
  'gemma3-linear': (  # RoPE scaling as llama.cpp writes it for Gemma 3 4B and larger
    dict(GEMMA3, n_layers=2, layer_types=('sliding', 'sliding'), rope_scaling=('linear', 8.0)),
    {
      '{arch}.attention.sliding_window': 4,
      '{arch}.rope.scaling.type': 'linear',
      '{arch}.rope.scaling.factor': 8.0,
    },
  ),
}


@pytest.mark.parametrize('family', list(GGUF_FAMILIES))
def test_load_gguf_families_recover_params(tmp_path, family):
  """qwen2 (biases), qwen3 (Q/K norms) and gemma3 (norms stored as 1 + w, no Q/K permutation,
  the layer pattern and local RoPE base of Gemma 3) load back to the tree that was written."""
  overrides, extra = dict(GGUF_FAMILIES[family][0]), GGUF_FAMILIES[family][1]
  sizes = {
    k: overrides.pop(k) for k in ('n_layers', 'head_dim', 'tie_embeddings') if k in overrides
  }
  cfg = dataclasses.replace(testing.tiny_config(**sizes), **overrides)
  params = jax.tree.map(np.asarray, init_params(cfg, jax.random.key(0), scale=0.2))
  if cfg.norm_offset:  # norms near 0 (Gemma scales by 1 + w), exactly representable after + 1
    params = jax.tree_util.tree_map_with_path(
      lambda p, w: np.round(w * 64) / 64 if 'norm' in jax.tree_util.keystr(p) else w, params
    )
  path = write_gguf(
    tmp_path / f'{family}.gguf', cfg, params, arch=cfg.arch, key_length=True, extra=extra
  )
  loaded_cfg, loaded = gguf_io.load_gguf(path, progress=False)
  assert same_config(loaded_cfg, cfg), loaded_cfg
  assert_trees_equal(loaded, params)
  np.testing.assert_array_equal(logits(loaded_cfg, loaded), logits(cfg, params))
  names = [name for name, _, _ in gguf_io.tensor_table(cfg)]
  if family == 'qwen2':
    assert 'blk.1.attn_v.bias' in names
  if family.startswith('gemma3'):
    assert {'blk.0.post_attention_norm.weight', 'blk.0.post_ffw_norm.weight'} <= set(names)
    assert 'blk.0.attn_q_norm.weight' in names and 'output.weight' not in names


def test_gemma3_layer_types():
  assert gguf_io._gemma3_layer_types(None, 12) == (('sliding',) * 5 + ('full',)) * 2
  assert gguf_io._gemma3_layer_types(2, 3) == ('sliding', 'full', 'sliding')
  assert gguf_io._gemma3_layer_types([True, False], 2) == ('sliding', 'full')
  with pytest.raises(ValueError, match='2 entries, expected 3'):
    gguf_io._gemma3_layer_types([True, False], 3)


def test_load_gguf_unsupported_rope_scaling(tmp_path):
  cfg, params = tiny()
  extra = {'{arch}.rope.scaling.type': 'yarn'}
  path = write_gguf(tmp_path / 'yarn.gguf', cfg, params, extra=extra)
  with pytest.raises(ValueError, match=r"yarn\.gguf: llama\.rope\.scaling\.type='yarn' is not"):
    gguf_io.load_gguf(path, progress=False)


def test_reader_equals_gguf_package(tmp_path):
  """specjax's own GGUF reader gives gguf.GGUFReader's metadata, tensors and bytes."""
  cfg, params = tiny(tie_embeddings=False)
  path = write_gguf(tmp_path / 'q8.gguf', cfg, params, qtype=QType.Q8_0)
  ours, theirs = gguf_io.open_reader(path), gguf.GGUFReader(path)
  for key, field in theirs.fields.items():
    if not key.startswith('GGUF.'):
      assert ours.fields[key] == field.contents(), key
  assert gguf_io.read_metadata(path, 'llama.') == {
    k: v for k, v in ours.fields.items() if k.startswith('llama.')
  }
  assert len(ours.tensors) == len(theirs.tensors)
  for a, b in zip(ours.tensors, theirs.tensors):
    assert (a.name, a.tensor_type, a.data_offset, a.n_bytes) == (
      b.name,
      b.tensor_type,
      b.data_offset,
      b.n_bytes,
    )
    assert a.shape == tuple(int(d) for d in b.shape)
    assert a.data.dtype == b.data.dtype and a.data.shape == b.data.shape
    np.testing.assert_array_equal(np.asarray(a.data), np.asarray(b.data))


def test_load_gguf_wrong_shape(tmp_path):
  cfg, params = tiny()
  bad = np.zeros((cfg.ffn_dim + 4, cfg.d_model), np.float32)
  path = write_gguf(tmp_path / 'shape.gguf', cfg, params, tensors={'blk.1.ffn_up.weight': bad})
  with pytest.raises(
    ValueError,
    match=r"shape\.gguf: tensor 'blk\.1\.ffn_up\.weight' has shape "
    r'\(52, 32\), expected \(48, 32\)',
  ):
    gguf_io.load_gguf(path, progress=False)


def test_load_gguf_missing_and_unexpected_tensors(tmp_path):
  cfg, params = tiny()
  path = write_gguf(tmp_path / 'm.gguf', cfg, params, tensors={'blk.0.attn_v.weight': None})
  with pytest.raises(ValueError, match=r"missing tensors \['blk\.0\.attn_v\.weight'\]"):
    gguf_io.load_gguf(path, progress=False)
  extra = {'rope_freqs.weight': np.ones(cfg.head_dim // 2, np.float32)}
  path = write_gguf(tmp_path / 'u.gguf', cfg, params, tensors=extra)
  with pytest.raises(ValueError, match=r"unexpected tensors \['rope_freqs\.weight'\]"):
    gguf_io.load_gguf(path, progress=False)


def test_load_gguf_unsupported_type(tmp_path):
  cfg, params = tiny()
  block, size = gguf.GGML_QUANT_SIZES[QType.Q8_1]  # the gguf package cannot dequantise Q8_1
  raw = np.zeros((cfg.n_heads * cfg.head_dim, cfg.d_model // block * size), np.uint8)
  path = write_gguf(
    tmp_path / 'q81.gguf', cfg, params, tensors={'blk.0.attn_q.weight': (raw, QType.Q8_1)}
  )
  with pytest.raises(ValueError, match=r"q81\.gguf: tensor 'blk\.0\.attn_q\.weight' has type Q8_1"):
    gguf_io.load_gguf(path, progress=False)


@pytest.fixture(scope='module')
def smollm2_path() -> pathlib.Path:
  from specjax.data import assets

  return assets.fetch('smollm2-135m-instruct')


@pytest.mark.slow
def test_load_real_smollm2(smollm2_path):
  cfg, params = gguf_io.load_gguf(smollm2_path, progress=False)
  assert same_config(
    cfg,
    LlamaConfig(
      vocab_size=49152,
      d_model=576,
      n_layers=30,
      n_heads=9,
      n_kv_heads=3,
      head_dim=64,
      ffn_dim=1536,
      rope_base=100000.0,
      norm_eps=1e-5,
      tie_embeddings=True,
      max_seq_len=8192,
    ),
  )
  reader = gguf.GGUFReader(smollm2_path)
  tensors = {t.name: t for t in reader.tensors}
  deq = lambda name: gguf.quants.dequantize(tensors[name].data, tensors[name].tensor_type)
  cases = [  # GGUF name, tree path, its type, the array the loader should produce
    (
      'blk.3.attn_q.weight',
      ('layers', 3, 'wq'),
      QType.Q4_1,
      lambda w: gguf_io.unpermute_rows(w, 9).T,
    ),
    (
      'blk.7.attn_k.weight',
      ('layers', 7, 'wk'),
      QType.Q4_1,
      lambda w: gguf_io.unpermute_rows(w, 3).T,
    ),
    ('blk.5.ffn_down.weight', ('layers', 5, 'w_down'), QType.Q4_1, lambda w: w.T),
    ('token_embd.weight', ('embed',), QType.Q8_0, lambda w: w),
    ('blk.0.attn_norm.weight', ('layers', 0, 'attn_norm'), QType.F32, lambda w: w),
    ('output_norm.weight', ('final_norm',), QType.F32, lambda w: w),
  ]
  for name, tree_path, qtype, expected in cases:
    assert tensors[name].tensor_type == qtype, name
    np.testing.assert_array_equal(
      gguf_io._get(params, tree_path), expected(deq(name)), err_msg=name
    )
  assert params['layers'][5]['w_down'].shape == (1536, 576)
  assert params['embed'].shape == (49152, 576) and params['embed'].dtype == np.float32


@pytest.mark.slow
def test_real_smollm2_weights_match_transformers_gguf_loader(smollm2_path, tmp_path):
  """transformers' own GGUF conversion gives the same weights as load_gguf + export_hf."""
  transformers = importlib.import_module('transformers')
  torch = importlib.import_module('torch')
  cfg, params = gguf_io.load_gguf(smollm2_path, progress=False)
  ours = hf.export_hf(tmp_path / 'hf', cfg, params)
  del params
  reference = transformers.AutoModelForCausalLM.from_pretrained(
    smollm2_path.parent, gguf_file=smollm2_path.name, dtype=torch.float32
  ).state_dict()
  with safetensors.safe_open(ours / hf.WEIGHTS_FILE, framework='numpy') as f:
    for name in (
      'model.layers.0.self_attn.q_proj.weight',
      'model.layers.12.mlp.gate_proj.weight',
      'model.layers.29.self_attn.k_proj.weight',
      'model.embed_tokens.weight',
    ):
      np.testing.assert_array_equal(f.get_tensor(name), reference[name].numpy(), err_msg=name)


# ----------------------------------------------------------------------------------------------
# Hugging Face


class FakeTokenizer:
  """Duck-types specjax.formats.tokenizer.Tokenizer's export surface."""

  bos_id, eos_id = 1, 2

  def save(self, directory):
    (pathlib.Path(directory) / 'tokenizer.json').write_text('{}')


@pytest.mark.parametrize('tie', [True, False])
def test_hf_round_trip_is_exact(tmp_path, tie):
  cfg, params = tiny(tie_embeddings=tie)
  hf.export_hf(tmp_path, cfg, params, tokenizer=FakeTokenizer())
  config = json.loads((tmp_path / 'config.json').read_text())
  assert config['architectures'] == ['LlamaForCausalLM'] and config['tie_word_embeddings'] == tie
  assert (config['bos_token_id'], config['eos_token_id']) == (1, 2)
  assert (tmp_path / 'tokenizer.json').is_file()
  with safetensors.safe_open(tmp_path / 'model.safetensors', framework='numpy') as f:
    assert ('lm_head.weight' in f.keys()) == (not tie)
    assert f.get_tensor('model.layers.1.mlp.down_proj.weight').shape == (cfg.d_model, cfg.ffn_dim)
  loaded_cfg, loaded = hf.load_hf(tmp_path)
  assert same_config(loaded_cfg, cfg)
  assert_trees_equal(loaded, params)


def test_hf_bf16_and_sharded(tmp_path):
  cfg, params = tiny()
  hf.export_hf(tmp_path, cfg, params, dtype=jnp.bfloat16)
  assert json.loads((tmp_path / 'config.json').read_text())['torch_dtype'] == 'bfloat16'
  tensors = safetensors.numpy.load_file(tmp_path / 'model.safetensors')
  names = sorted(tensors)
  (tmp_path / 'model.safetensors').unlink()
  for i, part in enumerate((names[::2], names[1::2])):
    safetensors.numpy.save_file(
      {n: tensors[n] for n in part}, tmp_path / f'model-{i + 1:05d}-of-00002.safetensors'
    )
  _, loaded = hf.load_hf(tmp_path)
  expected = jax.tree.map(lambda x: np.asarray(x.astype(jnp.bfloat16), np.float32), params)
  assert_trees_equal(loaded, expected)
  _, loaded16 = hf.load_hf(tmp_path, dtype=jnp.bfloat16)
  assert loaded16['embed'].dtype == jnp.bfloat16


@pytest.mark.parametrize(
  'overrides',
  [
    {'tie_embeddings': True},
    {'tie_embeddings': False, 'head_dim': 16, 'n_kv_heads': 1},
  ],
)
def test_hf_export_matches_transformers(tmp_path, overrides):
  transformers = importlib.import_module('transformers')
  torch = importlib.import_module('torch')
  cfg, params = tiny(**overrides)
  cfg = dataclasses.replace(cfg, rope_base=500.0)  # a base that is no default
  hf.export_hf(tmp_path, cfg, params)
  model = transformers.LlamaForCausalLM.from_pretrained(tmp_path).eval()
  with torch.no_grad():
    reference = model(torch.from_numpy(TOKENS.astype(np.int64))).logits.numpy()
  np.testing.assert_allclose(logits(cfg, params), reference, atol=1e-4, rtol=0)


def test_load_hf_errors(tmp_path):
  with pytest.raises(FileNotFoundError, match=r'config\.json'):
    hf.load_hf(tmp_path)
  cfg, params = tiny()
  hf.export_hf(tmp_path, cfg, params)
  config_file = tmp_path / 'config.json'
  config = json.loads(config_file.read_text())
  config_file.write_text(json.dumps({**config, 'model_type': 'gemma3'}))
  with pytest.raises(ValueError, match=r"config\.json: model_type 'gemma3' is not supported"):
    hf.load_hf(tmp_path)
  config_file.write_text(json.dumps({**config, 'intermediate_size': 40}))
  with pytest.raises(
    ValueError,
    match=r"'model\.layers\.0\.mlp\.gate_proj\.weight' has shape "
    r'\(48, 32\), expected \(40, 32\)',
  ):
    hf.load_hf(tmp_path)
  config_file.write_text(json.dumps(config))
  tensors = safetensors.numpy.load_file(tmp_path / 'model.safetensors')
  tensors['model.layers.0.self_attn.rotary_emb.inv_freq'] = np.ones(4, np.float32)  # ignored
  safetensors.numpy.save_file(tensors, tmp_path / 'model.safetensors')
  hf.load_hf(tmp_path)
  del tensors['model.norm.weight']
  tensors['model.layers.0.self_attn.q_proj.bias'] = np.ones(32, np.float32)
  safetensors.numpy.save_file(tensors, tmp_path / 'model.safetensors')
  with pytest.raises(ValueError, match=r"missing tensors \['model\.norm\.weight'\]"):
    hf.load_hf(tmp_path)
  tensors['model.norm.weight'] = np.ones(32, np.float32)
  safetensors.numpy.save_file(tensors, tmp_path / 'model.safetensors')
  with pytest.raises(ValueError, match=r"unexpected tensors \['model\.layers\.0\.self_attn\.q_pro"):
    hf.load_hf(tmp_path)


# ----------------------------------------------------------------------------------------------
# orbax


def test_orbax_round_trip(tmp_path):
  cfg, params = tiny(tie_embeddings=False)
  params['embed'] = params['embed'].astype(jnp.bfloat16)
  jax_params = jax.tree.map(jnp.asarray, params)
  orbax_io.save_params(tmp_path / 'ckpt', jax_params, cfg)
  restored_cfg, restored = orbax_io.restore_params(tmp_path / 'ckpt')
  assert restored_cfg == cfg
  assert isinstance(restored['layers'], list) and len(restored['layers']) == cfg.n_layers
  assert_trees_equal(restored, jax_params)

  orbax_io.save_params(tmp_path / 'np', params)  # numpy leaves, no config
  for given in (None, cfg):
    restored_cfg, restored = orbax_io.restore_params(tmp_path / 'np', given)
    assert restored_cfg == given and isinstance(restored['layers'], list)
    assert_trees_equal(restored, params)


def test_orbax_errors(tmp_path):
  with pytest.raises(FileNotFoundError, match='missing'):
    orbax_io.restore_params(tmp_path / 'missing')
  cfg, params = tiny()
  orbax_io.save_params(tmp_path / 'ckpt', params, cfg)
  with pytest.raises(ValueError, match='already exists'):
    orbax_io.save_params(tmp_path / 'ckpt', params, cfg)
  orbax_io.save_params(tmp_path / 'ckpt', params, cfg, overwrite=True)
  with pytest.raises(ValueError, match='3 layers|2 layers'):
    orbax_io.restore_params(tmp_path / 'ckpt', dataclasses.replace(cfg, n_layers=3))
