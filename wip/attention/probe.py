"""Prototype check: the FFI attention (wip/attention/cpu_attention.cc) equals
llama.attention within 3e-7, and what it does to whole forwards (see README.md here).

  python wip/attention/probe.py [time]   # after building /tmp/att/libatt.so (README.md)
"""

import ctypes
import os
import sys

import jax
import jax.numpy as jnp
import numpy as np

from specjax.models import llama

lib = ctypes.cdll.LoadLibrary('/tmp/att/libatt.so')
jax.ffi.register_ffi_target(
  'specjax_attention', jax.ffi.pycapsule(lib.specjax_attention), platform='cpu'
)
reference = llama.attention


def kernel_attention(q, k, v, mask, scale=0.0):
  s = scale or q.shape[-1] ** -0.5
  call = jax.ffi.ffi_call('specjax_attention', jax.ShapeDtypeStruct(q.shape, jnp.float32))
  return call(q.astype(jnp.float32), k, v, mask, scale=np.float32(s))


def check():
  rng = np.random.default_rng(0)
  for b, t, n, g, s, h in [(1, 1, 9, 3, 512, 64), (2, 5, 4, 2, 37, 16), (1, 3, 2, 1, 8, 12)]:
    q = jnp.asarray(rng.standard_normal((b, t, n, h), np.float32))
    k = jnp.asarray(rng.standard_normal((b, g, s, h), np.float32))
    v = jnp.asarray(rng.standard_normal((b, g, s, h), np.float32))
    mask = rng.random((b, t, s)) < 0.6
    if t > 1:
      mask[0, 0] = False  # a query that sees nothing
    mask = jnp.asarray(mask)
    want = jax.jit(reference)(q, k, v, mask)
    got = jax.jit(kernel_attention)(q, k, v, mask)
    err = float(jnp.abs(got - want).max())
    print(f'shape b{b} t{t} n{n} g{g} s{s} h{h}: max |kernel - xla| = {err:.2e}')
    assert err < 1e-5, err


def timing():
  from specjax import config_lib
  from specjax.bench import costs
  from specjax.checkpoints import loader
  from specjax.drafters import model as dm
  from specjax.models import quant

  config = config_lib.load_config('configs/smollm2.py')
  target = loader.load_model(config.model, config.dtype)
  draft = quant.fuse(dm.quantized_params(target)[0])
  cfg = target.cfg
  timers = {}
  for mode in ('xla', 'kernel'):
    llama.attention = reference if mode == 'xla' else kernel_attention
    for size in (512, 2048):
      timers[f'{mode} q1/{size}'] = costs.timer_forward(draft, cfg, 1, 1, size)
      timers[f'{mode} t1/{size}'] = costs.timer_forward(target.params, cfg, 1, 1, size)
      timers[f'{mode} t5/{size}'] = costs.timer_forward(target.params, cfg, 1, 5, size)
  llama.attention = reference
  keys, times = list(timers), {k: [] for k in timers}
  for r in range(int(os.environ.get('ROUNDS', 7))):
    for k in keys[r % len(keys) :] + keys[: r % len(keys)]:
      times[k].append(timers[k]())
  for k in keys:
    print(f'{k}: median {np.median(times[k]):.2f} ms, min {np.min(times[k]):.2f}')


if __name__ == '__main__':
  check()
  if 'time' in sys.argv:
    timing()
