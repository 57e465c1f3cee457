"""CPU kernels for products of a few rows, registered with JAX's FFI, used only where they
beat XLA's own product on this machine.

Five products have a kernel (specjax/kernels/*.cc):

  kind     operands                            where the model uses it
  'nk'     x[..., K] @ w[N, K].T, float32       a tied embedding as the output head
  'kn'     x[..., K] @ w[K, N], float32         every layer weight (stored (in, out))
  'q4_1r8' x[..., K] @ W.T, W in q4_1 blocks,   a quantized self-draft's layers
           its rows in groups of 8              (models/quant.py interleave_rows8)
  'q4_1'   the same, W's rows in order          its layers with quantized:layout=rows
  'q8_0'   x[..., K] @ W.T, W in q8_0 blocks   its embedding head

and two more operations: attention over the KV cache ('attn', cpu_attention.cc) and the
argmax of logits ('argmax', sampling's greedy tokens), each measured against XLA's the
same way (`attention`, `argmax` below).

A forward of 1-9 new tokens (a plain step, a verification, a draft step) multiplies
each weight by that many rows; a kernel reads each weight once for all of them. The
sources are compiled once per machine and instruction set with the system C++ compiler
(`$CXX`, else `c++`) into `$SPECJAX_CACHE/kernels/` (a few seconds):

  'avx512'  AVX-512 (and VNNI where the CPU has it) 512-bit paths
  'avx2'    AVX2 + FMA 256-bit paths (int8 dots with maddubs/madd)
  'scalar'  plain C++, for exactness tests: never chosen unless forced

Which runs is decided by measurement: the first time a product of a shape and a row
count is traced, the kernel of the best instruction set this CPU has and XLA's product
are timed on it (interleaved, the median of a few calls each, every weight streamed from
memory as in a forward; row counts in buckets 1, 2, 3, 4-5, 6-9, 10-16, 17-32, 33-64,
timed at the largest) and the kernel is kept only if it is 10% faster (`MARGIN`: near-ties
go to XLA, whose thread pool runs the rest of the step); decisions are stored beside the
library, under a key of the CPU's model and features, the compiler flags and the sources
(`decisions()` lists them; removing the file measures them again).

Products timed one at a time do not add up to a forward, so a run (`specjax.run`, before
it compiles anything for decoding) also times each model's whole forward per row bucket
under every policy this CPU allows (`policies()`: the per-product choice above, each
vector ISA's kernels throughout, XLA throughout) and gives every product of that forward
the winner's path (`bench/costs.tune_forwards`, `tune`; stored beside the libraries and
reused, listed under 'forwards' in `describe()`). Code that builds an Engine itself keeps
the per-product choice unless it calls `tune_forwards`. Switches:

  SPECJAX_CPU_ISA=avx512|avx2|scalar   that path for every product it takes (no timing)
  SPECJAX_CPU_ISA=xla                  XLA's products throughout (as SPECJAX_CPU_KERNELS=0)
  SPECJAX_CPU_ISA=auto:avx2            measured dispatch with kernels no newer than AVX2:
                                       an AVX-512 machine runs what an AVX2 one would
  SPECJAX_CPU_FLOAT_KERNELS=0          float32 products on XLA, untimed (blocks measured)

A library is written atomically with its sha256 beside it and checked before it is
loaded; a mismatch rebuilds it with a warning. If compiling fails, XLA's product is used
with a warning; `status()` says which. Results differ from XLA's only in float32
rounding (the sums run in another order), and the block products round x to 8 bits per
block as llama.cpp does.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import contextvars
import ctypes
import functools
import hashlib
import json
import math
import os
import pathlib
import platform
import subprocess
import threading
import time
import warnings

import jax
import jax.numpy as jnp
import numpy as np

_DIR = pathlib.Path(__file__).parent
_SOURCES = tuple(_DIR / n for n in ('cpu_linear.cc', 'cpu_blocks.cc', 'cpu_attention.cc'))
_HEADERS = (_DIR / 'spin_pool.h', _DIR / 'simd.h')
TARGETS = {
  'nk': 'specjax_linear_nk',
  'kn': 'specjax_linear_kn',
  'q4_1': 'specjax_blocks_q4_1',
  'q8_0': 'specjax_blocks_q8_0',
  'q4_1r8': 'specjax_blocks_q4_1_r8',
  'attn': 'specjax_attention',
  'argmax': 'specjax_argmax',
}
MAX_ROWS = 64  # the most rows measured dispatch sends to a kernel (a forced path: any)
MIN_WEIGHTS = 1 << 16  # smaller products (tiny test models) stay with XLA: a call costs more
# A kernel must beat XLA's product by this factor to be kept: the rest of a step runs on
# XLA's thread pool, and a step that mixes the two pools for near-ties measured slower
# than either (a 2-token verification at 1.6 steps with AVX2 kernels, 1.2 on XLA alone).
MARGIN = 0.9
# Part of the decisions' file name: decisions made by an earlier way of measuring (v1 timed
# inside the trace, where nothing ran; v2 did not record how busy the machine was) are
# never reused.
DISPATCH_VERSION = 3
# A timing taken while other processes used more than this share of the machine's CPU
# time is marked busy (`others_load`): a busy machine's timings chose XLA and per-product
# dispatch where a quiet one chose kernels, and a choice is kept on disk. A busy record is
# timed again by the first process that finds the machine quiet (`quiet_now`), and used as
# it is while the machine stays busy (a test suite's workers, a training run beside).
BUSY = 0.25
# SPECJAX_CPU_FLOAT_KERNELS=0 keeps float32 products (nk, kn) with XLA untimed, block
# products still measured. The float32 'kn' kernel splits K so that each thread streams
# contiguous rows of the weight; its first form split the columns and walked the rows with
# a stride, and made a 2-token verification cost 1.56-1.60 target steps where XLA alone took
# 1.21 (2-core Zen 4 EPYC, 26 GB/s). Split over K: 0.93-1.08 at a 26.6-27.6 ms step
# (BENCHMARKS.md, issue 27).
ISAS = ('avx512', 'avx2', 'scalar')
CHOICES = (*ISAS, 'xla')
_BASE_FLAGS = ('-O3', '-std=c++17', '-shared', '-fPIC', '-fno-math-errno', '-pthread')
# What each instruction set needs of the CPU (/proc/cpuinfo names) and its compiler flags.
_NEEDS = {
  'avx512': ('avx512f', 'avx512vl', 'avx512bw', 'avx512dq', 'avx2', 'fma', 'f16c'),
  'avx2': ('avx2', 'fma', 'f16c'),
  'scalar': (),
}
_FLAGS = {
  'avx512': ('-mavx512f', '-mavx512vl', '-mavx512bw', '-mavx512dq', '-mavx2', '-mfma', '-mf16c'),
  'avx2': ('-mavx2', '-mfma', '-mf16c'),
  'scalar': (),
}

_lock = threading.RLock()
_state: dict = {}  # 'libs': isa -> CDLL, 'why': str, 'decisions': {key: record}
_registered: set = set()  # FFI target names registered in this process (never twice)


def _cache_dir() -> pathlib.Path:
  root = os.environ.get('SPECJAX_CACHE') or os.path.join(
    os.path.expanduser('~'), '.cache', 'specjax'
  )
  return pathlib.Path(root) / 'kernels'


@functools.cache
def cpu_info() -> dict:
  """{'model': str, 'flags': sorted feature names, 'machine': 'x86_64' ...} of this CPU."""
  model, flags = platform.processor() or '', set()
  try:
    with open('/proc/cpuinfo') as f:
      for line in f:
        key, _, value = line.partition(':')
        key = key.strip()
        if key == 'model name':
          model = value.strip()
        elif key in ('flags', 'Features') and not flags:
          flags = set(value.split())
  except OSError:
    pass
  return {'model': model, 'flags': sorted(flags), 'machine': platform.machine()}


def isa_flags() -> str:
  """The ISA flags that matter here, as present on this CPU ('avx2 fma avx512f ...')."""
  wanted = ('sse4_2', 'avx', 'avx2', 'fma', 'f16c', 'avx512f', 'avx512vl', 'avx512bw')
  have = set(cpu_info()['flags'])
  return ' '.join(f for f in (*wanted, 'avx512_vnni', 'avx_vnni', 'amx_tile') if f in have)


def supported() -> tuple[str, ...]:
  """The instruction sets this CPU can run, best first."""
  if cpu_info()['machine'] not in ('x86_64', 'AMD64'):
    return ('scalar',)
  have = set(cpu_info()['flags'])
  return tuple(isa for isa in ISAS if all(f in have for f in _NEEDS[isa]))


def requested() -> str:
  """'auto' (measured dispatch) or the path that SPECJAX_CPU_ISA / SPECJAX_CPU_KERNELS force."""
  if os.environ.get('SPECJAX_CPU_KERNELS', '1') == '0':
    return 'xla'
  isa = os.environ.get('SPECJAX_CPU_ISA', '').strip().lower()
  if isa in ('', 'auto'):
    return 'auto'
  cap = isa.removeprefix('auto:')
  if cap not in CHOICES or (cap != isa and cap in ('xla', 'scalar')):
    raise ValueError(
      f'SPECJAX_CPU_ISA={isa!r} is not one of auto, {", ".join(CHOICES)}, or auto:<isa> '
      '(measured dispatch with kernels no newer than that ISA, e.g. auto:avx2)'
    )
  return isa


def _flags(isa: str) -> list[str]:
  extra = list(_FLAGS[isa])
  if isa == 'avx512' and 'avx512_vnni' in cpu_info()['flags']:
    extra.append('-mavx512vnni')
  return [*_BASE_FLAGS, *extra]


def library_key(isa: str) -> str:
  """What a built library depends on: the sources, jaxlib, the compiler and its flags, and
  this CPU's model and features (a library built for one CPU is never loaded on another)."""
  compiler = os.environ.get('CXX', 'c++')
  parts = [
    *(f.read_bytes() for f in (*_SOURCES, *_HEADERS)),
    jax.lib.__version__.encode(),
    ' '.join([compiler, *_flags(isa)]).encode(),
    json.dumps(cpu_info(), sort_keys=True).encode(),
  ]
  return hashlib.sha256(b'\0'.join(parts)).hexdigest()[:16]


