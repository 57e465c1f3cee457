"""Token trees through the decoding loop: the tree forward equals forwards of each path,
speculative greedy with trees equals target greedy (batch 1 and ragged batches, every
tree drafter), sampling with trees is lossless end to end (chi-square, with a wrong tree
verifier to show the test has power), and bad tree settings are named."""

import jax.numpy as jnp
import numpy as np
import pytest
from test_speculative import (
  PROMPT,
  PROMPTS,
  SAMPLINGS,
  VOCAB,
  chi_square_pvalue,
  exact_continuations,
)

from specjax import testing
from specjax.core import tree as tree_lib
from specjax.core.contract import At
from specjax.core.sampling import SamplingConfig
from specjax.decode.engine import Engine
from specjax.decode.method import Method
from specjax.drafters import ModelDrafter, truncated_target
from specjax.drafters.ngram import NgramDrafter
from specjax.models import llama
from specjax.models.kv_cache import KVCache
from specjax.verify import tree as tree_verify

TREES = {
  'static 2x2x1': tree_lib.TreeSpec(tree_lib.parse_shape('2x2x1')),
  'static uneven': tree_lib.TreeSpec(tree_lib.parse_shape('0;1;2;0.0;0.1;1.0;0.0.0')),
  'chain 3': tree_lib.TreeSpec(tree_lib.parse_shape('chain:3')),
  'dynamic': tree_lib.TreeSpec(size=6, depth=3, width=2),
}


@pytest.fixture(scope='module')
def target():
  return testing.tiny_model(seed=3, n_layers=3)


def model_engine(target, draft, cache=128, eos_id=-1):
  (cfg, params), (draft_cfg, draft_params) = target, draft
  return Engine(
    params,
    cfg,
    eos_id=eos_id,
    cache_size=cache,
    drafter=ModelDrafter(draft_cfg),
    draft_params=draft_params,
  )


def test_tree_forward_equals_a_forward_of_each_path(target):
  cfg, params = target
  context = [5, 9, 2, 7]
  shape = tree_lib.parse_shape('0;1;0.0;0.1;1.0;0.0.0')
  rng = np.random.default_rng(0)
  nodes = rng.integers(3, cfg.vocab_size, shape.size)
  cache = KVCache.init(cfg, 1, 32)
  _, cache = llama.forward(params, jnp.asarray([context[:-1]]), cache, cfg)[:2]
  anc = tree_lib.ancestors(shape.parents_array(1))
  depth = tree_lib.depths(anc, shape.parents_array(1))
  start = cache.lengths
  tokens = jnp.asarray([[context[-1], *nodes]])
  logits, _ = llama.forward(
    params,
    tokens,
    cache,
    cfg,
    at=At(
      start[:, None] + depth,
      start[:, None] + jnp.arange(shape.size + 1),
      tree_lib.tree_mask(anc, start, 32),
    ),
  )[:2]
  for i, path in enumerate([(), *shape.paths]):
    seq = context + [int(nodes[shape.paths.index(path[:k])]) for k in range(1, len(path) + 1)]
    full, _ = llama.forward(params, jnp.asarray([seq]), KVCache.init(cfg, 1, 32), cfg)[:2]
    np.testing.assert_allclose(logits[0, i], full[0, -1], atol=2e-5, err_msg=str(path))


DRAFTS = {
  'truncated target': lambda t: truncated_target(*t, 1),
  'random tiny model': lambda t: testing.tiny_model(
    seed=11, n_layers=1, d_model=16, n_heads=2, n_kv_heads=1
  ),
  'target itself': lambda t: t,
}


@pytest.mark.parametrize('draft', list(DRAFTS))
def test_tree_greedy_equals_target_greedy(target, draft):
  engine = model_engine(target, DRAFTS[draft](target))
  reference = engine.generate(PROMPTS, max_new_tokens=24).tokens
  for name, spec in TREES.items():
    batch = engine.generate(PROMPTS, Method.tree(spec), max_new_tokens=24)
    assert batch.tokens == reference, name
    alone = engine.generate(PROMPTS[1:2], Method.tree(spec), max_new_tokens=24)
    assert alone.tokens[0] == reference[1], name


def test_a_perfect_draft_accepts_the_whole_depth(target):
  engine = model_engine(target, target)
  for spec in (TREES['static 2x2x1'], tree_lib.TreeSpec(size=4, depth=4, width=1)):
    out = engine.generate(PROMPTS, Method.tree(spec), max_new_tokens=25)
    for acc in out.accepted:  # every iteration but maybe a row's last keeps the depth
      assert set(acc[:-1]) == {spec.max_depth}, acc


