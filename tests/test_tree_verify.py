"""Token trees: static shapes, and tree verification is lossless.

Exact enumeration of the output distribution over every tree a drafter can propose, for
sampled (with and without replacement) and deterministic children, on small vocabularies
and several shapes; a deliberately wrong tree verifier fails the same check."""

import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from test_verify import KINDS, BrokenTree, Tree, target_distribution

from specjax.core import tree as tree_lib
from specjax.verify import tree as tree_verify

SHAPES = ['2', '3', '2x1', '1x2', '0;1;0.0;1.0', '2x2', '0;0.0;0.1;1']


def contexts(shape, tokens):
  """The tokens on the path to each node (root: ()), for one assignment of the shape."""
  ctx = [()]
  for parent, x in zip(shape.parents, tokens):
    ctx.append(ctx[parent] + (int(x),))
  return ctx


def draft_trees(tree, shape, children):
  """Every tree the drafter proposes with positive probability: (tokens, weight, p, q).

  children: 'sampled' (i.i.d. from the draft q), 'without' (q with earlier siblings
  removed), 'deterministic' (the draft's top tokens in order, q one-hot: None).
  """
  out = []
  n = shape.size
  if children == 'deterministic':
    tokens = []
    for i, parent in enumerate(shape.parents):
      ctx = contexts(shape, tokens + [0] * (n - len(tokens)))[parent]
      order = np.argsort(-tree.q(ctx), kind='stable')
      tokens.append(int(order[shape.ranks[i] % tree.vocab]))
    ctx = contexts(shape, tokens)
    return [(tokens, 1.0, [tree.p(c) for c in ctx], None)]
  for tokens in itertools.product(range(tree.vocab), repeat=n):
    ctx = contexts(shape, tokens)
    weight, qs = 1.0, []
    for i, parent in enumerate(shape.parents):
      q = tree.q(ctx[parent]).copy()
      if children == 'without':
        for j in range(i):
          if shape.parents[j] == parent:
            q[tokens[j]] = 0.0
        # A drafter that has used up the draft's support proposes token 0 (one-hot).
        q = q / q.sum() if q.sum() > 0 else np.eye(tree.vocab)[0]
      qs.append(tree.reported(ctx[parent]) if children == 'sampled' else q)
      weight *= q[tokens[i]]
    if weight > 0:
      out.append((list(tokens), weight, [tree.p(c) for c in ctx], qs))
  return out


def output_distribution(tree, shape, children, plan_fn=tree_verify.rejection_tree_plan):
  """Exact law of the first depth+1 tokens: one tree verification, then the target."""
  drafts = draft_trees(tree, shape, children)
  tokens = jnp.asarray([d[0] for d in drafts], jnp.int32)
  p = jnp.asarray(np.array([d[2] for d in drafts], np.float32))
  q = (
    None
    if children == 'deterministic'
    else jnp.asarray(np.array([d[3] for d in drafts], np.float32))
  )
  parents = shape.parents_array(len(drafts))
  plan = plan_fn(p, q, tokens, parents)
  stop = np.asarray(tree_verify.stop_distribution(plan, parents), np.float64)
  residuals = np.asarray(plan.residuals, np.float64)
  length = shape.depth + 1
  out = {}
  for (toks, w, _, _), s, r in zip(drafts, stop, residuals):
    ctx = contexts(shape, toks)
    for j in range(shape.size + 1):
      for y in np.nonzero(r[j] * s[j] * w)[0]:
        emitted = ctx[j] + (int(y),)
        mass = w * s[j] * r[j, y]
        for rest in itertools.product(range(tree.vocab), repeat=length - len(emitted)):
          seq = emitted + rest
          cont = np.prod([tree.p(seq[:k])[seq[k]] for k in range(len(emitted), length)])
          out[seq] = out.get(seq, 0.0) + mass * cont
  return out


def assert_lossless(got, want):
  for z, prob in want.items():
    assert abs(got.get(z, 0.0) - prob) < 1e-5, (z, got.get(z, 0.0), prob)
  assert abs(sum(got.values()) - 1) < 1e-5


@pytest.mark.parametrize('children', ['sampled', 'without', 'deterministic'])
@settings(max_examples=20, deadline=None, derandomize=True)
@given(
  kind=st.sampled_from(KINDS),
  shape=st.sampled_from(SHAPES),
  vocab=st.integers(2, 3),
  seed=st.integers(0, 2**31 - 1),
)
def test_tree_verification_is_the_target_distribution(children, kind, shape, vocab, seed):
  tree, shape = Tree(vocab, kind, seed), tree_lib.parse_shape(shape)
  got = output_distribution(tree, shape, children)
  assert_lossless(got, target_distribution(tree, shape.depth))