def _sha256(path: pathlib.Path) -> str:
  return hashlib.sha256(path.read_bytes()).hexdigest()


def _compile(isa: str) -> pathlib.Path:
  """Builds the library for `isa` (once per key) and returns its path; a cached one whose
  recorded hash does not match is rebuilt with a warning."""
  out = _cache_dir() / f'specjax_cpu-{isa}-{library_key(isa)}.so'
  digest = out.with_suffix('.sha256')
  if out.exists():
    want = digest.read_text().strip() if digest.exists() else None
    if want == _sha256(out):
      return out
    warnings.warn(
      f'specjax CPU kernel {out.name} does not match its recorded hash: rebuilding it',
      stacklevel=4,
    )
  out.parent.mkdir(parents=True, exist_ok=True)
  tmp = out.with_suffix(f'.{os.getpid()}.{threading.get_ident()}.tmp')
  compiler = os.environ.get('CXX', 'c++')
  includes = [f'-I{jax.ffi.include_dir()}', f'-I{_SOURCES[0].parents[2]}']
  cmd = [compiler, *_flags(isa), *includes, *map(str, _SOURCES), '-o', str(tmp)]
  try:
    done = subprocess.run(cmd, capture_output=True, text=True)
  except OSError as e:
    raise RuntimeError(f'cannot run the C++ compiler {compiler!r}: {e}') from None
  if done.returncode:
    raise RuntimeError(f'{" ".join(cmd)} failed:\n{done.stderr[-2000:]}')
  tmp_digest = tmp.with_name(tmp.name + '.sha256')
  tmp_digest.write_text(_sha256(tmp) + '\n')
  os.replace(tmp_digest, digest)  # the hash first: a library present always has one
  os.replace(tmp, out)
  return out


