r"""Speculative decoding on SmolLM2-135M-Instruct: acceptance, tokens per call, speed, overhead.

  python experiments/speculative_bench/bench.py --draft truncated:4 --gammas 1,2,4,8 \
      --batches 1,8 --temperatures 0,1 --max_new 64 --out experiments/speculative_bench/results

For every (batch size, temperature) it runs autoregressive decoding and speculative
decoding at each gamma on the same MT-bench prompts (one per category), interleaved
prompt batch by prompt batch, and reports per gamma: acceptance rate, mean tokens per
target call, tokens/s, speedup over the autoregressive run, greedy mismatches, and the
loop's overhead: time per iteration minus (the draft's gamma forward passes + one
(gamma+1)-token verify forward, each timed alone inside a jitted loop so that dispatch
is left out of both), as a fraction of the iteration.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import pathlib
import platform
import subprocess

import jax

from specjax.control.costs import forward_ms
from specjax.data import prompts as prompts_lib
from specjax.decode.engine import Engine
from specjax.decode.sampling import SamplingConfig
from specjax.models import loader


def run_setting(engine, prompts, batch, sampling, gammas, max_new, seed=0):
  """Per method: lists of per-batch outputs, interleaved batch by batch."""
  outs = {g: [] for g in (0, *gammas)}
  for i in range(0, len(prompts), batch):
    chunk = prompts[i : i + batch]
    for g in outs:
      outs[g].append(engine.generate(chunk, max_new, sampling, seed=seed + i, gamma=g))
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
    'tokens_per_call': tokens / calls,
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
      verified * (costs['draft_first'] + (gamma - 1) * costs['draft_step'] + costs['verify'][gamma])
      + (1 - verified) * costs['target_step']
    )
    res['verified_fraction'] = verified
    res['parts_ms'] = parts
    res['overhead_fraction'] = (res['iteration_ms'] - parts) / res['iteration_ms']
  return res


def main():
  parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  parser.add_argument('--draft', default='truncated:4')
  parser.add_argument('--gammas', default='1,2,4,8')
  parser.add_argument('--batches', default='1,8')
  parser.add_argument('--temperatures', default='0,1')
  parser.add_argument('--max_new', type=int, default=64)
  parser.add_argument('--verifier', default='rejection')
  parser.add_argument(
    '--prompts', default='mtbench', help='a prompt set; mtbench uses one prompt per category'
  )
  parser.add_argument('--num_prompts', type=int, default=8)
  parser.add_argument('--out', default='experiments/speculative_bench/results')
  args = parser.parse_args()
  gammas = [int(g) for g in args.gammas.split(',')]

  target = loader.load_model('smollm2-135m-instruct')
  drafter, draft_params, label = loader.load_draft(args.draft, target)
  engine = Engine(
    target.params,
    target.cfg,
    eos_id=target.tokenizer.eos_id,
    cache_size=1024,
    drafter=drafter,
    draft_params=draft_params,
  )
  chosen = prompts_lib.load_prompts(args.prompts)
  chosen = chosen[::10] if args.prompts == 'mtbench' else chosen[: args.num_prompts]
  prompts = [target.tokenizer.encode_chat(p.text) for p in chosen]
  results = []
  for batch in (int(b) for b in args.batches.split(',')):
    slots = max(256, 1 << (max(map(len, prompts)) + args.max_new - 1).bit_length())
    model_draft = hasattr(drafter, 'cfg')  # prompt lookup has no forward pass to time
    costs = {
      'draft_first': forward_ms(engine.draft_params, drafter.cfg, batch, 2, slots)
      if model_draft
      else 0.0,
      'draft_step': forward_ms(engine.draft_params, drafter.cfg, batch, 1, slots)
      if model_draft
      else 0.0,
      'target_step': forward_ms(engine.params, target.cfg, batch, 1, slots),
      'verify': {g: forward_ms(engine.params, target.cfg, batch, g + 1, slots) for g in gammas},
    }
    for temp in (float(t) for t in args.temperatures.split(',')):
      sampling = SamplingConfig(temperature=temp)
      verifier = args.verifier
      engine.method(1, verifier, sampling)  # validates
      outs = run_setting(engine, prompts, batch, sampling, gammas, args.max_new)
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
          draft_cost_ratio=costs['draft_step'] / costs['target_step'],
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
    'date': datetime.date.today().isoformat(),
    'commit': subprocess.run(
      ['git', 'rev-parse', '--short', 'HEAD'], capture_output=True, text=True
    ).stdout.strip(),
    'machine': f'{platform.machine()}, {os.cpu_count()} cores, jax {jax.__version__} '
    f'{jax.devices()[0].platform}',
    'draft': label,
    'verifier': args.verifier,
    'prompt_set': args.prompts,
    'prompts': len(prompts),
    'max_new': args.max_new,
  }
  out = pathlib.Path(args.out)
  out.mkdir(parents=True, exist_ok=True)
  (out / 'results.json').write_text(json.dumps({'meta': meta, 'results': results}, indent=2))
  lines = [
    '| batch | T | γ | acceptance | tokens/call | tok/s | speedup | overhead '
    '| same measure for autoregressive | greedy mismatches |',
    '|---|---|---|---|---|---|---|---|---|---|',
  ]
  for r in results:
    lines.append(
      f'| {r["batch"]} | {r["temperature"]:g} | {r["gamma"]} | '
      f'{r["acceptance_rate"]:.2f} | {r["tokens_per_call"]:.2f} | '
      f'{r["tokens_per_second"]:.1f} | {r["speedup"]:.2f}x | '
      f'{100 * r["overhead_fraction"]:.0f}% | '
      f'{100 * r["autoregressive_overhead_fraction"]:.0f}% | '
      f'{r["greedy_mismatches"] if r["temperature"] == 0 else "-"} |'
    )
  (out / 'table.md').write_text('\n'.join(lines) + '\n')
  print('\n'.join(lines))


if __name__ == '__main__':
  main()
