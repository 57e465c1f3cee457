r"""How many tokens per target call could any consensus draft buy on this model? An upper bound.

  python experiments/consensus_bench/oracle.py --sets mtbench:math,mtbench:reasoning,humaneval \
      --num_prompts 3 --n 8 --temperature 0.7 --max_new 128 --gammas 2,4 \
      --out experiments/consensus_bench/oracle
  cd experiments/consensus_bench  # replay the recorded paths without the model:
  python oracle.py --replay oracle/texts.jsonl --matched 4:1,2:0 --out /tmp/oracle

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
  * oracle with the other paths' complete texts (their future too): a looser bound;
  * matched oracle (k, m): the best, knowing the future, of exactly the candidates a
    `consensus:N,k=K,m=M` draft chooses from (the continuation after every place in the
    other paths' generated text whose preceding k tokens differ from the path's last k
    in at most m positions, and the path's own lookup). A consensus draft in 'mode'
    proposes a prefix of one of them (then repeats), so this bounds it for that (k, m),
    whatever the weighting; the plain oracle bounds every (k, m) and is far looser.
If the oracle's tokens per call are below 1.5x own lookup's, no consensus draft (mode)
over these paths can reach the issue's 1.5x.
"""

from __future__ import annotations

import json
import pathlib
import sys

import numpy as np
from absl import app, flags

from specjax.bench import provenance, tables
from specjax.checkpoints import loader
from specjax.core.sampling import SamplingConfig
from specjax.data import prompts as prompts_lib
from specjax.decode.engine import Engine

flags.DEFINE_string(
  'sets', 'mtbench:math,mtbench:reasoning,humaneval', 'Comma-separated prompt sets.'
)
flags.DEFINE_integer('num_prompts', 3, 'Prompts per set (the first N).')
flags.DEFINE_integer('n', 8, 'Paths sampled per prompt, decoded as one batch.')
flags.DEFINE_float('temperature', 0.7, 'Sampling temperature.')
flags.DEFINE_integer('max_new', 128, 'Tokens generated per path.')
flags.DEFINE_string('gammas', '2,4', 'Comma-separated draft lengths.')
flags.DEFINE_string('matched', '4:1,3:1,2:0,1:0', '(k:m) settings for the matched oracle')
flags.DEFINE_string(
  'replay', '', 'texts.jsonl of an earlier run: replay its paths instead of sampling'
)
flags.DEFINE_string(
  'out', 'experiments/consensus_bench/oracle', 'Folder for results.json, table.md, texts.jsonl.'
)
FLAGS = flags.FLAGS

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
    tail = ctx[length - n :]
    for end in range(length - 2, n - 2, -1):
      if ctx[end - n + 1 : end + 1] == tail:
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


def matched_candidates(
  prompt: list[int], ctx: list[int], others: list[list[int]], k: int, m: int, gamma: int
) -> list[list[int]]:
  """What consensus drafting can propose: the continuations (padded with their last token)
  after every place in another path's generated text where the tokens before it differ
  from the path's last k tokens in at most m positions, plus the path's own lookup."""
  out = []
  own = own_lookup(ctx, gamma)
  if own:
    out.append(own)
  if len(ctx) < k:
    return out
  pattern = ctx[-k:]
  for other in others:
    full = prompt + other
    for end in range(max(k - 1, len(prompt) - 1), len(full) - 1):
      window = full[end - k + 1 : end + 1]
      if sum(a != b for a, b in zip(window, pattern)) <= m:
        cont = full[end + 1 : end + 1 + gamma]
        out.append(cont + cont[-1:] * (gamma - len(cont)))
  return out


