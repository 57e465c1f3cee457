"""Leviathan et al. 2023's curves for a run: python experiments/papers/leviathan2023/analyse.py RUN

Writes RUN/leviathan.md (alpha, c, measured and predicted tokens per call and speedup per
draft, category and gamma) and RUN/leviathan.png (specjax.bench.leviathan).
"""

import json
import pathlib
import sys

from specjax.bench import leviathan


def main(run: str) -> None:
  run_dir = pathlib.Path(run)
  summary = json.loads((run_dir / 'results.json').read_text())
  curves = leviathan.analyse(summary)
  model = pathlib.Path(summary['model']).name
  title = f'{model}, T={summary["temperature"]}, {summary["verifier"]}'
  (run_dir / 'leviathan.md').write_text(f'{title}\n\n{leviathan.table(curves)}\n')
  print(leviathan.table(curves))
  print(leviathan.plot(curves, run_dir / 'leviathan.png', title))


if __name__ == '__main__':
  main(sys.argv[1])
