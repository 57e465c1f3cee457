"""The speculative loop: greedy identity, exact acceptance counts, lossless sampling end to
end (chi-square, with a wrong verifier to show the test has power), and clear errors."""

import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy import stats

from specjax import registry, testing, verify
from specjax.core.sampling import SamplingConfig, probabilities
from specjax.decode.engine import Engine
from specjax.decode.method import Method
from specjax.drafters import ModelDrafter, truncated_target
from specjax.models import llama
from specjax.models.kv_cache import KVCache

PROMPTS = [[3, 1, 4, 1, 5], [9, 2, 6, 5, 3, 5, 8, 9, 7, 9, 3, 2, 3], [7], [2, 7, 1, 8, 2, 8, 1]]


@pytest.fixture(scope='module')
def target():
  return testing.tiny_model(seed=3, n_layers=3)


def engine_with(target, draft, **kwargs):
  cfg, params = target
  draft_cfg, draft_params = draft
  return Engine(
    params,
    cfg,
    eos_id=kwargs.pop('eos_id', -1),
    cache_size=kwargs.pop('cache', 128),
    drafter=ModelDrafter(draft_cfg),
    draft_params=draft_params,
    **kwargs,
  )


DRAFTS = {
  'random tiny model': lambda t: testing.tiny_model(
    seed=11, n_layers=1, d_model=16, n_heads=2, n_kv_heads=1
  ),
  'truncated target': lambda t: truncated_target(*t, 1),
  'target itself': lambda t: t,
}


@pytest.mark.parametrize('draft', list(DRAFTS))
@pytest.mark.parametrize('verifier', ['greedy', 'rejection', 'block'])
def test_speculative_greedy_equals_target_greedy(target, draft, verifier):
  engine = engine_with(target, DRAFTS[draft](target))
  reference = engine.generate(PROMPTS, max_new_tokens=24).tokens
  for gamma in (1, 2, 4, 8):
    batch = engine.generate(PROMPTS, Method.chain(gamma, verifier), max_new_tokens=24)
    assert batch.tokens == reference, (gamma, verifier)
    alone = engine.generate(PROMPTS[1:2], Method.chain(gamma, verifier), max_new_tokens=24)
    assert alone.tokens[0] == reference[1]


def test_a_perfect_draft_is_always_fully_accepted(target):
  engine = engine_with(target, target)
  for sampling in (SamplingConfig(), SamplingConfig(temperature=1.0)):
    for verifier in ('rejection', 'block'):
      out = engine.generate(
        PROMPTS, Method.chain(4, verifier), max_new_tokens=21, sampling=sampling
      )
      assert all(a == [4] * 4 for a in out.accepted), out.accepted  # 1 + 4 * 5 = 21 tokens
      assert out.steps == 4 and out.acceptance_rate == 1.0
      assert [len(t) for t in out.tokens] == [21] * 4


def test_acceptance_history_matches_the_output(target):
  engine = engine_with(target, DRAFTS['random tiny model'](target))
  out = engine.generate(PROMPTS, Method.chain(3), max_new_tokens=[10, 17, 5, 30])
  for tokens, accepted in zip(out.tokens, out.accepted):
    assert all(0 <= a <= 3 for a in accepted)
    # every iteration emits accepted + 1 tokens, the last one clamped by max_new
    assert sum(a + 1 for a in accepted[:-1]) < len(tokens) - 1 <= sum(a + 1 for a in accepted)
  assert out.steps == max(len(a) for a in out.accepted)


def test_per_row_eos_with_speculation(target):
  draft = DRAFTS['truncated target'](target)
  free = engine_with(target, draft).generate(PROMPTS, max_new_tokens=20).tokens
  eos = free[0][6]
  engine = engine_with(target, draft, eos_id=eos)
  expected = [row[: row.index(eos) + 1] if eos in row else row for row in free]
  for gamma in (2, 5):
    assert engine.generate(PROMPTS, Method.chain(gamma), max_new_tokens=20).tokens == expected


def test_rows_that_fill_their_cache_exactly(target):
  engine = engine_with(target, DRAFTS['random tiny model'](target), cache=32)
  prompts = [[1] * 20, [2] * 3]
  reference = engine.generate(
    prompts, max_new_tokens=[12, 29]
  ).tokens  # 20 + 12 = 3 + 29 = 32 slots
  assert engine.generate(prompts, Method.chain(8), max_new_tokens=[12, 29]).tokens == reference


