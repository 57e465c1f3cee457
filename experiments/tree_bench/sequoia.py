r"""Static tree shapes chosen from measured acceptance and measured costs (Sequoia-style).

  python experiments/tree_bench/sequoia.py --draft eagle --prompts humaneval \
      --calibrate 6 --evaluate 10 --out experiments/tree_bench/sequoia_eagle_humaneval

1. Calibration: greedy decoding with a wide probe tree on the first `--calibrate` prompts
   records the node every iteration stopped at, which gives the chance that the target's
   token is the draft's r-th best child at each depth (cost_model.rank_acceptance).
2. Search: for every tree size N in `--sizes`, the N-node tree of most expected accepted
   tokens under that acceptance (core.tree.best_shape); its proposal and its (N + 1)-token
   verification are timed on this machine (specjax.bench.costs), and the cost model
   predicts its speedup, (expected accepted + 1) / (draft + verify) in target steps.
   Chains of each length get the same prediction from the rank-0 column.
3. Evaluation on the next `--evaluate` prompts (held out from calibration): autoregressive
   decoding, the best predicted chain and the best predicted tree (and the runner-up
   tree), measured tokens per call and speedups beside the predicted ones.
"""

from __future__ import annotations

import json
import pathlib

import jax
import numpy as np
from absl import app, flags

from specjax import registry
from specjax.bench import costs as costs_lib
from specjax.bench import provenance, tables
from specjax.checkpoints import loader
from specjax.control import cost_model
from specjax.core import tree as tree_lib
from specjax.core.sampling import SamplingConfig
from specjax.data import prompts as prompts_lib
from specjax.decode.engine import Engine
from specjax.decode.method import Method

