"""The CPU kernels (specjax/kernels): every instruction-set path equals XLA's product, the
measured dispatch keeps the faster path, and the library cache is keyed and checked."""

import contextlib
import json
import os
import subprocess
import sys
import time
import types
import warnings

import gguf
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from specjax import testing
from specjax.core import sampling
from specjax.decode.engine import Engine
from specjax.decode.method import Method
from specjax.drafters import ModelDrafter, truncated_target
from specjax.kernels import cpu
from specjax.models import llama, quant
from tests.test_quant import _reference as blocks_reference

# Every path this CPU runs: on an AVX-512 machine all three, on an AVX2 one two.
PATHS = [pytest.param(isa, id=isa) for isa in cpu.supported()]


def _reference(x, w, kind):
  x, w = np.asarray(x, np.float64), np.asarray(w, np.float64)
  return np.einsum('...k,nk->...n', x, w) if kind == 'nk' else x @ w


@pytest.fixture
def fresh(monkeypatch, tmp_path):
  """A kernel module state with its own cache folder (decisions, new libraries); the
  libraries already loaded stay loaded."""
  monkeypatch.setattr(
    cpu, '_state', {'libs': {k: v for k, v in cpu._state.get('libs', {}).items() if v}}
  )
  monkeypatch.setattr(cpu, '_cache_dir', lambda: tmp_path)
  monkeypatch.delenv('SPECJAX_CPU_ISA', raising=False)
  monkeypatch.delenv('SPECJAX_CPU_KERNELS', raising=False)
  monkeypatch.delenv('SPECJAX_CPU_FLOAT_KERNELS', raising=False)  # the default: every kind
  return tmp_path


@pytest.mark.parametrize('isa', PATHS)
@pytest.mark.parametrize('kind', ['nk', 'kn'])
@pytest.mark.parametrize(
  'x_shape,n',  # K = 576, 1000, 1536: the kn kernel's parts of 8, 4 and single rows
  [((1, 576), 1001), ((2, 576), 1536), ((1, 3, 40), 64), ((4, 16), 5), ((2, 2, 100), 37),
   ((5, 576), 192), ((9, 64), 200), ((33, 48), 70), ((3, 1000), 70), ((2, 1536), 576),
   ((7, 90), 9)],  # 7 rows: the nk tiles' last rows after a full tile; N = 9 with a tail
)  # fmt: skip
def test_every_path_equals_the_product(isa, kind, x_shape, n):
  assert cpu.library(isa) is not None, cpu.status()
  kx, kw = jax.random.split(jax.random.PRNGKey(sum(x_shape) + n))
  x = jax.random.normal(kx, x_shape)
  k = x_shape[-1]
  w = jax.random.normal(kw, (n, k) if kind == 'nk' else (k, n))
  got = np.asarray(jax.jit(lambda x, w: cpu._kernel(kind, isa, x, w))(x, w))
  want = _reference(x, w, kind)
  np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-4 * np.sqrt(k))
  # ... and as close to the exact product as XLA's own float32 product is.
  xla = np.asarray(cpu._xla_product(kind, x, w))
  assert np.abs(got - want).max() <= 4 * np.abs(xla - want).max() + 1e-5


@pytest.mark.parametrize(
  'm,n,k',  # row tiles of 6 (AVX-512) and 3 (AVX2), stretches of 64 / 32 columns and tails
  [(9, 219, 576), (13, 219, 100), (7, 1536, 576), (2, 576, 1536), (64, 200, 48), (3, 37, 1000)],
)
def test_kn_rows_are_summed_alike_on_every_path(m, n, k):
  """The kn kernel's sums are one FMA chain over k per output: a row's result does not
  depend on the other rows, nor on the path (so several rows, the one-row path and the
  scalar build agree bitwise)."""
  x = jax.random.normal(jax.random.PRNGKey(m + n), (m, k))
  w = jax.random.normal(jax.random.PRNGKey(k), (k, n))
  run = jax.jit(lambda x, w, isa: cpu._kernel('kn', isa, x, w), static_argnums=2)
  want = None
  for isa in cpu.supported():
    assert cpu.library(isa) is not None, cpu.status()
    got = np.asarray(run(x, w, isa))
    want = got if want is None else want
    np.testing.assert_array_equal(got, want, err_msg=isa)
    one = np.concatenate([np.asarray(run(x[i : i + 1], w, isa)) for i in range(m)])
    np.testing.assert_array_equal(one, want, err_msg=f'{isa}, one row at a time')


def _block_weight(fmt, w):
  if fmt == 'q8_0':
    return quant.quantize_q8_0(w, transposed=False)
  data = gguf.quants.quantize(w, gguf.GGMLQuantizationType.Q4_1)
  return quant.from_gguf(data, fmt, w.shape[1], False)


@pytest.mark.parametrize('isa', PATHS)
@pytest.mark.parametrize('fmt', ['q4_1', 'q8_0'])
@pytest.mark.parametrize('rows', [1, 2, 3, 5, 9])
@pytest.mark.parametrize('k', [96, 1120])  # 3 blocks a row; 35: four runs of eight, a pair, one
def test_every_block_path_is_the_product_with_rounded_activations(isa, fmt, rows, k):
  assert cpu.library(isa) is not None, cpu.status()
  rng = np.random.default_rng(rows)
  bw = _block_weight(fmt, rng.normal(size=(38, k)).astype(np.float32))  # 38 rows: tiles, a tail
  x = jnp.asarray(rng.normal(size=(rows, k)).astype(np.float32))
  got = np.asarray(jax.jit(lambda x, *w: cpu._call(fmt, isa, x, *w))(x, bw.qs, bw.d, bw.m))
  np.testing.assert_allclose(got, blocks_reference(x, bw), rtol=1e-5, atol=1e-4)


