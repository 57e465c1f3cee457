"""What the quantized draft's one-row forward is made of: the forward at 128, 512 and 2048
cache slots, and at 512 with attention (XLA then also drops its unread cache write), the
RMS norms or RoPE replaced by nothing (monkeypatched into models/llama.py), beside the
target step; 9 interleaved
rounds, medians and minima (ms).

  python experiments/cpu_paths/ablate.py
"""

import os
import pathlib

import numpy as np

from specjax import config_lib
from specjax.bench import costs
from specjax.checkpoints import loader
from specjax.drafters import model as model_drafters
from specjax.models import llama, quant

ROOT = pathlib.Path(__file__).resolve().parents[2]


def variants(draft, target, cfg):
  """{name: timer}; each monkeypatch holds while its forward is traced (timer_forward
  compiles at once), and is undone after."""
  timers = {f'q1/cache{n}': costs.timer_forward(draft, cfg, 1, 1, n) for n in (128, 512, 2048)}
  timers['target/cache512'] = costs.timer_forward(target, cfg, 1, 1, 512)
  patches = {
    'no-attention': [('attention', lambda q, k, v, mask, scale=0.0: q)],
    'no-norms': [('rms_norm', lambda x, w, eps, offset=0.0: x)],
    'no-rope': [('apply_rope', lambda x, cos, sin: x)],
  }
  for name, changes in patches.items():
    saved = {attr: getattr(llama, attr) for attr, _ in changes}
    for attr, fn in changes:
      setattr(llama, attr, fn)
    try:
      timers[f'q1/{name}'] = costs.timer_forward(draft, cfg, 1, 1, 512)
    finally:
      for attr, fn in saved.items():
        setattr(llama, attr, fn)
  return timers


def main():
  config = config_lib.load_config(ROOT / 'configs' / 'smollm2.py')
  target = loader.load_model(config.model, config.dtype)
  draft = quant.for_kernels(model_drafters.quantized_params(target)[0])
  timers = variants(draft, target.params, target.cfg)
  keys, times = list(timers), {k: [] for k in timers}
  for r in range(9):
    for k in keys[r % len(keys) :] + keys[: r % len(keys)]:
      times[k].append(timers[k]())
  print(f'SPECJAX_CPU_ISA={os.environ.get("SPECJAX_CPU_ISA", "auto")}')
  for k, v in times.items():
    print(f'  {k}: median {np.median(v):.2f} ms, min {np.min(v):.2f}')


if __name__ == '__main__':
  main()