def test_tree_iterations_record_their_stopping_node(target):
  engine = model_engine(target, truncated_target(*target, 1))
  spec = TREES['static uneven']
  out = engine.generate(PROMPTS, Method.tree(spec), max_new_tokens=24)
  depth = [0] + [len(p) for p in spec.shape.paths]
  for stops, accepted, drafted in zip(out.stops, out.accepted, out.drafted):
    assert len(stops) == len(accepted) == len(drafted)
    assert [depth[s] for s in stops] == accepted
    assert set(drafted) == {spec.nodes}
  assert any(s > 0 for row in out.stops for s in row)
  assert (
    engine.generate(PROMPTS, Method.chain(2), max_new_tokens=8).stops == []
  )  # chains record none


def test_tree_rows_stop_at_their_eos(target):
  cfg, params = target
  reference = model_engine(target, target).generate(PROMPTS, max_new_tokens=24).tokens
  eos = reference[0][5]  # row 0 emits this token early
  engine = model_engine(target, truncated_target(cfg, params, 1), eos_id=eos)
  want = engine.generate(PROMPTS, max_new_tokens=24).tokens
  assert want[0][-1] == eos and len(want[0]) <= 6
  assert (
    engine.generate(PROMPTS, Method.tree(TREES['static 2x2x1']), max_new_tokens=24).tokens == want
  )


def test_tree_rows_that_fill_their_cache():
  """Each row's prompt + max_new + tree nodes fills the cache exactly."""
  target = testing.tiny_model(seed=3, n_layers=2)
  engine = model_engine(target, truncated_target(*target, 1), cache=32)
  spec = TREES['static 2x2x1']
  prompts = [[3] * (32 - spec.nodes - 12), [4, 5] * 3]
  max_new = [12, 32 - spec.nodes - 6]
  assert (
    engine.generate(prompts, Method.tree(spec), max_new_tokens=max_new).tokens
    == engine.generate(prompts, max_new_tokens=max_new).tokens
  )
  with pytest.raises(ValueError, match='and 10 for the tree draft it needs 33 cache slots'):
    engine.generate(prompts, Method.tree(spec), max_new_tokens=[13, 1])


LOOKUP_PROMPTS = [
  [3, 1, 4, 1, 5, 3, 1, 4, 1, 5, 3, 1],
  [9, 2, 6, 5, 3, 5, 8, 9, 7, 9, 3, 2, 3],
  [7],
  [2, 7, 1, 8, 2, 8, 1, 8, 2, 8],
]


def test_lookup_trie_greedy_equals_target_greedy(target):
  cfg, params = target
  engine = Engine(params, cfg, eos_id=-1, cache_size=128, drafter=NgramDrafter(cfg.vocab_size))
  reference = engine.generate(LOOKUP_PROMPTS, max_new_tokens=40).tokens
  for spec in (
    tree_lib.TreeSpec(size=8, depth=4, width=3),
    tree_lib.TreeSpec(size=3, depth=6, width=4),
  ):
    out = engine.generate(LOOKUP_PROMPTS, Method.tree(spec), max_new_tokens=40)
    assert out.tokens == reference
    assert sum(map(sum, out.accepted)) > 0


def test_lookup_trie_merges_shared_prefixes():
  from specjax.drafters import ngram

  conts = jnp.asarray([[[5, 6, 7], [5, 6, 8], [5, 9, 1], [2, 3, 4]]])
  valid = jnp.asarray([[[1, 1, 1], [1, 1, 1], [1, 1, 0], [0, 0, 0]]], bool)
  draft = ngram.trie(conts, valid, 8)  # the best continuation whole, then what others add
  assert np.asarray(draft.tokens)[0].tolist() == [5, 6, 7, 8, 9, 0, 0, 0]
  assert np.asarray(draft.parents)[0].tolist() == [0, 1, 2, 2, 1, -1, -1, -1]
  shallow = ngram.trie(conts, valid, 8, rank_major=False)
  assert np.asarray(shallow.tokens)[0].tolist() == [5, 6, 9, 7, 8, 0, 0, 0]
  assert np.asarray(shallow.parents)[0].tolist() == [0, 1, 1, 2, 2, -1, -1, -1]
  assert np.asarray(ngram.trie(conts, valid, 3).parents)[0].tolist() == [0, 1, 2]
  assert np.asarray(ngram.trie(conts, valid, 3, False).parents)[0].tolist() == [0, 1, 1]