@pytest.mark.parametrize('rows', [1, 2, 3, 5, 9])
@pytest.mark.parametrize('k', [96, 1120])
def test_q4_1_in_groups_of_8_rows_is_the_same_product_on_every_path(rows, k):
  """interleave_rows8's layout on its own kernel ('q4_1r8'): the product with rounded
  activations, as the weights in row order give it; bitwise the same on every path and for
  a row of x alone (integer dots are exact, each row's sum runs block by block in order);
  its XLA fallback and expand_rows read the layout back."""
  rng = np.random.default_rng(rows + k)
  emb = _block_weight('q4_1', rng.normal(size=(40, k)).astype(np.float32))  # 5 groups
  assert quant.interleave_rows8(emb) is emb  # an embedding's rows stay in order
  plain = emb.replace(transposed=True)  # a layer weight
  bw = quant.interleave_rows8(plain)
  assert bw.rows8 and bw.kind == 'q4_1r8' and not np.array_equal(bw.qs, plain.qs)
  np.testing.assert_array_equal(bw.expand_rows(), plain.expand_rows())
  x = jnp.asarray(rng.normal(size=(rows, k)).astype(np.float32))
  want = blocks_reference(x, plain)
  run = jax.jit(lambda x, isa, *w: cpu._call('q4_1r8', isa, x, *w), static_argnums=1)
  first = None
  for isa in cpu.supported():
    assert cpu.library(isa) is not None, cpu.status()
    got = np.asarray(run(x, isa, bw.qs, bw.d, bw.m))
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-4, err_msg=isa)
    first = got if first is None else first
    np.testing.assert_array_equal(got, first, err_msg=isa)
    alone = np.concatenate(
      [np.asarray(run(x[i : i + 1], isa, bw.qs, bw.d, bw.m)) for i in range(rows)]
    )
    np.testing.assert_array_equal(alone, got, err_msg=f'{isa}, one row at a time')
  xla = cpu._xla_product('q4_1r8', x, bw.qs, bw.d, bw.m)
  np.testing.assert_allclose(xla, cpu._xla_product('q4_1', x, plain.qs, plain.d, plain.m))
  assert quant.interleave_rows8(bw) is bw  # once only
  odd = _block_weight('q4_1', rng.normal(size=(12, 96)).astype(np.float32))
  odd = odd.replace(transposed=True)
  assert quant.interleave_rows8(odd) is odd  # 12 rows: not whole groups, left in row order


@pytest.mark.parametrize('fmt', ['q4_1', 'q8_0'])
@pytest.mark.parametrize('k', [256, 1056, 1600])
def test_a_block_products_row_does_not_depend_on_the_call(fmt, k):
  """Each row of x is rounded and summed alone (runs of eight blocks, pairs, single
  blocks, in a fixed order): on each path a row's result is bitwise the same alone as with
  other rows, in any tile."""
  rng = np.random.default_rng(k)
  bw = _block_weight(fmt, rng.normal(size=(44, k)).astype(np.float32))
  x = jnp.asarray(rng.normal(size=(9, k)).astype(np.float32) * 3)
  run = jax.jit(lambda x, isa, *w: cpu._call(fmt, isa, x, *w), static_argnums=1)
  for isa in cpu.supported():
    assert cpu.library(isa) is not None, cpu.status()
    together = np.asarray(run(x, isa, bw.qs, bw.d, bw.m))
    alone = np.concatenate(
      [np.asarray(run(x[i : i + 1], isa, bw.qs, bw.d, bw.m)) for i in range(9)]
    )
    np.testing.assert_array_equal(alone, together, err_msg=isa)
    for m in (2, 5):
      part = np.asarray(run(x[:m], isa, bw.qs, bw.d, bw.m))
      np.testing.assert_array_equal(part, together[:m], err_msg=f'{isa}, {m} rows')


@pytest.mark.parametrize('isa', PATHS)
def test_gradients_and_vmap_match_xla(isa):
  assert cpu.library(isa) is not None  # built and registered, whichever test ran first
  kx, kw = jax.random.split(jax.random.PRNGKey(0))
  x, w = jax.random.normal(kx, (3, 48)), jax.random.normal(kw, (20, 48))
  kernel = lambda x, w: cpu._kernel('nk', isa, x, w)
  loss = lambda f: lambda x, w: jnp.sum(jnp.sin(f(x, w)))
  got = jax.grad(loss(kernel), argnums=(0, 1))(x, w)
  want = jax.grad(loss(lambda x, w: cpu._xla_product('nk', x, w)), argnums=(0, 1))(x, w)
  for g, r in zip(got, want):
    np.testing.assert_allclose(g, r, rtol=1e-4, atol=1e-4)
  xs = jax.random.normal(kx, (5, 2, 48))
  np.testing.assert_allclose(
    jax.vmap(kernel, in_axes=(0, None))(xs, w), _reference(xs, w, 'nk'), rtol=1e-4, atol=1e-3
  )


