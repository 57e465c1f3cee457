"""Consensus drafts across parallel samples: proposals come from the other paths, greedy
identity, lossless sampling end to end (chi-square), and clear errors."""

import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy import stats

from specjax import registry, testing, verify
from specjax.checkpoints import loader
from specjax.core.sampling import SamplingConfig, probabilities
from specjax.decode.engine import Engine
from specjax.decode.method import Method
from specjax.decode.prefill import prefill
from specjax.drafters.consensus import ConsensusDrafter, group_candidates, heaviest_path
from specjax.models import llama
from specjax.models.kv_cache import KVCache


@pytest.fixture(scope='module')
def target():
  return testing.tiny_model(seed=3, n_layers=3)


def consensus_engine(target, group, cache=128, **kwargs):
  cfg, params = target
  return Engine(
    params,
    cfg,
    eos_id=-1,
    cache_size=cache,
    drafter=ConsensusDrafter(cfg.vocab_size, group=group, **kwargs),
  )


def test_matches_come_from_the_other_rows_of_the_group():
  # Two groups of two rows, prompt length 2 each. Row 0 ends with '7 8'; row 1 wrote
  # '5 7 8 9 4' earlier: its continuation after '7 8' is '9 4'. Rows 2-3 (another group)
  # hold the same text but must not be used by rows 0-1.
  ctx = jnp.array(
    [
      [1, 2, 3, 7, 8, -1, -1, -1],
      [1, 2, 5, 7, 8, 9, 4, -1],
      [1, 2, 5, 7, 8, 6, 6, -1],
      [1, 2, 0, 0, 0, -1, -1, -1],
    ]
  )
  length = jnp.array([5, 7, 7, 5])
  prompt_lens = jnp.full((4,), 2)
  end, mism = group_candidates(ctx, length, prompt_lens, 2, k=2, max_mismatches=0, gamma=3)
  assert end.tolist()[0] == [-1, 4]  # never itself; '7 8' ends at 4 in row 1
  assert end.tolist()[1] == [-1, -1]  # row 1's '8 9 4' suffix '9 4' is nowhere in row 0
  assert end.tolist()[3] == [-1, -1]  # '0 0' is nowhere in row 2
  drafter = ConsensusDrafter(10, group=2, k=2, max_mismatches=0, n_max=0)
  cand, valid, weight = drafter.candidates(ctx, length, prompt_lens, 3)
  tokens, supported = heaviest_path(cand, valid, weight)
  assert tokens[0, :2].tolist() == [9, 4] and supported[0].tolist() == [True, True, False]
  assert not bool(supported[3, 0])


def test_a_match_may_differ_in_up_to_m_tokens():
  ctx = jnp.array([[1, 2, 3, 4, 5, -1, -1, -1, -1], [1, 2, 3, 9, 5, 6, 7, 8, -1]])
  length, prompt_lens = jnp.array([5, 8]), jnp.array([2, 2])
  exact, _ = group_candidates(ctx, length, prompt_lens, 2, k=3, max_mismatches=0, gamma=2)
  loose, mism = group_candidates(ctx, length, prompt_lens, 2, k=3, max_mismatches=1, gamma=2)
  assert int(exact[0, 1]) == -1
  assert int(loose[0, 1]) == 4 and int(mism[0, 1]) == 1  # '3 9 5' ~ '3 4 5', then '6 7'


def test_the_draft_is_the_best_supported_path():
  # Four candidates: 'a b c' twice, 'a d e' once with more weight than each 'a b c'
  # alone, 'f g h' once: the trie's heaviest edge from the root is 'a' (4 votes in all),
  # then 'b' (2 x 1.0) beats 'd' (1.5).
  cand = jnp.array([[[1, 2, 3], [1, 2, 3], [1, 4, 5], [6, 7, 8]]])
  valid = jnp.ones(cand.shape, bool).at[0, 1, 2].set(False)
  weight = jnp.array([[1.0, 1.0, 1.5, 1.2]])
  tokens, supported = heaviest_path(cand, valid, weight)
  assert tokens[0].tolist() == [1, 2, 3] and supported[0].tolist() == [True, True, True]
  weight = jnp.array([[1.0, 0.0, 1.5, 1.2]])  # one 'a b c' path is gone: 'a d e' wins
  assert heaviest_path(cand, valid, weight)[0][0].tolist() == [1, 4, 5]