def test_lookup_finds_the_best_earlier_matches():
  from specjax.drafters import ngram

  ctx = jnp.asarray([[1, 2, 3, 9, 2, 3, 8, 7, 3, 5, 2, 3]])
  ends = ngram.recent_matches(ctx, jnp.asarray([12]), 1, 3, 4)
  # "2 3" ends at 5 and 2 (longest first, most recent first), then "3" alone at 8.
  assert np.asarray(ends)[0].tolist() == [5, 2, 8, -1]


@pytest.fixture(scope='module')
def small_vocab():
  target = testing.tiny_model(seed=21, vocab_size=VOCAB, n_layers=2, scale=0.3)
  draft = testing.tiny_model(seed=22, vocab_size=VOCAB, n_layers=1, scale=0.3)
  return target, draft


def tree_samples(small_vocab, sampling, spec, seed=0):
  target, draft = small_vocab
  engine = model_engine(target, draft, cache=16)
  out = engine.generate(
    [PROMPT] * 30000, Method.tree(spec), max_new_tokens=3, sampling=sampling, seed=seed
  )
  return np.array(out.tokens)


@pytest.mark.parametrize('sampling', SAMPLINGS, ids=['t1', 't0.7-k5-p0.9'])
@pytest.mark.parametrize('tree', ['static uneven', 'dynamic'])
def test_tree_sampling_matches_the_target(small_vocab, sampling, tree):
  probs = exact_continuations(*small_vocab[0], sampling)
  samples = tree_samples(small_vocab, sampling, TREES[tree])
  assert chi_square_pvalue(samples, probs) > 1e-3


def test_the_chi_square_test_catches_a_wrong_tree_verifier(small_vocab, monkeypatch):
  from test_tree_verify import naive_plan

  monkeypatch.setattr(tree_verify, 'rejection_tree_plan', naive_plan)
  sampling = SamplingConfig(temperature=1.0)
  probs = exact_continuations(*small_vocab[0], sampling)
  samples = tree_samples(small_vocab, sampling, TREES['static 2x2x1'])
  assert chi_square_pvalue(samples, probs) < 1e-3


@pytest.mark.parametrize(
  'kwargs, match',
  [
    ({'verifier': 'block'}, 'block verification is proved for chains only'),
  ],
)
def test_bad_tree_settings_are_named(target, kwargs, match):
  engine = model_engine(target, target)
  with pytest.raises(ValueError, match=match):
    engine.generate(PROMPTS, Method.tree(TREES['dynamic'], **kwargs), max_new_tokens=4)


def test_a_lookup_drafter_refuses_a_fixed_shape(target):
  cfg, params = target
  engine = Engine(params, cfg, eos_id=-1, cache_size=64, drafter=NgramDrafter(cfg.vocab_size))
  with pytest.raises(ValueError, match='builds tries of continuations, not fixed shapes'):
    engine.generate(PROMPTS, Method.tree(TREES['static 2x2x1']), max_new_tokens=4)


def test_a_dynamic_tree_larger_than_its_candidates_is_refused(target):
  engine = model_engine(target, target)
  with pytest.raises(ValueError, match='has 6 candidates, fewer than its size 7'):
    engine.generate(
      PROMPTS, Method.tree(tree_lib.TreeSpec(size=7, depth=2, width=2)), max_new_tokens=4
    )


def test_a_dynamic_tree_needs_its_sizes():
  with pytest.raises(ValueError, match='a dynamic tree needs size, depth and width >= 1'):
    tree_lib.TreeSpec(size=4, depth=0, width=2)


# ---------------------------------------------------------------------------------------------
# Every tree drafter drafts what its chain drafts along the best path, and trees with a
# feature head or a distilled draft are lossless too.


def _drafted(engine, spec, gamma):
  """(tree tokens, chain tokens) drafted from the same state after a prefill."""
  import jax

  from specjax.decode import prefill

  tokens, lengths, max_new, out_len, cache_size = engine.prepare(PROMPTS, 8, spare=16)
  sampling = SamplingConfig()
  method = Method.chain(gamma)
  state = prefill.prefill(
    {'target': engine.params, 'draft': engine.draft_params},
    jnp.asarray(tokens),
    jnp.asarray(lengths),
    jnp.asarray(max_new),
    jax.random.key(0),
    cfg=engine.cfg,
    method=method,
    drafter=engine.drafter,
    sampling=sampling,
    eos_id=-1,
    cache_size=cache_size,
    out_len=out_len,
  )
  drafter, key = engine.drafter, jax.random.key(1)
  tree, _ = drafter.propose_tree(engine.draft_params, state.spec.draft, state, key, spec, sampling)
  chain, _, _ = drafter.propose(engine.draft_params, state.spec.draft, state, key, gamma, sampling)
  return tree, chain