def test_dispatch_keeps_the_faster_path_by_measurement(fresh, monkeypatch):
  isa = cpu.supported()[0]
  if isa == 'scalar':
    pytest.skip('no vector path on this CPU: auto dispatch never considers scalar')
  timings = {}
  monkeypatch.setattr(cpu, '_time_both', lambda kernel, xla, args: timings['next'])
  timings['next'] = (1e-4, 2e-4)  # the kernel is faster
  assert cpu.path('kn', 1536, 576, 2) == isa
  timings['next'] = (3e-4, 2e-4)  # XLA is faster
  assert cpu.path('kn', 1536, 576, 3) is None
  timings['next'] = (1.9e-4, 2e-4)  # a near-tie (within cpu.MARGIN) keeps XLA
  assert cpu.path('nk', 4096, 576, 1) is None
  # Decisions are kept on disk beside the library and read back without timing again.
  saved = json.loads(next(fresh.glob('dispatch-*.json')).read_text())
  assert saved['kn 1536x576 rows<=2']['use'] == isa and saved['kn 1536x576 rows<=3']['use'] == 'xla'
  cpu._state['decisions'] = {}  # a new process
  monkeypatch.setattr(cpu, '_time_both', lambda *a: pytest.fail('timed a decided product'))
  assert cpu.path('kn', 1536, 576, 2) == isa and cpu.path('kn', 1536, 576, 3) is None
  assert set(cpu.decisions()) >= {'kn 1536x576 rows<=2', 'kn 1536x576 rows<=3'}
  timings['next'] = (1e-4, 2e-4)
  monkeypatch.setattr(cpu, '_time_both', lambda kernel, xla, args: timings['next'])
  assert cpu.path('kn', 1536, 576, 7) == isa and 'kn 1536x576 rows<=9' in cpu.decisions()
  # SPECJAX_CPU_FLOAT_KERNELS=0: float32 products stay with XLA untimed.
  monkeypatch.setenv('SPECJAX_CPU_FLOAT_KERNELS', '0')
  assert cpu.path('kn', 1536, 576, 2) is None and cpu.path('nk', 8192, 576, 2) is None
  assert cpu.path('q4_1', 1536, 576, 2) == isa
  monkeypatch.delenv('SPECJAX_CPU_FLOAT_KERNELS')
  # Tiny products and long prefills stay with XLA without timing.
  assert cpu.path('kn', 64, 96, 2) is None and cpu.path('kn', 1536, 576, 65) is None
  # auto:avx2 on an AVX-512 machine: dispatch as an AVX2 machine's, its own decisions.
  if 'avx2' in cpu.supported():
    monkeypatch.setenv('SPECJAX_CPU_ISA', 'auto:avx2')
    assert cpu.path('kn', 1536, 576, 5) == 'avx2' and len(list(fresh.glob('dispatch-*avx2*'))) == 1


def test_dispatch_times_real_calls_while_a_forward_is_traced(fresh, monkeypatch):
  isa = cpu.supported()[0]
  if isa == 'scalar':
    pytest.skip('no vector path on this CPU: auto dispatch never considers scalar')
  staged = []

  def timer(kernel, xla, args):  # a traced array here would mean nothing ran
    staged.append(isinstance(kernel(*args), jax.core.Tracer))
    return 1e-4, 2e-4

  monkeypatch.setattr(cpu, '_time_both', timer)
  w = jnp.ones((576, 1536), jnp.float32)
  jax.jit(lambda x: cpu.dense_product(x, w)).lower(jnp.ones((2, 576), jnp.float32))
  assert staged == [False]


def _jaxpr(fn, *args) -> str:
  """`fn` traced afresh (jax caches traces by function, and a kernel path is decided when
  a product is traced)."""
  return str(jax.make_jaxpr(lambda *a: fn(*a))(*args))


def _product_calls(fn, *args) -> int:
  """How many kernel (FFI) calls the traced `fn` makes."""
  return _jaxpr(fn, *args).count('ffi_call')


