"""The side-by-side tables of experiments/papers/*/README.md from the runs of run.sh.

  python experiments/papers/tables.py chen RUN/t1            # code vs prose at T=1
  python experiments/papers/tables.py sun RUN/t1 RUN/t1_block  # token vs block verification

chen: per category (code, prose) and method, the acceptance rate (accepted / drafted
tokens), tokens per target call, the decode loop's mean time per token and its speedup
over autoregressive decoding in the same run, and the end-to-end speedup (prefill in).

sun: the same prompts and keys verified token by token (rejection sampling) and by
blocks; per category and method, tokens per call of each (block efficiency) and each
one's decode speedup over its own run's autoregressive decoding (wall clock as a ratio
taken within a run: the two runs are minutes apart on a shared machine).
"""

from __future__ import annotations

import json
import pathlib
import sys


def _methods(run: str) -> dict[str, dict]:
  summary = json.loads((pathlib.Path(run) / 'results.json').read_text())
  return summary['methods']


def _cells(m: dict, cat: str) -> dict:
  return m if cat == 'all' else m['categories'][cat]


def _categories(methods: dict) -> list[str]:
  return [*sorted(methods['autoregressive'].get('categories', {})), 'all']


def chen(run: str) -> str:
  methods = _methods(run)
  lines = [
    '| category | method | acceptance | tokens/call | ms/token (decode) | decode speedup '
    '| speedup (prefill in) |',
    '|---|---|---|---|---|---|---|',
  ]
  for cat in _categories(methods):
    for name, m in methods.items():
      c = _cells(m, cat)
      acc = '-' if c['acceptance_rate'] is None else f'{c["acceptance_rate"]:.2f}'
      lines.append(
        f'| {cat} | {name} | {acc} | {c["tokens_per_call"]:.2f} '
        f'| {1e3 / c["decode_tokens_per_second"]:.1f} | {c["decode_speedup"]:.2f}x '
        f'| {c["speedup"]:.2f}x |'
      )
  return '\n'.join(lines)


def sun(token_run: str, block_run: str) -> str:
  token, block = _methods(token_run), _methods(block_run)
  lines = [
    '| category | method | tokens/call, token | tokens/call, block | block / token '
    '| decode speedup, token | decode speedup, block | block / token |',
    '|---|---|---|---|---|---|---|---|',
  ]
  for cat in _categories(token):
    for name in token:
      if name == 'autoregressive' or name not in block:
        continue
      t, b = _cells(token[name], cat), _cells(block[name], cat)
      lines.append(
        f'| {cat} | {name} | {t["tokens_per_call"]:.2f} | {b["tokens_per_call"]:.2f} '
        f'| {b["tokens_per_call"] / t["tokens_per_call"]:.3f} '
        f'| {t["decode_speedup"]:.2f}x | {b["decode_speedup"]:.2f}x '
        f'| {b["decode_speedup"] / t["decode_speedup"]:.3f} |'
      )
  return '\n'.join(lines)


def main(argv: list[str]) -> int:
  tables = {'chen': (chen, 1), 'sun': (sun, 2)}
  if len(argv) < 2 or argv[0] not in tables or len(argv) - 1 != tables[argv[0]][1]:
    print(__doc__, file=sys.stderr)
    return 2
  fn, _ = tables[argv[0]]
  for run in argv[1:]:
    if not (pathlib.Path(run) / 'results.json').is_file():
      print(f'error: {run}/results.json: no such file (a run of experiments/papers/run.sh)')
      return 2
  print(fn(*argv[1:]))
  return 0


if __name__ == '__main__':
  sys.exit(main(sys.argv[1:]))