# ---------------------------------------------------------------------------------------------
# Sampling is lossless end to end.

VOCAB, PROMPT, N = 8, [1, 5, 2], 30000


@pytest.fixture(scope='module')
def small_vocab():
  target = testing.tiny_model(seed=21, vocab_size=VOCAB, n_layers=2, scale=0.3)
  draft = testing.tiny_model(seed=22, vocab_size=VOCAB, n_layers=1, scale=0.3)
  return target, draft


def exact_continuations(cfg, params, sampling):
  """P(z1 z2 z3 | PROMPT) under the warped target, by enumeration."""
  seqs = np.array(list(itertools.product(range(VOCAB), repeat=3)))
  tokens = jnp.asarray(np.concatenate([np.tile(PROMPT, (len(seqs), 1)), seqs], 1))
  logits, _ = llama.forward(params, tokens, KVCache.init(cfg, len(seqs), 8), cfg)[:2]
  probs = np.asarray(probabilities(logits, sampling), np.float64)  # [512, 6, V]
  n = len(PROMPT)
  steps = [probs[np.arange(len(seqs)), n - 1 + j, seqs[:, j]] for j in range(3)]
  return np.prod(steps, axis=0)


def chi_square_pvalue(samples, probs):
  counts = np.bincount(samples[:, 0] * 64 + samples[:, 1] * 8 + samples[:, 2], minlength=512)
  assert counts[probs == 0].sum() == 0, 'sampled a continuation the warped target excludes'
  expected = probs / probs.sum() * len(samples)
  big = expected >= 5  # pool the rare continuations into one cell
  obs, exp = counts[big], expected[big]
  if expected[~big].sum() > 0:
    obs, exp = np.append(obs, counts[~big].sum()), np.append(exp, expected[~big].sum())
  return stats.chisquare(obs, exp * obs.sum() / exp.sum()).pvalue


def sample_continuations(small_vocab, sampling, gamma, verifier, seed=0):
  target, draft = small_vocab
  engine = engine_with(target, draft, cache=16)
  out = engine.generate(
    [PROMPT] * N, Method.chain(gamma, verifier), max_new_tokens=3, sampling=sampling, seed=seed
  )
  return np.array(out.tokens)


SAMPLINGS = [SamplingConfig(temperature=1.0), SamplingConfig(temperature=0.7, top_k=5, top_p=0.9)]


@pytest.mark.parametrize('sampling', SAMPLINGS, ids=['t1', 't0.7-k5-p0.9'])
@pytest.mark.parametrize(
  'gamma,verifier', [(0, 'rejection'), (2, 'rejection'), (1, 'block'), (3, 'block')]
)
def test_speculative_sampling_matches_the_target(small_vocab, sampling, gamma, verifier):
  probs = exact_continuations(*small_vocab[0], sampling)
  samples = sample_continuations(small_vocab, sampling, gamma, verifier)
  assert chi_square_pvalue(samples, probs) > 1e-3


def always_accept(p, q, draft, key):
  """A deliberately wrong verifier: keeps every draft token."""
  accepted = jnp.full(draft.shape[:1], draft.shape[1], jnp.int32)
  return accepted, jax.random.categorical(key, jnp.log(p[:, -1]), axis=-1).astype(jnp.int32)


def test_the_chi_square_test_catches_a_wrong_verifier(small_vocab, monkeypatch):
  monkeypatch.setitem(
    registry.VERIFIERS.table, 'always', verify.Verifier('always', always_accept, None)
  )
  sampling = SamplingConfig(temperature=1.0)
  probs = exact_continuations(*small_vocab[0], sampling)
  samples = sample_continuations(small_vocab, sampling, 2, 'always')
  assert chi_square_pvalue(samples, probs) < 1e-3


def nan_draft(draft):
  """The draft with its final norm's weights NaN: every q it hands over is NaN (a
  diverged head)."""
  cfg, params = draft
  return cfg, {**params, 'final_norm': jnp.full_like(params['final_norm'], jnp.nan)}