def test_a_forward_takes_the_policy_its_whole_forward_ran_fastest_with(fresh, monkeypatch):
  from specjax.bench import costs  # noqa: PLC0415

  policies = cpu.policies()
  if len(policies) < 3:
    pytest.skip('no vector path on this CPU: nothing to choose')
  assert policies[0] == 'auto' and policies[-1] == 'xla' and 'scalar' not in policies
  # Products large enough for a kernel (d_model * ffn_dim >= MIN_WEIGHTS).
  cfg, params = testing.tiny_model(seed=2, n_layers=1, d_model=256, ffn_dim=512, n_heads=4,
                                   head_dim=64, vocab_size=300)  # fmt: skip
  monkeypatch.setattr(cpu, '_time_both', lambda kernel, xla, args: (1e-4, 2e-4))  # 'auto'
  fake = {'t': {}}

  def fastest(pieces, repeats=5):  # whole forwards: the last ISA wins at 1 row, XLA at 2
    fake['t'] = {k: (1.0 if k[1] == (policies[-2] if k[0] == 1 else 'xla') else 2.0)
                 for k in pieces}  # fmt: skip
    return fake['t']

  monkeypatch.setattr(costs, 'fastest', fastest)
  out = costs.tune_forwards(params, cfg, 1, (1, 2), cache_size=32)
  assert {r: out[r]['use'] for r in out} == {1: policies[-2], 2: 'xla'}
  assert set(fake['t']) == {(r, p) for r in (1, 2) for p in policies}  # every policy timed
  assert out[1]['products'] and all('rows<=1' in k for k in out[1]['products'])

  # The forwards traced from now on take the chosen paths, product by product.
  def forward(p, t):  # a new function per trace: make_jaxpr caches traces by function
    return llama.forward(p, t, llama.init_cache(cfg, 1, 32), cfg)[0]

  assert _product_calls(forward, params, jnp.ones((1, 1), jnp.int32)) >= len(out[1]['products'])
  assert _product_calls(forward, params, jnp.ones((1, 2), jnp.int32)) == 0
  for key in out[1]['products']:
    kind, shape, rows = key.split()
    n, k = map(int, shape.split('x'))
    assert cpu.path(kind, n, k, 1) == policies[-2]
  assert cpu.describe()['forwards'] and all(
    cpu.decisions()[k]['use'] == policies[-2] for k in out[1]['products']
  )
  # Recorded beside the libraries: a new process reuses the choice untimed.
  assert len(list(fresh.glob('forwards-*.json'))) == 1
  monkeypatch.setattr(cpu, '_state', {'libs': cpu._state['libs']})
  monkeypatch.setattr(costs, 'fastest', lambda *a, **k: pytest.fail('re-timed a tuned forward'))
  again = costs.tune_forwards(params, cfg, 1, (1, 2), cache_size=32)
  assert {r: again[r]['use'] for r in again} == {1: policies[-2], 2: 'xla'}
  assert cpu.path(kind, n, k, 1) == policies[-2]
  # Another model (other shapes or dtypes) is its own key; a tiny one has nothing to tune.
  assert costs.model_key(params) != costs.model_key(jax.tree.map(lambda x: x[..., :-1], params))
  small_cfg, small = testing.tiny_model(seed=2, n_layers=1)
  assert costs.tune_forwards(small, small_cfg, 1, (1,), cache_size=32) == {}
  with pytest.raises(ValueError, match='kernel policy'):
    with cpu.forcing('avx9'):
      pass
  # Under a forced policy every product takes it: none on XLA, the ISA's targets on it.
  x1 = jnp.ones((1, 1), jnp.int32)
  with cpu.forcing('xla'):
    assert _product_calls(forward, params, x1) == 0
  with cpu.forcing(policies[1]):
    assert f'_{policies[1]}' in _jaxpr(forward, params, x1)
  # The same products under another name (a layer-skip draft runs the target's own): the
  # first model's choice holds, and the second is not timed.
  assert costs.tune_forwards(params, cfg, 1, (1, 2), cache_size=32, name='draft') == {}
  assert cpu.path(kind, n, k, 1) == policies[-2]
  # A forced path (or kernels off) has nothing to choose among.
  monkeypatch.setenv('SPECJAX_CPU_ISA', policies[1])
  assert cpu.policies() == ()


def test_forward_choices_keep_near_ties_and_ignore_what_they_cannot_read(fresh, monkeypatch):
  policies = cpu.policies()
  if len(policies) < 3:
    pytest.skip('no vector path on this CPU: nothing to choose')
  near = {'auto': 10.0, policies[1]: 9.9, 'xla': 12.0}  # within FORWARD_MARGIN of auto
  assert cpu.tune('m', 1, near, ['kn 1536x576 rows<=1'])['use'] == 'auto'
  far = {'auto': 10.0, policies[1]: 9.0, 'xla': 12.0}
  assert cpu.tune('m', 2, far, ['kn 1536x576 rows<=2'])['use'] == policies[1]
  path = next(fresh.glob('forwards-*.json'))
  # Float kernels switched off: choices of their own (the recorded ones ran float kernels).
  monkeypatch.setenv('SPECJAX_CPU_FLOAT_KERNELS', '0')
  assert cpu._forwards_path() != path
  monkeypatch.delenv('SPECJAX_CPU_FLOAT_KERNELS')
  for junk in ('[]', 'null', '{"m": {"1": {"use": "avx9"}}, "n": 3}', '{"m": {"2": []}}'):
    path.write_text(junk)
    monkeypatch.setattr(cpu, '_state', {'libs': cpu._state['libs']})
    assert cpu.tuned('m', 1) is None and cpu.tuned('m', 2) is None


def test_the_load_of_other_processes_is_their_share_of_the_cpus(monkeypatch):
  # Scripted /proc readings: 2 CPUs at 100 ticks a second for 1 s are 200 ticks; the
  # machine was busy 150 of them, 50 of which this process's: others took 100, a half.
  readings = iter([(1000, 50), (1150, 100)])
  clock = iter([0.0, 1.0])
  monkeypatch.setattr(cpu, '_jiffies', lambda: next(readings))
  monkeypatch.setattr(cpu, 'time', types.SimpleNamespace(monotonic=lambda: next(clock)))
  monkeypatch.setattr(cpu.os, 'cpu_count', lambda: 2)
  monkeypatch.setattr(cpu.os, 'sysconf', lambda name: 100)
  with cpu.others_load() as load:
    pass
  assert load == [0.5]


def test_a_busy_sibling_process_is_seen():
  if cpu._jiffies() is None:
    pytest.skip('no /proc here')
  burner = subprocess.Popen([sys.executable, '-c', 'while True: pass'])
  try:
    time.sleep(0.5)  # started
    with cpu.others_load() as load:
      time.sleep(1.0)  # this process idle
  finally:
    burner.kill()
  assert load and load[0] >= 0.8 / os.cpu_count(), load  # one CPU of os.cpu_count()


