"""EAGLE-3-style feature heads: the training unroll equals cached drafting, the drafter in
the loop proposes what a from-scratch head computes, greedy identity and lossless sampling
end to end, the EAGLE-3 checkpoint layout round trip, and clear errors."""

import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from specjax import registry, testing
from specjax.checkpoints import eagle3
from specjax.control.adaptive import AdaptiveConfig
from specjax.core.sampling import SamplingConfig
from specjax.decode import loop
from specjax.decode.engine import Engine
from specjax.decode.method import Method
from specjax.decode.prefill import prefill
from specjax.drafters.eagle import EagleDrafter
from specjax.models import eagle as eagle_model
from specjax.models import llama
from specjax.models.kv_cache import KVCache
from specjax.train import eagle_head

PROMPTS = [[3, 1, 4, 1, 5], [9, 2, 6, 5, 3, 5, 8, 9, 7, 9, 3, 2, 3], [7], [2, 7, 1, 8, 2, 8, 1]]


@pytest.fixture(scope='module')
def target():
  return testing.tiny_model(seed=3, n_layers=3)


def make_head(target, vocab_step=2, seed=0, scale=1.0):
  cfg, params = target
  ids = np.arange(0, cfg.vocab_size, vocab_step)
  hc = eagle_model.EagleConfig.for_target(cfg, len(ids))
  hp = eagle_model.init_params(hc, jax.random.key(seed), ids, params)
  hp['fc'] = hp['fc'] * 10 * scale  # larger states: distinct argmaxes, no near-ties
  return hc, hp


def features_of(target, tokens, capture):
  cfg, params = target
  tokens = jnp.asarray(tokens)
  cache = KVCache.init(cfg, tokens.shape[0], tokens.shape[1])
  return llama.forward(params, tokens, cache, cfg, capture=capture).features


def test_capture_is_the_stream_entering_each_layer(target):
  cfg, params = target
  tokens = jnp.asarray([PROMPTS[1]])
  feats = features_of(target, tokens, (0, 2, 3))
  d = cfg.d_model
  np.testing.assert_allclose(feats[..., :d], params['embed'][tokens], rtol=1e-6)
  ref = llama.forward(params, tokens, KVCache.init(cfg, 1, 16), cfg, layers=(0, 1)).hidden
  # the hidden output is normalised its output; the captured stream entering layer 2 is before that
  x = feats[..., d : 2 * d]
  normed = llama.rms_norm(x, params['final_norm'], cfg.norm_eps)
  np.testing.assert_allclose(normed, ref, rtol=1e-4, atol=1e-5)
  with pytest.raises(ValueError, match='captured layers'):
    llama.check_capture(cfg, (0, 4))


def test_training_unroll_equals_cached_drafting(target):
  """Step k of the training-time test at position t is the k-th draft step's state."""
  cfg, params = target
  hc, hp = make_head(target)
  tokens = jnp.asarray([PROMPTS[1] + [4, 4, 2]])
  feats = features_of(target, tokens, hc.capture)
  states = eagle_head.unrolled_states(hp, params['embed'], feats, tokens, hc, 3)
  t = tokens.shape[1]
  for p in range(3, t - 3):  # true features up to p - 1, then steps 2 and 3 on own states
    cache = KVCache.init(hc, 1, 32)
    positions = jnp.arange(p)[None]
    out, cache = eagle_model.cached_step(
      hp,
      params['embed'],
      eagle_model.fuse(hp, feats[:, :p]),
      tokens[:, 1 : p + 1],
      positions,
      jnp.ones_like(positions, bool),
      cache,
      hc,
    )
    np.testing.assert_allclose(out[0], states[0, 0, :p], rtol=2e-4, atol=2e-5)
    prev = out[:, -1:]
    for k in (2, 3):
      pos = jnp.asarray([[p + k - 2]])
      prev, cache = eagle_model.cached_step(
        hp, params['embed'], prev, tokens[:, p + k - 1 : p + k], pos, pos >= 0, cache, hc
      )
      np.testing.assert_allclose(prev[0, 0], states[k - 1, 0, p + k - 2], rtol=2e-4, atol=2e-5)


def reference_draft(target, hc, hp, context, gamma):
  """The greedy draft after `context`, from a head run from scratch on true features."""
  cfg, params = target
  drafted = []
  for k in range(gamma):
    tokens = context + drafted
    tokens = jnp.asarray([tokens + [0] * (64 - len(tokens))])  # causal: padding changes nothing
    feats = features_of(target, tokens, hc.capture)
    states = eagle_head.unrolled_states(hp, params['embed'], feats, tokens, hc, k + 1)
    logits = eagle_model.head_logits(hp, states[k, 0, len(context) - 2 + k], hc)
    drafted.append(int(hp['vocab_ids'][jnp.argmax(logits)]))
  return drafted


