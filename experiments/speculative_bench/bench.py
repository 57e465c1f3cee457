r"""Speculative decoding on SmolLM2-135M-Instruct: acceptance, tokens per call, speed, overhead.

  python experiments/speculative_bench/bench.py --draft truncated:4 --gammas 1,2,4,8 \
      --batches 1,8 --temperatures 0,1 --max_new 64 --out experiments/speculative_bench/results

For every (batch size, temperature) it runs autoregressive decoding and speculative
decoding at each gamma on the same MT-bench prompts (one per category), interleaved
prompt batch by prompt batch, and reports per gamma: acceptance rate, mean tokens per
target call, tokens/s, speedup over the autoregressive run, greedy mismatches, and the
loop's overhead: time per iteration minus (the drafter's proposal of gamma tokens + one
(gamma+1)-token verify forward, each timed alone inside a jitted loop so that dispatch
is left out of both), as a fraction of the iteration.
"""

from __future__ import annotations

import json
import pathlib

import jax
from absl import app, flags

from specjax import registry
from specjax.bench import costs as costs_lib
from specjax.bench import metrics, provenance, tables
from specjax.checkpoints import loader
from specjax.core.sampling import SamplingConfig
from specjax.data import prompts as prompts_lib
from specjax.decode.engine import Engine
from specjax.decode.method import Method

flags.DEFINE_string('draft', 'truncated:4', 'The draft spec (specjax/registry.py).')
flags.DEFINE_string('gammas', '1,2,4,8', 'Comma-separated draft lengths.')
flags.DEFINE_string('batches', '1,8', 'Comma-separated batch sizes.')
flags.DEFINE_string('temperatures', '0,1', 'Comma-separated sampling temperatures.')
flags.DEFINE_integer('max_new', 64, 'Tokens generated per prompt.')
flags.DEFINE_string('verifier', 'rejection', 'greedy, rejection or block.')
flags.DEFINE_string('prompts', 'mtbench', 'a prompt set; mtbench uses one prompt per category')
flags.DEFINE_integer('num_prompts', 8, 'Prompts of a set other than mtbench (the first N).')
flags.DEFINE_string('out', 'experiments/speculative_bench/results', 'Folder for results.')
FLAGS = flags.FLAGS


def run_setting(engine, prompts, batch, sampling, gammas, max_new, seed=0):
  """Per method: lists of per-batch outputs, interleaved batch by batch."""
  outs = {g: [] for g in (0, *gammas)}
  for i in range(0, len(prompts), batch):
    chunk = prompts[i : i + batch]
    for g in outs:
      outs[g].append(
        engine.generate(
          chunk, Method.chain(g), max_new_tokens=max_new, sampling=sampling, seed=seed + i
        )
      )
  return outs


def verified_fraction(runs) -> float:
  """Share of iterations that verified a draft (the others were plain steps)."""
  spec = total = 0
  for o in runs:
    width = max(len(d) for d in o.drafted)
    for i in range(width):
      spec += any(i < len(d) and d[i] > 0 for d in o.drafted)
      total += 1
  return spec / max(total, 1)