def test_a_choice_timed_on_a_busy_machine_is_timed_again_once_it_is_quiet(fresh, monkeypatch):
  isa = cpu.supported()[0]
  if isa == 'scalar':
    pytest.skip('no vector path on this CPU: auto dispatch never considers scalar')
  calls, load = [], [0.6]

  def timing(kernel_s, xla_s):
    return lambda kernel, xla, args: (calls.append(1), (kernel_s, xla_s))[1]

  @contextlib.contextmanager
  def others():
    yield list(load)

  monkeypatch.setattr(cpu, 'others_load', others)
  monkeypatch.setattr(cpu, '_time_both', timing(3e-4, 2e-4))  # busy: XLA looks faster
  assert cpu.path('kn', 1536, 576, 2) is None and len(calls) == 1
  saved = lambda: json.loads(next(fresh.glob('dispatch-*.json')).read_text())
  assert saved()['kn 1536x576 rows<=2']['busy'] == 0.6
  new_process = lambda quiet: cpu._state.update(decisions={}, quiet=quiet, retimed=set())
  new_process(quiet=False)  # still busy: the choice holds, untimed
  assert cpu.path('kn', 1536, 576, 2) is None and len(calls) == 1
  new_process(quiet=True)  # quiet at first, busy again while timing: timed once, not again
  assert cpu.path('kn', 1536, 576, 2) is None and len(calls) == 2
  assert cpu.path('kn', 1536, 576, 2) is None and len(calls) == 2
  new_process(quiet=True)  # quiet now: timed again, and the quiet timing kept
  load[:] = [0.05]
  monkeypatch.setattr(cpu, '_time_both', timing(1e-4, 2e-4))
  assert cpu.path('kn', 1536, 576, 2) == isa and len(calls) == 3
  assert saved()['kn 1536x576 rows<=2']['busy'] == 0.05
  new_process(quiet=True)
  assert cpu.path('kn', 1536, 576, 2) == isa and len(calls) == 3
  # The same for a forward-level choice.
  policies = cpu.policies()
  ms = {'auto': 10.0, policies[1]: 9.0, 'xla': 12.0}
  assert cpu.tune('m', 1, ms, ['kn 1536x576 rows<=1'], busy=0.5)['busy'] == 0.5
  new_process(quiet=False)
  assert cpu.tuned('m', 1)['use'] == policies[1]
  new_process(quiet=True)
  assert cpu.tuned('m', 1) is None


def test_the_real_timer_times_both(fresh):
  if cpu.supported()[0] == 'scalar':
    pytest.skip('no vector path on this CPU')
  record = cpu.measure('kn', 1536, 576, 2, cpu.supported()[0])
  assert record['kernel_us'] > 0 and record['xla_us'] > 0


def test_a_forced_path_runs_everywhere_and_bad_switches_are_named(fresh, monkeypatch):
  monkeypatch.setenv('SPECJAX_CPU_ISA', 'scalar')
  monkeypatch.setattr(cpu, '_time_both', lambda *a: pytest.fail('a forced path is not timed'))
  assert cpu.path('kn', 64, 96, 2) == 'scalar' and cpu.path('nk', 10, 8, 1000) == 'scalar'
  monkeypatch.setenv('SPECJAX_CPU_ISA', 'xla')
  assert cpu.path('kn', 1536, 576, 2) is None and not cpu.load()
  monkeypatch.setenv('SPECJAX_CPU_ISA', 'avx3')
  with pytest.raises(ValueError, match="SPECJAX_CPU_ISA='avx3' is not one of auto, avx512"):
    cpu.path('kn', 1536, 576, 2)
  monkeypatch.setenv('SPECJAX_CPU_ISA', 'auto:xla')
  with pytest.raises(ValueError, match="SPECJAX_CPU_ISA='auto:xla' is not one of auto"):
    cpu.path('kn', 1536, 576, 2)
  monkeypatch.setenv('SPECJAX_CPU_ISA', 'avx512')
  monkeypatch.setattr(cpu, 'supported', lambda: ('avx2', 'scalar'))
  with pytest.raises(ValueError, match='SPECJAX_CPU_ISA=avx512 but this CPU .* lacks it'):
    cpu.path('kn', 1536, 576, 2)
  monkeypatch.setenv('SPECJAX_CPU_ISA', 'auto:avx512')
  with pytest.raises(ValueError, match='SPECJAX_CPU_ISA=auto:avx512: this CPU does not run'):
    cpu.path('kn', 1536, 576, 2)
  monkeypatch.delenv('SPECJAX_CPU_ISA')
  monkeypatch.setenv('SPECJAX_CPU_KERNELS', '0')
  assert cpu.requested() == 'xla' and cpu.path('nk', 49152, 576, 2) is None


def test_the_cache_key_follows_the_cpu_and_the_flags(monkeypatch):
  key = cpu.library_key('avx2')
  assert cpu.library_key('scalar') != key  # other compiler flags
  info = dict(cpu.cpu_info())
  monkeypatch.setattr(cpu, 'cpu_info', lambda: {**info, 'flags': [*info['flags'], 'avx512f']})
  assert cpu.library_key('avx2') != key  # another CPU's features
  monkeypatch.setattr(cpu, 'cpu_info', lambda: {**info, 'model': 'Another CPU'})
  assert cpu.library_key('avx2') != key


def test_a_tampered_library_is_rebuilt_not_loaded(fresh):
  built = cpu._compile('scalar')
  good = built.read_bytes()
  built.write_bytes(good[:-16] + b'\0' * 16)  # a corrupted or replaced file
  with pytest.warns(UserWarning, match='does not match its recorded hash: rebuilding'):
    again = cpu._compile('scalar')
  assert again == built and cpu._sha256(again) == again.with_suffix('.sha256').read_text().strip()
  with warnings.catch_warnings():
    warnings.simplefilter('error')
    assert cpu._compile('scalar') == built  # intact: loaded as it is


