r"""Two builds of the CPU kernels side by side in one process, interleaved: this checkout's
against another source tree or this one with build defines (the B build). Times the float32
kn product (`--kind kn`: a layer weight [K, N] against 1-9 rows) at SmolLM2-135M's shapes,
or attention (`--kind attn`: 1-9 queries per head, 3 KV heads, a half-full cache), each
streaming its operands from memory as a forward does (kernels/cpu.py `measure`,
`measure_attention`). Medians of 3 interleaved timings per cell.

  python experiments/cpu_paths/kernel_ab.py --kind kn --defines=-DSPECJAX_KN_TILE_ROWS=1000
  python experiments/cpu_paths/kernel_ab.py --kind attn --other /path/to/old/checkout
  python experiments/cpu_paths/kernel_ab.py --defines='-DSPECJAX_KN_JB=2 -DSPECJAX_KN_MB=6'

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

flags.DEFINE_enum('kind', 'kn', ['kn', 'attn'], 'What to time.')
flags.DEFINE_string('other', '', 'Source root of the B build (default: this checkout).')
flags.DEFINE_string('defines', '', 'Compiler flags of the B build, e.g. -DSPECJAX_KN_JB=2.')
flags.DEFINE_list('rows', ['2', '3', '5', '9'], 'Rows of x (kn) or queries per head (attn).')
flags.DEFINE_list('isas', ['avx512', 'avx2'], 'Paths to time (each must run on this CPU).')
flags.DEFINE_list('shapes', ['576x576', '192x576', '1536x576', '576x1536', '960x576'], 'kn: NxK.')
flags.DEFINE_integer('slots', 512, 'attn: cache slots (half of them seen).')
FLAGS = flags.FLAGS


def build_b(isa: str, root: pathlib.Path) -> None:
  """Compiles the B build for `isa` and registers its targets as the path `isa + 'B'`."""
  out = pathlib.Path(f'/tmp/specjax_kernel_ab-{isa}.so')
  sources = [str(root / 'specjax' / 'kernels' / f.name) for f in cpu._SOURCES]
  includes = [f'-I{jax.ffi.include_dir()}', f'-I{root}']
  cmd = ['c++', *cpu._flags(isa), *FLAGS.defines.split(), *includes, *sources, '-o', str(out)]
  subprocess.run(cmd, check=True, capture_output=True)
  lib = ctypes.cdll.LoadLibrary(str(out))
  for kind, name in cpu.TARGETS.items():
    fn = jax.ffi.pycapsule(getattr(lib, name))
    jax.ffi.register_ffi_target(cpu._target(kind, isa + 'B'), fn, platform='cpu')


def timed(isa: str, rows: int, shape) -> float:
  if FLAGS.kind == 'kn':
    return cpu.measure('kn', *shape, rows, isa)['kernel_us']
  return cpu.measure_attention(1, rows, 3, FLAGS.slots, 64, 3, isa, llama.xla_attention)[
    'kernel_us'
  ]


def main(_):
  root = pathlib.Path(FLAGS.other or pathlib.Path(__file__).resolve().parents[2])
  for isa in FLAGS.isas:
    assert cpu.library(isa) is not None, cpu.status()
    build_b(isa, root)
  shapes = [tuple(map(int, s.split('x'))) for s in FLAGS.shapes] if FLAGS.kind == 'kn' else [()]
  print(f'{cpu.cpu_info()["model"]} ({cpu.isa_flags()}); B: {root} {FLAGS.defines}')
  for shape in shapes:
    for rows in map(int, FLAGS.rows):
      cells = []
      for isa in FLAGS.isas:
        a, b = [], []
        for _ in range(3):
          a.append(timed(isa, rows, shape))
          b.append(timed(isa + 'B', rows, shape))
        a, b = float(np.median(a)), float(np.median(b))
        cells.append(f'{isa} this {a:6.1f} us, B {b:6.1f} us ({b / a:4.2f}x)')
      what = f'N={shape[0]} K={shape[1]} rows={rows}' if shape else f'queries={rows}'
      print(f'{what}: ' + ' | '.join(cells), flush=True)


if __name__ == '__main__':
  app.run(main)
