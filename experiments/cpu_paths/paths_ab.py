r"""The pieces of an iteration on several kernel paths in one process, interleaved: the
target's step and 3- and 5-token verifications, and the quantized draft's proposals of 1,
2 and 4 tokens (SmolLM2-135M-Instruct, batch 1). Each path's forwards are traced under its
SPECJAX_CPU_ISA setting, then all are timed round by round (medians). Nothing here makes
the whole-forward choice a run makes, so `auto` is per-product dispatch.

  python experiments/cpu_paths/paths_ab.py avx512,avx2,auto,auto:avx2 [CACHE_SIZE]
  ROUNDS=9 python experiments/cpu_paths/paths_ab.py auto,auto:avx2
  python experiments/cpu_paths/paths_ab.py avx512,avx512+noattention,avx2,avx2+noattention

It showed that per-product dispatch lost to a whole forward on one ISA (BENCHMARKS.md,
issue 27, fifth session). Run it on a quiet machine.
"""

import os
import pathlib
import sys

import jax
import numpy as np

from specjax import config_lib
from specjax.bench import costs
from specjax.checkpoints import loader
from specjax.drafters import model as model_drafters

root = pathlib.Path(__file__).resolve().parents[2]
config = config_lib.load_config(root / 'configs' / 'smollm2.py')
target = loader.load_model(config.model, config.dtype)
drafter, dparams = model_drafters.QUANTIZED.build(('auto', True), target, config.dtype)
tparams, dparams = jax.device_put(target.params), jax.device_put(dparams)
cfg, size = target.cfg, int(sys.argv[2]) if len(sys.argv) > 2 else 512
variants = sys.argv[1].split(',')
timers = {}
for v in variants:
  isa, _, extra = v.partition('+')  # avx512+noattention: attention on XLA's operations
  os.environ['SPECJAX_CPU_ISA'] = isa  # read when a product is traced
  os.environ['SPECJAX_CPU_ATTENTION'] = '0' if extra == 'noattention' else '1'
  timers[v, 'step'] = costs.timer_forward(tparams, cfg, 1, 1, size)
  for n in (3, 5):
    timers[v, f'verify{n}'] = costs.timer_forward(tparams, cfg, 1, n, size)
  for g in (1, 2, 4):
    timers[v, f'draft{g}'] = costs.timer_propose(drafter, dparams, tparams, cfg, 1, g, size)
keys, times = list(timers), {k: [] for k in timers}
for r in range(int(os.environ.get('ROUNDS', 7))):
  for k in keys[r % len(keys) :] + keys[: r % len(keys)]:
    times[k].append(timers[k]())
for v in variants:
  med = {p: float(np.median(times[v, p])) for (w, p) in keys if w == v}
  s = med['step']
  units = ' '.join(f'{p} {m / s:.3f}' for p, m in med.items() if p != 'step')
  iteration = med['draft4'] + med['verify5']
  print(f'{v:12} step {s:.2f} ms  {units}  gamma-4 iteration {iteration:.1f} ms')
