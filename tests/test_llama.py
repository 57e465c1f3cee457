"""The model contract: cached decoding, rollback and ragged batches agree with a full forward."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from specjax import testing
from specjax.models import llama
from specjax.models.kv_cache import KVCache


@pytest.fixture(scope='module')
def model():
  return testing.tiny_model(seed=1)


def full_logits(cfg, params, tokens):
  tokens = jnp.asarray(tokens, jnp.int32)[None]
  logits, cache = llama.forward(params, tokens, KVCache.init(cfg, 1, 64), cfg)[:2]
  assert int(cache.lengths[0]) == tokens.shape[1]
  return np.asarray(logits[0])


def reference_logits(cfg, params, tokens):
  """An independent, cache-free numpy forward pass (causal mask over the whole sequence)."""
  p = jax.tree_util.tree_map(np.asarray, params)
  t = len(tokens)
  n, g, h = cfg.n_heads, cfg.n_kv_heads, cfg.head_dim

  def norm(x, w):
    return x / np.sqrt((x * x).mean(-1, keepdims=True) + cfg.norm_eps) * w

  inv = cfg.rope_base ** (-np.arange(0, h, 2) / h)
  ang = np.arange(t)[:, None] * inv  # [T, H/2]
  cos = np.concatenate([np.cos(ang)] * 2, -1)[:, None]
  sin = np.concatenate([np.sin(ang)] * 2, -1)[:, None]

  def rope(x):
    rot = np.concatenate([-x[..., h // 2 :], x[..., : h // 2]], -1)
    return x * cos + rot * sin

  x = p['embed'][np.asarray(tokens)]
  for layer in p['layers']:
    y = norm(x, layer['attn_norm'])
    q = rope((y @ layer['wq']).reshape(t, n, h))
    k = np.repeat(rope((y @ layer['wk']).reshape(t, g, h)), n // g, axis=1)
    v = np.repeat((y @ layer['wv']).reshape(t, g, h), n // g, axis=1)
    s = np.einsum('tnh,snh->nts', q, k) / np.sqrt(h)
    s = np.where(np.tril(np.ones((t, t), bool)), s, -np.inf)
    a = np.exp(s - s.max(-1, keepdims=True))
    a /= a.sum(-1, keepdims=True)
    x = x + np.einsum('nts,snh->tnh', a, v).reshape(t, n * h) @ layer['wo']
    y = norm(x, layer['mlp_norm'])
    gate = y @ layer['w_gate']
    x = x + (gate / (1 + np.exp(-gate)) * (y @ layer['w_up'])) @ layer['w_down']
  x = norm(x, p['final_norm'])
  return x @ (p['embed'].T if cfg.tie_embeddings else p['lm_head'])


def test_forward_matches_independent_numpy_reference(model):
  cfg, params = model
  tokens = [3, 17, 42, 5, 9, 60, 1, 2]
  np.testing.assert_allclose(
    full_logits(cfg, params, tokens), reference_logits(cfg, params, tokens), atol=1e-4, rtol=1e-4
  )


def test_untied_head_matches_reference():
  cfg, params = testing.tiny_model(seed=2, tie_embeddings=False)
  tokens = [1, 2, 3, 4]
  np.testing.assert_allclose(
    full_logits(cfg, params, tokens), reference_logits(cfg, params, tokens), atol=1e-4, rtol=1e-4
  )


def test_incremental_cached_decoding_equals_full_forward(model):
  cfg, params = model
  tokens = np.array([5, 8, 13, 21, 34, 55, 2, 7, 11, 3], np.int32)
  expected = full_logits(cfg, params, tokens)
  cache = KVCache.init(cfg, 1, 64)
  logits, cache = llama.forward(params, jnp.asarray(tokens[None, :4]), cache, cfg)[:2]
  steps = [np.asarray(logits[0])]
  for i in range(4, len(tokens), 3):  # chunks of 3, then 1, as a verifier would
    chunk = tokens[None, i : i + 3]
    logits, cache = llama.forward(params, jnp.asarray(chunk), cache, cfg)[:2]
    steps.append(np.asarray(logits[0]))
  np.testing.assert_allclose(np.concatenate(steps), expected, atol=1e-5, rtol=1e-5)
  assert int(cache.lengths[0]) == len(tokens)


def test_rollback_is_lowering_the_length(model):
  cfg, params = model
  prefix, wrong, right = [4, 9, 16, 25], [1, 2, 3], [36, 49]
  cache = KVCache.init(cfg, 1, 64)
  _, cache = llama.forward(params, jnp.asarray([prefix + wrong]), cache, cfg)[:2]
  cache = cache.with_lengths(cache.lengths - len(wrong))
  logits, cache = llama.forward(params, jnp.asarray([right]), cache, cfg)[:2]
  expected = full_logits(cfg, params, prefix + right)[len(prefix) :]
  np.testing.assert_allclose(np.asarray(logits[0]), expected, atol=1e-5, rtol=1e-5)


def test_rows_at_different_positions_match_rows_alone(model):
  cfg, params = model
  a, b = [3, 1, 4, 1, 5, 9, 2, 6], [2, 7, 1]
  cache = KVCache.init(cfg, 2, 64)
  padded = np.zeros((2, len(a)), np.int32)
  padded[0], padded[1, : len(b)] = a, b
  _, cache = llama.forward(params, jnp.asarray(padded), cache, cfg)[:2]
  cache = cache.with_lengths(jnp.array([len(a), len(b)]))
  nxt = jnp.array([[8, 10], [28, 18]], jnp.int32)
  logits, cache = llama.forward(params, nxt, cache, cfg)[:2]
  np.testing.assert_allclose(
    np.asarray(logits[0]), full_logits(cfg, params, a + [8, 10])[-2:], atol=1e-5, rtol=1e-5
  )
  np.testing.assert_allclose(
    np.asarray(logits[1]), full_logits(cfg, params, b + [28, 18])[-2:], atol=1e-5, rtol=1e-5
  )
  np.testing.assert_array_equal(np.asarray(cache.lengths), [len(a) + 2, len(b) + 2])


def test_check_params_names_the_tensor_and_both_shapes(model):
  cfg, params = model
  bad = jax.tree_util.tree_map(lambda x: x, params)
  bad['layers'][1]['wk'] = jnp.zeros((3, 5))
  with pytest.raises(ValueError, match=r"\['layers'\]\[1\]\['wk'\].*\(3, 5\).*\(32, 16\)"):
    llama.check_params(cfg, bad)


@pytest.mark.parametrize(
  'field,value',
  [('n_layers', 0), ('d_model', -4), ('n_heads', 3), ('head_dim', 7), ('vocab_size', 2.5)],
)
def test_invalid_config_values_are_named(field, value):
  with pytest.raises(ValueError, match=field if field != 'n_heads' else 'n_kv_heads'):
    testing.tiny_config(**{field: value})
