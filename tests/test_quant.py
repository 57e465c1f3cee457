"""Block-quantized weights (models/quant.py), their 8-bit kernel, and the quantized self-draft."""

import gguf
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from specjax import registry
from specjax.decode.engine import Engine
from specjax.decode.method import Method
from specjax.drafters import model as model_drafters
from specjax.kernels import cpu as cpu_kernels
from specjax.models import llama, quant

CFG = llama.LlamaConfig(
  vocab_size=300, d_model=64, n_layers=2, n_heads=4, n_kv_heads=2, head_dim=16, ffn_dim=96
)


@pytest.mark.parametrize('fmt', ['q4_1', 'q8_0'])
def test_blocks_expand_to_what_gguf_dequantises(fmt):
  """from_gguf reads llama.cpp's own bytes; expanding them equals gguf's dequantize."""
  kind = gguf.GGMLQuantizationType[fmt.upper()]
  w = np.random.default_rng(0).normal(size=(12, 96)).astype(np.float32)
  data = gguf.quants.quantize(w, kind)  # uint8 [12, bytes per row]
  want = gguf.quants.dequantize(data, kind)
  order = np.array([3, 0, 1, 2, 7, 4, 5, 6, 11, 8, 9, 10])
  got = quant.from_gguf(data, fmt, 96, transposed=False, row_order=order)
  np.testing.assert_array_equal(np.asarray(got.expand_rows()), want[order])
  assert got.shape == (12, 96) and quant.from_gguf(data, fmt, 96, transposed=True).shape == (96, 12)


def _reference(x, w: quant.BlockWeight):
  """The kernel's arithmetic in numpy: x rounded per block of 32 to int8 (half to even),
  exact integer block dots, the float16 scales; the q4_1 offsets times the exact block sums."""
  x = np.asarray(x, np.float64).reshape(-1, x.shape[-1])
  blocks = x.reshape(x.shape[0], -1, 32)
  dx = np.abs(blocks).max(-1) / 127
  qx = np.round(blocks / np.where(dx > 0, dx, 1)[..., None])
  q = np.asarray(w.expand_rows(), np.float64).reshape(w.qs.shape[0], -1, 32)
  q = (q - np.asarray(w.m)[..., None]) / np.where(np.asarray(w.d) > 0, w.d, 1)[..., None]
  dots = np.einsum('mbj,nbj->mnb', qx, np.round(q))
  y = np.einsum('mnb,nb,mb->mn', dots, np.asarray(w.d, np.float64), dx)
  return y + np.einsum('nb,mb->mn', np.asarray(w.m, np.float64), blocks.sum(-1))


@pytest.mark.parametrize('fmt', ['q4_1', 'q8_0'])
@pytest.mark.parametrize('rows', [1, 3, 4, 9])
def test_the_kernel_is_the_product_with_rounded_activations(fmt, rows, monkeypatch):
  monkeypatch.setenv('SPECJAX_CPU_ISA', cpu_kernels.supported()[0])  # the best path, untimed
  monkeypatch.setattr(cpu_kernels, '_state', {})
  rng = np.random.default_rng(rows)
  # 39 rows: tiles of 4 (AVX2: 2) and a scalar tail of 3 (AVX2: 1); K = 96: a pair of q4_1
  # blocks and one more
  w = rng.normal(size=(39, 96)).astype(np.float32)
  if fmt == 'q8_0':
    bw = quant.quantize_q8_0(w, transposed=False)
  else:
    bw = quant.from_gguf(gguf.quants.quantize(w, gguf.GGMLQuantizationType.Q4_1), fmt, 96, False)
  x = jnp.asarray(rng.normal(size=(rows, 96)).astype(np.float32))
  assert quant.kernel_applies(x, bw)
  got = np.asarray(jax.jit(quant.dense_rows)(x, jax.device_put(bw)))
  np.testing.assert_allclose(got, _reference(x, bw), rtol=1e-5, atol=1e-4)
  # ... and within the activations' rounding of the float32 product.
  exact = np.asarray(x) @ np.asarray(bw.expand_rows()).T
  assert np.abs(got - exact).max() < 0.02 * np.abs(exact).max()


def test_blocks_with_float32_scales_are_expanded_not_handed_to_the_kernel(monkeypatch):
  """The kernels read float16 scales, as GGUF stores them; a BlockWeight built with float32
  ones is multiplied through XLA's expansion (exactly), not passed as the wrong type."""
  monkeypatch.setenv('SPECJAX_CPU_ISA', cpu_kernels.supported()[0])  # a kernel would run
  monkeypatch.setattr(cpu_kernels, '_state', {})
  rng = np.random.default_rng(2)
  bw = quant.quantize_q8_0(rng.normal(size=(39, 96)).astype(np.float32), transposed=False)
  wide = bw.replace(d=bw.d.astype(np.float32), m=bw.m.astype(np.float32))
  x = jnp.asarray(rng.normal(size=(3, 96)).astype(np.float32))
  assert quant.kernel_applies(x, bw) and not quant.kernel_applies(x, wide)
  want = np.asarray(x) @ np.asarray(bw.expand_rows()).T
  np.testing.assert_allclose(jax.jit(quant.dense_rows)(x, wide), want, rtol=1e-5, atol=1e-5)


