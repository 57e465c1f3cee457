"""Markdown tables of experiments/cpu_paths/decode.sh's runs: one row per method, one column
pair per run (tokens per target call, speedup over autoregressive decoding, prefill in).

  python experiments/cpu_paths/table.py experiments/cpu_paths/runs
"""

import json
import pathlib
import sys


def main(folder: str) -> None:
  runs = sorted(p for p in pathlib.Path(folder).iterdir() if (p / 'results.json').exists())
  results = {p.name: json.loads((p / 'results.json').read_text()) for p in runs}
  methods = list(next(iter(results.values()))['methods']) if results else []
  print('| method | ' + ' | '.join(f'{n}: tok/call, speedup' for n in results) + ' |')
  print('| --- |' + ' ---: |' * len(results))
  for name in methods:
    cells = []
    for r in results.values():
      m = r['methods'].get(name)
      cells.append(f'{m["tokens_per_call"]:.2f}, {m["speedup"]:.2f}x' if m else 'skipped')
    print(f'| {name} | ' + ' | '.join(cells) + ' |')
  for n, r in results.items():
    mism = sum(m.get('greedy_mismatches') or 0 for m in r['methods'].values())
    cpu = r['provenance'].get('cpu', {})
    print(
      f'\n{n}: {r["num_prompts"]} prompts, greedy mismatches {mism}; CPU {cpu.get("cpu")} '
      f'({cpu.get("isa_flags")}), kernels requested {cpu.get("kernels_requested")}'
    )


if __name__ == '__main__':
  main(sys.argv[1] if len(sys.argv) > 1 else 'experiments/cpu_paths/runs')