flags.DEFINE_string('draft', 'eagle', 'The draft spec (specjax/registry.py).')
flags.DEFINE_string('prompts', 'humaneval', 'A prompt set (specjax.data.prompts).')
flags.DEFINE_integer('calibrate', 6, 'Prompts for the acceptance calibration (the first ones).')
flags.DEFINE_integer('evaluate', 10, 'Held-out prompts for the evaluation (the next ones).')
flags.DEFINE_integer('max_new', 256, 'Tokens generated per prompt.')
flags.DEFINE_string('probe', '', 'Probe tree (default: 32 nodes from a generic prior).')
flags.DEFINE_string('sizes', '4,6,8,12,16,24', 'Tree sizes N searched.')
flags.DEFINE_string('chains', '2,3,4,6,8', 'Chain lengths compared.')
flags.DEFINE_integer('max_depth', 8, 'Deepest tree searched.')
flags.DEFINE_string('out', 'experiments/tree_bench/sequoia', 'Folder for results.')
FLAGS = flags.FLAGS


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f'unexpected arguments: {argv[1:]}')
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
  greedy = SamplingConfig()
  chosen = prompts_lib.load_prompts(FLAGS.prompts)
  calib = [target.tokenizer.encode_chat(p.text) for p in chosen[: FLAGS.calibrate]]
  held = chosen[FLAGS.calibrate : FLAGS.calibrate + FLAGS.evaluate]
  evaluate = [target.tokenizer.encode_chat(p.text) for p in held]

  # 1. Calibration with a probe tree.
  prior = np.array([[0.6 * 0.35**r for r in range(4)]] * FLAGS.max_depth)
  probe = (
    tree_lib.parse_shape(FLAGS.probe)
    if FLAGS.probe
    else tree_lib.best_shape(prior, 32, FLAGS.max_depth)
  )
  print(f'probe: {probe.describe()}', flush=True)
  stops = []
  for ids in calib:
    out = engine.generate(
      [ids], Method.tree(tree_lib.TreeSpec(probe)), max_new_tokens=FLAGS.max_new, sampling=greedy
    )
    stops += [s for s, d in zip(out.stops[0], out.drafted[0]) if d > 0]
  raw, trials = cost_model.rank_acceptance(probe, stops)
  accept = cost_model.fill_acceptance(raw)
  print('acceptance by depth (rows) and rank (columns):\n' + np.array2string(raw, precision=3))

  # 2. Search: the best tree of each size, timed; chains alike.
  cache_size = 512
  candidates = {}
  for n in (int(s) for s in FLAGS.sizes.split(',')):
    candidates[f'tree{n}'] = tree_lib.best_shape(accept, n, FLAGS.max_depth)
  for g in (int(s) for s in FLAGS.chains.split(',')):
    candidates[f'chain:{g}'] = tree_lib.TreeShape.chain(g)
  timers = {('step', 0): costs_lib.timer_forward(target.params, target.cfg, 1, 1, cache_size)}
  for name, shape in candidates.items():
    n = shape.size
    if ('verify', n) not in timers:
      timers['verify', n] = costs_lib.timer_forward(target.params, target.cfg, 1, n + 1, cache_size)
    if name.startswith('chain:'):
      timers['draft', name] = costs_lib.timer_propose(
        drafter, draft_params, target.params, target.cfg, 1, shape.size, cache_size
      )
    else:
      timers['draft', name] = costs_lib.timer_propose(
        drafter,
        draft_params,
        target.params,
        target.cfg,
        1,
        0,
        cache_size,
        tree=tree_lib.TreeSpec(shape),
      )
  ms = costs_lib.fastest(timers, repeats=5)
  step = ms['step', 0]
  search = []
  for name, shape in candidates.items():
    d, v = ms['draft', name] / step, ms['verify', shape.size] / step
    search.append(
      {
        'name': name,
        'shape': ';'.join('.'.join(map(str, p)) for p in shape.paths),
        'describe': shape.describe(),
        'nodes': shape.size,
        'expected_tokens_per_call': shape.expected_accepted(accept) + 1,
        'draft_cost': d,
        'verify_cost': v,
        'predicted_speedup': cost_model.tree_speedup(shape, accept, d, v),
      }
    )
    print(
      f'{name}: {shape.describe()}: E[tokens] {search[-1]["expected_tokens_per_call"]:.2f}, '
      f'draft {d:.2f} + verify {v:.2f} steps -> {search[-1]["predicted_speedup"]:.2f}x',
      flush=True,
    )
  trees = sorted(
    (s for s in search if s['name'].startswith('tree')), key=lambda s: -s['predicted_speedup']
  )
  chains = sorted(
    (s for s in search if s['name'].startswith('chain')), key=lambda s: -s['predicted_speedup']
  )
  picks = [chains[0], trees[0], trees[1]]

  # 3. Evaluation on held-out prompts, interleaved.
  runs = {'autoregressive': []} | {p['name']: [] for p in picks}
  for i, ids in enumerate(evaluate):
    runs['autoregressive'].append(
      engine.generate([ids], max_new_tokens=FLAGS.max_new, sampling=greedy)
    )
    for p in picks:
      shape = candidates[p['name']]
      method = (
        Method.chain(shape.size)
        if p['name'].startswith('chain')
        else Method.tree(tree_lib.TreeSpec(shape))
      )
      runs[p['name']].append(engine.generate([ids], method, FLAGS.max_new, greedy))
    print(f'[{i + 1}/{len(evaluate)}] evaluated', flush=True)
  total = lambda outs: (
    sum(o.num_generated for o in outs),
    sum(o.prefill_seconds + o.decode_seconds for o in outs),
    sum(o.decode_seconds for o in outs),
    sum(o.target_calls for o in outs),
  )
  base = total(runs['autoregressive'])
  ar_tokens = [o.tokens[0] for o in runs['autoregressive']]
  results = []
  for name, outs in runs.items():
    tokens, seconds, decode, calls = total(outs)
    pick = next((p for p in picks if p['name'] == name), {})
    results.append(
      {
        'method': name,
        'describe': pick.get('describe', ''),
        'tokens_per_call': tokens / calls,
        'expected_tokens_per_call': pick.get('expected_tokens_per_call'),
        'tokens_per_second': tokens / seconds,
        'speedup': (tokens / seconds) / (base[0] / base[1]),
        'decode_speedup': (tokens / decode) / (base[0] / base[2]),
        'predicted_speedup': pick.get('predicted_speedup'),
        'greedy_mismatches': sum(o.tokens[0] != a for o, a in zip(outs, ar_tokens)),
      }
    )
  meta = {
    **provenance.provenance(),
    'backend': jax.default_backend(),
    'draft': drafter.name,
    'prompt_set': FLAGS.prompts,
    'calibration_prompts': [p.id for p in chosen[: FLAGS.calibrate]],
    'evaluation_prompts': [p.id for p in held],
    'max_new': FLAGS.max_new,
    'probe': probe.describe(),
    'calibration_iterations': len(stops),
    'acceptance': np.where(np.isnan(raw), None, raw).tolist(),
    'trials': trials.tolist(),
    'step_ms': step,
  }
  out = pathlib.Path(FLAGS.out)
  out.mkdir(parents=True, exist_ok=True)
  (out / 'results.json').write_text(
    json.dumps({'meta': meta, 'search': search, 'results': results}, indent=2)
  )
  texts = {n: [target.tokenizer.decode(o.tokens[0]) for o in outs] for n, outs in runs.items()}
  (out / 'texts.json').write_text(json.dumps(texts, indent=1))
  header = [
    'method',
    'tree',
    'tokens/call (expected)',
    'speedup',
    'decode speedup',
    'predicted',
    'mismatches',
  ]
  rows = [
    [
      r['method'],
      r['describe'],
      f'{r["tokens_per_call"]:.2f}'
      + (f' ({r["expected_tokens_per_call"]:.2f})' if r['expected_tokens_per_call'] else ''),
      f'{r["speedup"]:.2f}x',
      f'{r["decode_speedup"]:.2f}x',
      f'{r["predicted_speedup"]:.2f}x' if r['predicted_speedup'] else '',
      r['greedy_mismatches'],
    ]
    for r in results
  ]
  search_rows = [
    [
      s['name'],
      s['describe'],
      s['expected_tokens_per_call'],
      s['draft_cost'],
      s['verify_cost'],
      f'{s["predicted_speedup"]:.2f}x',
    ]
    for s in search
  ]
  table = (
    tables.markdown_table(header, rows)
    + '\n\nSearch (costs in one-token target steps):\n\n'
    + tables.markdown_table(
      ['candidate', 'shape', 'E[tokens/call]', 'draft', 'verify', 'predicted'], search_rows
    )
  )
  (out / 'table.md').write_text(table + '\n')
  print(table)


if __name__ == '__main__':
  app.run(main)
