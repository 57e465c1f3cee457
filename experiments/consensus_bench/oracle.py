r"""How many tokens per target call could any consensus draft buy on this model? An upper bound.

  python experiments/consensus_bench/oracle.py --sets mtbench:math,mtbench:reasoning,humaneval \
      --num_prompts 3 --n 8 --temperature 0.7 --max_new 128 --gammas 2,4 \
      --out experiments/consensus_bench/oracle

N paths per prompt are sampled from the target as one batch (plain autoregressive
decoding, so the samples are exactly the target's). With a deterministic draft (q
one-hot), rejection sampling keeps a drafted token x with probability p(x): the number
of draft tokens kept has the same law as the number of leading draft tokens that agree
with a fresh target sample. So replaying a drafter over recorded samples (its draft at
position t compared with the sample's next tokens, then moving past the kept tokens and
the one that follows) gives its tokens per target call without the target.

Replayed per path, iterating in lockstep across the N paths of a prompt:
  * own lookup: exactly what `ngram` (n-grams of 3 down to 1 tokens over the path's own
    prompt and text) would draft;
  * oracle: the draft that agrees longest with the path's true future among every
    substring of the other paths' text generated so far and of the path's own context
    (each followed by repeats of its last token, as specjax's drafters pad). A consensus
    draft in 'mode' (the heaviest path of the trie built from those texts) is a prefix
    of one such substring, so it can never keep more; the oracle also reaches at least as
    far at every position, so its tokens per call bound consensus drafting's from above.
  * oracle with the other paths' complete texts (their future too): a looser bound.
If the oracle's tokens per call are below 1.5x own lookup's, no consensus draft (mode)
over these paths can reach the issue's 1.5x.
"""

from __future__ import annotations

import argparse
import datetime
import json
import pathlib
import subprocess
import sys

import numpy as np

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2]))  # the repository
from specjax.data import prompts as prompts_lib  # noqa: E402
from specjax.decode.engine import Engine  # noqa: E402
from specjax.decode.sampling import SamplingConfig  # noqa: E402
from specjax.models import loader  # noqa: E402

SEP = '\x00'


def as_text(tokens) -> str:
  """Token ids as a string of code points, so str.find does substring search."""
  return ''.join(chr(0x100 + t) for t in tokens)


def own_lookup(ctx: list[int], gamma: int, n_max: int = 3) -> list[int]:
  """The `ngram` drafter's proposal: the tokens after the most recent earlier occurrence of
  the longest of the last n_max..1 tokens, clamped to the context (last token repeated)."""
  length = len(ctx)
  for n in range(n_max, 0, -1):
    if length < n:
      continue
    tail = ctx[length - n:]
    for end in range(length - 2, n - 2, -1):
      if ctx[end - n + 1:end + 1] == tail:
        return [ctx[min(end + 1 + i, length - 1)] for i in range(gamma)]
  return []  # nothing proposed


def agreement(draft: list[int], future: list[int]) -> int:
  run = 0
  for a, b in zip(draft, future):
    if a != b:
      break
    run += 1
  return run


def best_substring_run(sources: list[str], future: list[int], gamma: int) -> int:
  """The longest prefix of `future` (at most gamma) found in any source text."""
  joined = SEP.join(sources)
  for r in range(min(gamma, len(future)), 0, -1):
    if as_text(future[:r]) in joined:
      return r
  return 0


def padded(tokens: list[int], gamma: int) -> str:
  return as_text(tokens + tokens[-1:] * gamma) if tokens else ''