def _target(kind: str, isa: str) -> str:
  return f'{TARGETS[kind]}_{isa}'


def library(isa: str):
  """The loaded library of `isa` (compiled and registered on first use), or None with the
  reason in status() when it cannot be had."""
  with _lock:
    libs = _state.setdefault('libs', {})
    if isa in libs:
      return libs[isa]
    libs[isa] = None
    if isa not in supported():
      _state['why'] = f'this CPU cannot run the {isa} path (flags: {isa_flags() or "none"})'
      return None
    try:
      lib = ctypes.cdll.LoadLibrary(str(_compile(isa)))
      lib.specjax_isa.restype = ctypes.c_char_p
      built = lib.specjax_isa().decode()
      if built != isa:
        raise RuntimeError(f'the {isa} build compiled the {built} path')
      names = {_target(kind, isa): name for kind, name in TARGETS.items()}
      names[f'specjax_stream_sum_{isa}'] = 'specjax_stream_sum'
      for target, name in names.items():
        if target not in _registered:
          fn = jax.ffi.pycapsule(getattr(lib, name))
          jax.ffi.register_ffi_target(target, fn, platform='cpu')
          _registered.add(target)
      libs[isa] = lib
      _state['why'] = f'{isa} compiled and registered'
    except Exception as e:  # noqa: BLE001 - any failure means: use XLA
      warnings.warn(f'specjax CPU kernel unavailable, using XLA: {e}', stacklevel=3)
      _state['why'] = str(e)
    return libs[isa]


def best_isa() -> str | None:
  """The path measured dispatch considers: the best this CPU runs (never 'scalar', which is
  for tests), or the forced one; None when kernels are off or cannot be built."""
  want = requested()
  if want == 'xla':
    _state.setdefault('why', 'disabled by SPECJAX_CPU_ISA=xla or SPECJAX_CPU_KERNELS=0')
    return None
  cap = want.removeprefix('auto:')
  if not want.startswith('auto'):
    if want not in supported():
      raise ValueError(
        f'SPECJAX_CPU_ISA={want} but this CPU ({cpu_info()["model"]}) lacks it; it runs: '
        f'{", ".join(supported())} (flags: {isa_flags() or "none"})'
      )
    return want if library(want) is not None else None
  runs = supported()
  if cap != 'auto' and cap not in runs:
    raise ValueError(f'SPECJAX_CPU_ISA={want}: this CPU does not run {cap} ({isa_flags()})')
  for isa in runs[runs.index(cap) if cap != 'auto' else 0 :]:
    if isa != 'scalar' and library(isa) is not None:
      return isa
  _state.setdefault('why', 'no vector path on this CPU: XLA throughout')
  return None


def load() -> bool:
  """Whether a kernel path can be used (compiles and registers it on first use)."""
  with _lock:
    return best_isa() is not None


def status() -> str:
  """The kernel path in use (and why not), after the first call that wanted it."""
  return _state.get('why', 'not loaded yet')


# ---- measured dispatch ----------------------------------------------------------------


def _jiffies() -> tuple[int, int] | None:
  """(CPU time every CPU of the machine spent busy, CPU time this process spent), in clock
  ticks, from /proc; None where it cannot be read (not Linux)."""
  try:
    with open('/proc/stat') as f:
      cpu = [int(x) for x in f.readline().split()[1:9]]
    with open('/proc/self/stat') as f:
      own = f.read().rsplit(')', 1)[1].split()  # fields from the 3rd: utime is the 14th
    return sum(cpu) - cpu[3] - cpu[4], int(own[11]) + int(own[12])  # less idle and iowait
  except (OSError, ValueError, IndexError):
    return None


@contextlib.contextmanager
def others_load():
  """Yields a list that afterwards holds the share (0-1) of the machine's CPU time other
  processes used while the block ran (stolen time included); empty where /proc cannot be
  read or the block was too short to tell (under a clock tick per CPU)."""
  out: list = []
  start, t0 = _jiffies(), time.monotonic()
  try:
    yield out
  finally:
    end, wall, cpus = _jiffies(), time.monotonic() - t0, os.cpu_count() or 1
    capacity = os.sysconf('SC_CLK_TCK') * wall * cpus  # clock ticks the CPUs had
    if start is not None and end is not None and capacity >= cpus:
      others = (end[0] - start[0]) - (end[1] - start[1])
      out.append(round(min(1.0, max(0.0, others / capacity)), 3))


