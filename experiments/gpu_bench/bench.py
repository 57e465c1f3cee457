r"""One accelerator, a few minutes: decode speed, the speculative loop's overhead, prompt lookup.

  python experiments/gpu_bench/bench.py --out DIR            # an accelerator, bfloat16
  python experiments/gpu_bench/bench.py --out DIR --quick    # anywhere, tiny sizes, seconds

Three measurements, batch 1, greedy, each method's first call (compile) kept out:

  decode     autoregressive decode tokens/s of SmolLM2-135M-Instruct and Gemma 3 270M (the
             'gemma3-270m' asset; skipped with a note where this checkout lacks it), median
             of --repeats runs over a few MT-bench prompts;
  overhead   the speculative loop's iteration time against its parts, as
             experiments/speculative_bench measured it: the drafter's proposal of gamma
             tokens and one (gamma + 1)-token verify forward, each timed alone in a jitted
             loop (specjax.bench.costs), weighted by the share of iterations that drafted;
             overhead = (iteration - parts) / iteration, with autoregressive decoding's
             (iteration - one target step) / iteration beside it as the calibration;
  code_edit  prompt lookup (ngram:3-8 at gamma 12, the setting measured best on code
             editing) against autoregressive decoding on the code-editing prompts,
             interleaved prompt by prompt: end to end and decode-phase speedups, acceptance,
             greedy mismatches (must be 0).

--quick swaps in the random tiny model over bytes and a handful of tokens (float32 on a
CPU, where bfloat16 is slow), so the whole path is known to run. Results go to
DIR/results.json (with provenance) and DIR/table.md, rewritten after each measurement so
that a run cut short keeps what it finished.
"""

from __future__ import annotations

import json
import pathlib
import statistics
import time

import jax
from absl import app, flags

from specjax import registry
from specjax.bench import costs as costs_lib
from specjax.bench import provenance, tables
from specjax.checkpoints import loader
from specjax.core.sampling import SamplingConfig
from specjax.data import prompts as prompts_lib
from specjax.decode.engine import Engine
from specjax.decode.method import Method

flags.DEFINE_string('out', None, 'Folder for results.json and table.md.')
flags.DEFINE_bool('quick', False, 'Tiny sizes (the random tiny model): a smoke run anywhere.')
flags.DEFINE_string('dtype', '', 'Parameter dtype (default bfloat16; float32 with --quick).')
flags.DEFINE_integer('repeats', 3, 'Timed runs per decode measurement (median).')
flags.DEFINE_float('budget_s', 400.0, 'Measurements not started by then are skipped.')
FLAGS = flags.FLAGS

GEMMA = 'gemma3-270m'
GREEDY = SamplingConfig()


def sizes(quick: bool) -> dict:
  if quick:
    return dict(
      models=('tiny', GEMMA),
      target='tiny',
      drafts=(('ngram:3-8', 8), ('truncated:1', 4)),
      decode_prompts=1,
      decode_new=16,
      overhead_prompts=2,
      overhead_new=16,
      edit_prompts=2,
      edit_new=16,
    )
  return dict(
    models=('smollm2-135m-instruct', GEMMA),
    target='smollm2-135m-instruct',
    drafts=(('ngram:3-8', 8), ('truncated:4', 4)),
    decode_prompts=3,
    decode_new=256,
    overhead_prompts=4,
    overhead_new=128,
    edit_prompts=8,
    edit_new=256,
  )


def cache_for(prompts, max_new: int, cfg) -> int:
  return min(cfg.max_seq_len, max(256, 1 << (max(map(len, prompts)) + max_new - 1).bit_length()))


def encode(model, prompt_set: str, n: int) -> list[list[int]]:
  chosen = prompts_lib.load_prompts(prompt_set)
  chosen = chosen[::10][:n] if prompt_set == 'mtbench' else chosen[:n]
  return [model.tokenizer.encode_chat(p.text) for p in chosen]


def engine_for(model, prompts, max_new, drafter=None, draft_params=None) -> Engine:
  return Engine(
    model.params,
    model.cfg,
    eos_id=-1,  # every run generates max_new tokens: equal work per method
    cache_size=cache_for(prompts, max_new, model.cfg),
    drafter=drafter,
    draft_params=draft_params,
  )