def test_without_the_kernel_weights_are_expanded_exactly(monkeypatch):
  bw = quant.quantize_q8_0(np.random.default_rng(1).normal(size=(64, 40)).astype(np.float32))
  monkeypatch.setenv('SPECJAX_CPU_ISA', 'xla')
  monkeypatch.setattr(cpu_kernels, '_state', {})
  assert not quant.kernel_applies(jnp.ones((2, 64)), bw)
  x = jnp.ones((2, 64))
  np.testing.assert_allclose(quant.dense(x, bw), np.asarray(x) @ np.asarray(bw.expand()), rtol=1e-6)
  with pytest.raises(ValueError, match='dense_rows'):
    quant.dense(x, quant.quantize_q8_0(np.ones((40, 64), np.float32), transposed=False))


def test_q8_0_rounding_is_close_and_the_tree_checks():
  params = llama.init_params(CFG, jax.random.PRNGKey(0), scale=0.2)
  q = quant.quantize_params(params)
  CFG.family.check_params(CFG, q)  # BlockWeights stand for arrays of the same shapes
  for got, want in zip(
    jax.tree_util.tree_leaves(q, is_leaf=quant.is_block), jax.tree_util.tree_leaves(params)
  ):
    got = got.expand() if quant.is_block(got) else got
    np.testing.assert_allclose(got, want, atol=float(np.abs(want).max()) / 200)
  assert quant.nbytes(q) < quant.nbytes(params) / 2.5


@pytest.mark.parametrize('path', ['kernel', 'xla'])
@pytest.mark.parametrize('tokens', [1, 3])
def test_fused_projections_give_the_same_logits(path, tokens, monkeypatch):
  isa = cpu_kernels.supported()[0] if path == 'kernel' else 'xla'
  monkeypatch.setenv('SPECJAX_CPU_ISA', isa)  # forced: the tiny products run the kernel
  monkeypatch.setattr(cpu_kernels, '_state', {})
  params = quant.quantize_params(llama.init_params(CFG, jax.random.PRNGKey(3), scale=0.2))
  params['layers'][1]['wk'] = params['layers'][1]['wk'].expand()  # one layer stays split
  fused = quant.fuse(params)
  assert set(fused['layers'][0]) >= {'wqkv', 'w_gate_up'} and 'wq' not in fused['layers'][0]
  assert 'wqkv' not in fused['layers'][1] and 'w_gate_up' in fused['layers'][1]
  assert quant.kernel_applies(jnp.ones((tokens, CFG.d_model)), fused['layers'][0]['wqkv']) == (
    path == 'kernel'
  )
  cache = llama.init_cache(CFG, 2, 16)
  ids = jnp.arange(2 * tokens).reshape(2, tokens) + 5
  run = jax.jit(lambda p: llama.forward(p, ids, cache, CFG)[:2])
  (want, want_cache), (got, got_cache) = run(params), run(fused)
  if path == 'kernel':  # each output row is the same integer dot, however many rows
    np.testing.assert_array_equal(got, want)
    np.testing.assert_array_equal(np.stack(got_cache.k), np.stack(want_cache.k))
  else:  # XLA's expanded product may sum a wider matrix in another order
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize('path', ['kernel', 'xla'])
@pytest.mark.parametrize('tokens', [1, 9])
def test_fused_float_projections_give_the_same_logits_and_check(path, tokens, monkeypatch):
  isa = cpu_kernels.supported()[0] if path == 'kernel' else 'xla'
  monkeypatch.setenv('SPECJAX_CPU_ISA', isa)
  monkeypatch.setattr(cpu_kernels, '_state', {})
  params = llama.init_params(CFG, jax.random.PRNGKey(4), scale=0.2)  # a float32 target's
  fused = CFG.family.fuse(params)
  assert quant.is_fused(fused) and not quant.is_fused(params)
  qkv = (CFG.n_heads + 2 * CFG.n_kv_heads) * CFG.head_dim
  assert fused['layers'][0]['wqkv'].shape == (CFG.d_model, qkv)
  assert 'w_gate' in fused['layers'][0] and 'w_gate_up' not in fused['layers'][0]
  assert CFG.family.fuse(fused)['layers'][0]['wqkv'] is fused['layers'][0]['wqkv']  # once
  CFG.family.check_params(CFG, fused)  # an engine's check takes either form
  cache = llama.init_cache(CFG, 2, 16)
  ids = jnp.arange(2 * tokens).reshape(2, tokens) % CFG.vocab_size
  run = jax.jit(lambda p: llama.forward(p, ids, cache, CFG)[:2])
  (want, want_cache), (got, got_cache) = run(params), run(fused)
  if path == 'kernel':  # the kn kernel's sums do not depend on the other columns
    np.testing.assert_array_equal(got, want)
    np.testing.assert_array_equal(np.stack(got_cache.v), np.stack(want_cache.v))
  else:
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
  bad = {**fused, 'layers': [dict(layer) for layer in fused['layers']]}
  bad['layers'][1]['wqkv'] = bad['layers'][1]['wqkv'][:, :-2]
  with pytest.raises(ValueError, match=r"'wqkv'\] has shape"):
    CFG.family.check_params(CFG, bad)