def test_a_missing_compiler_falls_back_to_xla_with_a_warning(fresh, monkeypatch):
  cpu._state.clear()
  monkeypatch.setenv('CXX', str(fresh / 'no-such-compiler'))
  with pytest.warns(UserWarning, match='unavailable, using XLA'):
    assert not cpu.load()
  assert 'no-such-compiler' in cpu.status()
  x, w = jnp.ones((2, 576)), jnp.ones((4096, 576))
  assert not cpu.applicable(x, w)
  np.testing.assert_allclose(cpu.rows_product(x, w), 576.0)


# The model on each path: cached == full, and speculative greedy == target greedy.


@pytest.mark.parametrize('isa', PATHS)
def test_the_model_on_each_path_equals_the_model_on_xla(isa, monkeypatch):
  cfg, params = testing.tiny_model(seed=1, n_layers=2)
  tokens = jnp.array([[5, 17, 59, 3, 42]])  # in the vocabulary (64): no NaN embedding
  want, _ = jax.jit(lambda p, t: llama.forward(p, t, llama.init_cache(cfg, 1, 16), cfg)[:2])(
    params, tokens
  )
  monkeypatch.setenv('SPECJAX_CPU_ISA', isa)
  monkeypatch.setattr(cpu, '_state', {})
  assert cpu.path('kn', cfg.d_model, cfg.d_model, 2) == isa  # forced: tiny products too
  _, cache = llama.forward(params, tokens[:, :2], llama.init_cache(cfg, 1, 16), cfg)[:2]
  rest, _ = llama.forward(params, tokens[:, 2:], cache, cfg)[:2]  # 3 rows on the kernels
  full, _ = llama.forward(params, tokens, llama.init_cache(cfg, 1, 16), cfg)[:2]
  np.testing.assert_allclose(full, want, rtol=1e-5, atol=2e-5)
  np.testing.assert_allclose(rest, want[:, 2:], rtol=1e-5, atol=2e-5)


@pytest.mark.parametrize('isa', PATHS)
def test_speculative_greedy_equals_target_greedy_on_each_path(isa, monkeypatch):
  monkeypatch.setenv('SPECJAX_CPU_ISA', isa)
  monkeypatch.setattr(cpu, '_state', {})
  cfg, params = testing.tiny_model(seed=3, n_layers=3)
  draft_cfg, draft_params = truncated_target(cfg, params, 1)
  engine = Engine(params, cfg, eos_id=-1, cache_size=64, drafter=ModelDrafter(draft_cfg),
                  draft_params=draft_params)  # fmt: skip
  prompts = [[3, 1, 4, 1, 5], [9, 2, 6, 5, 3, 5, 8, 9, 7], [7]]
  reference = engine.generate(prompts, max_new_tokens=16).tokens
  for gamma in (2, 4):
    assert (
      engine.generate(prompts, Method.chain(gamma, 'greedy'), max_new_tokens=16).tokens == reference
    )


@pytest.mark.parametrize('isa', PATHS)
def test_speculative_sampling_matches_the_target_on_each_path(isa, monkeypatch):
  from tests import test_speculative as spec  # noqa: PLC0415

  target = testing.tiny_model(seed=21, vocab_size=spec.VOCAB, n_layers=2, scale=0.3)
  draft = testing.tiny_model(seed=22, vocab_size=spec.VOCAB, n_layers=1, scale=0.3)
  sampling = spec.SamplingConfig(temperature=1.0)
  probs = spec.exact_continuations(*target, sampling)  # on XLA's products
  monkeypatch.setenv('SPECJAX_CPU_ISA', isa)
  monkeypatch.setattr(cpu, '_state', {})
  chosen = []
  real_path = cpu.path
  monkeypatch.setattr(cpu, 'path', lambda *a: chosen.append(real_path(*a)) or chosen[-1])
  samples = spec.sample_continuations((target, draft), sampling, 2, 'rejection')
  assert chosen and set(chosen) == {isa}  # traced here, every product on this path
  assert spec.chi_square_pvalue(samples, probs) > 1e-3


# ---- attention (cpu_attention.cc) --------------------------------------------------------


def _attention_case(b, t, n, g, s, h, mask, seed=0):
  rng = np.random.default_rng(seed)
  q = jnp.asarray(rng.standard_normal((b, t, n, h), np.float32))
  k = jnp.asarray(rng.standard_normal((b, g, s, h), np.float32))
  v = jnp.asarray(rng.standard_normal((b, g, s, h), np.float32))
  return q, k, v, jnp.asarray(np.broadcast_to(mask, (b, t, s)))


def _attention_cases():
  """(name, b, t, n, g, s, h, mask): causal caches, a query that sees nothing, sliding
  windows, a token tree's ancestors, GQA, odd H, and caches split into several spans."""
  rng = np.random.default_rng(1)
  slots = lambda s: np.arange(s)[None, None]
  causal = lambda t, s, start: slots(s) <= start + np.arange(t)[None, :, None]
  parents = (-1, 0, 0, 1, 2)  # a token tree of 5 nodes after a 40-token prompt
  tree = np.zeros((1, 5, 64), bool)
  tree[:, :, :40] = True
  for node in range(5):
    at = node
    while at >= 0:
      tree[0, node, 40 + at] = True
      at = parents[at]
  nothing = np.broadcast_to(causal(5, 37, 20), (2, 5, 37)).copy()
  nothing[1, 3] = False  # a padded query: sees no slot
  window = causal(3, 300, 250) & (slots(300) > 250 + np.arange(3)[None, :, None] - 64)
  return [
    ('one row, SmolLM2 heads', 1, 1, 9, 3, 512, 64, causal(1, 512, 300)),
    ('five rows, batch 2, one sees nothing', 2, 5, 6, 2, 37, 16, nothing),
    ('sliding window', 1, 3, 4, 1, 300, 32, window),
    ('token tree', 1, 5, 8, 2, 64, 24, tree),
    ('odd H, random mask', 3, 2, 3, 3, 129, 20, rng.random((3, 2, 129)) < 0.3),
    ('batch 2 over several spans', 2, 3, 2, 1, 300, 32, causal(3, 300, 200)),
  ]