def decode_speed(spec: str, s: dict, dtype: str) -> dict:
  """Batch-1 autoregressive decode tokens/s (median over repeats and prompts)."""
  if spec not in loader.MODEL_ASSETS and spec != 'tiny':
    return {
      'skipped': f'{spec!r} is not an asset of this checkout (specjax.checkpoints.loader.'
      f'MODEL_ASSETS = {list(loader.MODEL_ASSETS)}): the Gemma 3 270M GGUF loader is not in yet'
    }
  if FLAGS.quick and spec != 'tiny':
    return {'skipped': f'{spec!r} is an asset of this checkout; --quick does not fetch it'}
  try:
    start = time.perf_counter()
    model = loader.load_model(spec, dtype)
    load_s = time.perf_counter() - start
  except Exception as e:  # a fetch that fails (no network), a loader that cannot read it
    return {'skipped': f'loading {spec!r} failed: {type(e).__name__}: {e}'}
  prompts = encode(model, 'mtbench', s['decode_prompts'])
  engine = engine_for(model, prompts, s['decode_new'])
  speeds, prefill, compile_s = [], [], 0.0
  for p in prompts:
    compile_s += engine.generate(
      [p], max_new_tokens=s['decode_new'], sampling=GREEDY
    ).compile_seconds
    for _ in range(FLAGS.repeats):
      out = engine.generate([p], max_new_tokens=s['decode_new'], sampling=GREEDY)
      speeds.append(out.num_generated / out.decode_seconds)
      prefill.append(out.prefill_seconds * 1e3)
  return {
    'model': model.source,
    'params_millions': model.cfg.num_params / 1e6,
    'load_seconds': load_s,
    'compile_seconds': compile_s,
    'tokens_per_second': statistics.median(speeds),
    'ms_per_token': 1e3 / statistics.median(speeds),
    'prefill_ms': statistics.median(prefill),
    'prompt_tokens': [len(p) for p in prompts],
    'new_tokens': s['decode_new'],
  }


def verified_fraction(outs) -> float:
  """Share of iterations that verified a draft (experiments/speculative_bench/bench.py)."""
  spec = total = 0
  for o in outs:
    width = max(len(d) for d in o.drafted)
    for i in range(width):
      spec += any(i < len(d) and d[i] > 0 for d in o.drafted)
      total += 1
  return spec / max(total, 1)


def iteration_ms(outs) -> float:
  return 1e3 * sum(o.decode_seconds for o in outs) / sum(o.steps for o in outs)


def loop_overhead(model, s: dict, dtype: str) -> list[dict]:
  """Per draft: iteration time against its separately timed parts (see the docstring)."""
  prompts = encode(model, 'mtbench', s['overhead_prompts'])
  rows = []
  for spec, gamma in s['drafts']:
    drafter, draft_params = registry.build_draft(spec, model, dtype)
    engine = engine_for(model, prompts, s['overhead_new'], drafter, draft_params)
    costs = costs_lib.measure(engine, 1, engine.cache_size, (gamma,))
    outs = {0: [], gamma: []}
    for g in outs:  # compile first, out of the timings
      engine.generate(
        [prompts[0]], Method.chain(g, 'greedy'), max_new_tokens=s['overhead_new'], sampling=GREEDY
      )
    for p in prompts:  # interleaved prompt by prompt
      for g in outs:
        outs[g].append(
          engine.generate(
            [p], Method.chain(g, 'greedy'), max_new_tokens=s['overhead_new'], sampling=GREEDY
          )
        )
    verified = verified_fraction(outs[gamma])
    parts = verified * (costs.draft_ms[gamma] + costs.verify_ms[gamma])
    parts += (1 - verified) * costs.target_ms
    spec_ms, ar_ms = iteration_ms(outs[gamma]), iteration_ms(outs[0])
    accepted = sum(sum(a) for o in outs[gamma] for a in o.accepted)
    drafted = sum(sum(d) for o in outs[gamma] for d in o.drafted)
    rows.append(
      {
        'draft': spec,
        'gamma': gamma,
        'target_step_ms': costs.target_ms,
        'draft_ms': costs.draft_ms[gamma],
        'verify_ms': costs.verify_ms[gamma],
        'verified_fraction': verified,
        'iteration_ms': spec_ms,
        'parts_ms': parts,
        'overhead_fraction': (spec_ms - parts) / spec_ms,
        'autoregressive_iteration_ms': ar_ms,
        'autoregressive_overhead_fraction': (ar_ms - costs.target_ms) / ar_ms,
        'acceptance_rate': accepted / max(drafted, 1),
      }
    )
  return rows