class _Tiny:
  """A LoadedModel-like tiny target (no GGUF source: the draft rounds to q8_0)."""

  cfg = CFG
  params = jax.tree_util.tree_map(
    np.asarray, llama.init_params(CFG, jax.random.PRNGKey(2), scale=0.3)
  )
  source = 'tiny'


@pytest.mark.parametrize('gamma', [1, 3])
def test_the_quantized_draft_keeps_greedy_output_and_is_accepted(gamma):
  drafter, draft_params = registry.build_draft('quantized', _Tiny)
  assert isinstance(drafter, model_drafters.QuantizedDrafter) and 'q8_0' in drafter.name
  engine = Engine(
    _Tiny.params, CFG, eos_id=-1, cache_size=64, drafter=drafter, draft_params=draft_params
  )
  prompts = [[5, 17, 99, 3], [7, 8, 9, 10, 11, 12, 13]]  # ragged
  reference = engine.generate(prompts, max_new_tokens=20).tokens
  out = engine.generate(prompts, Method.chain(gamma, 'greedy'), max_new_tokens=20)
  assert out.tokens == reference
  assert out.acceptance_rate > 0.5  # the same model, rounded


def test_bad_quantized_specs_are_named():
  with pytest.raises(ValueError, match='quantized:q8_0'):
    registry.build_draft('quantized:q5_k', _Tiny)
  with pytest.raises(ValueError, match='layout=rows keeps'):
    registry.build_draft('quantized:layout=columns', _Tiny)

  class Odd(_Tiny):  # d_model 48: not whole blocks of 32
    cfg = llama.LlamaConfig(
      vocab_size=50, d_model=48, n_layers=1, n_heads=2, n_kv_heads=1, head_dim=24, ffn_dim=64
    )
    params = jax.tree_util.tree_map(np.asarray, llama.init_params(cfg, jax.random.PRNGKey(0)))
    source = 'odd-model'

  with pytest.raises(
    ValueError, match='draft quantized: cannot quantize odd-model.*multiple of 32'
  ):
    registry.build_draft('quantized', Odd)


@pytest.mark.slow
def test_the_real_quantized_drafts_q4_1_layers_come_in_groups_of_8_rows(smollm2):
  """The registry's quantized draft holds its q4_1 layers in interleave_rows8's layout (the
  same weights: expanded, equal to the row-order ones); layout=rows keeps row order."""
  _, plain = registry.build_draft('quantized:layout=rows', smollm2)
  _, grouped = registry.build_draft('quantized', smollm2)
  leaves = lambda t: jax.tree_util.tree_leaves(t, is_leaf=quant.is_block)
  pairs = [(a, b) for a, b in zip(leaves(plain), leaves(grouped)) if quant.is_block(a)]
  assert sum(b.rows8 for _, b in pairs) == 4 * smollm2.cfg.n_layers  # qkv, o, gate|up, down
  assert not any(a.rows8 for a, _ in pairs)
  for a, b in pairs:
    assert b.rows8 == (a.fmt == 'q4_1')
    np.testing.assert_array_equal(np.asarray(b.expand()), np.asarray(a.expand()))


@pytest.mark.slow
def test_the_real_quantized_draft_holds_the_files_weights_exactly(smollm2):
  params, stored = model_drafters.quantized_params(smollm2)
  assert stored == ['q4_1', 'q8_0']
  blocks = jax.tree_util.tree_leaves_with_path(params, is_leaf=quant.is_block)
  full = dict(jax.tree_util.tree_leaves_with_path(smollm2.params))
  assert sum(quant.is_block(w) for _, w in blocks) == 1 + 7 * smollm2.cfg.n_layers
  for path, w in blocks:
    want = full[path]
    np.testing.assert_array_equal(np.asarray(w.expand()) if quant.is_block(w) else w, want)
