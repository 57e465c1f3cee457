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


def _stats(m: dict, category: str) -> dict | None:
  return m if category == 'all' else m.get('categories', {}).get(category)


def advise(summary: dict, min_speedup: float = 1.03) -> dict:
  """{category: {'verdict', 'method', per-draft candidates...}}."""
  methods = summary['methods']
  base = methods['autoregressive']
  categories = ['all', *sorted(base.get('categories', {}))]
  advice = {}
  for cat in categories:
    ref = _stats(base, cat)
    candidates = []
    for name, m in methods.items():
      sub = _stats(m, cat)
      if name == 'autoregressive' or sub is None:
        continue
      overhead = sub['iteration_ms'] / ref['iteration_ms'] - 1
      margin = sub['tokens_per_call'] - 1 - overhead
      candidates.append(
        {
          'method': name,
          'draft': name.rpartition('@')[0],
          'speedup': sub['speedup'],
          'tokens_per_call': sub['tokens_per_call'],
          'overhead': overhead,
          'margin': margin,
          'acceptance_rate': sub['acceptance_rate'],
          'p99_ms_per_token_ratio': (
            sub['latency_ms_per_token']['p99'] / ref['latency_ms_per_token']['p99']
          ),
          'p99_latency_ms_delta': sub['latency_ms']['p99'] - ref['latency_ms']['p99'],
        }
      )
    per_draft = {}
    for c in candidates:
      best = per_draft.get(c['draft'])
      if best is None or c['speedup'] > best['speedup']:
        per_draft[c['draft']] = c
    for draft, c in per_draft.items():
      c['model_best_gamma'] = summary.get('best_gamma', {}).get(draft, {}).get(cat, {}).get('gamma')
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
  lines = [
    f'{"category":<14}{"advice":<26}{"speedup":>8}{"tok/call":>9}{"overhead":>9}'
    f'{"margin":>8}{"p99 ms/tok":>11}{"model gamma":>12}'
  ]
  for cat, a in advice.items():
    b = a['best']
    if b is None:
      lines.append(f'{cat:<14}{"off (no draft ran)":<26}')
      continue
    verdict = f'on: {b["method"]}' if a['verdict'] == 'on' else f'off (best {b["method"]})'
    gamma = b['model_best_gamma']
    lines.append(
      f'{cat:<14}{verdict:<26}{b["speedup"]:>7.2f}x{b["tokens_per_call"]:>9.2f}'
      f'{b["overhead"]:>+9.2f}{b["margin"]:>+8.2f}'
      f'{b["p99_ms_per_token_ratio"]:>10.2f}x'
      f'{"-" if gamma is None else ("off" if gamma == 0 else gamma):>12}'
    )
  lines.append(
    'margin = tokens per call - 1 - overhead (iteration time over an autoregressive '
    'step, minus 1): positive pays; p99 ms/tok is against autoregressive decoding'
  )
  return '\n'.join(lines)


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
