r"""Token trees against chains on SmolLM2-135M-Instruct: tokens per call, speed, identity.

  python experiments/tree_bench/bench.py --draft quantized --prompts humaneval \
      --methods chain:4,chain:8,dynamic:16-6-4,4x2x1x1x1x1 --out experiments/tree_bench/results

Methods: `chain:G` (the drafter's chain of G tokens), a tree (specjax.core.tree.parse_tree:
`dynamic:SIZE-DEPTH-WIDTH` or a static shape such as `4x2x1x1`), or adaptive control
choosing among off and the given chains and static trees (`adaptive:2/4/3x2x1`, with
costs measured here first). Every method and
autoregressive decoding run on the same prompts, interleaved prompt batch by prompt batch
(`--rounds` times over the set; figures are medians over rounds of per-round totals).
It reports tokens per target call, tok/s (prefill included), speedup over autoregressive
decoding, tokens-per-call and speed ratios over the best chain, greedy mismatches
against autoregressive decoding, and the measured cost of a target forward over N + 1
tokens (the verification of an N-node tree) relative to a one-token step. Every
generated text goes to texts.json.
"""

from __future__ import annotations

import json
import pathlib
import statistics

import jax
from absl import app, flags

from specjax import registry
from specjax.bench import costs as costs_lib
from specjax.bench import provenance, tables
from specjax.checkpoints import loader
from specjax.control.adaptive import AdaptiveConfig
from specjax.core import tree as tree_lib
from specjax.core.sampling import SamplingConfig
from specjax.data import prompts as prompts_lib
from specjax.decode.engine import Engine
from specjax.decode.method import Method

flags.DEFINE_string('draft', 'quantized', 'The draft spec (specjax/registry.py).')
flags.DEFINE_string('methods', 'chain:4,chain:8,dynamic:16-6-4', 'Comma-separated methods.')
flags.DEFINE_string('prompts', 'humaneval', 'A prompt set (specjax.data.prompts).')
flags.DEFINE_integer('num_prompts', 10, 'How many prompts of the set.')
flags.DEFINE_integer('skip', 0, 'Prompts skipped at the start of the set (held-out slices).')
flags.DEFINE_integer('every', 1, 'Take every k-th prompt (mtbench with 10: one per category).')
flags.DEFINE_integer('max_new', 256, 'Tokens generated per prompt (EOS ends a row earlier).')
flags.DEFINE_float('temperature', 0.0, 'Sampling temperature (0: greedy).')
flags.DEFINE_integer('batch', 1, 'Rows per batch.')
flags.DEFINE_integer('rounds', 1, 'Passes over the prompt set (medians over rounds).')
flags.DEFINE_string('verify_sizes', '1,2,4,8,12,16,24,32', 'Tree sizes N whose cost is timed.')
flags.DEFINE_string('out', 'experiments/tree_bench/results', 'Folder for results.')
FLAGS = flags.FLAGS


def parse_method(text: str):
  """'chain:G' -> ('chain', G); 'adaptive:2/4/3x2x1' -> ('adaptive', (gammas, shapes));
  anything else a tree -> ('tree', TreeSpec)."""
  if text.startswith('chain:'):
    return 'chain', int(text[len('chain:') :])
  if text.startswith('adaptive:'):
    arms = text[len('adaptive:') :].split('/')
    gammas = tuple(sorted(int(a) for a in arms if a.isdigit()))
    shapes = tuple(tree_lib.parse_shape(a) for a in arms if not a.isdigit())
    return 'adaptive', (gammas, shapes)
  return 'tree', tree_lib.parse_tree(text)


def run_method(engine, method, prompts, sampling, seed):
  kind, arg = method
  build = {'chain': Method.chain, 'tree': Method.tree, 'adaptive': Method.adaptive}
  m = build[kind](arg) if kind in build else Method()
  return engine.generate(prompts, m, FLAGS.max_new, sampling, seed=seed)