def replay(prompt: list[int], paths: list[list[int]], gamma: int, mode: str) -> list[float]:
  """Tokens per target call of each path (prefill included) under `mode`."""
  n = len(paths)
  pos = [1] * n  # the prefill emits each path's first token
  calls = [1] * n
  while any(p < len(path) for p, path in zip(pos, paths)):
    now = list(pos)  # every path drafts from the others' text as of this iteration
    for i, path in enumerate(paths):
      t = now[i]
      if t >= len(path):
        continue
      future = path[t:t + gamma]
      ctx = prompt + path[:t]
      if mode == 'own':
        run = agreement(own_lookup(ctx, gamma), future)
      else:
        others = [paths[j] if mode == 'oracle_full' else paths[j][:now[j]]
                  for j in range(n) if j != i]
        run = best_substring_run([padded(ctx, gamma)] + [padded(o, gamma) for o in others],
                                 future, gamma)
      pos[i] = min(t + run + 1, len(path))
      calls[i] += 1
  return [len(path) / c for path, c in zip(paths, calls)]


def main():
  parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  parser.add_argument('--sets', default='mtbench:math,mtbench:reasoning,humaneval')
  parser.add_argument('--num_prompts', type=int, default=3)
  parser.add_argument('--n', type=int, default=8)
  parser.add_argument('--temperature', type=float, default=0.7)
  parser.add_argument('--max_new', type=int, default=128)
  parser.add_argument('--gammas', default='2,4')
  parser.add_argument('--out', default='experiments/consensus_bench/oracle')
  args = parser.parse_args()
  gammas = [int(g) for g in args.gammas.split(',')]
  out = pathlib.Path(args.out)
  out.mkdir(parents=True, exist_ok=True)

  target = loader.load_model('smollm2-135m-instruct')
  tok = target.tokenizer
  engine = Engine(target.params, target.cfg, eos_id=tok.eos_id, cache_size=1024)
  sampling = SamplingConfig(temperature=args.temperature)
  rows, texts = [], []
  for name in args.sets.split(','):
    for k, p in enumerate(prompts_lib.load_prompts(name)[:args.num_prompts]):
      prompt = tok.encode_chat(p.text)
      o = engine.generate([prompt] * args.n, args.max_new, sampling, seed=k)
      paths = [list(map(int, t)) for t in o.tokens]
      for i, path in enumerate(paths):
        texts.append({'set': name, 'id': p.id, 'path': i, 'text': tok.decode(path)})
      for g in gammas:
        res = {m: float(np.mean(replay(prompt, paths, g, m)))
               for m in ('own', 'oracle', 'oracle_full')}
        rows.append({'set': name, 'id': p.id, 'gamma': g, **res})
        print(f'{name} {p.id} gamma={g}: own {res["own"]:.2f}, oracle {res["oracle"]:.2f} '
              f'({res["oracle"] / res["own"]:.2f}x), oracle with full texts '
              f'{res["oracle_full"]:.2f}', flush=True)

  lines = ['| set | γ | own lookup | oracle (others so far) | ÷ own | oracle (others complete) '
           '| ÷ own |',
           '|---|---|---|---|---|---|---|']
  summary = {}
  for name in args.sets.split(','):
    for g in gammas:
      sel = [r for r in rows if r['set'] == name and r['gamma'] == g]
      m = {k: float(np.mean([r[k] for r in sel])) for k in ('own', 'oracle', 'oracle_full')}
      summary[f'{name} g{g}'] = m
      lines.append(f'| {name} | {g} | {m["own"]:.2f} | {m["oracle"]:.2f} | '
                   f'{m["oracle"] / m["own"]:.2f}x | {m["oracle_full"]:.2f} | '
                   f'{m["oracle_full"] / m["own"]:.2f}x |')
  table = '\n'.join(lines)
  print(table)
  commit = subprocess.run(['git', 'rev-parse', '--short', 'HEAD'], capture_output=True,
                          text=True).stdout.strip()
  (out / 'results.json').write_text(json.dumps(
      {'args': vars(args), 'commit': commit, 'date': str(datetime.date.today()),
       'summary': summary, 'prompts': rows}, indent=1) + '\n')
  (out / 'table.md').write_text(table + '\n')
  with open(out / 'texts.jsonl', 'w') as f:
    for t in texts:
      f.write(json.dumps(t) + '\n')


if __name__ == '__main__':
  main()