def summarize(outs, gamma, baseline, costs):
  runs = outs[gamma]
  tokens = sum(o.num_generated for o in runs)
  seconds = sum(o.prefill_seconds + o.decode_seconds for o in runs)
  rows = [a for o in runs for a in o.accepted]
  drafted = sum(sum(d) for o in runs for d in o.drafted)
  iters = sum(len(a) for a in rows)
  calls = sum(len(a) + 1 for a in rows)
  res = {
    'tokens': tokens,
    'tokens_per_second': tokens / seconds,
    'tokens_per_call': metrics.tokens_per_call(tokens, calls),
    'acceptance_rate': sum(map(sum, rows)) / max(drafted, 1) if gamma else None,
    'zero_accept_fraction': (sum(a.count(0) for a in rows) / iters) if gamma else None,
    'greedy_mismatches': sum(
      t != b for o, ob in zip(runs, baseline) for t, b in zip(o.tokens, ob.tokens)
    ),
    'iteration_ms': 1e3 * sum(o.decode_seconds for o in runs) / sum(o.steps for o in runs),
  }
  if gamma:
    verified = verified_fraction(runs)
    parts = (
      verified * (costs['draft'][gamma] + costs['verify'][gamma])
      + (1 - verified) * costs['target_step']
    )
    res['verified_fraction'] = verified
    res['parts_ms'] = parts
    res['overhead_fraction'] = (res['iteration_ms'] - parts) / res['iteration_ms']
  return res


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f'unexpected arguments: {argv[1:]}')
  gammas = [int(g) for g in FLAGS.gammas.split(',')]

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
  chosen = prompts_lib.load_prompts(FLAGS.prompts)
  chosen = chosen[::10] if FLAGS.prompts == 'mtbench' else chosen[: FLAGS.num_prompts]
  prompts = [target.tokenizer.encode_chat(p.text) for p in chosen]
  results = []
  for batch in (int(b) for b in FLAGS.batches.split(',')):
    cache_size = max(256, 1 << (max(map(len, prompts)) + FLAGS.max_new - 1).bit_length())
    # The drafter's own proposals (its layers, its head, lookup's search) and the target's
    # forwards, each timed alone in a jitted loop (specjax.bench.costs).
    measured = costs_lib.measure(engine, batch, cache_size, gammas)
    costs = {
      'draft': dict(measured.draft_ms),
      'target_step': measured.target_ms,
      'verify': dict(measured.verify_ms),
    }
    for temp in (float(t) for t in FLAGS.temperatures.split(',')):
      sampling = SamplingConfig(temperature=temp)
      verifier = FLAGS.verifier
      engine.check(Method.chain(1, verifier), sampling)  # validates
      outs = run_setting(engine, prompts, batch, sampling, gammas, FLAGS.max_new)
      base = summarize(outs, 0, outs[0], costs)
      # The same measurement for autoregressive decoding calibrates the method: its loop
      # runs exactly the separately timed target step.
      ar_overhead = (base['iteration_ms'] - costs['target_step']) / base['iteration_ms']
      for g in gammas:
        res = summarize(outs, g, outs[0], costs)
        res.update(
          batch=batch,
          temperature=temp,
          gamma=g,
          costs_ms=costs,
          autoregressive_iteration_ms=base['iteration_ms'],
          autoregressive_overhead_fraction=ar_overhead,
          speedup=res['tokens_per_second'] / base['tokens_per_second'],
          baseline_tokens_per_second=base['tokens_per_second'],
          draft_cost_ratio=measured.c,
        )
        results.append(res)
        print(
          f'batch {batch} T={temp} gamma={g}: accept {res["acceptance_rate"]:.2f}, '
          f'{res["tokens_per_call"]:.2f} tok/call, {res["tokens_per_second"]:.1f} tok/s '
          f'({res["speedup"]:.2f}x of {base["tokens_per_second"]:.1f}), overhead '
          f'{100 * res["overhead_fraction"]:.1f}% (autoregressive: {100 * ar_overhead:.1f}%), '
          f'mismatches {res["greedy_mismatches"]}',
          flush=True,
        )
  meta = {
    **provenance.provenance(),
    'backend': jax.default_backend(),
    'draft': drafter.name,
    'verifier': FLAGS.verifier,
    'prompt_set': FLAGS.prompts,
    'prompts': len(prompts),
    'max_new': FLAGS.max_new,
  }
  out = pathlib.Path(FLAGS.out)
  out.mkdir(parents=True, exist_ok=True)
  (out / 'results.json').write_text(json.dumps({'meta': meta, 'results': results}, indent=2))
  header = [
    'batch',
    'T',
    'γ',
    'acceptance',
    'tokens/call',
    'tok/s',
    'speedup',
    'overhead',
    'same measure for autoregressive',
    'greedy mismatches',
  ]
  rows = [
    [
      r['batch'],
      r['temperature'],
      r['gamma'],
      r['acceptance_rate'],
      r['tokens_per_call'],
      r['tokens_per_second'],
      f'{r["speedup"]:.2f}x',
      f'{100 * r["overhead_fraction"]:.0f}%',
      f'{100 * r["autoregressive_overhead_fraction"]:.0f}%',
      r['greedy_mismatches'] if r['temperature'] == 0 else None,
    ]
    for r in results
  ]
  table = tables.markdown_table(header, rows, formats={'T': 'g', 'tok/s': '.1f'})
  (out / 'table.md').write_text(table + '\n')
  print(table)


if __name__ == '__main__':
  app.run(main)
