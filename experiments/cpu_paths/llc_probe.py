r"""How much of the quantized draft this CPU's last-level cache keeps, and how fast it comes
back after the target's forward has streamed through it.

  python experiments/cpu_paths/llc_probe.py [--sizes 16,32,64,96,128,192,256,538]
      [--draft_mb 48,64,80,96,112] [--passes 8] [--rounds 5]

1. Streaming bandwidth by buffer size (kernels.cpu.stream_sum, medians of --rounds): where
   it falls from cache speed to memory speed is the cache a process can use (a VM's
   /proc/cpuinfo may report the whole socket's).
2. A one-row q4_1 product chain over `--draft_mb` of weights (3072 x 576 blocks, as the
   draft's gate|up), timed pass by pass right after a 538 MB stream (the float32 target's
   bytes): the decoding loop's order, one verification then a draft's steps. Medians of
   --rounds per pass. With --nta, the stream uses non-temporal prefetches (a build of
   this checkout's kernels with the stream's hint changed), to see whether they leave
   the draft's weights in the cache.

Run it on a quiet machine; it prints one table per part.
"""

from __future__ import annotations

import ctypes
import pathlib
import subprocess
import tempfile
import time

import jax
import jax.numpy as jnp
import numpy as np
from absl import app, flags

from specjax.bench import provenance
from specjax.kernels import cpu

flags.DEFINE_list('sizes', ['16', '32', '64', '96', '128', '192', '256', '538'], 'MB streamed.')
flags.DEFINE_list('draft_mb', ['48', '64', '80', '96', '112'], 'MB of q4_1 weights.')
flags.DEFINE_integer('passes', 8, 'Passes over the weights after each stream (a gamma).')
flags.DEFINE_integer('rounds', 5, 'Repetitions (medians).')
flags.DEFINE_bool('nta', False, 'Also stream with non-temporal prefetches.')
FLAGS = flags.FLAGS

TARGET_MB = 538
N, K = 3072, 576


def timed(f, *args) -> float:
  start = time.perf_counter()
  jax.block_until_ready(f(*args))
  return time.perf_counter() - start


def nta_stream():
  """stream_sum built with _MM_HINT_NTA prefetches, as a jitted function."""
  root = pathlib.Path(__file__).resolve().parents[2]
  src = (root / 'specjax' / 'kernels' / 'cpu_linear.cc').read_text()
  hint = '_mm_prefetch(reinterpret_cast<const char*>(xp + i + 1024 + p), _MM_HINT_T0);'
  assert hint in src, 'the stream prefetch changed: update llc_probe.py'
  tmp = pathlib.Path(tempfile.mkdtemp(prefix='specjax_nta_'))
  (tmp / 'specjax' / 'kernels').mkdir(parents=True)
  for f in (*cpu._SOURCES, *cpu._HEADERS):
    text = f.read_text()
    (tmp / 'specjax' / 'kernels' / f.name).write_text(text.replace(hint, hint.replace('T0', 'NTA')))
  out = tmp / 'nta.so'
  sources = [str(tmp / 'specjax' / 'kernels' / f.name) for f in cpu._SOURCES]
  cmd = ['c++', *cpu._flags(cpu.best_isa()), f'-I{jax.ffi.include_dir()}', f'-I{tmp}']
  subprocess.run([*cmd, *sources, '-o', str(out)], check=True, capture_output=True)
  lib = ctypes.cdll.LoadLibrary(str(out))
  jax.ffi.register_ffi_target(
    'specjax_probe_nta', jax.ffi.pycapsule(lib.specjax_stream_sum), platform='cpu'
  )
  call = jax.ffi.ffi_call('specjax_probe_nta', jax.ShapeDtypeStruct((1,), jnp.float32))
  return jax.jit(lambda x: call(x.reshape(-1)))


def main(_):
  isa = cpu.best_isa()
  assert isa is not None, cpu.status()
  cpu_info = provenance.provenance().get('cpu', {})
  print(f'{cpu_info.get("cpu")} ({cpu_info.get("isa_flags")}), kernels {isa}')
  stream = jax.jit(cpu.stream_sum)
  print('\n| MB streamed | GB/s |\n| ---: | ---: |')
  for mb in map(int, FLAGS.sizes):
    x = jnp.ones((mb << 20) // 4, jnp.float32)
    timed(stream, x)
    t = np.median([timed(stream, x) for _ in range(FLAGS.rounds)])
    print(f'| {mb} | {mb * 1.048576 / 1e3 / t:.1f} |', flush=True)
    del x
  streams = {'stream': stream}
  if FLAGS.nta:
    streams['NTA stream'] = nta_stream()
  big = jnp.ones((TARGET_MB << 20) // 4, jnp.float32)
  per = N * K * 20 / 32
  print(
    f'\nms per pass over the q4_1 weights (one row), right after a {TARGET_MB} MB stream:\n'
    f'\n| MB | after | ' + ' | '.join(f'pass {p + 1}' for p in range(FLAGS.passes)) + ' |'
  )
  print('| ---: | --- |' + ' ---: |' * FLAGS.passes)
  for mb in map(int, FLAGS.draft_mb):
    copies = max(1, int(mb * 1e6 // per))
    args = cpu._operands('q4_1', N, K, 1, copies)
    chain = cpu._chain(lambda *a: cpu._call('q4_1', isa, *a))
    timed(chain, *args)
    for name, s in streams.items():
      timed(s, big)
      rows = []
      for _ in range(FLAGS.rounds):
        timed(s, big)
        rows.append([timed(chain, *args) * 1e3 for _ in range(FLAGS.passes)])
      med = np.median(np.array(rows), axis=0)
      cells = ' | '.join(f'{m:.2f}' for m in med)
      print(f'| {copies * per / 1e6:.0f} | {name} | {cells} |', flush=True)
    del args


if __name__ == '__main__':
  app.run(main)
