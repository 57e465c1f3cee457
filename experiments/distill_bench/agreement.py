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

import argparse
import pathlib
import sys

import jax.numpy as jnp
import numpy as np

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2]))  # the repository
from specjax.data import prompts as prompts_lib  # noqa: E402
from specjax.decode.engine import Engine  # noqa: E402
from specjax.drafters import distilled  # noqa: E402
from specjax.models import loader  # noqa: E402
from specjax.models.kv_cache import KVCache  # noqa: E402


def main():
  parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  parser.add_argument('--draft', default='distilled')
  parser.add_argument('--prompts', default='humaneval')
  parser.add_argument('--num_prompts', type=int, default=4)
  parser.add_argument('--max_new', type=int, default=96)
  args = parser.parse_args()

  target = loader.load_model('smollm2-135m-instruct')
  drafter, draft_params, label = loader.load_draft(args.draft, target)
  if not isinstance(drafter, distilled.DistilledDrafter):
    raise SystemExit(f'--draft {args.draft!r} is {label}, not a distilled draft')
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
  print(f'{"prompt":<16} {"teacher-forced, all":>20} {"at visited":>11} {"in the loop":>12}')
  for p in prompts_lib.load_prompts(args.prompts)[: args.num_prompts]:
    prompt = target.tokenizer.encode_chat(p.text)
    answer = plain.generate([prompt], args.max_new).tokens[0]
    cache = KVCache.init(drafter.cfg, 1, len(prompt) + len(answer), jnp.float32)
    logits, _ = distilled.subset_logits(
      draft_params, jnp.asarray([prompt + answer]), cache, drafter.cfg
    )
    predicted = np.asarray(draft_params['vocab_ids'])[np.asarray(logits[0].argmax(-1))]
    # Answer token j is predicted from prompt + answer[:j], at position len(prompt) - 1 + j.
    agree = predicted[len(prompt) - 1 : len(prompt) - 1 + len(answer)] == np.asarray(answer)
    out = spec.generate([prompt], args.max_new, gamma=1, verifier='greedy')
    if out.tokens[0] != answer:
      raise SystemExit(f'{p.id}: speculative output differs from the target greedy answer')
    position, visited, kept = 1, [], []  # the prefill emits answer[0]
    for drafted, accepted in zip(out.drafted[0], out.accepted[0]):
      if drafted and position < len(answer):
        visited.append(agree[position])
        kept.append(accepted)
      position += accepted + 1
    print(f'{p.id:<16} {agree[1:].mean():>20.3f} {np.mean(visited):>11.3f} {np.mean(kept):>12.3f}')


if __name__ == '__main__':
  main()
