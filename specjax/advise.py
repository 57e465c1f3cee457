r"""Should speculation be on? Advice per category from a run's results.json.

  python -m specjax.advise runs/<dir> [--min_speedup 1.03]

For every category of the workload (and all prompts together) it takes each draft's
best measured setting (a fixed gamma or adaptive) and says whether to enable it:

  margin = tokens per target call - 1 - overhead,

where overhead is how much longer one iteration takes than one autoregressive step
(measured, in autoregressive steps): speculation pays exactly when the margin is
positive. The advice is 'on' only when the measured end-to-end speedup is at least
--min_speedup (default 1.03: smaller gains drown in a shared machine's noise) and the
margin is positive; otherwise 'off'. It also gives the p99 per-token latency cost
against autoregressive decoding, and the cost model's best gamma for the category.
Writes advice.json beside results.json.
"""

from __future__ import annotations

import argparse
import json
import pathlib
import sys

from specjax.bench import tables
from specjax.bench.metrics import Summary


def _load(path: pathlib.Path) -> dict:
  results = path / 'results.json' if path.is_dir() else path
  if not results.is_file():
    raise ValueError(
      f'{results}: no such file (expected the results.json that '
      f'python -m specjax.run writes into its work directory)'
    )
  try:
    summary = json.loads(results.read_text())
  except json.JSONDecodeError as e:
    raise ValueError(f'{results}: not valid JSON ({e})') from None
  methods = summary.get('methods') if isinstance(summary, dict) else None
  if not isinstance(methods, dict) or 'autoregressive' not in methods:
    raise ValueError(
      f'{results}: expected a "methods" object with an "autoregressive" '
      f'baseline, as python -m specjax.run writes'
    )
  return summary


def _stats(m: Summary, category: str) -> Summary | None:
  return m if category == 'all' else m.categories.get(category)


def advise(summary: dict, min_speedup: float = 1.03) -> dict:
  """{category: {'verdict', 'method', per-draft candidates...}} from results.json's content."""
  methods = {name: Summary.from_json(m) for name, m in summary['methods'].items()}
  if 'autoregressive' not in methods:
    raise ValueError(
      'the run has no autoregressive decoding to compare with (from Python: compare=True)'
    )
  base = methods['autoregressive']
  advice = {}
  for cat in ['all', *sorted(base.categories)]:
    ref = _stats(base, cat)
    per_draft = {}
    for name, m in methods.items():
      sub = _stats(m, cat)
      if name == 'autoregressive' or sub is None:
        continue
      overhead = sub.iteration_ms / ref.iteration_ms - 1
      draft = name.rpartition('@')[0]
      candidate = {
        'method': name,
        'draft': draft,
        'speedup': sub.speedup,
        'tokens_per_call': sub.tokens_per_call,
        'overhead': overhead,
        'margin': sub.tokens_per_call - 1 - overhead,
        'acceptance_rate': sub.acceptance_rate,
        'p99_ms_per_token_ratio': sub.latency_ms_per_token['p99'] / ref.latency_ms_per_token['p99'],
        'p99_latency_ms_delta': sub.latency_ms['p99'] - ref.latency_ms['p99'],
        'model_best_gamma': summary.get('best_gamma', {}).get(draft, {}).get(cat, {}).get('gamma'),
      }
      if draft not in per_draft or candidate['speedup'] > per_draft[draft]['speedup']:
        per_draft[draft] = candidate
    best = max(per_draft.values(), key=lambda c: c['speedup'], default=None)
    on = best is not None and best['speedup'] >= min_speedup and best['margin'] > 0
    advice[cat] = {
      'verdict': 'on' if on else 'off',
      'method': best['method'] if on else None,
      'best': best,
      'drafts': per_draft,
    }
  return advice


def format_advice(advice: dict) -> str:
  header = ['category', 'advice', 'speedup', 'tok/call', 'overhead', 'margin', 'p99 ms/tok']
  rows = []
  for cat, a in advice.items():
    b = a['best']
    if b is None:
      rows.append([cat, 'off (no draft ran)'] + [None] * (len(header) - 1))
      continue
    verdict = f'on: {b["method"]}' if a['verdict'] == 'on' else f'off (best {b["method"]})'
    gamma = b['model_best_gamma']
    rows.append(
      [
        cat,
        verdict,
        f'{b["speedup"]:.2f}x',
        b['tokens_per_call'],
        f'{b["overhead"]:+.2f}',
        f'{b["margin"]:+.2f}',
        f'{b["p99_ms_per_token_ratio"]:.2f}x',
        None if gamma is None else ('off' if gamma == 0 else gamma),
      ]
    )
  note = (
    'margin = tokens per call - 1 - overhead (iteration time over an autoregressive '
    'step, minus 1): positive pays; p99 ms/tok is against autoregressive decoding'
  )
  return tables.text_table([*header, 'model gamma'], rows) + '\n' + note


def main(argv=None) -> int:
  parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  parser.add_argument('workdir', help='a python -m specjax.run work directory (or results.json)')
  parser.add_argument('--min_speedup', type=float, default=1.03)
  args = parser.parse_args(argv)
  path = pathlib.Path(args.workdir)
  try:
    advice = advise(_load(path), args.min_speedup)
  except ValueError as e:
    print(f'error: {e}', file=sys.stderr)
    return 2
  print(format_advice(advice))
  out = (path if path.is_dir() else path.parent) / 'advice.json'
  out.write_text(json.dumps(advice, indent=2))
  print(f'advice in {out}')
  return 0


if __name__ == '__main__':
  sys.exit(main())
