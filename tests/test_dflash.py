"""DFlash-style block drafters: the block forward against a plain attention over the
concatenated context and block, the drafter in the loop proposes what a from-scratch
forward computes, greedy identity and lossless sampling end to end, the checkpoint
layout round trip, and clear errors for bad specs."""

import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from specjax import registry, testing
from specjax.checkpoints import dflash as dflash_ckpt
from specjax.checkpoints import loader
from specjax.control.adaptive import AdaptiveConfig
from specjax.core.sampling import SamplingConfig
from specjax.decode import loop
from specjax.decode.engine import Engine
from specjax.decode.method import Method
from specjax.decode.prefill import prefill
from specjax.drafters.dflash import DFlashDrafter, RandomSettings, committed_length
from specjax.models import dflash as dflash_model
from specjax.models import llama
from specjax.models.kv_cache import KVCache

PROMPTS = [[3, 1, 4, 1, 5], [9, 2, 6, 5, 3, 5, 8, 9, 7, 9, 3, 2, 3], [7], [2, 7, 1, 8, 2, 8, 1]]


@pytest.fixture(scope='module')
def target():
  return testing.tiny_model(seed=3, n_layers=3)


def make_drafter(target, block=4, vocab_ids=None, seed=0, layers=1):
  """(cfg, params) of a random block drafter for `target` (its head the target's rows)."""
  cfg, params = target
  ids = np.arange(cfg.vocab_size) if vocab_ids is None else np.asarray(vocab_ids)
  dc = dflash_model.DFlashConfig.for_target(cfg, len(ids), n_layers=layers, block_size=block)
  dp = dflash_model.init_params(dc, jax.random.key(seed), ids, params)
  return dc, dp


def features_of(target, tokens, capture):
  cfg, params = target
  tokens = jnp.asarray(tokens)
  cache = KVCache.init(cfg, tokens.shape[0], tokens.shape[1])
  return llama.forward(params, tokens, cache, cfg, capture=capture).features