def replay(
  prompt: list[int], paths: list[list[int]], gamma: int, mode: str, k: int = 4, m: int = 1
) -> list[float]:
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
      future = path[t : t + gamma]
      ctx = prompt + path[:t]
      if mode == 'own':
        run = agreement(own_lookup(ctx, gamma), future)
      elif mode == 'matched':
        others = [paths[j][: now[j]] for j in range(n) if j != i]
        run = max(
          (agreement(c, future) for c in matched_candidates(prompt, ctx, others, k, m, gamma)),
          default=0,
        )
      else:
        others = [
          paths[j] if mode == 'oracle_full' else paths[j][: now[j]] for j in range(n) if j != i
        ]
        run = best_substring_run(
          [padded(ctx, gamma)] + [padded(o, gamma) for o in others], future, gamma
        )
      pos[i] = min(t + run + 1, len(path))
      calls[i] += 1
  return [len(path) / c for path, c in zip(paths, calls)]


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f'unexpected arguments: {argv[1:]}')
  gammas = [int(g) for g in FLAGS.gammas.split(',')]
  matched = [tuple(int(x) for x in km.split(':')) for km in FLAGS.matched.split(',') if km]
  modes = ['own', 'oracle', 'oracle_full'] + [f'matched k={k} m={m}' for k, m in matched]
  out = pathlib.Path(FLAGS.out)
  out.mkdir(parents=True, exist_ok=True)

  groups = {}  # (set, id) -> (prompt tokens, [path tokens])
  texts = []
  if FLAGS.replay:
    for line in open(FLAGS.replay):
      t = json.loads(line)
      texts.append(t)
      groups.setdefault((t['set'], t['id']), (t['prompt_tokens'], []))[1].append(t['tokens'])
  else:
    target = loader.load_model('smollm2-135m-instruct')
    tok = target.tokenizer
    engine = Engine(target.params, target.cfg, eos_id=tok.eos_id, cache_size=1024)
    sampling = SamplingConfig(temperature=FLAGS.temperature)
    for name in FLAGS.sets.split(','):
      for i, p in enumerate(prompts_lib.load_prompts(name)[: FLAGS.num_prompts]):
        prompt = tok.encode_chat(p.text)
        o = engine.generate(
          [prompt] * FLAGS.n, max_new_tokens=FLAGS.max_new, sampling=sampling, seed=i
        )
        paths = [list(map(int, t)) for t in o.tokens]
        groups[name, p.id] = (prompt, paths)
        texts += [
          {
            'set': name,
            'id': p.id,
            'path': j,
            'text': tok.decode(path),
            'tokens': path,
            'prompt_tokens': prompt,
          }
          for j, path in enumerate(paths)
        ]

  rows = []
  for (name, pid), (prompt, paths) in groups.items():
    for g in gammas:
      res = {}
      for mode in modes:
        if mode.startswith('matched'):
          k, m = (int(x.split('=')[1]) for x in mode.split()[1:])
          res[mode] = float(np.mean(replay(prompt, paths, g, 'matched', k, m)))
        else:
          res[mode] = float(np.mean(replay(prompt, paths, g, mode)))
      rows.append({'set': name, 'id': pid, 'gamma': g, **res})
      print(
        f'{name} {pid} gamma={g}: '
        + ', '.join(f'{mode} {v:.2f} ({v / res["own"]:.2f}x)' for mode, v in res.items()),
        flush=True,
      )

  table_rows = []
  summary = {}
  for name in dict.fromkeys(r['set'] for r in rows):
    for g in gammas:
      sel = [r for r in rows if r['set'] == name and r['gamma'] == g]
      mean = {mode: float(np.mean([r[mode] for r in sel])) for mode in modes}
      summary[f'{name} g{g}'] = mean
      table_rows.append(
        [name, g]
        + [
          f'{v:.2f}' + ('' if mode == 'own' else f' ({v / mean["own"]:.2f}x)')
          for mode, v in mean.items()
        ]
      )
  table = tables.markdown_table(['set', 'γ', *modes], table_rows)
  print(table)
  (out / 'results.json').write_text(
    json.dumps(
      {
        'args': {f.name: f.value for f in FLAGS.get_key_flags_for_module(sys.modules[__name__])},
        'provenance': provenance.provenance(),
        'summary': summary,
        'prompts': rows,
      },
      indent=1,
    )
    + '\n'
  )
  (out / 'table.md').write_text(table + '\n')
  if not FLAGS.replay:
    with open(out / 'texts.jsonl', 'w') as f:
      for t in texts:
        f.write(json.dumps(t) + '\n')


if __name__ == '__main__':
  app.run(main)
