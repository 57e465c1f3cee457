"""Verifiers are lossless: exact enumeration of their output distribution over every draft
block, property-based over random and adversarial target/draft pairs."""

import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from specjax import registry
from specjax.core.sampling import SamplingConfig, probabilities
from specjax.verify import common

KINDS = [
  'random',
  'equal',
  'disjoint',
  'q_zero_where_p_positive',
  'one_hot_q',
  'low_temperature',
  'top_k_top_p',
]


class Tree:
  """Context-dependent target p(.|prefix) and draft q(.|prefix) over a small vocabulary."""

  def __init__(self, vocab, kind, seed):
    self.vocab, self.kind, self.rng = vocab, kind, np.random.default_rng(seed)
    self._p, self._q = {}, {}

  def _logits(self):
    return self.rng.normal(size=self.vocab) * 2.0

  def p(self, prefix):
    prefix = tuple(prefix)
    if prefix not in self._p:
      logits = self._logits()
      if self.kind == 'low_temperature':
        dist = probabilities(jnp.asarray(logits), SamplingConfig(temperature=0.01))
      elif self.kind == 'top_k_top_p':
        dist = probabilities(jnp.asarray(logits), SamplingConfig(1.3, top_k=3, top_p=0.9))
      else:
        dist = np.exp(logits) / np.exp(logits).sum()
        if self.kind == 'disjoint':  # p lives on the first half of the vocabulary
          dist = np.where(np.arange(self.vocab) < self.vocab // 2, dist, 0.0)
      self._p[prefix] = np.asarray(dist, np.float64) / np.sum(dist)
    return self._p[prefix]

  def q(self, prefix):
    prefix = tuple(prefix)
    if prefix not in self._q:
      logits = self._logits()
      dist = np.exp(logits) / np.exp(logits).sum()
      if self.kind == 'equal':
        dist = self.p(prefix)
      elif self.kind == 'disjoint':  # q lives on the other half
        dist = np.where(np.arange(self.vocab) >= self.vocab // 2, dist, 0.0)
      elif self.kind == 'q_zero_where_p_positive':
        dist = np.where(np.arange(self.vocab) == self.rng.integers(self.vocab), 0.0, dist)
      elif self.kind == 'one_hot_q':
        dist = np.eye(self.vocab)[self.rng.integers(self.vocab)]
      self._q[prefix] = dist / dist.sum()
    return self._q[prefix]

  def reported(self, prefix):
    """The distribution the draft hands the verifier (its true proposal q here)."""
    return self.q(prefix)


class BrokenTree(Tree):
  """A draft whose reported distribution is not the one it samples from, at the first
  position and about half of the others: NaN rows, rows that do not sum to 1, rows whose
  float32 total overflows, or a token
  it proposes 30% of the time while reporting probability 0 for it (it samples the
  reported row otherwise)."""

  def __init__(self, vocab, kind, seed):
    super().__init__(vocab, 'random', seed)
    self.broken, self._r = kind, {}

  def _rows(self, prefix):
    prefix = tuple(prefix)
    if prefix not in self._r:
      honest = super().q(prefix)
      true, shown = honest, honest
      if prefix == () or self.rng.random() < 0.5:  # the first position always
        if self.broken == 'nan_q':
          shown = np.where(np.arange(self.vocab) == 0, np.nan, honest)
        elif self.broken == 'unnormalised_q':
          shown = honest * self.rng.choice([0.5, 3.0])
        elif self.broken == 'overflowing_q':  # finite entries, a float32 total of inf
          shown = np.where(honest > 0, 3e38, 0.0)
        elif self.broken == 'proposes_zero':
          t = self.rng.integers(self.vocab)
          shown = np.where(np.arange(self.vocab) == t, 0.0, honest)
          shown = shown / shown.sum()
          true = 0.7 * shown + 0.3 * np.eye(self.vocab)[t]
      self._r[prefix] = (true, shown)
    return self._r[prefix]

  def q(self, prefix):
    return self._rows(prefix)[0]

  def reported(self, prefix):
    return self._rows(prefix)[1]


def draft_blocks(tree, gamma):
  """Every block with positive draft probability, with its probability and (P, Q) arrays."""
  blocks, weights, ps, qs = [], [], [], []
  for x in itertools.product(range(tree.vocab), repeat=gamma):
    w = np.prod([tree.q(x[:j])[x[j]] for j in range(gamma)])
    if w > 0:
      blocks.append(x)
      weights.append(w)
      ps.append([tree.p(x[:j]) for j in range(gamma + 1)])
      qs.append([tree.reported(x[:j]) for j in range(gamma)])
  return (np.array(blocks), np.array(weights), np.array(ps, np.float32), np.array(qs, np.float32))


def output_distribution(name, tree, gamma):
  """Exact distribution of gamma+1 tokens: one verification round, then the target."""
  blocks, weights, ps, qs = draft_blocks(tree, gamma)
  plan = registry.VERIFIERS.get(name).plan(jnp.asarray(ps), jnp.asarray(qs), jnp.asarray(blocks))
  stop = np.asarray(common.stop_distribution(plan), np.float64)
  residuals = np.asarray(plan.residuals, np.float64)
  out = {}
  for x, w, s, r in zip(blocks, weights, stop, residuals):
    for k in range(gamma + 1):
      for y in np.nonzero(r[k] * s[k] * w)[0]:
        emitted = tuple(x[:k]) + (int(y),)
        mass = w * s[k] * r[k, y]
        # The target writes the rest of the gamma+1 tokens.
        for rest in itertools.product(range(tree.vocab), repeat=gamma - k):
          seq = emitted + rest
          cont = np.prod([tree.p(seq[:j])[seq[j]] for j in range(k + 1, gamma + 1)])
          out[seq] = out.get(seq, 0.0) + mass * cont
  return out


def target_distribution(tree, gamma):
  return {
    z: np.prod([tree.p(z[:j])[z[j]] for j in range(gamma + 1)])
    for z in itertools.product(range(tree.vocab), repeat=gamma + 1)
  }


def expected_accepted(name, tree, gamma):
  blocks, weights, ps, qs = draft_blocks(tree, gamma)
  plan = registry.VERIFIERS.get(name).plan(jnp.asarray(ps), jnp.asarray(qs), jnp.asarray(blocks))
  stop = np.asarray(common.stop_distribution(plan), np.float64)
  return float(np.sum(weights[:, None] * stop * np.arange(gamma + 1)))


@pytest.mark.parametrize('name', ['rejection', 'block'])
@settings(max_examples=25, deadline=None, derandomize=True)
@given(
  kind=st.sampled_from(KINDS),
  gamma=st.integers(1, 3),
  vocab=st.integers(2, 4),
  seed=st.integers(0, 2**31 - 1),
)
def test_verifier_output_is_the_target_distribution(name, kind, gamma, vocab, seed):
  tree = Tree(vocab, kind, seed)
  got, want = output_distribution(name, tree, gamma), target_distribution(tree, gamma)
  for z, prob in want.items():
    assert abs(got.get(z, 0.0) - prob) < 1e-5, (z, got.get(z, 0.0), prob)
  assert abs(sum(got.values()) - 1) < 1e-5


@pytest.mark.parametrize('name', ['rejection', 'block'])
@pytest.mark.parametrize('broken', ['nan_q', 'unnormalised_q', 'overflowing_q', 'proposes_zero'])
@pytest.mark.parametrize('seed', range(4))
def test_a_broken_draft_leaves_the_output_exactly_the_targets(name, broken, seed):
  tree = BrokenTree(3, broken, seed)
  got, want = output_distribution(name, tree, 2), target_distribution(tree, 2)
  for z, prob in want.items():
    assert abs(got.get(z, 0.0) - prob) < 1e-5, (z, got.get(z, 0.0), prob)


def test_untrusted_names_nan_negative_and_zero_probability_proposals():
  q = jnp.array([[[0.5, 0.5, 0.0], [jnp.nan, 0.5, 0.5], [0.5, 0.6, 0.0], [0.2, 0.8, 0.0]]])
  q = jnp.concatenate([q, jnp.array([[[-0.1, 0.6, 0.5]]])], axis=1)
  tokens = jnp.array([[1, 1, 0, 2, 1]])
  assert common.untrusted(q, tokens).tolist() == [[False, True, False, True, True]]
  fixed, bad = common.trusted(q, tokens)  # a row off 1 is its normalised self
  np.testing.assert_allclose(fixed[0, 2], [0.5 / 1.1, 0.6 / 1.1, 0.0], rtol=1e-6)
  assert np.all(np.asarray(fixed)[np.asarray(bad)] == 0)


@pytest.mark.parametrize('kind', KINDS)
def test_every_edge_case_at_gamma_3(kind):
  tree = Tree(3, kind, seed=11)
  want = target_distribution(tree, 3)
  for name in ('rejection', 'block'):
    got = output_distribution(name, tree, 3)
    np.testing.assert_allclose([got.get(z, 0.0) for z in want], list(want.values()), atol=1e-5)


def test_greedy_verifier_reproduces_the_greedy_target():
  tree = Tree(4, 'low_temperature', seed=3)  # p is (numerically) one-hot: greedy target
  got, want = output_distribution('greedy', tree, 3), target_distribution(tree, 3)
  np.testing.assert_allclose([got.get(z, 0.0) for z in want], list(want.values()), atol=1e-5)


@settings(max_examples=25, deadline=None, derandomize=True)
@given(
  kind=st.sampled_from(['random', 'q_zero_where_p_positive', 'one_hot_q', 'top_k_top_p']),
  gamma=st.integers(1, 3),
  seed=st.integers(0, 2**31 - 1),
)
def test_block_accepts_at_least_as_many_as_token_level(kind, gamma, seed):
  tree = Tree(3, kind, seed)
  assert (
    expected_accepted('block', tree, gamma) >= expected_accepted('rejection', tree, gamma) - 1e-6
  )


def test_block_beats_token_level_on_the_papers_example():
  """Sun et al.: binary vocabulary, p = (1/3, 2/3), q = (2/3, 1/3), gamma 2: 10/9 vs 11/9."""
  tree = Tree(2, 'random', 0)
  tree.p = lambda prefix: np.array([1 / 3, 2 / 3])
  tree.q = lambda prefix: np.array([2 / 3, 1 / 3])
  assert expected_accepted('rejection', tree, 2) == pytest.approx(10 / 9, abs=1e-6)
  assert expected_accepted('block', tree, 2) == pytest.approx(11 / 9, abs=1e-6)


@pytest.mark.parametrize('name', ['rejection', 'block', 'greedy'])
def test_sampled_verification_follows_its_plan(name):
  """The random draw of (accepted, next) matches the plan's exact law (chi-square)."""
  from scipy import stats

  tree = Tree(3, 'random' if name != 'greedy' else 'low_temperature', seed=5)
  blocks, _, ps, qs = draft_blocks(tree, 2)
  n = 20000
  p = jnp.asarray(np.repeat(ps[:1], n, 0))
  q = jnp.asarray(np.repeat(qs[:1], n, 0))
  x = jnp.asarray(np.repeat(blocks[:1], n, 0))
  accepted, nxt = registry.VERIFIERS.get(name).verify(p, q, x, jax.random.key(0))
  plan = registry.VERIFIERS.get(name).plan(p[:1], q[:1], x[:1])
  law = (
    np.asarray(common.stop_distribution(plan), np.float64)[0][:, None]
    * np.asarray(plan.residuals, np.float64)[0]
  ).ravel()
  counts = np.bincount(np.asarray(accepted) * 3 + np.asarray(nxt), minlength=law.size)
  support = law > 1e-9
  assert counts[~support].sum() == 0
  if support.sum() > 1:
    expected = law[support] / law[support].sum() * counts[support].sum()
    assert stats.chisquare(counts[support], expected).pvalue > 1e-3


def test_unknown_verifier_lists_the_known_ones():
  with pytest.raises(ValueError, match=r"unknown verifier 'magic'.*block.*greedy.*rejection"):
    registry.VERIFIERS.get('magic')