def test_the_own_context_lookup_is_the_fallback():
  ctx = jnp.array([[1, 2, 3, 4, 1, 2, -1, -1], [1, 2, 7, -1, -1, -1, -1, -1]])
  length, prompt_lens = jnp.array([6, 3]), jnp.array([2, 2])
  drafter = ConsensusDrafter(10, group=2, k=4, n_max=2)
  cand, valid, weight = drafter.candidates(ctx, length, prompt_lens, 3)
  tokens, supported = heaviest_path(cand, valid, weight)
  assert tokens[0].tolist() == [3, 4, 1] and bool(supported[0, 0])  # own '1 2' -> '3 4 1'


def test_proposals_inside_the_loop_come_from_the_other_path(target):
  # Two paths of one prompt after the prefill; then row 1 is made to be ahead of row 0 on
  # the same text: row 0's draft is what row 1 wrote next.
  cfg, params = target
  drafter = ConsensusDrafter(cfg.vocab_size, group=2, k=1, max_mismatches=0, n_max=0)
  method = Method.chain(3)
  prompts = jnp.array([[5, 6, 7, 8], [5, 6, 7, 8]])
  state = prefill(
    {'target': params, 'draft': None},
    prompts,
    jnp.array([4, 4]),
    jnp.array([20, 20]),
    jax.random.key(0),
    cfg=cfg,
    method=method,
    drafter=drafter,
    sampling=SamplingConfig(),
    eos_id=-1,
    cache_size=32,
    out_len=32,
  )
  x = int(state.tokens[0, 0])
  tokens = (
    state.tokens.at[0, :2].set(jnp.array([x, 11])).at[1, :5].set(jnp.array([x, 11, 12, 13, 14]))
  )
  state = state.replace(tokens=tokens, num_generated=jnp.array([2, 5]))
  draft, q, ds = drafter.propose(None, state.spec.draft, state, None, 3, SamplingConfig())
  assert draft[0].tolist() == [12, 13, 14] and bool(ds.found[0])
  assert q is None  # deterministic: the loop builds one-hot q when it verifies


@pytest.mark.parametrize('verifier', ['greedy', 'rejection', 'block'])
def test_consensus_greedy_equals_target_greedy(target, verifier):
  engine = consensus_engine(target, group=4, k=2)
  prompts = [[3, 1, 4, 1, 5] * 3] * 4 + [[9, 2, 6, 5, 3, 5], [9, 2], [9, 2, 6], [7, 7, 7]]
  reference = engine.generate(prompts, max_new_tokens=30).tokens
  for gamma in (1, 4) if verifier == 'greedy' else (4,):
    out = engine.generate(prompts, Method.chain(gamma, verifier), max_new_tokens=30)
    assert out.tokens == reference, gamma
    assert sum(map(sum, out.drafted)) > 0


def test_consensus_tries_keep_greedy_identity(target):
  from specjax.core import tree as tree_lib

  engine = consensus_engine(target, group=4, k=2)
  prompts = [[3, 1, 4, 1, 5] * 3] * 4 + [[9, 2, 6, 5, 3, 5], [9, 2], [9, 2, 6], [7, 7, 7]]
  reference = engine.generate(prompts, max_new_tokens=30).tokens
  for spec in (
    tree_lib.TreeSpec(size=8, depth=4, width=3),
    tree_lib.TreeSpec(size=4, depth=4, width=5),
  ):
    out = engine.generate(prompts, Method.tree(spec), max_new_tokens=30)
    assert out.tokens == reference, spec
    assert sum(map(sum, out.accepted)) > 0