@pytest.mark.parametrize('verifier', ['rejection', 'block'])
def test_a_nan_draft_leaves_sampling_exactly_the_targets(small_vocab, verifier):
  target, draft = small_vocab
  sampling = SamplingConfig(temperature=1.0)
  engine = engine_with(target, nan_draft(draft), cache=16)
  out = engine.generate(
    [PROMPT] * N, Method.chain(2, verifier), max_new_tokens=3, sampling=sampling, seed=1
  )
  assert sum(map(sum, out.accepted)) == 0 and min(out.untrusted) >= 1
  probs = exact_continuations(*target, sampling)
  assert chi_square_pvalue(np.array(out.tokens), probs) > 1e-3


@pytest.mark.parametrize('sampling', SAMPLINGS, ids=['t1', 't0.7-k5-p0.9'])
def test_an_honest_draft_is_never_untrusted(target, sampling):
  engine = engine_with(target, truncated_target(*target, 1))
  out = engine.generate(
    PROMPTS * 8, Method.chain(3, 'rejection'), max_new_tokens=24, sampling=sampling
  )
  assert out.untrusted == [0] * len(PROMPTS) * 8 and sum(map(sum, out.accepted)) > 0


# ---------------------------------------------------------------------------------------------
# Bad input.


def test_vocabulary_mismatch_is_refused(target):
  other = testing.tiny_model(seed=1, vocab_size=96)
  with pytest.raises(ValueError, match='vocabulary of 96 tokens but the target .* has 64'):
    engine_with(target, other)


@pytest.mark.parametrize(
  'kwargs,match',
  [
    ({'gamma': -1}, 'gamma must be an integer >= 0'),
    ({'gamma': 200}, 'gamma=200 is too large for cache_size 128'),
    ({'gamma': 2, 'verifier': 'nope'}, "unknown verifier 'nope'"),
    (
      {'gamma': 2, 'verifier': 'greedy', 'sampling': SamplingConfig(temperature=1.0)},
      'greedy verifier is only lossless for greedy decoding',
    ),
  ],
)
def test_bad_speculative_settings_are_named(target, kwargs, match):
  engine = engine_with(target, target)
  sampling = kwargs.get('sampling', SamplingConfig())
  with pytest.raises(ValueError, match=match):
    method = Method.chain(kwargs['gamma'], kwargs.get('verifier', 'rejection'))
    engine.generate(PROMPTS, method, max_new_tokens=8, sampling=sampling)


def test_speculation_without_a_drafter_is_refused(target):
  engine = Engine(target[1], target[0], eos_id=-1, cache_size=64)
  with pytest.raises(ValueError, match='gamma=2 needs a drafter'):
    engine.generate(PROMPTS, Method.chain(2), max_new_tokens=8)


def test_truncated_draft_layer_count_is_checked(target):
  with pytest.raises(ValueError, match='1 <= layers < 3'):
    truncated_target(*target, 3)


# ---------------------------------------------------------------------------------------------
# Prompt lookup.


def ngram_engine(target, **kwargs):
  from specjax.drafters import NgramDrafter

  cfg, params = target
  return Engine(
    params, cfg, eos_id=-1, cache_size=128, drafter=NgramDrafter(cfg.vocab_size, **kwargs)
  )


def test_ngram_lookup_finds_the_most_recent_longest_match():
  from specjax.drafters.ngram import last_match

  ctx = jnp.array([[5, 6, 7, 1, 5, 6, 9, 2, 5, 6, -1, -1]])
  length = jnp.array([10])
  assert int(last_match(ctx, length, 2)[0]) == 5  # '5 6' ended at 5 most recently
  assert int(last_match(ctx, length, 3)[0]) == -1  # '2 5 6' never occurred before
  assert int(last_match(ctx, length, 1)[0]) == 5  # the last earlier '6'


def test_ngram_lookup_equals_a_brute_force_search():
  from specjax.drafters.ngram import lookup

  def reference(row, length, n_min, n_max):  # longest n first, then the most recent end
    for n in range(n_max, n_min - 1, -1):
      if length < n:
        continue
      tail = row[length - n : length]
      for end in range(length - 2, n - 2, -1):
        if row[end - n + 1 : end + 1] == tail:
          return end
    return -1

  rng = np.random.default_rng(0)
  for n_min, n_max in ((1, 1), (1, 3), (2, 5), (4, 10)):
    ctx = rng.integers(0, 3, (16, 40))
    lengths = rng.integers(0, 41, 16)
    ctx = np.where(np.arange(40)[None] < lengths[:, None], ctx, -1)
    got = np.asarray(lookup(jnp.asarray(ctx), jnp.asarray(lengths), n_min, n_max))
    want = [reference(list(r), int(n), n_min, n_max) for r, n in zip(ctx, lengths)]
    assert got.tolist() == want, (n_min, n_max)


