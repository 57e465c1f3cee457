r"""Which joined weights pay for the float32 target (models/quant.fuse): its whole forward
of 1, 5 and 9 rows with nothing joined, q|k|v only, gate|up only and both, timed in
interleaved rounds on one path (medians in ms). It chose q|k|v only (BENCHMARKS.md, issue
29, third session). Run it on a quiet machine, once per path:

  SPECJAX_CPU_ISA=avx512 python experiments/cpu_paths/fusion.py
  SPECJAX_CPU_ISA=avx2 python experiments/cpu_paths/fusion.py
"""

from __future__ import annotations

import json
import os
import pathlib

import jax
import numpy as np

from specjax import config_lib
from specjax.bench import costs
from specjax.checkpoints import loader
from specjax.models import quant


def joined(params, keys):
  """The tree with only `keys` of quant.FUSED joined (float matrices)."""
  out = {**params, 'layers': []}
  for layer in params['layers']:
    layer = dict(layer)
    for key in keys:
      parts = quant.FUSED[key]
      layer[key] = np.concatenate([np.asarray(layer.pop(p)) for p in parts], axis=1)
    out['layers'].append(layer)
  return out


def main():
  root = pathlib.Path(__file__).resolve().parents[2]
  config = config_lib.load_config(root / 'configs' / 'smollm2.py')
  target = loader.load_model(config.model, config.dtype)
  options = {'none': (), 'qkv': ('wqkv',), 'gate_up': ('w_gate_up',), 'both': tuple(quant.FUSED)}
  variants = jax.device_put({k: joined(target.params, keys) for k, keys in options.items()})
  timers = {
    f'{name} {rows}': costs.timer_forward(params, target.cfg, 1, rows, 512)
    for name, params in variants.items()
    for rows in (1, 5, 9)
  }
  keys, times = list(timers), {k: [] for k in timers}
  for r in range(9):
    for k in keys[r % len(keys) :] + keys[: r % len(keys)]:
      times[k].append(timers[k]())
  path = os.environ.get('SPECJAX_CPU_ISA', 'auto')
  print(path, json.dumps({k: round(float(np.median(v)), 2) for k, v in times.items()}))


if __name__ == '__main__':
  main()
