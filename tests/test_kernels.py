"""The CPU output-head kernel (specjax/kernels): equal to XLA's product, used where meant."""

import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from specjax import kernels
from specjax.kernels import cpu
from specjax.models import llama


def _reference(x, w):
  return np.einsum('...k,nk->...n', np.asarray(x, np.float64), np.asarray(w, np.float64))


@pytest.mark.parametrize(
  'x_shape,n',
  [((2, 576), 1001), ((1, 3, 40), 64), ((4, 16), 5), ((2, 2, 100), 37), ((4, 576), 4096)],
)
def test_the_kernel_equals_the_product(x_shape, n):
  kx, kw = jax.random.split(jax.random.PRNGKey(sum(x_shape) + n))
  x = jax.random.normal(kx, x_shape)
  w = jax.random.normal(kw, (n, x_shape[-1]))
  assert kernels.applicable(x, w), kernels.status()  # K % 16 != 0 and N % 4 != 0 included
  got = np.asarray(jax.jit(kernels.rows_product)(x, w))
  np.testing.assert_allclose(got, _reference(x, w), rtol=1e-5, atol=1e-4 * np.sqrt(x_shape[-1]))


def test_it_runs_only_for_two_to_four_rows():
  w = jnp.ones((8, 32))
  for rows, used in [(1, False), (2, True), (4, True), (5, False), (9, False)]:
    assert kernels.applicable(jnp.ones((rows, 32)), w) == used, rows
  assert not kernels.applicable(jnp.ones((2, 32), jnp.bfloat16), w.astype(jnp.bfloat16))


def test_gradients_and_vmap_match_xla():
  kx, kw = jax.random.split(jax.random.PRNGKey(0))
  x, w = jax.random.normal(kx, (3, 48)), jax.random.normal(kw, (20, 48))

  def loss(f):
    return lambda x, w: jnp.sum(jnp.sin(f(x, w)))

  got = jax.grad(loss(kernels.rows_product), argnums=(0, 1))(x, w)
  want = jax.grad(loss(cpu._xla), argnums=(0, 1))(x, w)
  for g, r in zip(got, want):
    np.testing.assert_allclose(g, r, rtol=1e-4, atol=1e-4)
  xs = jax.random.normal(kx, (5, 2, 48))
  np.testing.assert_allclose(
    jax.vmap(kernels.rows_product, in_axes=(0, None))(xs, w),
    _reference(xs, w),
    rtol=1e-4,
    atol=1e-3,
  )


def test_a_missing_compiler_falls_back_to_xla_with_a_warning(monkeypatch, tmp_path):
  monkeypatch.setattr(cpu, '_state', {})
  monkeypatch.setattr(cpu, '_cache_dir', lambda: tmp_path)
  monkeypatch.setenv('CXX', str(tmp_path / 'no-such-compiler'))
  with pytest.warns(UserWarning, match='unavailable, using XLA'):
    assert not cpu.load()
  assert 'no-such-compiler' in cpu.status()
  x, w = jnp.ones((2, 32)), jnp.ones((8, 32))
  assert not cpu.applicable(x, w)
  np.testing.assert_allclose(cpu.rows_product(x, w), 32.0)


def test_it_can_be_switched_off(monkeypatch):
  monkeypatch.setattr(cpu, '_state', {})
  monkeypatch.setenv('SPECJAX_CPU_KERNELS', '0')
  with warnings.catch_warnings():
    warnings.simplefilter('error')
    assert not cpu.load()
  assert 'SPECJAX_CPU_KERNELS=0' in cpu.status()


def test_the_model_head_with_the_kernel_equals_the_xla_head():
  """Two-token forwards (kernel head) and one-token steps (XLA head) agree position by position."""
  cfg = llama.LlamaConfig(
    vocab_size=300, d_model=64, n_layers=2, n_heads=4, n_kv_heads=2, head_dim=16, ffn_dim=96
  )
  params = llama.init_params(cfg, jax.random.PRNGKey(1), scale=0.2)
  tokens = jnp.array([[5, 17, 99]])
  cache = llama.init_cache(cfg, 1, 16)
  _, cache = llama.forward(params, tokens[:, :1], cache, cfg)
  both, _ = llama.forward(params, tokens[:, 1:], cache, cfg)  # 2 rows: the kernel
  assert kernels.applicable(jnp.ones((1, 2, 64)), params['embed'])
  one, cache1 = llama.forward(params, tokens[:, 1:2], cache, cfg)  # 1 row: XLA
  two, _ = llama.forward(params, tokens[:, 2:], cache1, cfg)
  np.testing.assert_allclose(both, jnp.concatenate([one, two], 1), rtol=1e-5, atol=2e-5)
