"""A/B of adaptive control against fixed gamma 8 with prompt lookup on the held-out code
edits (engine only, batch 1, one pass, methods interleaved prompt by prompt).

  python experiments/adaptive_bench/ab_lookup.py

The adaptive costs are the ones the harness measured on 2026-12-02 (verify / step).
"""

import dataclasses
import json
import pathlib

from specjax import registry
from specjax.checkpoints import loader
from specjax.control.adaptive import AdaptiveConfig
from specjax.decode.engine import Engine
from specjax.decode.method import Method

PROMPTS = pathlib.Path(__file__).parent / 'code_edit_heldout.jsonl'


def main():
  target = loader.load_model('smollm2-135m-instruct')
  drafter, draft_params = registry.build_draft('ngram', target)
  engine = Engine(
    target.params,
    target.cfg,
    eos_id=target.tokenizer.eos_id,
    cache_size=1024,
    drafter=drafter,
    draft_params=draft_params,
  )
  lines = PROMPTS.read_text().splitlines()
  prompts = [target.tokenizer.encode_chat(json.loads(line)['prompt']) for line in lines]
  base = AdaptiveConfig(
    gammas=(1, 2, 4, 8, 12), draft_cost=(0,) * 5, verify_cost=(1.18, 1.27, 1.41, 1.68, 1.92)
  )
  runs = {
    'fixed8': Method.chain(8),
    'adaptive': Method.adaptive(base),
    'adaptive hyst .05': Method.adaptive(dataclasses.replace(base, hysteresis=0.05)),
  }
  for method in runs.values():  # compile and warm
    engine.generate(prompts[:1], method, 256)
  engine.reset_control()
  totals = {name: [0.0, 0, 0] for name in runs}  # seconds, tokens, plain steps
  for prompt in prompts:
    for name, method in runs.items():
      out = engine.generate([prompt], method, 256)
      t = totals[name]
      t[0] += out.decode_seconds
      t[1] += out.num_generated
      t[2] += sum(d == 0 for d in out.drafted[0])
  speed = {name: t[1] / t[0] for name, t in totals.items()}
  for name, t in totals.items():
    ratio = speed[name] / speed['fixed8']
    print(f'{name:22s} {speed[name]:.1f} tok/s  plain steps {t[2]}  vs fixed8 {ratio:.3f}')


if __name__ == '__main__':
  main()