def naive_block_logits(dp, embed, feats, anchor, dc):
  """One row's block by the definition: each layer's queries over the keys and values of
  [context (from the fused features); block] with no mask at all (numpy, float64)."""
  f64 = lambda a: np.asarray(a, np.float64)
  rms = lambda x, w: x / np.sqrt(np.mean(x * x, -1, keepdims=True) + dc.norm_eps) * f64(w)
  n, g, h, t = dc.n_heads, dc.n_kv_heads, dc.head_dim, dc.block_size
  ctx = rms(f64(feats) @ f64(dp['fc']), dp['hidden_norm'])  # [L, D]
  length = ctx.shape[0]
  inv = 1.0 / dc.rope_base ** (np.arange(0, h, 2) / h)

  def rope(x, start):  # x[T, heads, H] at positions start, start + 1, ...
    ang = (start + np.arange(x.shape[0]))[:, None, None] * inv
    x1, x2 = np.split(x, 2, axis=-1)
    return np.concatenate(
      [x1 * np.cos(ang) - x2 * np.sin(ang), x2 * np.cos(ang) + x1 * np.sin(ang)], -1
    )

  x = np.concatenate([f64(embed)[int(anchor)][None], np.tile(f64(dp['mask']), (t - 1, 1))])
  for lp in dp['layers']:
    lp = {k: f64(v) for k, v in lp.items()}
    y = rms(x, lp['attn_norm'])
    both = np.concatenate([ctx, y])  # keys and values: context, then the block
    q = rope(rms((y @ lp['wq']).reshape(t, n, h), lp['q_norm']), length)
    k = rope(rms((both @ lp['wk']).reshape(-1, g, h), lp['k_norm']), 0)
    v = (both @ lp['wv']).reshape(-1, g, h)
    k, v = np.repeat(k, n // g, axis=1), np.repeat(v, n // g, axis=1)
    s = np.einsum('tnh,snh->nts', q, k) / np.sqrt(h)
    p = np.exp(s - s.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    x = x + np.einsum('nts,snh->tnh', p, v).reshape(t, n * h) @ lp['wo']
    y = rms(x, lp['mlp_norm'])
    gate = y @ lp['w_gate']
    x = x + (gate / (1 + np.exp(-gate)) * (y @ lp['w_up'])) @ lp['w_down']
  return rms(x[1:], dp['norm']) @ f64(dp['head'])


def test_the_block_forward_is_bidirectional_attention_over_context_and_block(target):
  cfg, params = target
  dc, dp = make_drafter(target, block=5, layers=2)
  rows = [PROMPTS[1], PROMPTS[3] + [0] * 6]
  lens = np.array([len(PROMPTS[1]) - 1, len(PROMPTS[3]) - 1])  # the last token: the anchor
  feats = features_of(target, rows, dc.capture)
  anchors = jnp.asarray([r[n] for r, n in zip(rows, lens)])
  got = dflash_model.forward(dp, params['embed'], feats, jnp.asarray(lens), anchors, dc)
  assert got.shape == (2, 4, cfg.vocab_size)
  for row in range(2):
    want = naive_block_logits(dp, params['embed'], feats[row, : lens[row]], anchors[row], dc)
    np.testing.assert_allclose(got[row], want, rtol=2e-4, atol=2e-4)


def reference_logits(target, dc, dp, context):
  """The block after `context` (its last token the anchor), from scratch on true features."""
  _, params = target
  padded = jnp.asarray([context + [0] * (64 - len(context))])  # causal: padding changes nothing
  feats = features_of(target, padded, dc.capture)
  n = jnp.asarray([len(context) - 1])
  return dflash_model.forward(dp, params['embed'], feats, n, jnp.asarray(context[-1:]), dc)[0]


@pytest.mark.parametrize('adaptive', [False, True], ids=['fixed', 'adaptive'])
def test_the_drafter_in_the_loop_proposes_what_a_fresh_forward_does(adaptive):
  """The ring of features, update (absorb, trim), the catch-up, after iterations that kept
  different numbers of draft tokens (and plain steps under adaptive control): the greedy
  draft and the T = 1 distributions of every position. A small vocabulary makes a random
  drafter right often enough."""
  target = testing.tiny_model(seed=21, vocab_size=8, n_layers=3, scale=0.3)
  cfg, params = target
  dc, dp = make_drafter(target, block=4, seed=1)
  drafter, gamma = DFlashDrafter(dc), 3
  if adaptive:
    drafter = registry.resync(drafter, 8)
    adaptive_cfg = AdaptiveConfig(
      gammas=(1, gamma), draft_cost=(0.4, 1.2), verify_cost=(1.1, 1.3), probe_every=3
    )
    method = Method.adaptive(adaptive_cfg, 'greedy')
  else:
    method = Method.chain(gamma, 'greedy')
  greedy, t1 = SamplingConfig(temperature=0.0), SamplingConfig(temperature=1.0)
  all_params = {'target': params, 'draft': {'block': dp, 'embed': params['embed']}}
  prompts = [[t % 8 for t in PROMPTS[1]], [t % 8 for t in PROMPTS[3]] + [0] * 6]
  lens = jnp.asarray([len(PROMPTS[1]), len(PROMPTS[3])])
  kw = dict(cfg=cfg, method=method, drafter=drafter, sampling=greedy, eos_id=-1)
  state = prefill(
    all_params,
    jnp.asarray(prompts),
    lens,
    jnp.asarray([40, 40]),
    jax.random.key(0),
    cache_size=64,
    out_len=48,
    **kw,
  )
  step = jax.jit(lambda s: loop.step(all_params, s, **kw))
  propose = jax.jit(drafter.propose, static_argnums=(4, 5))
  kept, drafted, lags = set(), set(), set()
  for i in range(12):
    ds = state.spec.draft
    lags |= set(np.asarray(committed_length(state) - ds.cache.lengths).tolist())
    draft, _, _ = propose(all_params['draft'], ds, state, jax.random.key(1), gamma, greedy)
    _, q, _ = propose(all_params['draft'], ds, state, jax.random.key(1), gamma, t1)
    for row in range(2):
      n = int(state.num_generated[row])
      context = prompts[row][: int(lens[row])] + list(np.asarray(state.tokens[row, :n]))
      want = reference_logits(target, dc, dp, context)[:gamma]
      assert list(np.asarray(draft[row])) == list(np.asarray(jnp.argmax(want, -1))), (i, row)
      np.testing.assert_allclose(q[row], jax.nn.softmax(want, -1), rtol=1e-4, atol=1e-6)
    state = step(state)
    kept |= set(np.asarray(state.spec.accepted[:, i]).tolist())
    drafted |= set(np.asarray(state.spec.drafted[:, i]).tolist())
  if adaptive:
    assert 0 in drafted and len(drafted) > 1, drafted  # plain steps and verifications
    assert max(lags) > dc.block_size, lags  # streaks of plain steps: the wide catch-up
  else:
    assert len(kept) > 1, kept  # iterations kept different numbers of draft tokens
    assert max(lags) <= gamma + 1, lags


@pytest.mark.parametrize('verifier', ['greedy', 'rejection', 'block'])
def test_dflash_greedy_equals_target_greedy(target, verifier):
  cfg, params = target
  dc, dp = make_drafter(target, block=4)
  engine = Engine(
    params,
    cfg,
    eos_id=-1,
    cache_size=128,
    drafter=DFlashDrafter(dc),
    draft_params={'block': dp, 'embed': params['embed']},
  )
  reference = engine.generate(PROMPTS, max_new_tokens=24).tokens
  for gamma in (1, 3):
    assert (
      engine.generate(PROMPTS, Method.chain(gamma, verifier), max_new_tokens=24).tokens == reference
    )
  adaptive = AdaptiveConfig(gammas=(1, 3))
  assert (
    engine.generate(PROMPTS, Method.adaptive(adaptive, verifier), max_new_tokens=24).tokens
    == reference
  )


def test_gamma_beyond_the_block_is_refused(target):
  cfg, params = target
  dc, dp = make_drafter(target, block=4)
  engine = Engine(
    params,
    cfg,
    eos_id=-1,
    cache_size=64,
    drafter=DFlashDrafter(dc),
    draft_params={'block': dp, 'embed': params['embed']},
  )
  with pytest.raises(ValueError, match='at most 3 tokens'):
    engine.generate(PROMPTS[:1], Method.chain(4), max_new_tokens=8)


@pytest.mark.parametrize('verifier', ['rejection', 'block'])
def test_dflash_sampling_is_lossless(verifier):
  """Chi-square of 3-token continuations against the exact target distribution at T = 1,
  with a drafter whose vocabulary leaves out two of the eight tokens (q = 0 there) and
  whose positions are drawn independently from one block forward."""
  from tests.test_speculative import chi_square_pvalue, exact_continuations

  target = testing.tiny_model(seed=21, vocab_size=8, n_layers=2, scale=0.3)
  cfg, params = target
  dc, dp = make_drafter(target, block=4, vocab_ids=[0, 1, 2, 4, 5, 7], seed=5)
  engine = Engine(
    params,
    cfg,
    eos_id=-1,
    cache_size=16,
    drafter=DFlashDrafter(dc),
    draft_params={'block': dp, 'embed': params['embed']},
  )
  sampling = SamplingConfig(temperature=1.0)
  probs = exact_continuations(cfg, params, sampling)
  out = engine.generate(
    [[1, 5, 2]] * 30000, Method.chain(3, verifier), max_new_tokens=3, sampling=sampling, seed=0
  )
  assert chi_square_pvalue(np.array(out.tokens), probs) > 1e-3


def test_dflash_layout_round_trip(target, tmp_path):
  cfg, params = target
  dc, dp = make_drafter(target, block=6, vocab_ids=np.arange(0, cfg.vocab_size, 3), layers=2)
  dflash_ckpt.save(tmp_path / 'd', dc, dp, {'note': 'test'})
  c = json.loads((tmp_path / 'd' / 'config.json').read_text())
  assert c['architectures'] == ['DFlashDraftModel'] and c['num_hidden_layers'] == 2
  assert c['dflash_config']['block_size'] == 6
  # DFlash names the layer whose output it reads: the stream entering the next one.
  assert c['dflash_config']['target_layer_ids'] == [i - 1 for i in dc.capture]
  import safetensors.numpy

  tensors = safetensors.numpy.load_file(str(tmp_path / 'd' / 'model.safetensors'))
  d, h = cfg.d_model, cfg.head_dim
  assert tensors['fc.weight'].shape == (d, len(dc.capture) * d)
  assert tensors['layers.1.self_attn.q_proj.weight'].shape == (cfg.n_heads * h, d)
  assert tensors['layers.0.self_attn.k_norm.weight'].shape == (h,)
  assert tensors['lm_head.weight'].shape == (len(dp['vocab_ids']), d)
  np.testing.assert_array_equal(np.arange(len(dp['vocab_ids'])) + tensors['d2t'], dp['vocab_ids'])
  assert 'embed_tokens.weight' not in tensors  # the target's embedding is shared
  dc2, dp2, info = dflash_ckpt.load(tmp_path / 'd')
  assert dc2 == dc and info == {'note': 'test'}
  bf16 = lambda a: np.asarray(jnp.asarray(a, jnp.bfloat16), np.float32)
  jax.tree.map(lambda a, b: np.testing.assert_array_equal(bf16(a), b), dp, dp2)
  # ... and the registry builds it for the target it was made for, and no other.
  drafter, draft_params = registry.build_draft(
    f'dflash:{tmp_path / "d"}', loader.LoadedModel(cfg, params, None, 'tiny')
  )
  assert drafter.cfg == dc and draft_params['block']['head'].shape == (d, len(dp['vocab_ids']))
  other = testing.tiny_model(seed=1, n_layers=3, d_model=16, head_dim=4)
  with pytest.raises(ValueError, match='width 32.*has 64 and 16'):
    registry.build_draft(f'dflash:{tmp_path / "d"}', loader.LoadedModel(*other, None, 'other'))


def test_dflash_specs_are_checked(tmp_path):
  kind, settings = registry.parse_draft('dflash:random,block=8,layers=2')
  assert settings == RandomSettings(block=8, layers=2) and kind is registry.DRAFTS.get('dflash')
  bad = {
    f'dflash:{tmp_path}': 'no DFlash drafter at',
    'dflash:a,b': 'expected dflash',
    'dflash:random,blk=4': "unknown option 'blk'",
    'dflash:random,block=x': 'expected dflash',
    'dflash:random,block=1': 'block >= 2',
    f'dflash:{tmp_path},block=4': 'expected dflash',
  }
  for spec, message in bad.items():
    with pytest.raises(ValueError, match=message):
      registry.parse_draft(spec)
  (tmp_path / 'config.json').write_text('{"dflash_config": {}}')
  (tmp_path / 'model.safetensors').write_bytes(b'')
  with pytest.raises(ValueError, match='bad or missing field'):
    dflash_ckpt.load(tmp_path)


def test_an_untrained_default_runs_through_the_registry(target):
  cfg, params = target
  drafter, draft_params = registry.build_draft(
    'dflash:random,block=3', loader.LoadedModel(cfg, params, None, 'tiny')
  )
  assert 'untrained' in drafter.name and drafter.capture == drafter.cfg.capture
  engine = Engine(params, cfg, eos_id=-1, cache_size=64, drafter=drafter, draft_params=draft_params)
  reference = engine.generate(PROMPTS[:2], max_new_tokens=12).tokens
  assert engine.generate(PROMPTS[:2], Method.chain(2), max_new_tokens=12).tokens == reference
