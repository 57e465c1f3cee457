"""The DistillSpec divergences against direct numpy formulas, and their basic properties."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from specjax import registry
from specjax.train import divergences


def _random(seed, shape=(3, 5, 11), zeros=True):
  rng = np.random.default_rng(seed)
  p = rng.dirichlet(np.ones(shape[-1]) * 0.5, size=shape[:-1])
  if zeros:  # a teacher known on its top-k only
    p[..., : shape[-1] // 3] = 0
    p /= p.sum(-1, keepdims=True)
  logits = rng.normal(size=shape) * 2
  return p.astype(np.float32), logits.astype(np.float32)


def _reference(name, p, logits):
  q = np.exp(logits - logits.max(-1, keepdims=True))
  q /= q.sum(-1, keepdims=True)
  p, q = p.astype(np.float64), q.astype(np.float64)

  def kl(a, b):
    return np.sum(np.where(a > 0, a * np.log(np.where(a > 0, a, 1) / b), 0), -1)

  if name == 'forward_kl':
    return kl(p, q)
  if name == 'reverse_kl':
    s = divergences.REVERSE_KL_SMOOTHING
    return kl(q, (1 - s) * p + s / p.shape[-1])
  if name == 'jsd':
    m = (p + q) / 2
    return (kl(p, m) + kl(q, m)) / 2
  return np.abs(p - q).sum(-1) / 2


@pytest.mark.parametrize('name', registry.DIVERGENCES.names)
def test_matches_numpy(name):
  p, logits = _random(0)
  got = registry.DIVERGENCES.get(name)(jnp.asarray(p), jnp.asarray(logits))
  assert got.shape == p.shape[:-1]
  np.testing.assert_allclose(got, _reference(name, p, logits), rtol=2e-4, atol=1e-6)


@pytest.mark.parametrize('name', registry.DIVERGENCES.names)
def test_zero_at_the_teacher_and_positive_elsewhere(name):
  p, logits = _random(1, zeros=False)
  fn = registry.DIVERGENCES.get(name)
  np.testing.assert_allclose(fn(jnp.asarray(p), jnp.log(jnp.asarray(p))), 0, atol=2e-4)
  assert np.all(np.asarray(fn(jnp.asarray(p), jnp.asarray(logits))) > 0)


@pytest.mark.parametrize('name', registry.DIVERGENCES.names)
def test_gradients_are_finite_with_zeros_in_p(name):
  p, logits = _random(2)
  grad = jax.grad(lambda x: registry.DIVERGENCES.get(name)(jnp.asarray(p), x).sum())(
    jnp.asarray(logits)
  )
  assert np.all(np.isfinite(np.asarray(grad)))
  assert np.abs(np.asarray(grad)).sum() > 0


def test_bounds_and_symmetry():
  p, logits = _random(3, zeros=False)
  q = np.asarray(jax.nn.softmax(logits, -1))
  js = np.asarray(divergences.jsd(jnp.asarray(p), jnp.asarray(logits)))
  js_swapped = np.asarray(divergences.jsd(jnp.asarray(q), jnp.log(jnp.asarray(p))))
  np.testing.assert_allclose(js, js_swapped, rtol=1e-4)
  assert np.all(js <= np.log(2) + 1e-6)
  tv = np.asarray(divergences.tvd(jnp.asarray(p), jnp.asarray(logits)))
  assert np.all((tv >= 0) & (tv <= 1))
  np.testing.assert_allclose(tv, 1 - np.minimum(p, q).sum(-1), atol=1e-5)  # 1 - acceptance


def test_unknown_divergence():
  with pytest.raises(ValueError, match='unknown divergence'):
    registry.DIVERGENCES.get('kl')