def quiet_now(seconds: float = 0.3) -> bool:
  """Whether other processes leave this machine quiet (under BUSY of its CPU time, over
  `seconds` of sleep); asked once a process. True where it cannot tell."""
  with _lock:
    if 'quiet' not in _state:
      with others_load() as load:
        time.sleep(seconds)
      _state['quiet'] = not load or load[0] < BUSY
    return _state['quiet']


def _stale(record: dict, key) -> bool:
  """A choice timed on a busy machine, now quiet: to be timed again, once a process (a
  timing busy again is used as it is until the next process)."""
  retimed = _state.setdefault('retimed', set())
  if record.get('busy', 0.0) <= BUSY or key in retimed or not quiet_now():
    return False
  retimed.add(key)
  return True


def _decisions_path(isa: str) -> pathlib.Path:
  optimised = not jax.config.read('jax_disable_most_optimizations')
  tag = '' if optimised else '-unoptimised'
  return _cache_dir() / f'dispatch-v{DISPATCH_VERSION}-{isa}-{library_key(isa)}{tag}.json'


def _stored(name: str, path: pathlib.Path) -> dict:
  """The JSON object stored at `path` (read once a process; {} if missing or unreadable),
  kept in _state[name] under its path."""
  table = _state.setdefault(name, {})
  if path not in table:
    try:
      loaded = json.loads(path.read_text())
    except (OSError, ValueError):
      loaded = {}
    table[path] = loaded if isinstance(loaded, dict) else {}
  return table[path]


def _store(path: pathlib.Path, data: dict) -> None:
  """Writes `data` to `path` atomically; a read-only cache keeps it for this process only."""
  tmp = path.with_suffix(f'.{os.getpid()}.tmp')
  try:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp.write_text(json.dumps(data, indent=1, sort_keys=True))
    os.replace(tmp, path)
  except OSError:
    pass


def _decisions(isa: str) -> dict:
  return _stored('decisions', _decisions_path(isa))


def _save(isa: str) -> None:
  _store(_decisions_path(isa), _decisions(isa))


def _time_both(kernel, xla, args, rounds: int = 5, span: float = 0.02) -> tuple[float, float]:
  """Median seconds per call of two jitted functions on `args`, interleaved round by round.
  Each timing repeats a call for at least `span` seconds: a shorter one would mostly
  measure the handover between XLA's thread pool and the kernels' spinning one."""
  calls = 1
  for f in (kernel, xla):
    jax.block_until_ready(f(*args))
    start = time.perf_counter()
    jax.block_until_ready(f(*args))
    calls = max(calls, math.ceil(span / max(time.perf_counter() - start, 1e-6)))
  times = ([], [])
  for _ in range(rounds):
    for f, out in zip((kernel, xla), times):
      start = time.perf_counter()
      for _ in range(calls):
        jax.block_until_ready(f(*args))
      out.append((time.perf_counter() - start) / calls)
  return float(np.median(times[0])), float(np.median(times[1]))


STREAM_BYTES = 64 << 20  # weights a timing streams through: more than most CPUs' last cache
BUCKETS = (1, 2, 3, 5, 9, 16, 32, 64)  # rows are decided by the bucket's largest count


