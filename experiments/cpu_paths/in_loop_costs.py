r"""A draft's proposals timed alone and as the decoding loop runs them (each followed by the
target's verification of it, less that verification), at several gammas, in interleaved
rounds: does a large last-level cache make a draft look cheaper alone than it is in the
loop, and by a ratio that holds across gammas (bench/costs._in_loop assumes one)?

  python experiments/cpu_paths/in_loop_costs.py [--draft quantized] [--gammas 1,2,4,8]

Prints the fastest of --rounds per piece, in ms, and the ratio in the loop / alone.
"""

from __future__ import annotations

import json
import pathlib

import jax
from absl import app, flags

from specjax import config_lib, registry
from specjax.bench import costs, provenance
from specjax.checkpoints import loader

flags.DEFINE_string('draft', 'quantized', 'A registry draft spec.')
flags.DEFINE_list('gammas', ['1', '2', '4', '8'], 'Proposal lengths.')
flags.DEFINE_integer('rounds', 5, 'Interleaved rounds; the fastest of each piece is kept.')
flags.DEFINE_integer('cache_size', 512, 'KV slots (half full while timed).')
FLAGS = flags.FLAGS


def main(_):
  root = pathlib.Path(__file__).resolve().parents[2]
  config = config_lib.load_config(root / 'configs' / 'smollm2.py')
  target = loader.load_model(config.model, config.dtype)
  kind, settings = registry.parse_draft(FLAGS.draft)
  drafter, dparams = kind.build(settings, target, config.dtype)
  cfg, size = target.cfg, FLAGS.cache_size
  # The target as an engine holds it on one device (q|k|v joined).
  params = jax.device_put(target.cfg.family.fuse(target.params))
  dparams = jax.device_put(dparams)
  pieces = {}
  for g in map(int, FLAGS.gammas):
    pieces['verify', g] = costs.timer_forward(params, cfg, 1, g + 1, size)
    pieces['alone', g] = costs.timer_propose(drafter, dparams, params, cfg, 1, g, size)
    pieces['loop', g] = costs.timer_propose(
      drafter, dparams, params, cfg, 1, g, size, verified=True
    )
  best = costs.fastest(pieces, FLAGS.rounds)
  rows = {}
  for g in map(int, FLAGS.gammas):
    alone, loop = best['alone', g], best['loop', g] - best['verify', g]
    rows[g] = {
      'alone_ms': round(alone, 2),
      'in_loop_ms': round(loop, 2),
      'ratio': round(loop / alone, 3),
    }
  cpu = provenance.provenance().get('cpu', {})
  print(
    f'{cpu.get("cpu")} ({cpu.get("isa_flags")}), draft {FLAGS.draft}, fastest of {FLAGS.rounds}:'
  )
  print(json.dumps(rows))


if __name__ == '__main__':
  app.run(main)