def test_ngram_drafter_proposes_the_continuation(target):
  engine = ngram_engine(target)
  cfg, params = target
  prompt = [10, 11, 12, 13, 14, 15, 16, 17, 10, 11]
  from specjax.decode.prefill import prefill

  method = Method.chain(4)
  state = prefill(
    {'target': params, 'draft': None},
    jnp.asarray([prompt]),
    jnp.array([10]),
    jnp.array([8]),
    jax.random.key(0),
    cfg=cfg,
    method=method,
    drafter=engine.drafter,
    sampling=SamplingConfig(),
    eos_id=-1,
    cache_size=32,
    out_len=16,
  )
  first = int(state.tokens[0, 0])
  tokens, q, ds = engine.drafter.propose(None, state.spec.draft, state, None, 4, SamplingConfig())
  if first == 12:  # '11 12' seen before: propose what followed it
    assert tokens[0].tolist() == [13, 14, 15, 16]
  assert bool(ds.found[0]) == (first in prompt)
  assert q is None  # deterministic: the loop builds one-hot q when it verifies


@pytest.mark.parametrize('verifier', ['greedy', 'rejection', 'block'])
def test_ngram_greedy_equals_target_greedy(target, verifier):
  engine = ngram_engine(target)
  repetitive = [PROMPTS[0] * 4, PROMPTS[1] * 2, [7, 7, 7, 7], PROMPTS[3] * 3]
  reference = engine.generate(repetitive, max_new_tokens=30).tokens
  for gamma in (1, 3, 8):
    out = engine.generate(repetitive, Method.chain(gamma, verifier), max_new_tokens=30)
    assert out.tokens == reference
    assert all(len(d) == len(a) for d, a in zip(out.drafted, out.accepted))
    assert all(x in (0, gamma) for d in out.drafted for x in d)


def test_ngram_on_a_looping_target_accepts_everything():
  # The successor model counts 4, 5, ..., 63, 0, 1, ...: nothing to look up until the count
  # wraps around and repeats the prompt, then every proposal is right.
  from specjax.drafters import NgramDrafter

  cfg, params = testing.successor_model(64)
  engine = Engine(params, cfg, eos_id=-1, cache_size=256, drafter=NgramDrafter(64))
  out = engine.generate([[1, 2, 3]], Method.chain(4, 'greedy'), max_new_tokens=150)
  assert out.tokens[0] == [(4 + i) % 64 for i in range(150)]
  drafted, accepted = out.drafted[0], out.accepted[0]
  first = drafted.index(4)  # the first iteration that found a match
  assert drafted[:first] == [0] * first and accepted[:first] == [0] * first  # plain steps
  assert first == 61  # when the last token is 1 (emitted at index 61): it is in the prompt
  assert accepted[first:-1] == [4] * (len(accepted) - first - 1)
  assert out.acceptance_rate > 0.95


def test_ngram_sampling_is_lossless(small_vocab):
  from specjax.drafters import NgramDrafter

  (cfg, params), _ = small_vocab
  engine = Engine(params, cfg, eos_id=-1, cache_size=16, drafter=NgramDrafter(VOCAB, n_max=2))
  sampling = SamplingConfig(temperature=1.0)
  probs = exact_continuations(cfg, params, sampling)
  out = engine.generate(
    [PROMPT] * N, Method.chain(2, 'rejection'), max_new_tokens=3, sampling=sampling, seed=4
  )
  assert chi_square_pvalue(np.array(out.tokens), probs) > 1e-3


# ---------------------------------------------------------------------------------------------
# Self-speculative layer skipping.


