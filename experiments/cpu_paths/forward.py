r"""Forwards of SmolLM2-135M-Instruct on this CPU: the float32 target's one-token step and the
quantized self-draft (q4_1 layers, q8_0 head) at 1, 2, 5 and 9 rows, each fused as an
engine holds it (models/quant.fuse), and with --target_rows 2,5,9 the target's
verifications, timed in interleaved rounds (the order rotates each round) and reported as
medians in ms and as fractions of the target step. A quick probe of the kernels' effect on
a whole forward (the harness's cost measurement takes minutes; this takes about one).

  python experiments/cpu_paths/forward.py [--rounds 9] [--unfused]
  SPECJAX_CPU_ISA=auto:avx2 python experiments/cpu_paths/forward.py   # the AVX2 build

To compare two versions of the kernels, run it from two checkouts alternately (PYTHONPATH
set to the other checkout's root), twice each: single runs on a 2-core VM differ by ~5%.
"""

from __future__ import annotations

import json
import os
import pathlib

import jax
import numpy as np
from absl import app, flags

from specjax import config_lib
from specjax.bench import costs, provenance
from specjax.checkpoints import loader
from specjax.drafters import model as model_drafters
from specjax.models import quant

flags.DEFINE_integer('rounds', 9, 'Interleaved rounds; medians are reported.')
flags.DEFINE_bool(
  'unfused', False, 'Time the target and the draft with q, k, v and gate, up unfused too.'
)
flags.DEFINE_integer('cache_size', 512, 'KV slots (half full while timed).')
flags.DEFINE_list('target_rows', [], 'Also time the target at these rows (verifications).')
FLAGS = flags.FLAGS


def main(_):
  root = pathlib.Path(__file__).resolve().parents[2]
  config = config_lib.load_config(root / 'configs' / 'smollm2.py')
  target = loader.load_model(config.model, config.dtype)
  blocks, _ = model_drafters.quantized_params(target)
  drafts = {'q': quant.for_kernels(blocks)}
  if FLAGS.unfused:
    drafts['q-unfused'] = blocks
  cfg, size = target.cfg, FLAGS.cache_size
  # On the device: numpy weights would be copied into every timed call.
  # The target as an engine holds it on one device (models/quant.fuse: q|k|v joined).
  targets = {'target': cfg.family.fuse(target.params)}
  if FLAGS.unfused:
    targets['target-unfused'] = target.params
  targets, drafts = jax.device_put(targets), jax.device_put(drafts)
  timers = {}
  for name, params in targets.items():
    timers[name] = costs.timer_forward(params, cfg, 1, 1, size)
    for rows in map(int, FLAGS.target_rows):
      timers[f'{name}{rows}'] = costs.timer_forward(params, cfg, 1, rows, size)
  for name, params in drafts.items():
    for rows in (1, 2, 5, 9):
      timers[f'{name}{rows}'] = costs.timer_forward(params, cfg, 1, rows, size)
  keys, times = list(timers), {k: [] for k in timers}
  for r in range(FLAGS.rounds):
    for k in keys[r % len(keys) :] + keys[: r % len(keys)]:
      times[k].append(timers[k]())
  med = {k: float(np.median(v)) for k, v in times.items()}
  cpu = provenance.provenance().get('cpu', {})
  print(
    f'{cpu.get("cpu")} ({cpu.get("isa_flags")}), SPECJAX_CPU_ISA='
    f'{os.environ.get("SPECJAX_CPU_ISA", "auto")}, {FLAGS.rounds} rounds, medians:'
  )
  print(json.dumps({k: [round(v, 2), round(v / med['target'], 3)] for k, v in med.items()}))


if __name__ == '__main__':
  app.run(main)