def totals(outs) -> dict:
  tokens = sum(o.num_generated for o in outs)
  seconds = sum(o.prefill_seconds + o.decode_seconds for o in outs)
  calls = sum(o.target_calls for o in outs)
  return {'tokens': tokens, 'seconds': seconds, 'calls': calls}


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f'unexpected arguments: {argv[1:]}')
  names = ['autoregressive'] + [m.strip() for m in FLAGS.methods.split(',') if m.strip()]
  methods = {n: (parse_method(n) if n != 'autoregressive' else ('ar', 0)) for n in names}
  target = loader.load_model('smollm2-135m-instruct')
  drafter, draft_params = registry.build_draft(FLAGS.draft, target)
  engine = Engine(
    target.params,
    target.cfg,
    eos_id=target.tokenizer.eos_id,
    cache_size=1024,
    drafter=drafter,
    draft_params=draft_params,
  )
  sampling = SamplingConfig(temperature=FLAGS.temperature)
  chosen = prompts_lib.load_prompts(FLAGS.prompts)[FLAGS.skip :: FLAGS.every][: FLAGS.num_prompts]
  prompts = [target.tokenizer.encode_chat(p.text) for p in chosen]
  for kind, arg in methods.values():  # bad settings fail before any decoding
    if kind == 'tree':
      engine.check(Method.tree(arg), sampling)
  # The verification of an N-node tree is one target forward over N + 1 tokens.
  cache_size = 512
  sizes = [int(n) for n in FLAGS.verify_sizes.split(',')]
  timers = {
    n: costs_lib.timer_forward(target.params, target.cfg, FLAGS.batch, n, cache_size)
    for n in sorted({1, *(s + 1 for s in sizes)})
  }
  forward_ms = costs_lib.fastest(timers, repeats=5)
  verify = {n: forward_ms[n + 1] / forward_ms[1] for n in sizes}
  print('verify cost / step by tree size N:', {n: round(v, 2) for n, v in verify.items()})
  controllers = {}
  adaptive_methods = {n: arg for n, (kind, arg) in methods.items() if kind == 'adaptive'}
  if adaptive_methods:  # one measurement of this machine's costs, shared by every controller
    every_gamma = tuple(sorted({g for gammas, _ in adaptive_methods.values() for g in gammas}))
    every_shape = tuple(dict.fromkeys(t for _, shapes in adaptive_methods.values() for t in shapes))
    draft = (drafter, draft_params, every_gamma, every_shape)
    _, c = costs_lib.measure_drafts(
      target.params, target.cfg, {'d': draft}, FLAGS.batch, cache_size, sampling
    )
    print(f'adaptive costs: {c["d"].to_json()}')
    for n, (gammas, shapes) in adaptive_methods.items():
      controllers[n] = c['d'].to_json()
      methods[n] = 'adaptive', AdaptiveConfig.from_costs(c['d'], gammas, trees=shapes)
      engine.check(Method.adaptive(methods[n][1]), sampling)

  per_round = {n: [] for n in names}
  texts = {n: [] for n in names}
  outs_all = {n: [] for n in names}
  for r in range(FLAGS.rounds):
    outs = {n: [] for n in names}
    for i in range(0, len(prompts), FLAGS.batch):
      chunk = prompts[i : i + FLAGS.batch]
      for n in names:
        outs[n].append(run_method(engine, methods[n], chunk, sampling, seed=i))
      line = ', '.join(
        f'{n}: {o[-1].num_generated / (o[-1].decode_seconds + o[-1].prefill_seconds):.1f}'
        for n, o in outs.items()
      )
      print(f'round {r + 1} [{i + len(chunk)}/{len(prompts)}] tok/s {line}', flush=True)
    for n in names:
      per_round[n].append(totals(outs[n]))
      outs_all[n] = outs[n]
  ar_tokens = [t for o in outs_all['autoregressive'] for t in o.tokens]
  results = []
  for n in names:
    speed = statistics.median(t['tokens'] / t['seconds'] for t in per_round[n])
    tpc = statistics.median(t['tokens'] / t['calls'] for t in per_round[n])
    ar_speed = statistics.median(t['tokens'] / t['seconds'] for t in per_round['autoregressive'])
    rows = [t for o in outs_all[n] for t in o.tokens]
    kind, arg = methods[n]
    drafted = [d for o in outs_all[n] for row in o.drafted for d in row]
    # Batches: the share of row-iterations spent on rows that had already finished.
    idle = 1 - sum(len(row) for o in outs_all[n] for row in o.accepted) / sum(
      o.steps * len(o.accepted) for o in outs_all[n]
    )
    results.append(
      {
        'method': n,
        'kind': kind,
        'nodes': arg.nodes if kind == 'tree' else arg if kind != 'adaptive' else None,
        'depth': arg.max_depth if kind == 'tree' else arg if kind != 'adaptive' else None,
        # iterations by nodes verified (0: plain steps), last round
        'iterations_by_nodes': {d: drafted.count(d) for d in sorted(set(drafted))},
        'finished_row_fraction': idle,
        'tokens_per_second': speed,
        'tokens_per_call': tpc,
        'speedup': speed / ar_speed,
        'greedy_mismatches': sum(a != b for a, b in zip(rows, ar_tokens)),
        'tokens': per_round[n][-1]['tokens'],
      }
    )
    texts[n] = [target.tokenizer.decode(t) for t in rows]
  chains = [r for r in results if r['kind'] == 'chain']
  best_chain = max(chains, key=lambda r: r['tokens_per_second']) if chains else None
  for r in results:
    if best_chain is not None:
      r['tokens_per_call_vs_best_chain'] = r['tokens_per_call'] / best_chain['tokens_per_call']
      r['speed_vs_best_chain'] = r['tokens_per_second'] / best_chain['tokens_per_second']
  meta = {
    **provenance.provenance(),
    'backend': jax.default_backend(),
    'draft': drafter.name,
    'prompt_set': FLAGS.prompts,
    'prompts': [p.id for p in chosen],
    'max_new': FLAGS.max_new,
    'temperature': FLAGS.temperature,
    'batch': FLAGS.batch,
    'rounds': FLAGS.rounds,
    'forward_ms': forward_ms,
    'verify_cost_by_nodes': verify,
    'adaptive_costs': controllers,
    'best_chain': best_chain['method'] if best_chain else None,
  }
  out = pathlib.Path(FLAGS.out)
  out.mkdir(parents=True, exist_ok=True)
  (out / 'results.json').write_text(json.dumps({'meta': meta, 'results': results}, indent=2))
  (out / 'texts.json').write_text(json.dumps(texts, indent=1))
  header = [
    'method',
    'nodes',
    'tokens/call',
    'tok/s',
    'speedup',
    'tokens/call vs best chain',
    'speed vs best chain',
    'greedy mismatches',
    'finished rows',
  ]
  rows = [
    [
      r['method'],
      r['nodes'],
      r['tokens_per_call'],
      r['tokens_per_second'],
      f'{r["speedup"]:.2f}x',
      f'{r.get("tokens_per_call_vs_best_chain", float("nan")):.2f}x',
      f'{r.get("speed_vs_best_chain", float("nan")):.2f}x',
      r['greedy_mismatches'] if FLAGS.temperature == 0 else None,
      f'{r["finished_row_fraction"]:.0%}',
    ]
    for r in results
  ]
  table = tables.markdown_table(header, rows, formats={'tok/s': '.1f'})
  cost_line = 'verify cost / one-token step by tree size N: ' + ', '.join(
    f'{n}: {v:.2f}' for n, v in verify.items()
  )
  (out / 'table.md').write_text(table + '\n\n' + cost_line + '\n')
  print(table)
  print(cost_line)


if __name__ == '__main__':
  app.run(main)
