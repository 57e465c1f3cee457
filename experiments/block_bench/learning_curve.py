"""The block drafter's learning curve against the EAGLE head's, at equal training tokens
and at equal training time, from the trainers' metrics.jsonl (held-aside evaluations).

  python experiments/block_bench/learning_curve.py \
      --dflash specjax/drafts/smollm2-135m-instruct-dflash/train_metrics.jsonl \
      --out experiments/block_bench/learning_curve.png

Both trainers consume 8 sequences of 320 positions a step from the same feature data
(configs/eagle_smollm2.py, configs/dflash_smollm2.py), so a step is the same number of
training tokens for both; time is each run's own (tokens / its measured tokens per second,
summed), on whichever CPU trained it. Plotted: `greedy_1` (the first drafted token is the
target's greedy one) and `chain` (expected greedy tokens accepted per call from a
teacher-forced block: 3 positions for the EAGLE head, the block's for DFlash).
"""

from __future__ import annotations

import argparse
import json
import pathlib

EAGLE = pathlib.Path(__file__).parents[2] / 'specjax/drafts/smollm2-135m-instruct-eagle3'


def curve(files: list[pathlib.Path]) -> list[dict]:
  """Evaluations with cumulative training tokens and seconds, over runs that continue
  each other (a file's steps restart where the one before ended)."""
  out, tokens, seconds = [], 0.0, 0.0
  for f in files:
    last_tokens, base_tokens = 0.0, tokens
    for line in f.read_text().splitlines():
      r = json.loads(line)
      if r['kind'] == 'train':
        # a resumed run logs some steps again: only tokens past the last count
        seconds += max(r['tokens'] - last_tokens, 0) / max(r['tokens_per_s'], 1e-9)
        last_tokens = r['tokens']
        tokens = base_tokens + r['tokens']
      elif r['kind'] == 'eval' and not (out and r['step'] == 0 and base_tokens):
        per_step = last_tokens / max(r['step'], 1) if last_tokens else 0.0
        out.append({**r, 'tokens': base_tokens + per_step * r['step'], 'seconds': seconds})
  return out


def main(argv=None):
  ap = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
  ap.add_argument('--dflash', type=pathlib.Path, nargs='+', required=True)
  ap.add_argument(
    '--eagle',
    type=pathlib.Path,
    nargs='+',
    default=[EAGLE / 'train_metrics.jsonl', EAGLE / 'train_metrics_phase2.jsonl'],
  )
  ap.add_argument('--out', type=pathlib.Path, required=True)
  args = ap.parse_args(argv)
  runs = {'EAGLE head (3 steps)': curve(args.eagle), 'DFlash block': curve(args.dflash)}
  for name, evals in runs.items():
    for e in evals:
      print(
        f'{name:20s} step {e["step"]:5d}  tokens {e["tokens"] / 1e6:5.2f}M  '
        f'time {e["seconds"] / 3600:5.2f} h  greedy_1 {e["greedy_1"]:.3f}  chain {e["chain"]:.2f}'
      )
  import matplotlib

  matplotlib.use('Agg')
  import matplotlib.pyplot as plt

  fig, axes = plt.subplots(2, 2, figsize=(10, 7), sharey='row')
  for row, metric in enumerate(('chain', 'greedy_1')):
    for col, (x, label) in enumerate((('tokens', 'training tokens (M)'), ('seconds', 'hours'))):
      ax = axes[row, col]
      for name, evals in runs.items():
        scale = 1e6 if x == 'tokens' else 3600
        ax.plot([e[x] / scale for e in evals], [e[metric] for e in evals], 'o-', ms=3, label=name)
      ax.set_xlabel(label)
      ax.set_ylabel(metric)
      ax.grid(alpha=0.3)
  axes[0, 0].legend()
  fig.suptitle('SmolLM2-135M-Instruct drafters, held-aside greedy acceptance')
  fig.tight_layout()
  fig.savefig(args.out, dpi=110)
  print(f'wrote {args.out}')


if __name__ == '__main__':
  main()