def _operands(kind: str, n: int, k: int, rows: int, copies: int = 1):
  """x[rows, k] and `copies` distinct weights of the kind's layout (each a tuple of arrays:
  (w,) or (qs, d, m)), separate buffers as a model's layers are."""
  rng = np.random.default_rng(0)
  x = jnp.asarray(rng.standard_normal((rows, k), np.float32))
  weights = []
  for _ in range(copies):
    if kind in ('nk', 'kn'):
      shape = (n, k) if kind == 'nk' else (k, n)
      weights.append((jnp.asarray(rng.standard_normal(shape, np.float32) * 0.05),))
      continue
    width = 32 if kind == 'q8_0' else 16  # q4_1 in either layout: random bytes time alike
    qs = jnp.asarray(rng.integers(0, 256, (n, k // 32, width), dtype=np.uint8))
    d = jnp.asarray(rng.uniform(0.001, 0.01, (n, k // 32)).astype(np.float16))
    m = jnp.asarray(rng.uniform(-0.05, 0.0, (n, k // 32)).astype(np.float16))
    weights.append((qs, d, jnp.zeros_like(m) if kind == 'q8_0' else m))
  return x, weights


def _chain(product):
  """f(x, weights): the product with each weight in turn, each input depending on the
  previous output (as a forward's layers do), so every weight is read from memory."""

  def run(x, weights):
    total = jnp.zeros((), jnp.float32)
    for w in weights:
      total = total + product(x, *w)[0, 0]
      x = x + 1e-30 * total  # a dependency, numerically nothing
    return total

  return jax.jit(run)


def measure(kind: str, n: int, k: int, rows: int, isa: str) -> dict:
  """Times the `isa` kernel and XLA's product for one shape, each streaming its weights
  from memory as a forward does (copies of the weight, STREAM_BYTES in all):
  {'kernel_us', 'xla_us'} per product."""
  per_weight = 4 if kind in ('nk', 'kn') else (34 / 32 if kind == 'q8_0' else 20 / 32)
  copies = int(min(32, max(1, STREAM_BYTES // max(1, n * k * per_weight))))
  args = _operands(kind, n, k, rows, copies)
  kernel = _chain(lambda *a: _call(kind, isa, *a))
  xla = _chain(lambda *a: _xla_product(kind, *a))
  t_kernel, t_xla = _time_both(kernel, xla, args)
  return {'kernel_us': round(t_kernel / copies * 1e6, 1), 'xla_us': round(t_xla / copies * 1e6, 1)}


def bucket(rows: int) -> int:
  """The row-count bucket a product of `rows` rows is decided in (its largest count)."""
  return next((b for b in BUCKETS if b >= rows), rows)


# ---- forward-level choice ---------------------------------------------------------------
# Products timed one by one do not add up to a forward: on a 2-core Zen 4 EPYC, the
# AVX-512 block kernels won most q4_1 products alone, yet the quantized draft's whole
# forward ran 8-15% slower on them than on the AVX2 kernels, and the target's step ran 10%
# faster with every product on a kernel than with the per-product choice (the hand-overs
# between XLA's thread pool and the kernels' spinning one are paid only in a forward). So
# a run also times each model's whole forward, per row bucket, under every policy this CPU
# allows (`policies()`), and every product of the winner's forward takes its path
# (`bench/costs.tune_forwards` times them; `tune` records the choice).

_forcing: contextvars.ContextVar = contextvars.ContextVar('specjax_cpu_forcing', default=None)
FORWARDS_VERSION = 2  # v1 did not record how busy the machine was
# Another policy replaces per-product dispatch only when its forward is this much faster:
# the fastest of a few timings differs by 1-2% between runs, and a choice is kept.
FORWARD_MARGIN = 0.97


def policies() -> tuple[str, ...]:
  """The whole-forward policies measured dispatch chooses among here: 'auto' (each product
  on its own measured path), every vector ISA the request allows (each product large
  enough for a kernel on that ISA's kernel) and 'xla'; () where nothing is measured (a
  forced path, kernels off or unavailable)."""
  want = requested()
  if not want.startswith('auto') or jax.default_backend() != 'cpu' or jax.device_count() != 1:
    return ()
  if best_isa() is None:
    return ()
  runs, cap = supported(), want.removeprefix('auto:')
  start = runs.index(cap) if cap != 'auto' else 0
  isas = [isa for isa in runs[start:] if isa != 'scalar' and library(isa) is not None]
  return ('auto', *isas, 'xla')


@contextlib.contextmanager
def forcing(policy: str):
  """Products traced inside take `policy`'s path (one of `policies()`); yields the set of
  product keys they add, so a tuned choice can be applied to exactly those products."""
  if policy not in CHOICES + ('auto',):
    raise ValueError(f'kernel policy {policy!r} is not auto, xla or one of {ISAS}')
  seen: set = set()
  token = _forcing.set((policy, seen))
  try:
    yield seen
  finally:
    _forcing.reset(token)


def _forwards_path() -> pathlib.Path:
  libs = '-'.join(f'{isa}{library_key(isa)[:8]}' for isa in policies() if isa in ISAS)
  tags = '' if not jax.config.read('jax_disable_most_optimizations') else '-unoptimised'
  if os.environ.get('SPECJAX_CPU_FLOAT_KERNELS') == '0':
    tags += '-nofloat'
  if os.environ.get('SPECJAX_CPU_ATTENTION') == '0':
    tags += '-noattention'
  want = requested().replace(':', '_')
  return _cache_dir() / f'forwards-v{FORWARDS_VERSION}-{want}-{libs}{tags}.json'


def _valid(record) -> bool:
  return (
    isinstance(record, dict)
    and record.get('use') in (*ISAS, 'auto', 'xla')
    and isinstance(record.get('products'), list)
    and isinstance(record.get('ms'), dict)
  )


def _forwards() -> dict:
  """{model: {bucket: record}} recorded on this machine; what cannot be read is dropped."""
  table = _stored('forwards', _forwards_path())
  for model, rows in list(table.items()):
    if not isinstance(rows, dict):
      del table[model]
    else:
      table[model] = {b: r for b, r in rows.items() if _valid(r)}
  return table


def tuned(model: str, rows: int) -> dict | None:
  """The recorded forward-level choice for `model` (a key of its weights' shapes) at this
  row bucket on this machine, applied to its products; None if never measured, or if it
  was measured on a busy machine and this one is quiet now (to be measured again)."""
  with _lock:
    record = _forwards().get(model, {}).get(str(bucket(rows)))
    if record is not None and _stale(record, (model, bucket(rows))):
      return None
    if record is not None:
      _apply(model, rows, record)
    return record


def tune(model: str, rows: int, ms: dict[str, float], products, busy: float | None = None) -> dict:
  """Records that `model`'s forward at this row bucket ran `ms` {policy: ms} and applies
  the fastest policy to its `products` (the keys `forcing` collected); `busy`: the share
  of the CPUs other processes used meanwhile (others_load; None: not known)."""
  use = min(ms, key=ms.get)
  if 'auto' in ms and ms[use] > FORWARD_MARGIN * ms['auto']:
    use = 'auto'  # a near-tie keeps per-product dispatch
  record = {'ms': {p: round(t, 3) for p, t in ms.items()}, 'use': use, 'products': sorted(products)}
  if busy is not None:
    record['busy'] = busy
  with _lock:
    _forwards().setdefault(model, {})[str(bucket(rows))] = record
    _apply(model, rows, record)
    _store(_forwards_path(), _forwards())
  return record


def _apply(model: str, rows: int, record: dict) -> None:
  """Gives `record`'s products its path, except those a model applied earlier holds: a
  layer-skip draft runs the target's own products, and keeps the target's choice."""
  applied = _state.setdefault('applied', {})
  applied[f'{model} rows<={bucket(rows)}'] = {
    k: record[k] for k in ('use', 'ms', 'busy') if k in record
  }
  chosen = _state.setdefault('chosen', {})
  for key in record['products']:
    if chosen.get(key, (model,))[0] == model:
      chosen[key] = (model, record['use'])


def held_elsewhere(model: str, products) -> bool:
  """Whether every one of `products` already has the choice of a model other than `model`
  (then timing `model`'s forward could change nothing)."""
  chosen = _state.get('chosen', {})
  return bool(products) and all(chosen.get(k, (model,))[0] != model for k in products)


def _may_run(rows: int, size: int, floor: int) -> bool:
  """Whether a kernel may run an operation of `rows` rows over `size` weights (or cache
  entries): only on one CPU device, and under measured dispatch only for at most MAX_ROWS
  rows and `floor` or more of them (smaller ones cost more in a call than they save)."""
  if rows < 1 or jax.default_backend() != 'cpu' or jax.device_count() != 1:
    return False
  return not requested().startswith('auto') or (rows <= MAX_ROWS and size >= floor)


def path(kind: str, n: int, k: int, rows: int) -> str | None:
  """The instruction set whose kernel runs this product, or None for XLA's (trace time)."""
  if not _may_run(rows, n * k, MIN_WEIGHTS):
    return None
  auto = requested().startswith('auto')
  if auto and kind in ('nk', 'kn') and os.environ.get('SPECJAX_CPU_FLOAT_KERNELS') == '0':
    return None  # float32 products on XLA, untimed (see SPECJAX_CPU_FLOAT_KERNELS above)
  key = f'{kind} {n}x{k} rows<={bucket(rows)}'
  return _dispatch(key, lambda isa: measure(kind, n, k, bucket(rows), isa))


def _dispatch(key: str, timer, owned: bool = True) -> str | None:
  """The path of the product `key` under a forced path, the forward-level choice, or its
  own measurement (`timer(isa)` -> {'kernel_us', 'xla_us'}, run once per machine). A key
  not `owned` by a forward (attention: the target and its quantized draft attend over
  caches of one shape) follows a policy being timed but keeps its own measured path."""
  with _lock:
    isa = best_isa()
    if isa is None or not requested().startswith('auto'):
      return isa
    forced = _forcing.get()
    chosen = _state.get('chosen', {}) if owned else {}
    policy = chosen.get(key, ('', 'auto'))[1] if forced is None else forced[0]
    if forced is not None and owned:
      forced[1].add(key)
    if policy != 'auto':
      if forced is None:
        _state.setdefault('used', {})[key] = policy
      return None if policy == 'xla' else policy
    table = _decisions(isa)
    if key not in table or _stale(table[key], key):
      # In a thread of its own: this runs while a forward is traced, and in the tracing
      # thread every array operation, timed calls included, would be staged into it.
      with others_load() as load, concurrent.futures.ThreadPoolExecutor(1) as pool:
        record = pool.submit(timer, isa).result()
      record['use'] = isa if record['kernel_us'] < MARGIN * record['xla_us'] else 'xla'
      if load:
        record['busy'] = load[0]
      table[key] = record
      _save(isa)
    use = table[key]['use']
    if forced is None:
      _state.setdefault('used', {})[key] = use
    return None if use == 'xla' else use


def decisions() -> dict:
  """{product: {'kernel_us', 'xla_us', 'use'}} decided in this process (for provenance)."""
  out = {}
  for table in _state.get('decisions', {}).values():
    out.update(table)
  used = _state.get('used', {})  # a forward-level choice overrides the product's own
  return {key: {**out.get(key, {}), 'use': use} for key, use in sorted(used.items())}


def describe() -> dict:
  """This CPU and the kernel paths in use so far (nothing is compiled or timed for it):
  what every run's provenance records."""
  try:
    want = requested()
  except ValueError as e:
    want = str(e)
  loaded = [isa for isa, lib in _state.get('libs', {}).items() if lib is not None]
  return {
    'cpu': cpu_info()['model'],
    'isa_flags': isa_flags(),
    'kernels_requested': want,
    'kernel_libraries': loaded,
    'kernel_status': status(),
    'products': decisions(),
    'forwards': dict(sorted(_state.get('applied', {}).items())),
  }


# ---- the products -----------------------------------------------------------------------


def unpack_rows8(qs, d, m):
  """q4_1 blocks in groups of 8 rows (the 'q4_1r8' kernel's layout, models/quant.py
  interleave_rows8) back in row order: qs [N, nb, 16], d and m [N, nb] (jnp or numpy)."""
  xp = np if isinstance(qs, np.ndarray) else jnp
  n, nb = d.shape
  qs = qs.reshape(n // 8, nb, 4, 8, 4).transpose(0, 3, 1, 2, 4).reshape(n, nb, 16)
  rows = lambda a: a.reshape(n // 8, nb, 8).transpose(0, 2, 1).reshape(n, nb)
  return xp.asarray(qs), rows(d), rows(m)


def expand_blocks(kind: str, qs, d, m, rows=None):
  """float32 [N, K] from a block kernel's operands (`kind` q4_1, q4_1r8 or q8_0; see
  models/quant.py BlockWeight), or only the rows `rows` ([..., K]): d * q + m, block by
  block. The one place that reads the block layouts back."""
  if kind == 'q4_1r8':
    qs, d, m = unpack_rows8(qs, d, m)
    kind = 'q4_1'
  if rows is not None:
    qs, d, m = (jnp.take(a, rows, 0) for a in (qs, d, m))
  if kind == 'q4_1':
    q = jnp.concatenate([qs & 0x0F, qs >> 4], axis=-1).astype(jnp.float32)
  else:
    q = qs.astype(jnp.float32) - 128.0
  w = q * d[..., None].astype(jnp.float32) + m[..., None].astype(jnp.float32)
  return w.reshape(*w.shape[:-2], -1)


def _xla_product(kind: str, x, *w):
  if kind == 'nk':
    return jnp.einsum('...K,NK->...N', x, w[0])
  if kind == 'kn':
    return x @ w[0]
  return jnp.einsum('...K,NK->...N', x, expand_blocks(kind, *w))


def _call(kind: str, isa: str, x, *w):
  n = w[0].shape[1] if kind == 'kn' else w[0].shape[0]
  call = jax.ffi.ffi_call(
    _target(kind, isa), jax.ShapeDtypeStruct((*x.shape[:-1], n), jnp.float32),
    vmap_method='sequential',
  )  # fmt: skip
  return call(x, *w)


def _rows(x) -> int:
  return int(np.prod(x.shape[:-1], dtype=np.int64))


def _float_path(kind: str, x, w) -> str | None:
  if x.dtype != jnp.float32 or w.dtype != jnp.float32 or w.ndim != 2 or x.ndim < 1:
    return None
  n, k = (w.shape[1], w.shape[0]) if kind == 'kn' else w.shape
  if x.shape[-1] != k:
    return None
  return path(kind, int(n), int(k), _rows(x))


def applicable(x: jax.Array, w: jax.Array) -> bool:
  """Whether `rows_product` runs a kernel for these operands (decided at trace time)."""
  return _float_path('nk', x, w) is not None


@functools.partial(jax.custom_vjp, nondiff_argnums=(0, 1))
def _kernel(kind: str, isa: str, x: jax.Array, w: jax.Array) -> jax.Array:
  return _call(kind, isa, x, w)


def _kernel_fwd(kind, isa, x, w):
  return _kernel(kind, isa, x, w), (x, w)


def _kernel_bwd(kind, isa, residuals, g):
  return jax.vjp(functools.partial(_xla_product, kind), *residuals)[1](g)


_kernel.defvjp(_kernel_fwd, _kernel_bwd)


def rows_product(x: jax.Array, w: jax.Array) -> jax.Array:
  """x[..., K] @ w[N, K].T, on a kernel where it is faster (see the module docstring)."""
  isa = _float_path('nk', x, w)
  return _kernel('nk', isa, x, w) if isa else _xla_product('nk', x, w)


def dense_product(x: jax.Array, w: jax.Array) -> jax.Array:
  """x[..., K] @ w[K, N], on a kernel where it is faster."""
  isa = _float_path('kn', x, w)
  return _kernel('kn', isa, x, w) if isa else x @ w


def blocks_path(kind: str, x: jax.Array, qs, d, m) -> str | None:
  """The kernel (an ISA) that runs x[..., K] @ W.T for W in `kind` blocks, or None where
  XLA's expanded product is faster or no kernel can run (a trace-time decision)."""
  if x.dtype != jnp.float32 or x.ndim < 1 or d.dtype != jnp.float16 or m.dtype != jnp.float16:
    return None  # the kernels take GGUF's float16 scales (models/quant.py)
  return path(kind, int(qs.shape[0]), int(x.shape[-1]), _rows(x))


def blocks_product(kind: str, x: jax.Array, qs, d, m) -> jax.Array | None:
  """x[..., K] @ W.T for W in `kind` blocks on a kernel, or None (blocks_path): the caller
  expands the weights then."""
  isa = blocks_path(kind, x, qs, d, m)
  return _call(kind, isa, x, qs, d, m) if isa else None


def stream_sum(x: jax.Array) -> jax.Array:
  """sum(x) of a float32 array, read once by every kernel thread: the memory-bandwidth
  probe of experiments/step_profile (XLA's own reduction for comparison: jnp.sum)."""
  isa = best_isa() if jax.default_backend() == 'cpu' and x.dtype == jnp.float32 else None
  if isa is None:
    return jnp.sum(x, keepdims=True).reshape(1)
  call = jax.ffi.ffi_call(f'specjax_stream_sum_{isa}', jax.ShapeDtypeStruct((1,), jnp.float32))
  return call(x.reshape(-1))


# ---- attention --------------------------------------------------------------------------
# One row's keys (G * S * H floats) below this stay with XLA under measured dispatch: the
# tiny test models' caches, where a call costs more than it saves. SPECJAX_CPU_ATTENTION=0
# keeps attention with XLA on every path (an A/B switch; products are unaffected).
MIN_CACHE = 1 << 14


def _attention_call(isa: str, scale: float, q, k, v, mask):
  call = jax.ffi.ffi_call(
    _target('attn', isa), jax.ShapeDtypeStruct(q.shape, jnp.float32), vmap_method='sequential'
  )
  return call(q, k, v, mask, scale=np.float32(scale))


@functools.partial(jax.custom_vjp, nondiff_argnums=(0, 1, 2))
def _attend(isa: str, scale: float, reference, q, k, v, mask):
  return _attention_call(isa, scale, q, k, v, mask)


def _attend_fwd(isa, scale, reference, q, k, v, mask):
  return _attend(isa, scale, reference, q, k, v, mask), (q, k, v, mask)


def _attend_bwd(isa, scale, reference, residuals, g):
  """The gradient of XLA's attention (`reference`): training never needs the kernel's."""
  q, k, v, mask = residuals
  grads = jax.vjp(lambda q, k, v: reference(q, k, v, mask, scale), q, k, v)[1](g)
  return (*grads, np.zeros(mask.shape, jax.dtypes.float0))


_attend.defvjp(_attend_fwd, _attend_bwd)


def measure_attention(b: int, t: int, g: int, s: int, h: int, r: int, isa: str, reference) -> dict:
  """Times the `isa` attention kernel and `reference` (XLA's) for b rows of t queries per
  query head against half-full caches of s slots, each call on another layer's cache (as
  a forward streams them): {'kernel_us', 'xla_us'} per call."""
  rng = np.random.default_rng(0)
  copies = int(min(32, max(1, STREAM_BYTES // (2 * b * g * s * h * 4))))
  q = jnp.asarray(rng.standard_normal((b, t, g * r, h), np.float32))
  caches = [
    tuple(jnp.asarray(rng.standard_normal((b, g, s, h), np.float32)) for _ in range(2))
    for _ in range(copies)
  ]
  seen = np.arange(s)[None, :] < s // 2 + np.arange(t)[:, None]
  mask = jnp.asarray(np.broadcast_to(seen, (b, t, s)))
  scale = h**-0.5

  def chain(attend):
    def run(q, caches):
      total = jnp.zeros((), jnp.float32)
      for k, v in caches:
        total = total + attend(q, k, v, mask, scale)[0, 0, 0, 0]
        q = q + 1e-30 * total  # a dependency, numerically nothing
      return total

    return jax.jit(run)

  kernel = chain(lambda *a: _attention_call(isa, a[-1], *a[:-1]))
  t_kernel, t_xla = _time_both(kernel, chain(reference), (q, caches))
  return {'kernel_us': round(t_kernel / copies * 1e6, 1), 'xla_us': round(t_xla / copies * 1e6, 1)}


# ---- argmax --------------------------------------------------------------------------
# Rows shorter than this stay with XLA (a call costs more than it saves).
MIN_VOCAB = 1 << 12
ARGMAX_COPIES = 8  # rows of logits a timing cycles through (each left in L2 by a head)


def _argmax_call(isa: str, x):
  call = jax.ffi.ffi_call(
    _target('argmax', isa), jax.ShapeDtypeStruct(x.shape[:-1], jnp.int32),
    vmap_method='broadcast_all',
  )  # fmt: skip
  return call(jax.lax.stop_gradient(x))


def measure_argmax(rows: int, v: int, isa: str, reference) -> dict:
  """Times the `isa` argmax kernel and `reference` (XLA's) over [rows, v] logits, each
  call on another buffer: {'kernel_us', 'xla_us'} per call."""
  rng = np.random.default_rng(0)
  xs = [jnp.asarray(rng.standard_normal((rows, v), np.float32)) for _ in range(ARGMAX_COPIES)]

  def chain(find):
    def run(xs):
      total = jnp.zeros((), jnp.int32)
      for x in xs:
        total = total + find(x + 1e-30 * total.astype(jnp.float32))[0]
      return total

    return jax.jit(run)

  kernel, xla = chain(lambda x: _argmax_call(isa, x)), chain(reference)
  t_kernel, t_xla = _time_both(kernel, xla, (xs,))
  per = lambda t: round(t / ARGMAX_COPIES * 1e6, 1)
  return {'kernel_us': per(t_kernel), 'xla_us': per(t_xla)}


def argmax(x: jax.Array, reference) -> jax.Array | None:
  """jnp.argmax(x, -1) as int32 (the first index of the maximum, or of the first NaN) on a
  kernel (cpu_linear.cc `Argmax`), or None where `reference` (XLA's, the same function) is
  faster or no kernel can run: the caller runs the reference then."""
  if x.ndim < 1 or x.dtype != jnp.float32 or x.shape[-1] < 1:
    return None
  v, rows = int(x.shape[-1]), _rows(x)
  if not _may_run(rows, v, MIN_VOCAB):
    return None
  key = f'argmax {v} rows<={bucket(rows)}'
  isa = _dispatch(key, lambda i: measure_argmax(bucket(rows), v, i, reference), owned=False)
  return _argmax_call(isa, x) if isa else None


def attention(q, k, v, mask, scale: float, reference) -> jax.Array | None:
  """Grouped-query attention of q[B, T, N, H] against a head-major cache k, v[B, G, S, H]
  under mask[B, T, S] on a kernel (cpu_attention.cc), or None where `reference` (XLA's
  attention, `reference(q, k, v, mask, scale)`, also its gradient) is faster or no kernel
  can run: the caller runs the reference then."""
  if q.ndim != 4 or k.ndim != 4 or v.shape != k.shape or mask.ndim != 3:
    return None
  if any(a.dtype != jnp.float32 for a in (q, k, v)) or mask.dtype != jnp.bool_:
    return None
  b, t, n, h = (int(x) for x in q.shape)
  g, s = int(k.shape[1]), int(k.shape[2])
  if k.shape[0] != b or k.shape[3] != h or n % g or mask.shape != (b, t, s):
    return None
  if not _may_run(b * t, g * s * h, MIN_CACHE) or os.environ.get('SPECJAX_CPU_ATTENTION') == '0':
    return None
  r, tb = n // g, bucket(t)
  key = f'attn {g}x{s}x{h} r{r} b{b} t<={tb}'
  isa = _dispatch(key, lambda i: measure_attention(b, tb, g, s, h, r, i, reference), owned=False)
  return _attend(isa, float(scale), reference, q, k, v, mask) if isa else None
