"""Logit warps: temperature, top-k and top-p keep exactly the tokens they should."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy import stats

from specjax.core.sampling import NEG_INF, SamplingConfig, probabilities, sample, warp_logits

LOGITS = jnp.log(jnp.array([[0.05, 0.4, 0.1, 0.3, 0.15]]))


def kept(sampling):
  return np.asarray(warp_logits(LOGITS, sampling)[0] > NEG_INF / 2)


def test_greedy_keeps_only_the_argmax():
  assert kept(SamplingConfig()).tolist() == [False, True, False, False, False]
  assert int(sample(LOGITS, jax.random.key(0), SamplingConfig())[0]) == 1


def test_top_k_keeps_the_k_largest():
  assert kept(SamplingConfig(1.0, top_k=2)).tolist() == [False, True, False, True, False]


def test_top_p_keeps_the_smallest_set_reaching_p():
  # sorted: 0.4, 0.3, 0.15, 0.1, 0.05 -> 0.4 + 0.3 = 0.7 < 0.75, so 0.15 joins.
  assert kept(SamplingConfig(1.0, top_p=0.75)).tolist() == [False, True, False, True, True]
  assert kept(SamplingConfig(1.0, top_p=0.7)).tolist() == [False, True, False, True, False]
  assert kept(SamplingConfig(1.0, top_p=0.01)).tolist() == [False, True, False, False, False]
  # Below float32's smallest number top_p rounds to 0: the top token still stays (it
  # kept none, and the softmax of nothing was uniform).
  assert kept(SamplingConfig(1.0, top_p=1e-50)).tolist() == [False, True, False, False, False]
  p = np.asarray(probabilities(LOGITS, SamplingConfig(1.0, top_p=1e-50))[0])
  np.testing.assert_array_equal(p, [0, 1, 0, 0, 0])


def test_the_smallest_temperature_stays_finite():
  # Near MIN_TEMPERATURE the warped distribution is one-hot, never NaN (1e-40 was).
  from specjax.core.sampling import MIN_TEMPERATURE

  big = LOGITS * 30  # logits up to ~90: / 1e-4 stays far below float32's largest
  p = np.asarray(probabilities(big, SamplingConfig(MIN_TEMPERATURE))[0])
  np.testing.assert_array_equal(p, [0, 1, 0, 0, 0])


def test_temperature_sharpens_and_renormalises():
  p = np.asarray(probabilities(LOGITS, SamplingConfig(0.5))[0])
  expected = np.array([0.05, 0.4, 0.1, 0.3, 0.15]) ** 2
  np.testing.assert_allclose(p, expected / expected.sum(), rtol=1e-5)


def test_samples_follow_the_warped_distribution():
  s = SamplingConfig(1.0, top_k=4)
  draws = sample(jnp.repeat(LOGITS, 20000, axis=0), jax.random.key(1), s)
  counts = np.bincount(np.asarray(draws), minlength=5)
  p = np.asarray(probabilities(LOGITS, s)[0], np.float64)[1:]
  assert counts[0] == 0
  assert stats.chisquare(counts[1:], p / p.sum() * counts.sum()).pvalue > 1e-3


@pytest.mark.parametrize(
  'kwargs,match',
  [
    ({'temperature': -1.0}, 'temperature'),
    ({'temperature': 1e-40}, r'temperature must be 0 \(greedy\) or in \[0.0001, inf\)'),
    ({'temperature': float('nan')}, 'temperature'),
    ({'temperature': float('inf')}, 'temperature'),
    ({'top_k': -2}, 'top_k'),
    ({'top_p': 0.0}, 'top_p'),
    ({'top_p': 1.5}, 'top_p'),
  ],
)
def test_invalid_settings_are_named(kwargs, match):
  with pytest.raises(ValueError, match=match):
    SamplingConfig(**kwargs)


def test_fast_argmax_is_argmax_with_first_index_on_ties():
  from specjax.core.sampling import argmax

  x = jax.random.normal(jax.random.key(3), (6, 1000))
  np.testing.assert_array_equal(argmax(x), jnp.argmax(x, -1))
  assert int(argmax(jnp.array([1.0, 3.0, 3.0, 2.0]))) == 1


def test_inverse_cdf_sampler_follows_probs_and_never_picks_zero_mass():
  from specjax.core.sampling import sample_probs

  p = jnp.array([0.0, 0.5, 0.0, 0.2, 0.3, 0.0])
  draws = sample_probs(jnp.tile(p, (40000, 1)), jax.random.key(2))
  counts = np.bincount(np.asarray(draws), minlength=6)
  assert counts[[0, 2, 5]].sum() == 0
  expected = np.array([0.5, 0.2, 0.3]) * counts.sum()
  assert stats.chisquare(counts[[1, 3, 4]], expected).pvalue > 1e-3
  unnormalised = sample_probs(jnp.tile(p * 7, (4, 1)), jax.random.key(2))
  np.testing.assert_array_equal(unnormalised, draws[:4])