@pytest.mark.parametrize('kind', KINDS)
@pytest.mark.parametrize('children', ['sampled', 'without', 'deterministic'])
def test_every_edge_case_on_a_wide_tree(kind, children):
  tree, shape = Tree(3, kind, seed=7), tree_lib.parse_shape('0;1;2;0.0;0.1;1.0')
  assert_lossless(output_distribution(tree, shape, children), target_distribution(tree, 2))


@pytest.mark.parametrize('broken', ['nan_q', 'unnormalised_q', 'overflowing_q', 'proposes_zero'])
@pytest.mark.parametrize('shape', ['2', '2x1', '0;1;0.0'])
def test_a_broken_draft_leaves_the_tree_output_exactly_the_targets(broken, shape):
  tree, shape = BrokenTree(3, broken, len(shape)), tree_lib.parse_shape(shape)
  assert_lossless(
    output_distribution(tree, shape, 'sampled'), target_distribution(tree, shape.depth)
  )


def naive_plan(p, q, tokens, parents):
  """A wrong tree verifier: every child is tried against the parent's p itself (no
  residual between siblings), as if each were the only draft."""
  b, n = tokens.shape
  at_parent = jnp.take_along_axis(p, jnp.maximum(parents, 0)[..., None], axis=1)  # [B, N, V]
  px = jnp.take_along_axis(at_parent, tokens[..., None], -1)[..., 0]
  qx = 1.0 if q is None else jnp.take_along_axis(q, tokens[..., None], -1)[..., 0]
  return tree_verify.TreePlan(thresholds=jnp.minimum(1.0, px / qx), residuals=p)


@pytest.mark.parametrize('children', ['sampled', 'deterministic'])
def test_the_enumeration_catches_a_wrong_tree_verifier(children):
  tree, shape = Tree(3, 'random', seed=3), tree_lib.parse_shape('3')
  got = output_distribution(tree, shape, children, plan_fn=naive_plan)
  want = target_distribution(tree, 1)
  assert max(abs(got.get(z, 0.0) - w) for z, w in want.items()) > 1e-2


def test_a_chain_tree_is_the_chain_verifier():
  """On a one-path tree, tree verification is token-level rejection sampling."""
  from test_verify import draft_blocks

  from specjax.verify import common, rejection

  tree = Tree(3, 'random', seed=4)
  blocks, _, ps, qs = draft_blocks(tree, 3)
  chain = rejection.rejection_plan(jnp.asarray(ps), jnp.asarray(qs), jnp.asarray(blocks))
  parents = tree_lib.TreeShape.chain(3).parents_array(len(blocks))
  plan = tree_verify.rejection_tree_plan(
    jnp.asarray(ps), jnp.asarray(qs), jnp.asarray(blocks), parents
  )
  np.testing.assert_allclose(plan.thresholds, chain.thresholds, atol=1e-6)
  np.testing.assert_allclose(
    tree_verify.stop_distribution(plan, parents), common.stop_distribution(chain), atol=1e-6
  )
  np.testing.assert_allclose(plan.residuals, chain.residuals, atol=1e-6)


def test_the_walk_follows_the_plan():
  """The random walk's stopping node and next token match the plan's exact law."""
  from scipy import stats

  tree, shape = Tree(3, 'random', seed=5), tree_lib.parse_shape('0;1;0.0;1.0')
  (tokens, _, ps, qs) = draft_trees(tree, shape, 'sampled')[17]
  n = 20000
  rep = lambda a, dt=jnp.float32: jnp.asarray(np.repeat(np.asarray(a)[None], n, 0), dt)
  draft = tree_lib.TreeDraft(
    tokens=rep(tokens, jnp.int32), parents=shape.parents_array(n), q=rep(qs)
  )
  path, accepted, nxt = tree_verify.verify_tree(
    rep(ps), draft.q, draft, jax.random.key(0), greedy=False, max_depth=shape.depth
  )
  plan = tree_verify.rejection_tree_plan(
    rep(ps)[:1], draft.q[:1], draft.tokens[:1], draft.parents[:1]
  )
  law = (
    np.asarray(tree_verify.stop_distribution(plan, draft.parents[:1]), np.float64)[0][:, None]
    * np.asarray(plan.residuals, np.float64)[0]
  ).ravel()
  anc = tree_lib.ancestors(draft.parents[:1])
  depth = np.asarray(tree_lib.depths(anc, draft.parents[:1]))[0]
  # The stopping node is the deepest on the path; recover it from (path, accepted).
  stop = np.asarray(path)[np.arange(n), np.asarray(accepted)]
  assert np.all(depth[stop] == np.asarray(accepted))
  counts = np.bincount(stop * 3 + np.asarray(nxt), minlength=law.size)
  support = law > 1e-9
  assert counts[~support].sum() == 0
  expected = law[support] / law[support].sum() * counts[support].sum()
  assert stats.chisquare(counts[support], expected).pvalue > 1e-3