def eagle_engine(target, **kwargs):
  from test_eagle import make_head

  from specjax.drafters.eagle import EagleDrafter

  cfg, params = target
  hc, hp = make_head(target)
  return Engine(
    params,
    cfg,
    eos_id=-1,
    cache_size=kwargs.pop('cache', 128),
    drafter=EagleDrafter(hc),
    draft_params={'head': hp, 'embed': params['embed']},
  )


@pytest.mark.parametrize('drafter', ['model', 'eagle'])
def test_a_tree_drafts_the_chain_along_its_best_path(target, drafter):
  engine = (
    model_engine(target, truncated_target(*target, 1))
    if drafter == 'model'
    else eagle_engine(target)
  )
  for spec in (
    tree_lib.TreeSpec(tree_lib.parse_shape('chain:3')),
    tree_lib.TreeSpec(size=3, depth=3, width=1),
    tree_lib.TreeSpec(tree_lib.parse_shape('2x2x1')),
  ):
    tree, chain = _drafted(engine, spec, 3)
    shape = spec.shape or tree_lib.TreeShape.chain(3)
    best = [shape.paths.index((0,) * d) for d in (1, 2, 3)]
    np.testing.assert_array_equal(np.asarray(tree.tokens)[:, best], chain, err_msg=str(spec))


def test_a_draft_models_second_branch_is_its_argmax_after_that_token(target):
  cfg, params = target
  draft_cfg, draft_params = truncated_target(cfg, params, 1)
  engine = model_engine(target, (draft_cfg, draft_params))
  spec = tree_lib.TreeSpec(tree_lib.parse_shape('2x2'))
  tree, _ = _drafted(engine, spec, 2)
  tokens = np.asarray(tree.tokens)
  for row, prompt in enumerate(PROMPTS):
    first = engine.generate([prompt], max_new_tokens=1).tokens[0]  # the prefill's token: the root
    for path in ((1, 0), (1, 1), (0, 1)):
      seq = prompt + first + [int(tokens[row, spec.shape.paths.index(path[:1])])]
      logits, _ = llama.forward(
        draft_params, jnp.asarray([seq]), KVCache.init(draft_cfg, 1, 32), draft_cfg
      )[:2]
      want = np.argsort(-np.asarray(logits[0, -1]), kind='stable')[path[1]]
      assert tokens[row, spec.shape.paths.index(path)] == want, (row, path)


def test_eagle_tree_greedy_equals_target_greedy(target):
  engine = eagle_engine(target)
  reference = engine.generate(PROMPTS, max_new_tokens=24).tokens
  for name, spec in TREES.items():
    assert engine.generate(PROMPTS, Method.tree(spec), max_new_tokens=24).tokens == reference, name


def test_distilled_tree_greedy_equals_target_greedy(target):
  from specjax.drafters import distilled

  cfg, params = target
  ids = np.arange(0, cfg.vocab_size, 3)
  draft_cfg, draft_params = distilled.init_from_target(cfg, params, (0,), ids)
  engine = Engine(
    params,
    cfg,
    eos_id=-1,
    cache_size=128,
    drafter=distilled.DistilledDrafter(draft_cfg),
    draft_params=draft_params,
  )
  reference = engine.generate(PROMPTS, max_new_tokens=24).tokens
  for name, spec in TREES.items():
    assert engine.generate(PROMPTS, Method.tree(spec), max_new_tokens=24).tokens == reference, name


@pytest.mark.parametrize('tree', ['static 2x2x1', 'dynamic'])
def test_eagle_tree_sampling_is_lossless(tree):
  """A head whose vocabulary leaves out two of the eight tokens (q = 0 there)."""
  from test_eagle import small_vocab_head_engine

  engine, (cfg, params) = small_vocab_head_engine()
  sampling = SamplingConfig(temperature=1.0)
  out = engine.generate(
    [PROMPT] * 30000, Method.tree(TREES[tree]), max_new_tokens=3, sampling=sampling, seed=0
  )
  probs = exact_continuations(cfg, params, sampling)
  assert chi_square_pvalue(np.array(out.tokens), probs) > 1e-3
