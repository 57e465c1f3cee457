"""Every family of the Llama lineage against transformers, offline.

transformers builds a tiny random model of each family from a config (no download) and
saves it as safetensors; specjax loads the directory and must give the same logits
(float32, 1e-4), the same greedy continuation, cached == full forwards and speculative
greedy identity with a truncated draft. Sliding windows (Mistral, Gemma 3) are shorter
than the prompts, so they are exercised.
"""

import importlib
import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from specjax.checkpoints import hf
from specjax.decode.engine import Engine
from specjax.decode.method import Method
from specjax.drafters import ModelDrafter, truncated_target
from specjax.models import llama
from specjax.models.kv_cache import KVCache

COMMON = dict(
  vocab_size=96,
  hidden_size=64,
  intermediate_size=112,
  num_hidden_layers=3,
  num_attention_heads=4,
  num_key_value_heads=2,
  head_dim=16,
  max_position_embeddings=256,
  rms_norm_eps=1e-6,
  tie_word_embeddings=False,
)
WINDOW = 8  # shorter than every prompt below

# family -> (transformers config class, its arguments)
FAMILIES = {
  'llama3': (
    'LlamaConfig',
    dict(
      rope_parameters=dict(
        rope_type='llama3',
        rope_theta=500000.0,
        factor=8.0,
        low_freq_factor=1.0,
        high_freq_factor=4.0,
        original_max_position_embeddings=16,  # small, so every band of the scaling is used
      )
    ),
  ),
  'mistral': ('MistralConfig', dict(sliding_window=WINDOW, rope_parameters={'rope_theta': 1e6})),
  'qwen2': ('Qwen2Config', dict(tie_word_embeddings=True)),
  'qwen3': ('Qwen3Config', dict()),
  'gemma3': (
    'Gemma3TextConfig',
    dict(
      sliding_window=WINDOW,
      layer_types=['sliding_attention', 'sliding_attention', 'full_attention'],
      query_pre_attn_scalar=24,  # not head_dim: the scale must come from the config
      rope_parameters={
        'full_attention': {'rope_type': 'linear', 'factor': 2.0, 'rope_theta': 1e6},
        'sliding_attention': {'rope_type': 'default', 'rope_theta': 1e4},
      },
      tie_word_embeddings=True,
    ),
  ),
}
ARCH = {'llama3': 'llama', 'mistral': 'mistral', 'qwen2': 'qwen2', 'qwen3': 'qwen3'}
PROMPTS = [list(np.random.default_rng(1).integers(3, 96, 21)), [5, 9, 2, 7, 7, 1, 30, 4, 8, 11, 2]]


def _randomize(model, gemma: bool, seed: int):
  """Random weights everywhere (transformers initialises biases to 0 and norms to 1)."""
  import torch

  gen = torch.Generator().manual_seed(seed)
  with torch.no_grad():
    for name, p in model.named_parameters():
      noise = torch.randn(p.shape, generator=gen)
      base = 0.0 if (gemma or 'norm' not in name) else 1.0
      p.copy_(base + (0.1 if 'norm' in name else 0.15) * noise)


@pytest.fixture(scope='module')
def checkpoints(tmp_path_factory):
  """{family: (directory, transformers model)}."""
  torch = pytest.importorskip('torch')
  transformers = importlib.import_module('transformers')
  torch.manual_seed(0)
  out = {}
  for i, (name, (cls, extra)) in enumerate(FAMILIES.items()):
    config = getattr(transformers, cls)(**{**COMMON, **extra}, bos_token_id=0, eos_token_id=1)
    config._attn_implementation = 'eager'
    model = transformers.AutoModelForCausalLM.from_config(config).to(torch.float32).eval()
    _randomize(model, name == 'gemma3', seed=i)
    if config.tie_word_embeddings:
      model.tie_weights()
    path = tmp_path_factory.mktemp(name)
    model.save_pretrained(path)
    out[name] = path, model
  return out


def _load(checkpoints, name):
  cfg, params = hf.load_hf(checkpoints[name][0])
  return cfg, jax.tree_util.tree_map(jnp.asarray, params)


@pytest.mark.parametrize('name', list(FAMILIES))
def test_configs_map_to_the_right_switches(checkpoints, name):
  cfg, _ = _load(checkpoints, name)
  assert cfg.arch == ARCH.get(name, name)
  assert cfg.qkv_bias == (name == 'qwen2')
  assert cfg.qk_norm == (name in ('qwen3', 'gemma3'))
  assert cfg.sliding_window == (WINDOW if name in ('mistral', 'gemma3') else 0)
  if name == 'llama3':
    assert cfg.rope_scaling == ('llama3', 8.0, 1.0, 4.0, 16.0)
  if name == 'gemma3':
    assert cfg.layer_types == ('sliding', 'sliding', 'full')
    assert cfg.rope_scaling == ('linear', 2.0) and cfg.rope_local_base == 1e4
    assert cfg.query_scale == pytest.approx(24**-0.5)


