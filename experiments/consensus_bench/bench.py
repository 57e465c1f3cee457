r"""Consensus drafts for N parallel samples on SmolLM2-135M-Instruct.

  python experiments/consensus_bench/bench.py --sets mtbench:math,mtbench:reasoning,humaneval \
      --num_prompts 3 --n 8 --gammas 2,4 --temperature 0.7 --max_new 128 \
      --out experiments/consensus_bench/results

For every prompt, N copies are decoded as one batch (same seed for every method) with:
plain batched autoregressive decoding, each path doing prompt lookup over its own context
alone (n-grams of 3..1), and consensus drafts (each path drafting from the other N - 1),
in both proposal modes (mode: best-supported path with one-hot q; sample: drawn from the
votes). Methods run back to back on the same prompt. Reported per prompt set and method:
mean tokens per target call (per row), aggregate tokens/s and speedup over the plain
batched decoding of the same N paths.
"""

from __future__ import annotations

import argparse
import datetime
import json
import pathlib
import platform
import subprocess
import sys

import numpy as np

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2]))  # the repository
from specjax import self_consistency as sc  # noqa: E402
from specjax.data import prompts as prompts_lib  # noqa: E402
from specjax.decode.engine import Engine  # noqa: E402
from specjax.decode.sampling import SamplingConfig  # noqa: E402
from specjax.drafters import ConsensusDrafter, NgramDrafter  # noqa: E402
from specjax.models import loader  # noqa: E402


def main():
  parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  parser.add_argument('--sets', default='mtbench:math,mtbench:reasoning,humaneval')
  parser.add_argument('--num_prompts', type=int, default=3)
  parser.add_argument('--n', type=int, default=8)
  parser.add_argument('--gammas', default='2,4')
  parser.add_argument('--temperature', type=float, default=0.7)
  parser.add_argument('--max_new', type=int, default=128)
  parser.add_argument('--proposals', default='mode,sample')
  parser.add_argument('--k', type=int, default=4)
  parser.add_argument('--m', type=int, default=1)
  parser.add_argument('--out', default='experiments/consensus_bench/results')
  args = parser.parse_args()
  gammas = [int(g) for g in args.gammas.split(',')]

  target = loader.load_model('smollm2-135m-instruct')
  vocab, eos = target.cfg.vocab_size, target.tokenizer.eos_id
  base = Engine(
    target.params, target.cfg, eos_id=eos, cache_size=1024, drafter=NgramDrafter(vocab, n_max=3)
  )
  engines = {'ngram': base}
  for proposal in args.proposals.split(','):
    drafter = ConsensusDrafter(
      vocab, group=args.n, k=args.k, max_mismatches=args.m, n_max=3, proposal=proposal
    )
    engines[f'consensus-{proposal}'] = Engine(
      base.params, target.cfg, eos_id=eos, cache_size=1024, drafter=drafter
    )
  sampling = SamplingConfig(temperature=args.temperature)
  records = []
  for spec in args.sets.split(','):
    for i, prompt in enumerate(prompts_lib.load_prompts(spec, args.num_prompts)):
      ids = target.tokenizer.encode_chat(prompt.text)
      row = {'set': spec, 'id': prompt.id, 'methods': {}}
      runs = [('autoregressive', base, 0)] + [
        (f'{name} g{g}', e, g) for name, e in engines.items() for g in gammas
      ]
      for label, engine, gamma in runs:
        out = sc.run_paths(engine, ids, args.n, args.max_new, sampling, seed=i, gamma=gamma)
        stats = sc.method_stats(out)
        if label.startswith('consensus'):
          texts = [target.tokenizer.decode(t) for t in out.tokens]
          stats['vote'] = sc.majority_vote([sc.extract_answer(t) for t in texts])
        row['methods'][label] = stats
        print(
          f'{spec} {prompt.id} {label}: {stats["tokens_per_call"]:.2f} tokens/call, '
          f'{stats["tokens_per_second"]:.1f} tok/s',
          flush=True,
        )
      records.append(row)

  summary = {}
  for spec in args.sets.split(','):
    rows = [r for r in records if r['set'] == spec]
    out = {}
    for label in rows[0]['methods']:
      ms = [r['methods'][label] for r in rows]
      out[label] = {
        'tokens_per_call': float(np.mean([m['tokens_per_call'] for m in ms])),
        'tokens_per_second': sum(m['tokens'] for m in ms) / sum(m['seconds'] for m in ms),
        'acceptance': float(np.mean([m['acceptance_rate'] or 0 for m in ms])),
      }
    ar = out['autoregressive']['tokens_per_second']
    for label, s in out.items():
      s['speedup'] = s['tokens_per_second'] / ar
      gamma = label.rsplit(' g', 1)[-1]
      if label.startswith('consensus'):
        s['tokens_per_call_vs_ngram'] = (
          s['tokens_per_call'] / out[f'ngram g{gamma}']['tokens_per_call']
        )
    summary[spec] = out

  commit = subprocess.run(
    ['git', 'rev-parse', '--short', 'HEAD'], capture_output=True, text=True
  ).stdout.strip()
  result = {
    'args': vars(args),
    'commit': commit,
    'date': datetime.date.today().isoformat(),
    'machine': platform.processor() or platform.machine(),
    'summary': summary,
    'prompts': records,
  }
  path = pathlib.Path(args.out)
  path.mkdir(parents=True, exist_ok=True)
  (path / 'results.json').write_text(json.dumps(result, indent=1))
  print('| set | method | tokens/call | vs own n-gram | acceptance | tok/s | speedup |')
  print('|---|---|---|---|---|---|---|')
  for spec, out in summary.items():
    for label, s in out.items():
      vs = s.get('tokens_per_call_vs_ngram')
      print(
        f'| {spec} | {label} | {s["tokens_per_call"]:.2f} | '
        f'{"" if vs is None else f"{vs:.2f}x"} | {s["acceptance"]:.2f} | '
        f'{s["tokens_per_second"]:.1f} | {s["speedup"]:.2f}x |'
      )


if __name__ == '__main__':
  main()
