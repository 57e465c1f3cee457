r"""Per-token cost of draft designs relative to one SmolLM2-135M-Instruct decoding step.

  python experiments/distill_bench/cost.py --out experiments/distill_bench/results/cost.json

Each draft shares the target's input embeddings and width (576); what varies is the number
of layers, the FFN width and the output vocabulary (full 49152 or a frequency-ranked
subset). Weights are random (cost does not depend on them). Every figure is the median
time of one 1-token forward at batch 1 against a 512-slot cache half full, run 16 times
inside one jitted fori_loop (so dispatch is left out), interleaved with the target's own
step in the same run, and reported as a ratio to it.

bench.py imports `step_ms` and `subset_forward` from this file; the flags are defined
only when it runs as a script, so that importing it defines none.
"""

from __future__ import annotations

import json
import pathlib
import time

import jax
import jax.numpy as jnp
import numpy as np
from absl import app, flags

from specjax.bench import provenance
from specjax.checkpoints import loader
from specjax.drafters import distilled
from specjax.models.kv_cache import KVCache

FLAGS = flags.FLAGS


def define_flags():
  flags.DEFINE_string('out', 'experiments/distill_bench/results/cost.json', 'The JSON written.')
  flags.DEFINE_integer('rounds', 2, 'Rounds of timing every design; medians are reported.')


def step_ms(fn_logits, params, cfg, cache_size=512, inner=16, repeats=9):
  def many(p, x, cache):
    def body(_, carry):
      x, cache, acc = carry
      logits, new_cache = fn_logits(p, x, cache, cfg)[:2]
      x = (x + jnp.argmax(logits[:, -1:], -1).astype(x.dtype)) % cfg.vocab_size
      return x, new_cache.with_lengths(cache.lengths), acc + logits[:, -1, 0]

    return jax.lax.fori_loop(0, inner, body, (x, cache, jnp.zeros(x.shape[:1])))[2]

  fn = jax.jit(many)
  cache = KVCache.init(cfg, 1, cache_size).with_lengths(jnp.full((1,), cache_size // 2))
  x = jnp.ones((1, 1), jnp.int32)
  fn(params, x, cache).block_until_ready()
  times = []
  for _ in range(repeats):
    t = time.perf_counter()
    fn(params, x, cache).block_until_ready()
    times.append(time.perf_counter() - t)
  return 1e3 * float(np.median(times)) / inner


def subset_forward(p, x, cache, cfg):
  return distilled.subset_logits(p, x, cache, cfg)


DESIGNS = [  # (layers, ffn, vocabulary)
  (2, 1536, 49152),
  (2, 1536, 16384),
  (2, 1536, 8192),
  (2, 1536, 4096),
  (2, 1536, 2048),
  (1, 1536, 8192),
  (1, 1536, 4096),
  (2, 768, 8192),
  (3, 1536, 8192),
  (4, 1536, 8192),
]


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f'unexpected arguments: {argv[1:]}')
  target = loader.load_model('smollm2-135m-instruct')
  tparams = jax.device_put(target.params)
  drafts = {}
  for layers, ffn, vocab in DESIGNS:
    ids = np.arange(vocab, dtype=np.int32)
    cfg, params = distilled.init_from_target(
      target.cfg, target.params, tuple(range(layers)), ids, ffn
    )
    drafts[(layers, ffn, vocab)] = (cfg, jax.device_put(params))
  rows = {d: [] for d in drafts}
  target_ms = []
  for _ in range(FLAGS.rounds):
    for d, (cfg, params) in drafts.items():
      t = step_ms(target.cfg.family.forward, tparams, target.cfg)
      target_ms.append(t)
      rows[d].append(step_ms(subset_forward, params, cfg) / t)
  out = []
  for (layers, ffn, vocab), ratios in rows.items():
    out.append(
      {'layers': layers, 'ffn': ffn, 'vocab': vocab, 'cost_ratio': float(np.median(ratios))}
    )
    print(
      f'{layers} layers, ffn {ffn}, vocab {vocab}: {100 * out[-1]["cost_ratio"]:.1f}% '
      f'of a target step',
      flush=True,
    )
  print(f'target step: {np.median(target_ms):.2f} ms (median)')
  path = pathlib.Path(FLAGS.out)
  path.parent.mkdir(parents=True, exist_ok=True)
  result = {
    'target_ms': float(np.median(target_ms)),
    'drafts': out,
    'provenance': provenance.provenance(),
  }
  path.write_text(json.dumps(result, indent=2))


if __name__ == '__main__':
  define_flags()
  app.run(main)