def test_greedy_tree_keeps_the_longest_argmax_path():
  vocab = 5
  rng = np.random.default_rng(0)
  shape = tree_lib.parse_shape('3x2')
  p = jnp.asarray(rng.dirichlet(np.ones(vocab), size=(1, shape.size + 1)), jnp.float32)
  top = np.asarray(jnp.argmax(p, -1))[0]
  # Root's second child (node 2) is the argmax, and its first child (node 6) too.
  tokens = np.array([(top[0] + 1) % vocab, top[0], (top[0] + 2) % vocab, 0, 0, 0, 0, 0, 0])
  tokens[shape.paths.index((1, 0))] = top[2]
  tokens[shape.paths.index((1, 1))] = top[2]  # a duplicate sibling: the first one wins
  draft = tree_lib.TreeDraft(jnp.asarray(tokens[None], jnp.int32), shape.parents_array(1))
  path, accepted, nxt = tree_verify.verify_tree(p, None, draft, None, greedy=True, max_depth=2)
  node = shape.paths.index((1, 0)) + 1
  assert int(accepted[0]) == 2
  assert np.asarray(path)[0].tolist() == [0, 2, node]
  assert int(nxt[0]) == top[node]


def test_unused_nodes_are_never_accepted():
  p = jnp.full((1, 4, 3), 1 / 3)
  draft = tree_lib.TreeDraft(jnp.asarray([[0, 1, 2]]), jnp.asarray([[0, -1, -1]]))
  stop = tree_verify.stop_distribution(
    tree_verify.rejection_tree_plan(p, None, draft.tokens, draft.parents), draft.parents
  )
  np.testing.assert_allclose(stop, [[2 / 3, 1 / 3, 0, 0]], atol=1e-6)


def test_ancestors_depths_and_paths():
  shape = tree_lib.parse_shape('0;1;0.0;1.0;1.0.0')
  parents = shape.parents_array(2)
  anc = tree_lib.ancestors(parents)
  depth = tree_lib.depths(anc, parents)
  assert shape.parents == (0, 0, 1, 2, 4)
  assert np.asarray(depth)[0].tolist() == [0, 1, 1, 2, 2, 3]
  path = tree_lib.path_to(anc, depth, jnp.asarray([5, 3]), 3)
  assert np.asarray(path).tolist() == [[0, 2, 4, 5], [0, 1, 3, 0]]


@pytest.mark.parametrize(
  'text, size, depth',
  [('4x2x1', 4 + 8 + 8, 3), ('chain:4', 4, 4), ('0;1;0.0', 3, 2), ('1', 1, 1)],
)
def test_tree_shapes_parse(text, size, depth):
  shape = tree_lib.parse_shape(text)
  assert (shape.size, shape.depth) == (size, depth)


@pytest.mark.parametrize(
  'text, match',
  [
    ('0;0.0.0', r'parent \(0, 0\) is not in the tree'),
    ('0;2', r'earlier sibling \(1,\) is missing'),
    ('4x0', 'expected a tree shape'),
    ('chain:x', 'expected a tree shape'),
    ('big', 'expected a tree shape'),
  ],
)
def test_bad_tree_shapes_are_named(text, match):
  with pytest.raises(ValueError, match=match):
    tree_lib.parse_shape(text)


def test_best_shape_is_the_most_accepting_tree_of_its_size():
  accept = np.array([[0.7, 0.15, 0.05], [0.8, 0.1, 0.05], [0.85, 0.08, 0.03]])
  best = tree_lib.best_shape(accept, 5, max_depth=3)
  # Brute force over every 5-node tree inside the 3x3x3 tree.
  full = tree_lib.TreeShape.branching([3, 3, 3]).paths
  top = 0.0
  for subset in itertools.combinations(full, 5):
    try:
      top = max(top, tree_lib.TreeShape(subset).expected_accepted(accept))
    except ValueError:
      continue
  assert best.size == 5
  assert best.expected_accepted(accept) == pytest.approx(top)
  assert tree_lib.TreeShape.chain(3).expected_accepted(accept) == pytest.approx(
    0.7 + 0.7 * 0.8 + 0.7 * 0.8 * 0.85
  )
