r"""EAGLE head design measurements for SmolLM2-135M-Instruct: draft vocabulary size against
coverage and cost, and the learning curve of a training run.

  python experiments/eagle_bench/design.py --workdir runs/eagle \
      --out experiments/eagle_bench/results

1. Coverage: the share of the target's greedy tokens on the held-aside feature data that
   fall inside the K most frequent training tokens, for several K (q = 0 outside, so a
   token outside can never be drafted).
2. Cost: one head proposal of gamma tokens (the catch-up pass over gamma + 1 committed
   positions plus gamma - 1 own steps), per drafted token, against one target step, for
   each K (random weights: cost does not depend on them), timed inside jitted loops
   (the fastest of 5 runs).
3. The learning curve of the run in --workdir (metrics.jsonl): held-aside greedy match per
   draft step and the chain estimate against training tokens, as PNG and JSONL.
"""

from __future__ import annotations

import json
import pathlib

import jax
import numpy as np
from absl import app, flags

from specjax.bench import costs as costs_lib
from specjax.bench import provenance, tables
from specjax.checkpoints import loader
from specjax.drafters.eagle import EagleDrafter
from specjax.models import eagle as eagle_model
from specjax.train import eagle_head, feature_data

flags.DEFINE_string('workdir', 'runs/eagle', 'A training run (metrics.jsonl) for the curve.')
flags.DEFINE_string('sizes', '2048,4096,8192,16384', 'Draft vocabulary sizes to compare.')
flags.DEFINE_integer('gamma', 3, 'Draft length for the cost measurement.')
flags.DEFINE_bool('curve_only', False, 'Only the learning curve (no model, no timing).')
flags.DEFINE_string('out', 'experiments/eagle_bench/results', 'Output folder.')
FLAGS = flags.FLAGS


def learning_curve(workdir: pathlib.Path, out: pathlib.Path) -> list[dict]:
  import matplotlib

  matplotlib.use('Agg')
  import matplotlib.pyplot as plt

  records = [json.loads(x) for x in (workdir / 'metrics.jsonl').read_text().splitlines()]
  per_step = {r['step']: r['tokens'] // r['step'] for r in records if r.get('tokens')}
  tokens_per_step = next(iter(per_step.values()))
  curve = [
    {'step': r['step'], 'train_tokens': r['step'] * tokens_per_step, **r}
    for r in records
    if r['kind'] == 'eval'
  ]
  with (out / 'learning_curve.jsonl').open('w') as f:
    for r in curve:
      f.write(json.dumps(r) + '\n')
  fig, ax = plt.subplots(figsize=(6.5, 4))
  x = [r['train_tokens'] / 1e6 for r in curve]
  for key in ('greedy_1', 'greedy_2', 'greedy_3', 'accept_t1_1'):
    ax.plot(x, [r[key] for r in curve], marker='.', label=key)
  ax.set_xlabel('training tokens (millions; positions seen, repeats counted)')
  ax.set_ylabel('held-aside agreement with the target')
  ax.set_ylim(0, 1)
  ax2 = ax.twinx()
  ax2.plot(x, [r['chain'] for r in curve], 'k--', label='chain (right)')
  ax2.set_ylabel('draft tokens kept per greedy chain of 3')
  h1, l1 = ax.get_legend_handles_labels()
  h2, l2 = ax2.get_legend_handles_labels()
  ax.legend(h1 + h2, l1 + l2, loc='upper left', fontsize=8)
  fig.tight_layout()
  fig.savefig(out / 'learning_curve.png', dpi=110)
  plt.close(fig)
  return curve


def main(_):
  out = pathlib.Path(FLAGS.out)
  out.mkdir(parents=True, exist_ok=True)
  if FLAGS.curve_only:
    learning_curve(pathlib.Path(FLAGS.workdir), out)
    return
  from specjax import config_lib

  config = config_lib.load_config('eagle_smollm2.py')
  target = loader.load_model(config.target)
  capture = eagle_model.default_capture(target.cfg.n_layers)
  train, held = feature_data.build(target, config.data, capture)
  full_w = eagle_head.full_w_of(target)
  top = eagle_head.target_argmax({'full_w': full_w}, held, 8)
  mask = held.mask[held.rows][:, 1:]
  sizes = [int(s) for s in FLAGS.sizes.split(',')]
  rows = []
  step_ms = costs_lib.forward_ms(target.params, target.cfg, 1, 1, 1024)
  for k in sizes:
    ids = eagle_head.vocabulary(target, train, k)
    inside = np.zeros(target.cfg.vocab_size, bool)
    inside[ids] = True
    cfg = eagle_model.EagleConfig.for_target(target.cfg, k)
    params = eagle_model.init_params(cfg, jax.random.key(0), ids, target.params)
    drafter = EagleDrafter(cfg)
    timer = costs_lib.timer_propose(
      drafter,
      {'head': params, 'embed': target.params['embed']},
      target.params,
      target.cfg,
      1,
      FLAGS.gamma,
      1024,
    )
    ms = costs_lib.fastest({'propose': timer})['propose']
    rows.append(
      {
        'draft_vocab': k,
        'coverage': float(inside[top][mask].mean()),
        'params_M': cfg.num_params / 1e6,
        'propose_ms': ms,
        'ms_per_token': ms / FLAGS.gamma,
        'fraction_of_target_step': ms / FLAGS.gamma / step_ms,
      }
    )
    print(rows[-1], flush=True)
  result = {'provenance': provenance.provenance(), 'target_step_ms': step_ms, 'vocab': rows}
  workdir = pathlib.Path(FLAGS.workdir)
  if (workdir / 'metrics.jsonl').exists():
    result['learning_curve'] = learning_curve(workdir, out)
  (out / 'design.json').write_text(json.dumps(result, indent=2))
  print(
    tables.markdown_table(
      ['K', 'greedy tokens covered', 'head params (M)', 'ms per draft token', 'of a target step'],
      [
        [
          r['draft_vocab'],
          f'{r["coverage"]:.3f}',
          f'{r["params_M"]:.1f}',
          f'{r["ms_per_token"]:.2f}',
          f'{r["fraction_of_target_step"]:.1%}',
        ]
        for r in rows
      ],
    )
  )


if __name__ == '__main__':
  app.run(main)
