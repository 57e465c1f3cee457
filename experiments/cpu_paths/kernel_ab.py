r"""Two builds of the CPU kernels side by side in one process, interleaved: this checkout's
against another source tree or this one with build defines (the B build). Times the float32
kn product (`--kind kn`: a layer weight [K, N] against 1-9 rows) at SmolLM2-135M's shapes,
the nk product (`--kind nk`: the tied head [V, K], 113 MB),
the quantized draft's block products (`--kind q4_1`, `--kind q8_0`: its layers and its
head), or attention (`--kind attn`: 1-9 queries per head, 3 KV heads, a half-full cache), each
streaming its operands from memory as a forward does. Products: medians of --rounds
interleaved timings of both builds on the same weights; attention: of 3 (kernels/cpu.py
`measure_attention`).

  python experiments/cpu_paths/kernel_ab.py --kind kn --defines=-DSPECJAX_KN_TILE_ROWS=1000
  python experiments/cpu_paths/kernel_ab.py --kind attn --other /path/to/old/checkout
  python experiments/cpu_paths/kernel_ab.py --kind q4_1 --rows 1,2 --other /path/to/old/checkout
  python experiments/cpu_paths/kernel_ab.py --kind nk --rows 1,2,3,5,9 --other /path/to/old/checkout
  python experiments/cpu_paths/kernel_ab.py --defines='-DSPECJAX_KN_JB=2 -DSPECJAX_KN_MB=6'
  python experiments/cpu_paths/kernel_ab.py --kind q4_1r8 --b_kind q4_1 --rows 1,2,4,5,9

`--b_kind` makes B this build's kernel of another kind on the same shapes (q4_1 blocks in
groups of 8 rows against row order: random weights time alike in either layout).

SPECJAX_KN_TILE_ROWS=1000 turns the kn row tiles off (the one-row path for every row
count: the kernel before 2026-12-06's third session). Run it on a quiet machine.
"""

from __future__ import annotations

import ctypes
import pathlib
import subprocess

import jax
import numpy as np
from absl import app, flags

from specjax.kernels import cpu
from specjax.models import llama

flags.DEFINE_enum('kind', 'kn', ['kn', 'nk', 'q4_1', 'q4_1r8', 'q8_0', 'attn'], 'What to time.')
flags.DEFINE_string('other', '', 'Source root of the B build (default: this checkout).')
flags.DEFINE_enum(
  'b_kind', '', ['', 'q4_1', 'q4_1r8'], 'B: this build, this q4_1 kernel (instead of a B build).'
)
flags.DEFINE_string('defines', '', 'Compiler flags of the B build, e.g. -DSPECJAX_KN_JB=2.')
flags.DEFINE_list('rows', ['2', '3', '5', '9'], 'Rows of x (kn) or queries per head (attn).')
flags.DEFINE_list('isas', ['avx512', 'avx2'], 'Paths to time (each must run on this CPU).')
flags.DEFINE_list('shapes', [], "NxK (default: SmolLM2-135M's for the kind).")
flags.DEFINE_integer('slots', 512, 'attn: cache slots (half of them seen).')
flags.DEFINE_integer('rounds', 9, 'Interleaved rounds per product cell (medians).')
FLAGS = flags.FLAGS

SHAPES = {  # SmolLM2-135M's products of each kind, as the engines hold them (q|k|v joined)
  'kn': ['576x576', '192x576', '1536x576', '576x1536', '960x576'],
  'nk': ['49152x576'],  # the head (tied to the embeddings)
  'q4_1': ['960x576', '576x576', '3072x576', '576x1536'],  # layers (gate|up joined)
  'q4_1r8': ['960x576', '576x576', '3072x576', '576x1536'],
  'q8_0': ['49152x576'],  # the head
}


def build_b(isa: str, root: pathlib.Path) -> None:
  """Compiles the B build for `isa` and registers its targets as the path `isa + 'B'`."""
  out = pathlib.Path(f'/tmp/specjax_kernel_ab-{isa}.so')
  sources = [str(root / 'specjax' / 'kernels' / f.name) for f in cpu._SOURCES]
  includes = [f'-I{jax.ffi.include_dir()}', f'-I{root}']
  cmd = ['c++', *cpu._flags(isa), *FLAGS.defines.split(), *includes, *sources, '-o', str(out)]
  subprocess.run(cmd, check=True, capture_output=True)
  lib = ctypes.cdll.LoadLibrary(str(out))
  for kind, name in cpu.TARGETS.items():
    if hasattr(lib, name):  # an older source tree lacks the newer kernels
      fn = jax.ffi.pycapsule(getattr(lib, name))
      jax.ffi.register_ffi_target(cpu._target(kind, isa + 'B'), fn, platform='cpu')


def products(isa: str, rows: int, shape) -> tuple[float, float]:
  """Microseconds per product of this build and of B, timed in turn round by round on the
  same weights (copies of them, 64 MB in all, streamed from memory as a forward does)."""
  n, k = shape
  per_weight = {'kn': 4, 'nk': 4, 'q4_1': 20 / 32, 'q4_1r8': 20 / 32, 'q8_0': 34 / 32}[FLAGS.kind]
  copies = int(min(32, max(1, cpu.STREAM_BYTES // (n * k * per_weight))))
  args = cpu._operands(FLAGS.kind, n, k, rows, copies)
  runs = [(FLAGS.kind, isa), (FLAGS.b_kind, isa) if FLAGS.b_kind else (FLAGS.kind, isa + 'B')]
  a, b = (cpu._chain(lambda *w, k=k, p=p: cpu._call(k, p, *w)) for k, p in runs)
  t_a, t_b = cpu._time_both(a, b, args, rounds=FLAGS.rounds, span=0.05)
  return t_a / copies * 1e6, t_b / copies * 1e6


def attention(isa: str, rows: int) -> tuple[float, float]:
  def one(path):
    return cpu.measure_attention(1, rows, 3, FLAGS.slots, 64, 3, path, llama.xla_attention)[
      'kernel_us'
    ]

  a, b = [], []
  for _ in range(3):
    a.append(one(isa))
    b.append(one(isa + 'B'))
  return float(np.median(a)), float(np.median(b))


def main(_):
  if FLAGS.b_kind and FLAGS.kind not in ('q4_1', 'q4_1r8'):
    raise app.UsageError('--b_kind compares the two q4_1 kernels: use --kind q4_1 or q4_1r8')
  root = pathlib.Path(FLAGS.other or pathlib.Path(__file__).resolve().parents[2])
  for isa in FLAGS.isas:
    assert cpu.library(isa) is not None, cpu.status()
    if not FLAGS.b_kind:
      build_b(isa, root)
  names = FLAGS.shapes or SHAPES.get(FLAGS.kind, [])
  shapes = [tuple(map(int, s.split('x'))) for s in names] if FLAGS.kind != 'attn' else [()]
  b = f'this build, {FLAGS.b_kind}' if FLAGS.b_kind else f'{root} {FLAGS.defines}'
  print(f'{cpu.cpu_info()["model"]} ({cpu.isa_flags()}); A: {FLAGS.kind}; B: {b}')
  for shape in shapes:
    for rows in map(int, FLAGS.rows):
      cells = []
      for isa in FLAGS.isas:
        a, b = products(isa, rows, shape) if shape else attention(isa, rows)
        cells.append(f'{isa} this {a:6.1f} us, B {b:6.1f} us ({b / a:4.2f}x)')
      what = f'N={shape[0]} K={shape[1]} rows={rows}' if shape else f'queries={rows}'
      print(f'{what}: ' + ' | '.join(cells), flush=True)


if __name__ == '__main__':
  app.run(main)