@pytest.mark.parametrize('isa', PATHS)
@pytest.mark.parametrize('case', _attention_cases(), ids=lambda c: c[0])
def test_every_attention_path_equals_xlas_attention(isa, case):
  assert cpu.library(isa) is not None, cpu.status()
  _, b, t, n, g, s, h, mask = case
  q, k, v, m = _attention_case(b, t, n, g, s, h, mask)
  scale = h**-0.5
  got = np.asarray(jax.jit(lambda *a: cpu._attention_call(isa, scale, *a))(q, k, v, m))
  want = np.asarray(llama.xla_attention(q, k, v, m, scale))
  np.testing.assert_allclose(got, want, rtol=1e-5, atol=2e-6)
  # Scores spread past exp's range (weights that flush to 0 on every path); scores 40x
  # larger carry 40x the float32 rounding of the dot products.
  sharp = np.asarray(jax.jit(lambda *a: cpu._attention_call(isa, 40 * scale, *a))(q, k, v, m))
  np.testing.assert_allclose(sharp, llama.xla_attention(q, k, v, m, 40 * scale), atol=2e-4)
  # A NaN in a key a query sees makes that query's attention NaN, as in XLA, and only its.
  seen = np.argwhere(np.asarray(m)[0, 0])[0, 0]
  broken = jax.jit(lambda *a: cpu._attention_call(isa, scale, *a))(
    q, k.at[0, 0, seen, 0].set(jnp.nan), v, m
  )
  nan = np.isnan(np.asarray(broken)).any(axis=-1)
  assert nan[0, 0, : n // g].all() and not nan[0, :, n // g :].any() and not nan[1:].any()
  # A query's attention does not depend on the other queries of the call: the last one
  # alone gives the same bits as within all T (a 1-row step against a 5-row verification).
  last = jax.jit(lambda *a: cpu._attention_call(isa, scale, *a))(
    q[:, -1:], k, v, m[:, -1:]
  )  # fmt: skip
  np.testing.assert_array_equal(np.asarray(last), got[:, -1:])
  # ... nor on how far the other queries see (the first sees the fewest slots: fewer spans).
  first = jax.jit(lambda *a: cpu._attention_call(isa, scale, *a))(q[:, :1], k, v, m[:, :1])
  np.testing.assert_array_equal(np.asarray(first), got[:, :1])


@pytest.mark.parametrize('isa', PATHS)
def test_attention_gradients_and_vmap_match_xla(isa):
  assert cpu.library(isa) is not None
  mask = np.arange(40)[None, None] <= 30 + np.arange(2)[None, :, None]
  q, k, v, m = _attention_case(1, 2, 4, 2, 40, 16, mask)
  kernel = lambda q, k, v: cpu._attend(isa, 0.25, llama.xla_attention, q, k, v, m)
  xla = lambda q, k, v: llama.xla_attention(q, k, v, m, 0.25)
  loss = lambda f: lambda *a: jnp.sum(jnp.sin(f(*a)))
  got = jax.grad(loss(kernel), argnums=(0, 1, 2))(q, k, v)
  want = jax.grad(loss(xla), argnums=(0, 1, 2))(q, k, v)
  for a, b in zip(got, want):
    np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5)
  qs = jnp.stack([q, 2 * q])
  np.testing.assert_allclose(
    jax.vmap(kernel, in_axes=(0, None, None))(qs, k, v),
    jax.vmap(xla, in_axes=(0, None, None))(qs, k, v),
    rtol=1e-5, atol=2e-6,
  )  # fmt: skip


def test_attention_dispatch_is_measured_and_forced(fresh, monkeypatch):
  isa = cpu.supported()[0]
  if isa == 'scalar':
    pytest.skip('no vector path on this CPU: auto dispatch never considers scalar')
  mask = np.arange(512)[None, None] <= 300
  q, k, v, m = _attention_case(1, 1, 9, 3, 512, 64, mask)
  attend = lambda q, k, v, m: llama.attention(q, k, v, m)
  timings, real_timer = {'next': (1e-4, 2e-4)}, cpu._time_both
  monkeypatch.setattr(cpu, '_time_both', lambda kernel, xla, args: timings['next'])
  assert 'specjax_attention' in _jaxpr(attend, q, k, v, m)  # the kernel was faster
  assert cpu.decisions()['attn 3x512x64 r3 b1 t<=1']['use'] == isa
  timings['next'] = (3e-4, 2e-4)
  assert 'specjax_attention' not in _jaxpr(attend, q, k[:, :, :400], v[:, :, :400], m[..., :400])
  # A tiny cache stays with XLA untimed; a whole-forward policy overrides the measurement.
  monkeypatch.setattr(cpu, '_time_both', lambda *a: pytest.fail('timed a tiny cache'))
  assert 'ffi_call' not in _jaxpr(
    attend, q[..., :16], k[:, :, :8, :16], v[:, :, :8, :16], m[..., :8]
  )
  # A whole-forward policy being timed takes attention along, but no forward owns it: the
  # target and its quantized draft attend over caches of one shape, and keep its own path.
  with cpu.forcing('xla') as seen:
    assert 'specjax_attention' not in _jaxpr(attend, q, k, v, m)
  assert not seen
  cpu._state['chosen'] = {'attn 3x512x64 r3 b1 t<=1': ('target', 'xla')}
  assert 'specjax_attention' in _jaxpr(attend, q, k, v, m)
  # The real timer runs both on this machine.
  monkeypatch.setattr(cpu, '_time_both', real_timer)
  timed = cpu.measure_attention(2, 2, 3, 256, 64, 3, isa, llama.xla_attention)
  assert timed['kernel_us'] > 0 and timed['xla_us'] > 0


