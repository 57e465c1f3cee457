r"""Does the distilled draft accept in the decoding loop what it agrees on teacher-forced?

  python experiments/distill_bench/agreement.py --draft distilled --prompts humaneval \
      --num_prompts 4 --max_new 96

For each prompt: the target's greedy answer; the draft's teacher-forced argmax over
prompt + answer (one full forward pass, no cache), and its agreement with the answer at
every position; then speculative decoding with gamma = 1 (greedy verifier), whose
iterations each draft the token at one position. Each drafted token must be the
teacher-forced argmax at that position, so the loop's acceptance must equal the
teacher-forced agreement over the positions it visited: a lower figure would mean the
draft's cache handling (rollback, catch-up) loses acceptance without breaking
losslessness, which the greedy-identity tests cannot see.
"""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
from absl import app, flags

from specjax import registry
from specjax.bench import tables
from specjax.checkpoints import loader
from specjax.data import prompts as prompts_lib
from specjax.decode.engine import Engine
from specjax.decode.method import Method
from specjax.drafters import distilled
from specjax.models.kv_cache import KVCache

flags.DEFINE_string('draft', 'distilled', 'A distilled draft spec: distilled or distilled:DIR.')
flags.DEFINE_string('prompts', 'humaneval', 'The prompt set.')
flags.DEFINE_integer('num_prompts', 4, 'Prompts (the first N of the set).')
flags.DEFINE_integer('max_new', 96, 'Tokens generated per prompt.')
FLAGS = flags.FLAGS


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f'unexpected arguments: {argv[1:]}')
  target = loader.load_model('smollm2-135m-instruct')
  drafter, draft_params = registry.build_draft(FLAGS.draft, target)
  if not isinstance(drafter, distilled.DistilledDrafter):
    raise SystemExit(f'--draft {FLAGS.draft!r} is {drafter.name}, not a distilled draft')
  eos = target.tokenizer.eos_id
  plain = Engine(target.params, target.cfg, eos_id=eos, cache_size=1024)
  spec = Engine(
    target.params,
    target.cfg,
    eos_id=eos,
    cache_size=1024,
    drafter=drafter,
    draft_params=draft_params,
  )
  rows = []
  for p in prompts_lib.load_prompts(FLAGS.prompts)[: FLAGS.num_prompts]:
    prompt = target.tokenizer.encode_chat(p.text)
    answer = plain.generate([prompt], max_new_tokens=FLAGS.max_new).tokens[0]
    cache = KVCache.init(drafter.cfg, 1, len(prompt) + len(answer), jnp.float32)
    logits, _ = distilled.subset_logits(
      draft_params, jnp.asarray([prompt + answer]), cache, drafter.cfg
    )
    predicted = np.asarray(draft_params['vocab_ids'])[np.asarray(logits[0].argmax(-1))]
    # Answer token j is predicted from prompt + answer[:j], at position len(prompt) - 1 + j.
    agree = predicted[len(prompt) - 1 : len(prompt) - 1 + len(answer)] == np.asarray(answer)
    out = spec.generate([prompt], Method.chain(1, 'greedy'), max_new_tokens=FLAGS.max_new)
    if out.tokens[0] != answer:
      raise SystemExit(f'{p.id}: speculative output differs from the target greedy answer')
    position, visited, kept = 1, [], []  # the prefill emits answer[0]
    for drafted, accepted in zip(out.drafted[0], out.accepted[0]):
      if drafted and position < len(answer):
        visited.append(agree[position])
        kept.append(accepted)
      position += accepted + 1
    rows.append([p.id, float(agree[1:].mean()), float(np.mean(visited)), float(np.mean(kept))])
    print(f'{p.id}: done', flush=True)
  header = ['prompt', 'teacher-forced, all', 'at visited', 'in the loop']
  print(tables.text_table(header, rows, digits=3))


if __name__ == '__main__':
  app.run(main)
