r"""Self-speculative layer skipping on SmolLM2-135M-Instruct, per MT-bench category and HumanEval.

  python experiments/layerskip_bench/bench.py --config configs/layerskip_smollm2.py \
      --per_category 2 --humaneval 4 --max_new 64 --out experiments/layerskip_bench/results

Reads the calibrated draft and gamma from the config (its `drafts[0]` and `gammas[0]`;
configs/layerskip_smollm2.py reads what `python -m specjax.calibrate_skip` wrote), or
takes --draft / --gamma, then decodes greedily at batch 1, autoregressive and speculative
back to back on every prompt, and reports per category: acceptance, tokens per target
call, tokens/s, speedup, greedy mismatches.
"""

from __future__ import annotations

import json
import pathlib
import sys

from absl import app, flags

from specjax import config_lib, registry
from specjax.bench import metrics, provenance, tables
from specjax.checkpoints import loader
from specjax.data import prompts as prompts_lib
from specjax.decode.engine import Engine
from specjax.decode.method import Method

flags.DEFINE_string(
  'config', 'configs/layerskip_smollm2.py', 'The config giving the draft (drafts[0]) and gamma.'
)
flags.DEFINE_string('draft', None, 'overrides the config, e.g. layers:0-11,20-29')
flags.DEFINE_integer('gamma', None, 'Overrides the config.')
flags.DEFINE_integer('per_category', 2, 'MT-bench prompts per category.')
flags.DEFINE_integer('humaneval', 4, 'HumanEval prompts (0: none).')
flags.DEFINE_integer('max_new', 64, 'Tokens generated per prompt.')
flags.DEFINE_string('out', 'experiments/layerskip_bench/results', 'Folder for results.json.')
FLAGS = flags.FLAGS


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f'unexpected arguments: {argv[1:]}')
  needs_config = FLAGS.draft is None or FLAGS.gamma is None
  config = config_lib.load_config(FLAGS.config) if needs_config else None
  draft = FLAGS.draft or config.drafts[0]
  gamma = FLAGS.gamma or config.gammas[0]

  target = loader.load_model('smollm2-135m-instruct')
  drafter, draft_params = registry.build_draft(draft, target)
  label = drafter.name
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
    sets += prompts_lib.load_prompts(f'mtbench:{cat}', FLAGS.per_category)
  if FLAGS.humaneval:
    sets += prompts_lib.load_prompts('humaneval', FLAGS.humaneval)
  per = {}
  for prompt in sets:
    ids = target.tokenizer.encode_chat(prompt.text)
    plain = engine.generate([ids], max_new_tokens=FLAGS.max_new)
    spec = engine.generate([ids], Method.chain(gamma, 'greedy'), max_new_tokens=FLAGS.max_new)
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
      f'{metrics.tokens_per_call(spec.num_generated, spec.target_calls):.2f} tokens/call',
      flush=True,
    )

  rows = {}
  for cat, c in per.items():
    tps = c['tokens'] / c['seconds']
    rows[cat] = {
      'prompts': c['prompts'],
      'acceptance': c['accepted'] / max(c['drafted'], 1),
      'tokens_per_call': metrics.tokens_per_call(c['tokens'], c['calls']),
      'tokens_per_second': tps,
      'speedup': tps / (c['plain_tokens'] / c['plain_seconds']),
      'greedy_mismatches': c['mismatches'],
    }
  total = {k: sum(c[k] for c in per.values()) for k in next(iter(per.values()))}
  rows['all'] = {
    'prompts': total['prompts'],
    'acceptance': total['accepted'] / max(total['drafted'], 1),
    'tokens_per_call': metrics.tokens_per_call(total['tokens'], total['calls']),
    'tokens_per_second': total['tokens'] / total['seconds'],
    'speedup': (total['tokens'] / total['seconds'])
    / (total['plain_tokens'] / total['plain_seconds']),
    'greedy_mismatches': total['mismatches'],
  }
  out = pathlib.Path(FLAGS.out)
  out.mkdir(parents=True, exist_ok=True)
  (out / 'results.json').write_text(
    json.dumps(
      {
        'args': {f.name: f.value for f in FLAGS.get_key_flags_for_module(sys.modules[__name__])},
        'draft': draft,
        'label': label,
        'gamma': gamma,
        'provenance': provenance.provenance(),
        'per_category': rows,
      },
      indent=1,
    )
  )
  print(f'draft {draft} ({label}), gamma {gamma}')
  header = 'category prompts acceptance tokens/call tok/s speedup'.split() + ['greedy mismatches']
  table = [
    [
      cat,
      r['prompts'],
      r['acceptance'],
      r['tokens_per_call'],
      r['tokens_per_second'],
      f'{r["speedup"]:.2f}x',
      r['greedy_mismatches'],
    ]
    for cat, r in rows.items()
  ]
  print(tables.markdown_table(header, table, formats={'tok/s': '.1f'}))


if __name__ == '__main__':
  app.run(main)
