r"""The cost of a plain step, of verifying 2-9 tokens and of each draft, on this CPU's
kernel path (SmolLM2-135M-Instruct, float32, batch 1, greedy: the default config's costs).

  SPECJAX_CPU_ISA=avx2 python experiments/cpu_paths/costs.py --out experiments/cpu_paths/results
  experiments/cpu_paths/run.sh   # every path this CPU runs (auto, each ISA, xla), one at a time

Writes costs-<path>.json: the target step (ms), verify/step per gamma, each draft's c and
draft/step per gamma, with provenance (the CPU, its ISA flags, the kernel path chosen for
each product and the timings behind the choice). The pieces are timed with
specjax.bench.costs (the fastest of 5 interleaved rounds, as the harness does).
"""

from __future__ import annotations

import json
import os
import pathlib

from absl import app, flags

from specjax import config_lib
from specjax.bench import provenance
from specjax.checkpoints import loader
from specjax.harness import run_config, run_lib
from specjax.kernels import cpu as cpu_kernels

flags.DEFINE_string('out', 'experiments/cpu_paths/results', 'Output folder.')
flags.DEFINE_list('drafts', ['quantized', 'eagle'], 'Drafts to cost.')
flags.DEFINE_integer('cache_size', 512, 'KV slots (the bucket of a ~300-token run).')
FLAGS = flags.FLAGS


def main(_):
  path = os.environ.get('SPECJAX_CPU_ISA', 'auto') or 'auto'
  root = pathlib.Path(__file__).resolve().parents[2]
  config = config_lib.load_config(root / 'configs' / 'smollm2.py')
  config.drafts = tuple(FLAGS.drafts)
  config.gammas = (1, 2, 4, 8)
  config.adaptive_gammas = ()
  methods = run_config.validate(config)
  model = loader.load_model(config.model, config.dtype)
  engines = run_lib.build_engines(config, model, methods)
  costs = run_lib.measure_costs(config, engines, methods, FLAGS.cache_size, print)
  step = next(iter(costs.values())).target_ms
  out = {
    'path': path,
    'target_ms': round(step, 3),
    'verify_steps': {
      g: round(v / step, 3) for g, v in next(iter(costs.values())).verify_ms.items()
    },
    'drafts': {
      spec: {'c': round(c.c, 4), 'draft_steps': {g: round(c.units(g)[0], 3) for g in c.draft_ms}}
      for spec, c in costs.items()
    },
    'provenance': {**provenance.provenance(), 'kernels': cpu_kernels.describe()},
  }
  folder = pathlib.Path(FLAGS.out)
  folder.mkdir(parents=True, exist_ok=True)
  (folder / f'costs-{path.replace(":", "-")}.json').write_text(json.dumps(out, indent=1))
  print(json.dumps({k: v for k, v in out.items() if k != 'provenance'}))
  print(cpu_kernels.describe()['kernel_isa'], cpu_kernels.status())


if __name__ == '__main__':
  app.run(main)