@pytest.mark.parametrize('name', list(FAMILIES))
def test_logits_match_transformers(checkpoints, name):
  import torch

  cfg, params = _load(checkpoints, name)
  tokens = np.array(PROMPTS[0])[None]
  with torch.no_grad():
    want = checkpoints[name][1](torch.tensor(tokens)).logits.numpy()
  got, _ = llama.forward(params, jnp.asarray(tokens), KVCache.init(cfg, 1, 32), cfg)[:2]
  assert np.abs(want).max() > 1.0  # logits far from uniform: a wrong layer would show
  np.testing.assert_allclose(np.asarray(got), want, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize('name', list(FAMILIES))
def test_greedy_continuation_matches_transformers(checkpoints, name):
  import torch

  cfg, params = _load(checkpoints, name)
  engine = Engine(params, cfg, eos_id=-1, cache_size=64)
  got = engine.generate(PROMPTS, max_new_tokens=16).tokens
  model = checkpoints[name][1]
  for prompt, tokens in zip(PROMPTS, got):
    with torch.no_grad():
      want = model.generate(
        torch.tensor([prompt]),
        max_new_tokens=16,
        min_new_tokens=16,
        do_sample=False,
        pad_token_id=0,
        eos_token_id=None,
      )[0, len(prompt) :].tolist()
    assert tokens == want


@pytest.mark.parametrize('name', list(FAMILIES))
def test_cached_steps_equal_the_full_forward(checkpoints, name):
  cfg, params = _load(checkpoints, name)
  tokens = jnp.asarray(PROMPTS[0])[None]
  full, _ = llama.forward(params, tokens, KVCache.init(cfg, 1, 32), cfg)[:2]
  logits, cache = llama.forward(params, tokens[:, :5], KVCache.init(cfg, 1, 32), cfg)[:2]
  steps = [logits]
  for t in range(5, tokens.shape[1], 3):  # 3 tokens at a time, across the window
    logits, cache = llama.forward(params, tokens[:, t : t + 3], cache, cfg)[:2]
    steps.append(logits)
  np.testing.assert_allclose(np.concatenate(steps, 1), full, atol=2e-5, rtol=1e-5)


@pytest.mark.parametrize('name', list(FAMILIES))
def test_speculative_greedy_equals_target_greedy(checkpoints, name):
  from specjax.core.tree import parse_tree

  cfg, params = _load(checkpoints, name)
  draft_cfg, draft = truncated_target(cfg, params, 2)
  engine = Engine(
    params, cfg, eos_id=-1, cache_size=96, drafter=ModelDrafter(draft_cfg), draft_params=draft
  )
  reference = engine.generate(PROMPTS, max_new_tokens=24).tokens
  assert engine.generate(PROMPTS, Method.chain(3, 'greedy'), max_new_tokens=24).tokens == reference
  assert engine.generate(
    PROMPTS, Method.tree(parse_tree('2x2x1'), 'greedy'), max_new_tokens=24
  ).tokens == (reference)
  # The draft's layers keep their own kinds (sliding or full) and RoPE.
  assert draft_cfg.layer_types == cfg.layer_types[:2]


def test_unsupported_configs_are_named(tmp_path):
  base = {
    'model_type': 'qwen2',
    'vocab_size': 8,
    'hidden_size': 8,
    'intermediate_size': 8,
    'num_hidden_layers': 1,
    'num_attention_heads': 2,
  }
  cases = [
    ({'model_type': 'gpt2'}, "model_type 'gpt2' is not supported"),
    ({'model_type': 'gemma3'}, 'gemma3_text'),
    ({'use_sliding_window': True}, 'use_sliding_window=True is not supported'),
    ({'hidden_act': 'relu'}, "hidden_act='relu' is not supported"),
    (
      {'model_type': 'gemma3_text', 'final_logit_softcapping': 30.0},
      'final_logit_softcapping=30.0 is not supported',
    ),
    ({'rope_parameters': {'rope_type': 'yarn', 'factor': 4}}, "type 'yarn' is not supported"),
    ({'rope_parameters': {'rope_type': 'llama3', 'factor': 4}}, 'lacks'),
    (
      {'model_type': 'gemma3_text', 'layer_types': ['chunked_attention']},
      r"layer_types has \['chunked_attention'\]",
    ),
  ]
  for change, message in cases:
    (tmp_path / 'config.json').write_text(json.dumps({**base, **change}))
    with pytest.raises(ValueError, match=message) as info:
      hf.load_hf(tmp_path)
    assert 'config.json' in str(info.value)
  with pytest.raises(ValueError, match='export_hf writes Llama models only'):
    hf.export_hf(tmp_path, llama.LlamaConfig(8, 8, 1, 2, 2, 4, 8, arch='qwen2'), {})


def test_bad_family_settings_are_named():
  kw = dict(vocab_size=8, d_model=8, n_layers=2, n_heads=2, n_kv_heads=2, head_dim=4, ffn_dim=8)
  with pytest.raises(ValueError, match='arch must be one of'):
    llama.LlamaConfig(**kw, arch='gpt2')
  with pytest.raises(ValueError, match="layer_types needs 'sliding' or 'full'"):
    llama.LlamaConfig(**kw, sliding_window=4, layer_types=('sliding',))
  with pytest.raises(ValueError, match='sliding_window is 0'):
    llama.LlamaConfig(**kw, layer_types=('sliding', 'full'))
  with pytest.raises(ValueError, match='rope_scaling must be'):
    llama.LlamaConfig(**kw, rope_scaling=('yarn', 4.0))
  with pytest.raises(ValueError, match='activation must be one of'):
    llama.LlamaConfig(**kw, activation='relu')