def test_layer_skipping_draft_shares_the_targets_weights(target):
  cfg, params = target
  drafter = ModelDrafter(cfg, layers=(0, 2))
  engine = Engine(params, cfg, eos_id=-1, cache_size=128, drafter=drafter, draft_params=params)
  reference = engine.generate(PROMPTS, max_new_tokens=24).tokens
  for gamma, verifier in ((2, 'greedy'), (4, 'block')):
    out = engine.generate(PROMPTS, Method.chain(gamma, verifier), max_new_tokens=24)
    assert out.tokens == reference
  all_layers = ModelDrafter(cfg, layers=(0, 1, 2))  # every layer: a perfect draft
  engine = Engine(params, cfg, eos_id=-1, cache_size=128, drafter=all_layers, draft_params=params)
  out = engine.generate(PROMPTS, Method.chain(4), max_new_tokens=21)
  assert all(a == [4] * 4 for a in out.accepted)


@pytest.mark.parametrize(
  'text,match',
  [
    ('5-2', 'distinct layers'),
    ('0-3,2', 'distinct layers'),
    ('a-b', 'ranges like'),
    ('0-40', r'in \[0, 30\)'),
  ],
)
def test_layer_lists_are_checked(text, match):
  from specjax.drafters.model import parse_layers

  with pytest.raises(ValueError, match=match):
    parse_layers(text, 30)


# bfloat16: parameters and activations in bfloat16, logits, attention softmax and the
# verification probabilities in float32 (README "Precision").


def bf16(model):
  cfg, params = model
  return cfg, jax.tree.map(lambda x: jnp.asarray(x, jnp.bfloat16), params)


def test_bfloat16_logits_and_attention_scores_accumulate_in_float32(target):
  cfg, params = target
  cfg, p16 = bf16(target)
  tokens = jnp.asarray(PROMPTS[1])[None]
  full, cache = llama.forward(p16, tokens, KVCache.init(cfg, 1, 16, jnp.bfloat16), cfg)[:2]
  assert full.dtype == jnp.float32 and cache.k[0].dtype == jnp.bfloat16
  # Not rounded to bfloat16 on the way out: most logits are not bfloat16 numbers.
  as16 = np.asarray(jnp.asarray(full, jnp.bfloat16), np.float32)
  assert np.mean(np.asarray(full) != as16) > 0.9
  ref, _ = llama.forward(params, tokens, KVCache.init(cfg, 1, 16), cfg)[:2]
  np.testing.assert_allclose(full, ref, atol=0.05 * float(jnp.abs(ref).max()))


@pytest.mark.parametrize('draft', ['truncated target', 'prompt lookup'])
def test_bfloat16_speculative_greedy_equals_target_greedy_up_to_near_ties(target, draft):
  from specjax.bench import metrics
  from specjax.drafters.ngram import NgramDrafter

  cfg, p16 = bf16(target)
  if draft == 'prompt lookup':
    engine = Engine(p16, cfg, eos_id=-1, cache_size=128, drafter=NgramDrafter(cfg.vocab_size))
  else:
    engine = engine_with((cfg, p16), truncated_target(cfg, p16, 1))
  plain = engine.generate(PROMPTS, max_new_tokens=40)
  spec = engine.generate(PROMPTS, Method.chain(4, 'greedy'), max_new_tokens=40)
  assert sum(spec.accepted[0]) > 0  # it drafted and verified
  records = lambda out: [{'tokens': t} for t in out.tokens]
  mismatches = sum(a != b for a, b in zip(plain.tokens, spec.tokens))
  ties = metrics.count_near_ties(engine, PROMPTS, records(spec), records(plain))
  assert mismatches == ties  # XLA:CPU: 0 (its verify and step forwards agree bit for bit)


def test_bfloat16_near_ties_are_relative_to_the_logits():
  from specjax.bench import metrics

  assert metrics.near_tie((9.95, 10.0), jnp.bfloat16)  # 0.05 < 10 / 64
  assert not metrics.near_tie((9.5, 10.0), jnp.bfloat16)
  assert not metrics.near_tie((9.95, 10.0), jnp.float32)
  assert metrics.near_tie((10.0 - 5e-5, 10.0), jnp.float32)


def test_bfloat16_speculative_sampling_matches_the_bfloat16_target(small_vocab):
  target, draft = bf16(small_vocab[0]), bf16(small_vocab[1])
  sampling = SamplingConfig(temperature=1.0)
  probs = exact_continuations(*target, sampling)
  samples = sample_continuations((target, draft), sampling, 2, 'rejection')
  assert chi_square_pvalue(samples, probs) > 1e-3