@pytest.mark.parametrize('adaptive', [False, True], ids=['fixed', 'adaptive'])
def test_the_drafter_in_the_loop_proposes_what_a_fresh_head_does(adaptive):
  """The ring of features, update (absorb, trim), the catch-up pass, after iterations that
  kept different numbers of draft tokens (and plain steps under adaptive control). A
  small vocabulary makes a random head right often enough."""
  target = testing.tiny_model(seed=21, vocab_size=8, n_layers=3, scale=0.3)
  cfg, params = target
  hc, hp = make_head(target, vocab_step=1, scale=0.3)
  drafter = EagleDrafter(hc)
  gamma = 3
  control = None
  if adaptive:
    drafter = registry.resync(drafter, 8)
    adaptive_cfg = AdaptiveConfig(
      gammas=(1, gamma), draft_cost=(0.4, 1.2), verify_cost=(1.1, 1.3), probe_every=3
    )
    method = Method.adaptive(adaptive_cfg, 'greedy')
  else:
    method = Method.chain(gamma, 'greedy')
  sampling = SamplingConfig(temperature=0.0)
  all_params = {'target': params, 'draft': {'head': hp, 'embed': params['embed']}}
  prompts = [[t % 8 for t in PROMPTS[1]], [t % 8 for t in PROMPTS[3]] + [0] * 6]
  lens = jnp.asarray([len(PROMPTS[1]), len(PROMPTS[3])])
  kw = dict(cfg=cfg, method=method, drafter=drafter, sampling=sampling, eos_id=-1)
  state = prefill(
    all_params,
    jnp.asarray(prompts),
    lens,
    jnp.asarray([40, 40]),
    jax.random.key(0),
    control,
    cache_size=64,
    out_len=48,
    **kw,
  )
  step = jax.jit(lambda s: loop.step(all_params, s, **kw))
  kept, drafted = set(), set()
  for i in range(12):
    draft, _, _ = drafter.propose(
      all_params['draft'], state.spec.draft, state, jax.random.key(1), gamma, sampling
    )
    for row in range(2):
      n = int(state.num_generated[row])
      context = prompts[row][: int(lens[row])] + list(np.asarray(state.tokens[row, :n]))
      assert list(np.asarray(draft[row])) == reference_draft(target, hc, hp, context, gamma), (
        i,
        row,
      )
    state = step(state)
    kept |= set(np.asarray(state.spec.accepted[:, i]).tolist())
    drafted |= set(np.asarray(state.spec.drafted[:, i]).tolist())
  if adaptive:
    assert 0 in drafted and len(drafted) > 1, drafted  # plain steps and verifications
  else:
    assert len(kept) > 1, kept  # iterations kept different numbers of draft tokens


@pytest.mark.parametrize('verifier', ['greedy', 'rejection', 'block'])
def test_eagle_greedy_equals_target_greedy(target, verifier):
  cfg, params = target
  hc, hp = make_head(target)
  engine = Engine(
    params,
    cfg,
    eos_id=-1,
    cache_size=128,
    drafter=EagleDrafter(hc),
    draft_params={'head': hp, 'embed': params['embed']},
  )
  reference = engine.generate(PROMPTS, max_new_tokens=24).tokens
  for gamma in (1, 2, 4):
    assert (
      engine.generate(PROMPTS, Method.chain(gamma, verifier), max_new_tokens=24).tokens == reference
    )
  adaptive = AdaptiveConfig(gammas=(1, 3))
  assert (
    engine.generate(PROMPTS, Method.adaptive(adaptive, verifier), max_new_tokens=24).tokens
    == reference
  )


def test_gamma_beyond_the_feature_ring_is_refused(target):
  cfg, params = target
  hc, hp = make_head(target)
  engine = Engine(
    params,
    cfg,
    eos_id=-1,
    cache_size=64,
    drafter=EagleDrafter(hc, ring=4),
    draft_params={'head': hp, 'embed': params['embed']},
  )
  with pytest.raises(ValueError, match='larger ring'):
    engine.generate(PROMPTS[:1], Method.chain(4), max_new_tokens=8)


def small_vocab_head_engine(cache_size: int = 16):
  """(engine, target) with an 8-token target and a head whose vocabulary leaves out two
  of the tokens (q = 0 there)."""
  target = testing.tiny_model(seed=21, vocab_size=8, n_layers=2, scale=0.3)
  cfg, params = target
  ids = np.array([0, 1, 2, 4, 5, 7])
  hc = eagle_model.EagleConfig.for_target(cfg, len(ids))
  hp = eagle_model.init_params(hc, jax.random.key(5), ids, params)
  engine = Engine(
    params,
    cfg,
    eos_id=-1,
    cache_size=cache_size,
    drafter=EagleDrafter(hc),
    draft_params={'head': hp, 'embed': params['embed']},
  )
  return engine, target


