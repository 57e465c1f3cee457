"""A CPU kernel for the output head of short forwards, registered with JAX's FFI.

`rows_product(x, w)` is `x @ w.T` for a float32 matrix w[N, K] stored (out, in), as a
tied embedding used as the output head. On XLA:CPU, when x has `KERNEL_ROWS` rows
(the 2-4 new tokens of a short verification forward, or a batch of 2-4 one-token
steps), it runs `cpu_linear.cc`, which reads w once for all rows; everywhere else
(one row, more rows, other backends and dtypes) it is XLA's own product, which is as
fast or faster there (measured in experiments/step_profile; BENCHMARKS.md).

The kernel is compiled once per machine with the system C++ compiler (`$CXX`, else
`c++`) into `$SPECJAX_CACHE/kernels/` (about 2 s) the first time it is needed. If that
fails, or with SPECJAX_CPU_KERNELS=0, XLA's product is used throughout; `status()`
says which. Results differ from XLA's only in float32 rounding (the sums run in
another order): both are within the model's parity tolerance.
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import pathlib
import subprocess
import threading
import warnings

import jax
import jax.numpy as jnp

KERNEL_ROWS = (2, 4)  # the rows of x for which the kernel beats XLA (inclusive)
_SOURCES = tuple(pathlib.Path(__file__).with_name(n) for n in ('cpu_linear.cc', 'cpu_blocks.cc'))
_TARGET = 'specjax_linear_nk'
BLOCK_TARGETS = {'q4_1': 'specjax_blocks_q4_1', 'q8_0': 'specjax_blocks_q8_0'}
MAX_BLOCK_ROWS = 64  # kMaxRows in cpu_blocks.cc
_lock = threading.Lock()
_state: dict = {}


def _cache_dir() -> pathlib.Path:
  root = os.environ.get('SPECJAX_CACHE') or os.path.join(
    os.path.expanduser('~'), '.cache', 'specjax'
  )
  return pathlib.Path(root) / 'kernels'


def _compile() -> pathlib.Path:
  """Builds the shared library (once per source, jaxlib and machine) and returns its path."""
  source = b''.join(f.read_bytes() for f in (*_SOURCES, _SOURCES[0].with_name('spin_pool.h')))
  flags = ['-O3', '-march=native', '-std=c++17', '-shared', '-fPIC', '-fno-math-errno', '-pthread']
  compiler = os.environ.get('CXX', 'c++')
  key = hashlib.sha256(
    b'\0'.join([source, jax.lib.__version__.encode(), ' '.join([compiler, *flags]).encode()])
    + os.uname().machine.encode()
    + os.uname().nodename.encode()
  ).hexdigest()[:16]
  out = _cache_dir() / f'specjax_cpu-{key}.so'
  if out.exists():
    return out
  out.parent.mkdir(parents=True, exist_ok=True)
  tmp = out.with_suffix(f'.{os.getpid()}.tmp')
  includes = [f'-I{jax.ffi.include_dir()}', f'-I{_SOURCES[0].parents[2]}']
  cmd = [compiler, *flags, *includes, *map(str, _SOURCES), '-o', str(tmp)]
  try:
    done = subprocess.run(cmd, capture_output=True, text=True)
  except OSError as e:
    raise RuntimeError(f'cannot run the C++ compiler {compiler!r}: {e}') from None
  if done.returncode:
    raise RuntimeError(f'{" ".join(cmd)} failed:\n{done.stderr[-2000:]}')
  os.replace(tmp, out)
  return out


def load() -> bool:
  """Compiles and registers the kernel once; True when it can be used."""
  with _lock:
    if 'ok' in _state:
      return _state['ok']
    if os.environ.get('SPECJAX_CPU_KERNELS', '1') == '0':
      _state.update(ok=False, why='disabled by SPECJAX_CPU_KERNELS=0')
      return False
    try:
      library = ctypes.cdll.LoadLibrary(str(_compile()))
      for target in (_TARGET, 'specjax_stream_sum', *BLOCK_TARGETS.values()):
        jax.ffi.register_ffi_target(
          target, jax.ffi.pycapsule(getattr(library, target)), platform='cpu'
        )
      _state.update(ok=True, why='compiled and registered', library=library)
    except Exception as e:  # noqa: BLE001 - any failure means: use XLA
      warnings.warn(f'specjax CPU kernel unavailable, using XLA: {e}', stacklevel=3)
      _state.update(ok=False, why=str(e))
    return _state['ok']


def status() -> str:
  """Whether the kernel is in use (and why not), after the first call that wanted it."""
  return _state.get('why', 'not loaded yet')


def applicable(x: jax.Array, w: jax.Array) -> bool:
  """Whether `rows_product` runs the kernel for these operands (decided at trace time)."""
  rows = 1
  for d in x.shape[:-1]:
    rows *= d
  return (
    KERNEL_ROWS[0] <= rows <= KERNEL_ROWS[1]
    and jax.default_backend() == 'cpu'
    and x.dtype == jnp.float32
    and w.dtype == jnp.float32
    and w.ndim == 2
    and load()
  )


def _xla(x: jax.Array, w: jax.Array) -> jax.Array:
  return jnp.einsum('...K,NK->...N', x, w)


@jax.custom_vjp
def _kernel(x: jax.Array, w: jax.Array) -> jax.Array:
  call = jax.ffi.ffi_call(
    _TARGET, jax.ShapeDtypeStruct((*x.shape[:-1], w.shape[0]), x.dtype), vmap_method='sequential'
  )
  return call(x, w)


def _kernel_fwd(x, w):
  return _kernel(x, w), (x, w)


def _kernel_bwd(residuals, g):
  return jax.vjp(_xla, *residuals)[1](g)


_kernel.defvjp(_kernel_fwd, _kernel_bwd)


def rows_product(x: jax.Array, w: jax.Array) -> jax.Array:
  """x[..., K] @ w[N, K].T, on the kernel where it is faster (see the module docstring)."""
  return _kernel(x, w) if applicable(x, w) else _xla(x, w)


def stream_sum(x: jax.Array) -> jax.Array:
  """sum(x) of a float32 array, read once by every kernel thread: the memory-bandwidth
  probe of experiments/step_profile (XLA's own reduction for comparison: jnp.sum)."""
  if not (jax.default_backend() == 'cpu' and x.dtype == jnp.float32 and load()):
    return jnp.sum(x, keepdims=True).reshape(1)
  call = jax.ffi.ffi_call('specjax_stream_sum', jax.ShapeDtypeStruct((1,), jnp.float32))
  return call(x.reshape(-1))
