r"""Self-speculative layer skipping on SmolLM2-135M-Instruct, per MT-bench category and HumanEval.

  python experiments/layerskip_bench/bench.py --config configs/layerskip_smollm2.py \
      --per_category 2 --humaneval 4 --max_new 64 --out experiments/layerskip_bench/results

Reads the calibrated draft and gamma from the config written by
`python -m specjax.calibrate_skip` (or takes --draft / --gamma), then decodes greedily at
batch 1, autoregressive and speculative back to back on every prompt, and reports per
category: acceptance, tokens per target call, tokens/s, speedup, greedy mismatches.
"""

from __future__ import annotations

import argparse
import datetime
import importlib.util
import json
import pathlib
import subprocess
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2]))  # the repository
from specjax.data import prompts as prompts_lib  # noqa: E402
from specjax.decode.engine import Engine  # noqa: E402
from specjax.models import loader  # noqa: E402


def read_config(path: str):
  spec = importlib.util.spec_from_file_location('layerskip_config', path)
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module


def main():
  parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  parser.add_argument('--config', default='configs/layerskip_smollm2.py')
  parser.add_argument('--draft', default=None, help='overrides the config, e.g. layers:0-11,20-29')
  parser.add_argument('--gamma', type=int, default=None)
  parser.add_argument('--per_category', type=int, default=2)
  parser.add_argument('--humaneval', type=int, default=4)
  parser.add_argument('--max_new', type=int, default=64)
  parser.add_argument('--out', default='experiments/layerskip_bench/results')
  args = parser.parse_args()
  config = read_config(args.config) if (args.draft is None or args.gamma is None) else None
  draft = args.draft or config.DRAFT
  gamma = args.gamma or config.GAMMA

  target = loader.load_model('smollm2-135m-instruct')
  drafter, draft_params, label = loader.load_draft(draft, target)
  engine = Engine(
    target.params,
    target.cfg,
    eos_id=target.tokenizer.eos_id,
    cache_size=1024,
    drafter=drafter,
    draft_params=draft_params,
  )
  sets = []
  for cat in (
    'writing',
    'roleplay',
    'reasoning',
    'math',
    'coding',
    'extraction',
    'stem',
    'humanities',
  ):
    sets += prompts_lib.load_prompts(f'mtbench:{cat}', args.per_category)
  if args.humaneval:
    sets += prompts_lib.load_prompts('humaneval', args.humaneval)
  per = {}
  for prompt in sets:
    ids = target.tokenizer.encode_chat(prompt.text)
    plain = engine.generate([ids], args.max_new)
    spec = engine.generate([ids], args.max_new, gamma=gamma, verifier='greedy')
    c = per.setdefault(
      prompt.category,
      {
        'tokens': 0,
        'plain_tokens': 0,
        'seconds': 0.0,
        'plain_seconds': 0.0,
        'accepted': 0,
        'drafted': 0,
        'calls': 0,
        'mismatches': 0,
        'prompts': 0,
      },
    )
    c['prompts'] += 1
    c['tokens'] += spec.num_generated
    c['plain_tokens'] += plain.num_generated
    c['seconds'] += spec.prefill_seconds + spec.decode_seconds
    c['plain_seconds'] += plain.prefill_seconds + plain.decode_seconds
    c['accepted'] += sum(map(sum, spec.accepted))
    c['drafted'] += sum(map(sum, spec.drafted))
    c['calls'] += spec.target_calls
    c['mismatches'] += int(spec.tokens != plain.tokens)
    print(
      f'{prompt.category} {prompt.id}: accept {spec.acceptance_rate:.2f}, '
      f'{spec.num_generated / spec.target_calls:.2f} tokens/call',
      flush=True,
    )

  rows = {}
  for cat, c in per.items():
    tps = c['tokens'] / c['seconds']
    rows[cat] = {
      'prompts': c['prompts'],
      'acceptance': c['accepted'] / max(c['drafted'], 1),
      'tokens_per_call': c['tokens'] / c['calls'],
      'tokens_per_second': tps,
      'speedup': tps / (c['plain_tokens'] / c['plain_seconds']),
      'greedy_mismatches': c['mismatches'],
    }
  total = {k: sum(c[k] for c in per.values()) for k in next(iter(per.values()))}
  rows['all'] = {
    'prompts': total['prompts'],
    'acceptance': total['accepted'] / max(total['drafted'], 1),
    'tokens_per_call': total['tokens'] / total['calls'],
    'tokens_per_second': total['tokens'] / total['seconds'],
    'speedup': (total['tokens'] / total['seconds'])
    / (total['plain_tokens'] / total['plain_seconds']),
    'greedy_mismatches': total['mismatches'],
  }
  commit = subprocess.run(
    ['git', 'rev-parse', '--short', 'HEAD'], capture_output=True, text=True
  ).stdout.strip()
  out = pathlib.Path(args.out)
  out.mkdir(parents=True, exist_ok=True)
  (out / 'results.json').write_text(
    json.dumps(
      {
        'args': vars(args),
        'draft': draft,
        'label': label,
        'gamma': gamma,
        'commit': commit,
        'date': datetime.date.today().isoformat(),
        'per_category': rows,
      },
      indent=1,
    )
  )
  print(f'draft {draft} ({label}), gamma {gamma}')
  print('| category | prompts | acceptance | tokens/call | tok/s | speedup | greedy mismatches |')
  print('|---|---|---|---|---|---|---|')
  for cat, r in rows.items():
    print(
      f'| {cat} | {r["prompts"]} | {r["acceptance"]:.2f} | {r["tokens_per_call"]:.2f} | '
      f'{r["tokens_per_second"]:.1f} | {r["speedup"]:.2f}x | {r["greedy_mismatches"]} |'
    )


if __name__ == '__main__':
  main()