def test_eagle_sampling_is_lossless():
  """Chi-square of 3-token continuations against the exact target distribution, with a
  head whose vocabulary leaves out two of the eight tokens (q = 0 there)."""
  from tests.test_speculative import chi_square_pvalue, exact_continuations

  engine, (cfg, params) = small_vocab_head_engine()
  sampling = SamplingConfig(temperature=1.0)
  probs = exact_continuations(cfg, params, sampling)
  out = engine.generate(
    [[1, 5, 2]] * 30000, Method.chain(2, 'rejection'), max_new_tokens=3, sampling=sampling, seed=0
  )
  assert chi_square_pvalue(np.array(out.tokens), probs) > 1e-3


def test_eagle3_layout_round_trip(target, tmp_path):
  cfg, params = target
  hc, hp = make_head(target, vocab_step=3)
  eagle3.save(tmp_path / 'head', hc, hp, {'note': 'test'})
  c = json.loads((tmp_path / 'head' / 'config.json').read_text())
  assert c['architectures'] == ['LlamaForCausalLMEagle3']
  assert c['draft_vocab_size'] == len(hp['vocab_ids'])
  assert c['eagle_config']['eagle_aux_hidden_state_layer_ids'] == list(hc.capture)
  import safetensors.numpy

  tensors = safetensors.numpy.load_file(str(tmp_path / 'head' / 'model.safetensors'))
  d = cfg.d_model
  assert tensors['fc.weight'].shape == (d, len(hc.capture) * d)
  assert tensors['midlayer.self_attn.q_proj.weight'].shape == (cfg.n_heads * cfg.head_dim, 2 * d)
  assert tensors['lm_head.weight'].shape == (len(hp['vocab_ids']), d)
  # d2t is an offset: target id = draft id + d2t[draft id]; t2d marks the target ids kept.
  np.testing.assert_array_equal(np.arange(len(hp['vocab_ids'])) + tensors['d2t'], hp['vocab_ids'])
  assert tensors['t2d'].sum() == len(hp['vocab_ids']) and tensors['t2d'][hp['vocab_ids']].all()
  assert 'embed_tokens.weight' not in tensors  # the target's embedding is shared
  hc2, hp2, info = eagle3.load(tmp_path / 'head')
  assert hc2 == hc and info == {'note': 'test'}
  bf16 = lambda a: np.asarray(jnp.asarray(a, jnp.bfloat16), np.float32)
  jax.tree.map(lambda a, b: np.testing.assert_array_equal(bf16(a), b), hp, hp2)


def test_eagle_specs_are_checked(tmp_path):
  with pytest.raises(ValueError, match='no EAGLE-3 head'):
    registry.parse_draft(f'eagle:{tmp_path}')
  (tmp_path / 'config.json').write_text('{"draft_vocab_size": 4}')
  (tmp_path / 'model.safetensors').write_bytes(b'')
  with pytest.raises(ValueError, match='bad or missing field'):
    eagle3.load(tmp_path)
  with pytest.raises(ValueError, match='usage|eagle'):
    registry.parse_draft('eagle:a,b')


def test_a_head_for_a_llama3_target_keeps_its_rope_scaling(target, tmp_path):
  import dataclasses

  cfg, _ = target
  scaled = dataclasses.replace(cfg, rope_scaling=('llama3', 8.0, 1.0, 4.0, 32.0))
  hc = eagle_model.EagleConfig.for_target(scaled, 16)
  assert hc.rope_scaling == scaled.rope_scaling
  ids = np.arange(16)
  hp = eagle_model.init_params(hc, jax.random.key(1), ids)
  eagle3.save(tmp_path / 'head', hc, hp)
  c = json.loads((tmp_path / 'head' / 'config.json').read_text())
  assert c['rope_scaling'] == {
    'rope_type': 'llama3',
    'factor': 8.0,
    'low_freq_factor': 1.0,
    'high_freq_factor': 4.0,
    'original_max_position_embeddings': 32,
  }
  assert eagle3.load(tmp_path / 'head')[0] == hc
  # The scaling reaches the head's attention: far positions see other rotations.
  plain = dataclasses.replace(hc, rope_scaling=())
  feats = jax.random.normal(jax.random.key(2), (1, 40, len(hc.capture) * hc.d_model))
  outs = []
  for head_cfg in (hc, plain):
    cache = KVCache.init(head_cfg, 1, 64)
    fused = eagle_model.fuse(hp, feats)
    positions = jnp.arange(40)[None]
    out, _ = eagle_model.cached_step(
      hp,
      jnp.ones((64, hc.d_model)),
      fused,
      jnp.ones((1, 40), jnp.int32),
      positions,
      jnp.ones((1, 40), bool),
      cache,
      head_cfg,
    )
    outs.append(np.asarray(out))
  assert not np.allclose(outs[0], outs[1])