def test_attention_splits_any_cache_over_many_threads():
  """With 64 kernel threads a one-head cache of 4289 slots, all seen, is split into 34
  spans (an earlier split that let a span start past the cache's end crashed there)."""
  import subprocess  # noqa: PLC0415
  import sys  # noqa: PLC0415

  isa = next(i for i in cpu.supported() if i != 'scalar') if len(cpu.supported()) > 1 else 'scalar'
  code = (
    'import jax, numpy as np\n'
    'from specjax.kernels import cpu\n'
    'from specjax.models import llama\n'
    'from tests.test_kernels import _attention_case\n'
    f'assert cpu.library({isa!r}) is not None\n'
    'for s in (4289, 4353, 130, 64, 1):\n'
    '  q, k, v, m = _attention_case(1, 2, 2, 1, s, 16, np.ones((1, 2, s), bool))\n'
    f'  got = cpu._attention_call({isa!r}, 0.25, q, k, v, m)\n'
    '  np.testing.assert_allclose(got, llama.xla_attention(q, k, v, m, 0.25), atol=1e-5)\n'
    'print("ok")\n'
  )
  env = {**__import__('os').environ, 'SPECJAX_KERNEL_THREADS': '64'}
  done = subprocess.run([sys.executable, '-c', code], capture_output=True, text=True, env=env)
  assert done.returncode == 0 and 'ok' in done.stdout, done.stderr[-2000:]


# Argmax over logits (sampling.argmax's kernel).


def _logit_rows():
  rng = np.random.default_rng(0)
  x = rng.normal(size=(8, 4099)).astype(np.float32)  # vector runs and a tail
  x[1, [5, 4000]] = 9.0  # a tie: the first index
  x[2, :] = -np.inf  # nothing but -inf: index 0
  x[3, 17] = np.nan  # a NaN: the first NaN's index, as jnp.argmax gives
  x[4, :] = 0.0
  x[4, :3] = -0.0  # zeros of both signs: equal, so the first
  x[5, -1] = 50.0  # the largest in the tail
  x[6, 4096] = np.inf
  x[7, 1000:1010] = np.nan  # NaN alone in a vector run
  x[0, 4097] = np.nan  # a NaN in the tail past the last vector
  return x


@pytest.mark.parametrize('isa', PATHS)
def test_every_argmax_path_is_the_first_largest_index(isa):
  assert cpu.library(isa) is not None, cpu.status()
  x = _logit_rows()
  got = np.asarray(jax.jit(lambda x: cpu._argmax_call(isa, x))(x))
  np.testing.assert_array_equal(got, np.asarray(sampling._xla_argmax(jnp.asarray(x))))
  np.testing.assert_array_equal(got, np.argmax(x, -1))
  np.testing.assert_array_equal(got, np.asarray(jnp.argmax(x, -1)))
  assert (got[0], got[3], got[4], got[7]) == (4097, 17, 0, 1000)
  for n in (1, 7, 17, 31, 33):  # rows shorter than a vector or two: the scalar tail alone
    short = x[:, :n]
    np.testing.assert_array_equal(np.asarray(cpu._argmax_call(isa, short)), np.argmax(short, -1))
  # Any leading shape, and under vmap.
  x3 = x[:6].reshape(2, 3, -1)
  np.testing.assert_array_equal(np.asarray(cpu._argmax_call(isa, x3)), got[:6].reshape(2, 3))
  mapped = jax.vmap(lambda r: cpu._argmax_call(isa, r))(jnp.asarray(x))
  np.testing.assert_array_equal(np.asarray(mapped), got)


def test_sampling_argmax_takes_the_kernel_where_it_measured_faster(fresh, monkeypatch):
  """Under measured dispatch sampling.argmax times the kernel against XLA's once and keeps
  the faster; a forced path runs the kernel; short rows stay with XLA."""
  timed = []

  def fake(rows, v, isa, reference):
    timed.append((rows, v, isa))
    return {'kernel_us': 5.0, 'xla_us': 100.0}

  monkeypatch.setattr(cpu, 'measure_argmax', fake)
  x = jnp.asarray(_logit_rows()[:2])
  want = np.asarray(sampling._xla_argmax(x))
  find = jax.jit(sampling.argmax)
  np.testing.assert_array_equal(np.asarray(find(x)), want)
  assert timed == [(2, x.shape[1], cpu.best_isa())]
  assert cpu.decisions()[f'argmax {x.shape[1]} rows<=2']['use'] == cpu.best_isa()
  assert cpu.argmax(jnp.ones((2, 100)), sampling._xla_argmax) is None  # short: XLA
  monkeypatch.setenv('SPECJAX_CPU_ISA', 'scalar')
  hlo = jax.jit(lambda x: sampling.argmax(x)).lower(x).as_text()  # traced anew
  assert 'specjax_argmax_scalar' in hlo and 'specjax_argmax_avx' not in hlo
