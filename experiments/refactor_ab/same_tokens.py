"""Are runs token-identical? python same_tokens.py RUN_DIR RUN_DIR [...]: every record of
the first run's generations.jsonl against the others', and each run's speedups."""

import json
import sys


def tokens(run: str) -> dict:
  out = {}
  with open(f'{run}/generations.jsonl') as f:
    for line in f:
      r = json.loads(line)
      out[r['method'], r['id'], r.get('turn', 1)] = r['tokens']
  return out


def main(runs: list[str]) -> None:
  first = tokens(runs[0])
  for other in runs[1:]:
    o = tokens(other)
    same = sum(first[k] == o.get(k) for k in first)
    print(f'{runs[0]} vs {other}: {same}/{len(first)} records token-identical')
  for run in runs:
    with open(f'{run}/results.json') as f:
      methods = json.load(f)['methods']
    print(run, ', '.join(f'{k} {v["speedup"]:.2f}x' for k, v in methods.items()))


if __name__ == '__main__':
  main(sys.argv[1:])