def test_consensus_on_a_looping_target_accepts_everything():
  # Every row counts up from its own start: row 1 is ahead of row 0 on the same count,
  # so row 0 can copy what row 1 already wrote.
  cfg, params = testing.successor_model(64)
  engine = Engine(
    params,
    cfg,
    eos_id=-1,
    cache_size=128,
    drafter=ConsensusDrafter(64, group=2, k=2, max_mismatches=0, n_max=0),
  )
  out = engine.generate([[1, 2, 3], [1, 2, 30]], Method.chain(4, 'greedy'), max_new_tokens=40)
  assert out.tokens[0] == [4 + i for i in range(40)]
  assert out.tokens[1] == [(31 + i) % 64 for i in range(40)]
  # Row 0 reaches 31 after 27 tokens; from then on it copies row 1's earlier text.
  assert out.accepted[0][-3:] == [4, 4, 4]


# ---------------------------------------------------------------------------------------------
# Sampling is lossless end to end: 5 tokens over a 4-token vocabulary (1024 continuations),
# groups of 8 paths of one prompt drafting from each other.

VOCAB, PROMPT, NEW, N = 4, [1, 3, 2, 0], 5, 24000


@pytest.fixture(scope='module')
def small_vocab():
  return testing.tiny_model(seed=21, vocab_size=VOCAB, n_layers=2, scale=0.3)


def exact_continuations(cfg, params, sampling):
  seqs = np.array(list(itertools.product(range(VOCAB), repeat=NEW)))
  tokens = jnp.asarray(np.concatenate([np.tile(PROMPT, (len(seqs), 1)), seqs], 1))
  logits, _ = llama.forward(params, tokens, KVCache.init(cfg, len(seqs), 16), cfg)[:2]
  probs = np.asarray(probabilities(logits, sampling), np.float64)
  n = len(PROMPT)
  steps = [probs[np.arange(len(seqs)), n - 1 + j, seqs[:, j]] for j in range(NEW)]
  return np.prod(steps, axis=0)


def chi_square_pvalue(samples, probs):
  index = (samples * VOCAB ** np.arange(NEW - 1, -1, -1)).sum(1)
  counts = np.bincount(index, minlength=VOCAB**NEW)
  assert counts[probs == 0].sum() == 0
  expected = probs / probs.sum() * len(samples)
  big = expected >= 5
  obs, exp = counts[big], expected[big]
  if expected[~big].sum() > 0:
    obs, exp = np.append(obs, counts[~big].sum()), np.append(exp, expected[~big].sum())
  return stats.chisquare(obs, exp * obs.sum() / exp.sum()).pvalue


def sample(small_vocab, sampling, gamma, verifier, proposal='mode'):
  cfg, params = small_vocab
  drafter = ConsensusDrafter(VOCAB, group=8, k=2, max_mismatches=1, n_max=1, proposal=proposal)
  engine = Engine(params, cfg, eos_id=-1, cache_size=16, drafter=drafter)
  out = engine.generate(
    [PROMPT] * N, Method.chain(gamma, verifier), max_new_tokens=NEW, sampling=sampling, seed=1
  )
  return np.array(out.tokens), out