def code_edit(model, s: dict) -> dict:
  """Prompt lookup (ngram:3-8, gamma 12) against autoregressive decoding on code edits."""
  prompts = encode(model, 'code_edit', s['edit_prompts'])
  drafter, draft_params = registry.build_draft('ngram:3-8', model)
  engine = engine_for(model, prompts, s['edit_new'], drafter, draft_params)
  gamma, outs = 12, {0: [], 12: []}
  for g in outs:
    engine.generate(
      [prompts[0]], Method.chain(g, 'greedy'), max_new_tokens=s['edit_new'], sampling=GREEDY
    )
  for p in prompts:
    for g in outs:
      outs[g].append(
        engine.generate(
          [p], Method.chain(g, 'greedy'), max_new_tokens=s['edit_new'], sampling=GREEDY
        )
      )

  def total(g, field):
    return sum(getattr(o, field) for o in outs[g])

  tokens = total(0, 'num_generated')
  end_to_end = {g: total(g, 'prefill_seconds') + total(g, 'decode_seconds') for g in outs}
  accepted = sum(sum(a) for o in outs[gamma] for a in o.accepted)
  drafted = sum(sum(d) for o in outs[gamma] for d in o.drafted)
  return {
    'draft': 'ngram:3-8',
    'gamma': gamma,
    'prompts': len(prompts),
    'new_tokens': s['edit_new'],
    'autoregressive_tokens_per_second': tokens / end_to_end[0],
    'lookup_tokens_per_second': total(gamma, 'num_generated') / end_to_end[gamma],
    'speedup_end_to_end': end_to_end[0] / end_to_end[gamma],
    'speedup_decode': total(0, 'decode_seconds') / total(gamma, 'decode_seconds'),
    'tokens_per_call': total(gamma, 'num_generated') / max(total(gamma, 'steps'), 1),
    'acceptance_rate': accepted / max(drafted, 1),
    'greedy_mismatches': sum(a.tokens != b.tokens for a, b in zip(outs[gamma], outs[0])),
  }


def table(results: dict) -> str:
  lines = [f'{results["device"]}, {results["dtype"]}, batch 1, greedy', '']
  decode = results.get('decode', {})
  rows = [
    [name, r.get('tokens_per_second'), r.get('ms_per_token'), r.get('prefill_ms'), r.get('skipped')]
    for name, r in decode.items()
  ]
  lines.append(tables.markdown_table(['model', 'tok/s', 'ms/token', 'prefill ms', 'note'], rows))
  overhead = results.get('overhead', [])
  if overhead:
    head = ['draft', 'gamma', 'accept', 'iteration ms', 'parts ms', 'overhead', 'AR overhead']
    rows = [
      [
        r['draft'],
        r['gamma'],
        r['acceptance_rate'],
        r['iteration_ms'],
        r['parts_ms'],
        f'{100 * r["overhead_fraction"]:.0f}%',
        f'{100 * r["autoregressive_overhead_fraction"]:.0f}%',
      ]
      for r in overhead
    ]
    lines += ['', tables.markdown_table(head, rows)]
  edit = results.get('code_edit')
  if edit:
    head = ['draft', 'gamma', 'AR tok/s', 'lookup tok/s', 'speedup', 'decode speedup', 'accept']
    row = [
      edit['draft'],
      edit['gamma'],
      edit['autoregressive_tokens_per_second'],
      edit['lookup_tokens_per_second'],
      f'{edit["speedup_end_to_end"]:.2f}x',
      f'{edit["speedup_decode"]:.2f}x',
      edit['acceptance_rate'],
    ]
    lines += ['', tables.markdown_table(head, [row])]
    lines.append(f'\ngreedy mismatches: {edit["greedy_mismatches"]} (must be 0)')
  for name in results.get('skipped', []):
    lines.append(f'\nskipped (time budget): {name}')
  return '\n'.join(lines) + '\n'


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f'unexpected arguments: {argv[1:]}')
  if not FLAGS.out:
    raise app.UsageError('--out DIR is required')
  start = time.perf_counter()
  out = pathlib.Path(FLAGS.out)
  out.mkdir(parents=True, exist_ok=True)
  s = sizes(FLAGS.quick)
  dtype = FLAGS.dtype or ('float32' if FLAGS.quick else 'bfloat16')
  device = jax.devices()[0]
  results = {
    'provenance': provenance.provenance(),
    'device': f'{device.platform}: {device.device_kind} x {jax.device_count()}',
    'dtype': dtype,
    'quick': FLAGS.quick,
    'sizes': s,
    'decode': {},
    'skipped': [],
  }

  def save():
    results['seconds'] = time.perf_counter() - start
    (out / 'results.json').write_text(json.dumps(results, indent=1, default=str))
    (out / 'table.md').write_text(table(results))

  def in_budget(name: str) -> bool:
    if time.perf_counter() - start < FLAGS.budget_s:
      print(f'[{time.perf_counter() - start:.0f} s] {name}', flush=True)
      return True
    results['skipped'].append(name)
    return False

  for spec in s['models']:
    if in_budget(f'decode {spec}'):
      results['decode'][spec] = decode_speed(spec, s, dtype)
      save()
  try:
    target = loader.load_model(s['target'], dtype)
  except Exception as e:  # no network for the download, say: keep the decode results
    results['error'] = f'loading the target {s["target"]!r} failed: {type(e).__name__}: {e}'
    save()
    raise SystemExit(results['error']) from None
  if in_budget('overhead'):
    results['overhead'] = loop_overhead(target, s, dtype)
    save()
  if in_budget('code_edit'):
    results['code_edit'] = code_edit(target, s)
  save()
  print(table(results))
  print(f'results in {out} ({time.perf_counter() - start:.0f} s)')


if __name__ == '__main__':
  app.run(main)
