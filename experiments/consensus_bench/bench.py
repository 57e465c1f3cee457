r"""Consensus drafts for N parallel samples on SmolLM2-135M-Instruct.

  python experiments/consensus_bench/bench.py --sets mtbench:math,mtbench:reasoning,humaneval \
      --num_prompts 3 --n 8 --gammas 2,4 --temperature 0.7 --max_new 128 \
      --out experiments/consensus_bench/results

For every prompt, N copies are decoded as one batch (same seed for every method) with:
plain batched autoregressive decoding, each path doing prompt lookup over its own context
alone (n-grams of 3..1), and consensus drafts (each path drafting from the other N - 1),
in both proposal modes (mode: best-supported path with one-hot q; sample: drawn from the
votes). Methods run back to back on the same prompt. Reported per prompt set and method:
mean tokens per target call (per row), aggregate tokens/s and speedup over the plain
batched decoding of the same N paths.
"""

from __future__ import annotations

import json
import pathlib
import sys

import numpy as np
from absl import app, flags

from specjax import self_consistency as sc
from specjax.bench import provenance, tables
from specjax.checkpoints import loader
from specjax.core.sampling import SamplingConfig
from specjax.data import prompts as prompts_lib
from specjax.decode.engine import Engine
from specjax.drafters import ConsensusDrafter, NgramDrafter

flags.DEFINE_string(
  'sets', 'mtbench:math,mtbench:reasoning,humaneval', 'Comma-separated prompt sets.'
)
flags.DEFINE_integer('num_prompts', 3, 'Prompts per set (the first N).')
flags.DEFINE_integer('n', 8, 'Paths sampled per prompt, decoded as one batch.')
flags.DEFINE_string('gammas', '2,4', 'Comma-separated draft lengths.')
flags.DEFINE_float('temperature', 0.7, 'Sampling temperature.')
flags.DEFINE_integer('max_new', 128, 'Tokens generated per path.')
flags.DEFINE_string('proposals', 'mode,sample', 'Comma-separated consensus proposal modes.')
flags.DEFINE_integer('k', 4, "Consensus drafts: how many of a path's last tokens are matched.")
flags.DEFINE_integer('m', 1, 'Consensus drafts: how many of those k may differ.')
flags.DEFINE_string('out', 'experiments/consensus_bench/results', 'Folder for results.json.')
FLAGS = flags.FLAGS


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f'unexpected arguments: {argv[1:]}')
  gammas = [int(g) for g in FLAGS.gammas.split(',')]

  target = loader.load_model('smollm2-135m-instruct')
  vocab, eos = target.cfg.vocab_size, target.tokenizer.eos_id
  base = Engine(
    target.params, target.cfg, eos_id=eos, cache_size=1024, drafter=NgramDrafter(vocab, n_max=3)
  )
  engines = {'ngram': base}
  for proposal in FLAGS.proposals.split(','):
    drafter = ConsensusDrafter(
      vocab, group=FLAGS.n, k=FLAGS.k, max_mismatches=FLAGS.m, n_max=3, proposal=proposal
    )
    engines[f'consensus-{proposal}'] = Engine(
      base.params, target.cfg, eos_id=eos, cache_size=1024, drafter=drafter
    )
  sampling = SamplingConfig(temperature=FLAGS.temperature)
  records = []
  for spec in FLAGS.sets.split(','):
    for i, prompt in enumerate(prompts_lib.load_prompts(spec, FLAGS.num_prompts)):
      ids = target.tokenizer.encode_chat(prompt.text)
      row = {'set': spec, 'id': prompt.id, 'methods': {}}
      runs = [('autoregressive', base, 0)] + [
        (f'{name} g{g}', e, g) for name, e in engines.items() for g in gammas
      ]
      for label, engine, gamma in runs:
        out = sc.run_paths(engine, ids, FLAGS.n, FLAGS.max_new, sampling, seed=i, gamma=gamma)
        stats = sc.method_stats(out)
        if label.startswith('consensus'):
          texts = [target.tokenizer.decode(t) for t in out.tokens]
          stats['vote'] = sc.majority_vote([sc.extract_answer(t) for t in texts])
        row['methods'][label] = stats
        print(
          f'{spec} {prompt.id} {label}: {stats["tokens_per_call"]:.2f} tokens/call, '
          f'{stats["tokens_per_second"]:.1f} tok/s',
          flush=True,
        )
      records.append(row)

  summary = {}
  for spec in FLAGS.sets.split(','):
    rows = [r for r in records if r['set'] == spec]
    out = {}
    for label in rows[0]['methods']:
      ms = [r['methods'][label] for r in rows]
      out[label] = {
        'tokens_per_call': float(np.mean([m['tokens_per_call'] for m in ms])),
        'tokens_per_second': sum(m['tokens'] for m in ms) / sum(m['seconds'] for m in ms),
        'acceptance': float(np.mean([m['acceptance_rate'] or 0 for m in ms])),
      }
    ar = out['autoregressive']['tokens_per_second']
    for label, s in out.items():
      s['speedup'] = s['tokens_per_second'] / ar
      gamma = label.rsplit(' g', 1)[-1]
      if label.startswith('consensus'):
        s['tokens_per_call_vs_ngram'] = (
          s['tokens_per_call'] / out[f'ngram g{gamma}']['tokens_per_call']
        )
    summary[spec] = out

  result = {
    'args': {f.name: f.value for f in FLAGS.get_key_flags_for_module(sys.modules[__name__])},
    'provenance': provenance.provenance(),
    'summary': summary,
    'prompts': records,
  }
  path = pathlib.Path(FLAGS.out)
  path.mkdir(parents=True, exist_ok=True)
  (path / 'results.json').write_text(json.dumps(result, indent=1))
  header = ['set', 'method', 'tokens/call', 'vs own n-gram', 'acceptance', 'tok/s', 'speedup']
  rows = []
  for spec, out in summary.items():
    for label, s in out.items():
      vs = s.get('tokens_per_call_vs_ngram')
      rows.append(
        [
          spec,
          label,
          s['tokens_per_call'],
          None if vs is None else f'{vs:.2f}x',
          s['acceptance'],
          s['tokens_per_second'],
          f'{s["speedup"]:.2f}x',
        ]
      )
  print(tables.markdown_table(header, rows, formats={'tok/s': '.1f'}))


if __name__ == '__main__':
  app.run(main)