@pytest.mark.parametrize(
  'gamma,verifier,proposal', [(2, 'block', 'mode'), (3, 'rejection', 'sample')]
)
def test_consensus_sampling_matches_the_target(small_vocab, gamma, verifier, proposal):
  sampling = SamplingConfig(temperature=1.0)
  probs = exact_continuations(*small_vocab, sampling)
  samples, out = sample(small_vocab, sampling, gamma, verifier, proposal)
  assert out.acceptance_rate > 0.2  # the drafter is doing something
  assert chi_square_pvalue(samples, probs) > 1e-3
  # The paths of a group stay independent: the first tokens of neighbouring rows agree
  # as often as two independent draws would.
  p1 = np.bincount(samples[:, 0], minlength=VOCAB) / N
  same = np.mean(samples[0::2, 0] == samples[1::2, 0])
  assert abs(same - (p1**2).sum()) < 4 * np.sqrt((p1**2).sum() / (N // 2))


def test_consensus_trie_sampling_matches_the_target(small_vocab):
  from specjax.core import tree as tree_lib

  cfg, params = small_vocab
  drafter = ConsensusDrafter(VOCAB, group=8, k=2, max_mismatches=1, n_max=1)
  engine = Engine(params, cfg, eos_id=-1, cache_size=24, drafter=drafter)
  sampling = SamplingConfig(temperature=1.0)
  spec = tree_lib.TreeSpec(size=6, depth=3, width=3)
  out = engine.generate(
    [PROMPT] * N, Method.tree(spec), max_new_tokens=NEW, sampling=sampling, seed=1
  )
  assert sum(map(sum, out.accepted)) > 0.2 * N
  assert chi_square_pvalue(np.array(out.tokens), exact_continuations(*small_vocab, sampling)) > 1e-3


def always_accept(p, q, draft, key):
  accepted = jnp.full(draft.shape[:1], draft.shape[1], jnp.int32)
  return accepted, jax.random.categorical(key, jnp.log(p[:, -1]), axis=-1).astype(jnp.int32)


def test_the_chi_square_test_catches_a_wrong_verifier(small_vocab, monkeypatch):
  monkeypatch.setitem(
    registry.VERIFIERS.table, 'always', verify.Verifier('always', always_accept, None)
  )
  sampling = SamplingConfig(temperature=1.0)
  probs = exact_continuations(*small_vocab, sampling)
  samples, _ = sample(small_vocab, sampling, 2, 'always')
  assert chi_square_pvalue(samples, probs) < 1e-3


# ---------------------------------------------------------------------------------------------
# Bad input.


def test_a_batch_that_is_not_a_multiple_of_the_group_is_refused(target):
  engine = consensus_engine(target, group=3)
  with pytest.raises(ValueError, match='groups 3 consecutive rows .* batch has 4 rows'):
    engine.generate([[1, 2]] * 4, Method.chain(2), max_new_tokens=8)


@pytest.mark.parametrize(
  'kwargs,match',
  [
    ({'group': 0}, 'group size >= 1'),
    ({'group': 2, 'k': 2, 'max_mismatches': 2}, '0 <= max_mismatches < k'),
    ({'group': 2, 'n_max': -1}, 'n_max >= 0'),
    ({'group': 2, 'proposal': 'best'}, "proposal must be 'mode' or 'sample'"),
  ],
)
def test_bad_settings_are_named(kwargs, match):
  with pytest.raises(ValueError, match=match):
    ConsensusDrafter(64, **kwargs)


def test_draft_spec(target):
  cfg, params = target
  model = loader.LoadedModel(cfg, params, None, 'tiny')
  drafter, draft_params = registry.build_draft('consensus:8,k=3,m=0,n=2', model)
  assert drafter == ConsensusDrafter(64, group=8, k=3, max_mismatches=0, n_max=2)
  assert draft_params is None
  assert registry.build_draft('consensus:4', model)[0].group == 4
  assert registry.build_draft('consensus:2,q=sample', model)[0].proposal == 'sample'
  for bad in ('consensus:', 'consensus:x', 'consensus:8,z=1', 'consensus:8,k=x'):
    with pytest.raises(ValueError, match='expected consensus:<N>'):
      registry.build_draft(bad, model)


def test_ngram_spec_with_a_range(target):
  from specjax.drafters import NgramDrafter

  cfg, params = target
  model = loader.LoadedModel(cfg, params, None, 'tiny')
  assert registry.build_draft('ngram:2-6', model)[0] == NgramDrafter(64, n_max=6, n_min=2)
  assert registry.build_draft('ngram:5', model)[0] == NgramDrafter(64, n_max=5, n_min=1)
  with pytest.raises(ValueError, match='expected ngram:<longest n-gram> or'):
    registry.build_draft('ngram:2-', model)
