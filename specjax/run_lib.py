"""The work behind `python -m specjax.run`: importable from notebooks and tests."""

from __future__ import annotations

import datetime
import json
import os
import pathlib
import time

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np

from specjax import config_lib, report, verify
from specjax.data import prompts as prompts_lib
from specjax.decode.engine import Engine
from specjax.decode.sampling import SamplingConfig
from specjax.models import llama, loader
from specjax.models import sharding as sharding_lib
from specjax.models.kv_cache import KVCache


def validate(config: ml_collections.ConfigDict) -> None:
  """Checks values the config file cannot type-check; errors name the field."""
  c = config
  config_lib.check(c.num_prompts >= 1, 'num_prompts', c.num_prompts, 'an integer >= 1')
  config_lib.check(c.batch_size >= 1, 'batch_size', c.batch_size, 'an integer >= 1')
  config_lib.check(c.max_new_tokens >= 1, 'max_new_tokens', c.max_new_tokens, 'an integer >= 1')
  config_lib.check(c.cache_size >= 2, 'cache_size', c.cache_size, 'an integer >= 2')
  config_lib.check(c.dtype in loader.DTYPES, 'dtype', c.dtype, f'one of {sorted(loader.DTYPES)}')
  config_lib.check(c.mesh.data >= 1 and c.mesh.model >= 1, 'mesh', c.mesh.to_dict(),
                   'data >= 1 and model >= 1')
  verifiers = sorted(verify.VERIFIERS)
  config_lib.check(c.verifier in verifiers, 'verifier', c.verifier, f'one of {verifiers}')
  if c.prompt and not c.prompt.strip():
    raise ValueError('config.prompt is empty (only whitespace)')
  try:
    SamplingConfig(c.temperature, c.top_k, c.top_p)
  except ValueError as e:
    raise ValueError(f'config: {e}') from None


def make_workdir(workdir: str | None) -> pathlib.Path:
  """Creates the work directory (default runs/<UTC time>) and checks it can be written."""
  if not workdir:
    workdir = os.path.join('runs', datetime.datetime.now(datetime.timezone.utc)
                           .strftime('%Y%m%d-%H%M%S'))
  path = pathlib.Path(workdir)
  try:
    path.mkdir(parents=True, exist_ok=True)
    probe = path / '.write_test'
    probe.write_text('ok')
    probe.unlink()
  except OSError as e:
    raise ValueError(f'work directory {str(path)!r} cannot be written: {e.strerror}') from None
  return path


def percentiles(values, qs=(50, 90, 99)) -> dict[str, float]:
  return {f'p{q}': float(np.percentile(values, q)) for q in qs}


def build_engines(config, model: loader.LoadedModel) -> dict[str, tuple[Engine, str]]:
  """One engine per draft ('' for autoregressive only), all sharing the target's arrays."""
  mesh = None
  if config.mesh.data * config.mesh.model > 1:
    mesh = sharding_lib.make_mesh(config.mesh.data, config.mesh.model)
  params = (sharding_lib.shard_params(model.params, mesh) if mesh is not None
            else jax.device_put(model.params))
  specs = [''] + (list(config.drafts) if config.gammas else [])
  engines = {}
  for spec in specs:
    drafter, draft_params, label = None, None, ''
    if spec:
      drafter, draft_params, label = loader.load_draft(spec, model, config.dtype)
    engines[spec] = (Engine(params, model.cfg, eos_id=model.tokenizer.eos_id,
                            cache_size=config.cache_size, mesh=mesh, drafter=drafter,
                            draft_params=draft_params), label)
  return engines


def build_methods(config) -> list[tuple[str, str, int]]:
  """(name, draft spec, gamma) for every method: autoregressive first, then the sweep."""
  methods = [('autoregressive', '', 0)]
  for g in config.gammas:
    config_lib.check(isinstance(g, int) and g >= 1, 'gammas', tuple(config.gammas),
                     'draft lengths, each an integer >= 1')
  for spec in config.drafts:
    config_lib.check(isinstance(spec, str) and spec, 'drafts', tuple(config.drafts),
                     'non-empty draft specs')
    methods += [(f'{spec} gamma={g}', spec, g) for g in config.gammas]
  return methods


def load_workload(config) -> list[prompts_lib.Prompt]:
  if config.prompt:
    return [prompts_lib.Prompt(id='prompt', text=config.prompt, category='prompt')]
  return prompts_lib.load_prompts(config.prompts, config.num_prompts)


def main(config: ml_collections.ConfigDict, workdir: str | None = None,
         verbose: bool = True) -> dict:
  """Loads the model, runs every method on the workload, writes results; returns them.

  Methods run interleaved batch by batch (every method on a batch before the next
  batch), so drift of a shared machine hits them alike. Compilation is kept out of
  every timing and reported separately.
  """
  say = print if verbose else (lambda *a, **k: None)
  validate(config)
  out_dir = make_workdir(workdir)
  workload = load_workload(config)
  methods = build_methods(config)
  start = time.perf_counter()
  model = loader.load_model(config.model, config.dtype)
  say(f'model {model.source}: {model.cfg.num_params / 1e6:.1f} M parameters, '
      f'{model.cfg.n_layers} layers, loaded in {time.perf_counter() - start:.1f} s')
  engines = build_engines(config, model)
  for spec, (_, label) in engines.items():
    if spec:
      say(f'draft {spec}: {label}' + ('  (an untrained stand-in until a distilled draft '
                                     'exists: expect low acceptance)' if 'untrained' in label
                                     else ''))
  sampling = SamplingConfig(config.temperature, config.top_k, config.top_p)
  encoded = []
  for p in workload:
    try:
      encoded.append(model.tokenizer.encode_chat(p.text))
    except ValueError as e:
      raise ValueError(f'prompt {p.id!r}: {e}') from None
  records = {name: [] for name, _, _ in methods}
  compile_seconds = {name: 0.0 for name, _, _ in methods}
  for i in range(0, len(workload), config.batch_size):
    batch = list(range(i, min(i + config.batch_size, len(workload))))
    for name, spec, gamma in methods:
      out = engines[spec][0].generate([encoded[j] for j in batch], config.max_new_tokens,
                                      sampling, seed=config.seed + i, gamma=gamma,
                                      verifier=config.verifier)
      compile_seconds[name] += out.compile_seconds
      for row, j in enumerate(batch):
        records[name].append(_record(workload[j], encoded[j], out, row, model.tokenizer, name))
    say(f'[{len(batch) + i}/{len(workload)}] ' + ', '.join(
        f'{name}: {records[name][-1]["decode_tokens_per_second"]:.1f} tok/s'
        for name, _, _ in methods))
  drafts = {spec: label for spec, (_, label) in engines.items() if spec}
  summary = summarize(config, model, records, compile_seconds, drafts)
  if sampling.greedy:
    for name, m in summary['methods'].items():
      m['near_ties'] = count_near_ties(engines[''][0], encoded, records[name],
                                       records['autoregressive'])
  write_results(out_dir, config, records, summary)
  if config.prompt or (verbose and len(workload) <= 4):
    show_texts(say, records, sampling)
  say(format_table(summary))
  say(f'results in {out_dir}')
  return summary


def _record(prompt, ids, out, row, tokenizer, method) -> dict:
  tokens = out.tokens[row]
  accepted = out.accepted[row] if out.accepted else []
  drafted = out.drafted[row] if out.drafted else []
  return {
      'method': method, 'id': prompt.id, 'category': prompt.category, 'prompt': prompt.text,
      'output': tokenizer.decode(tokens), 'tokens': tokens, 'prompt_tokens': len(ids),
      'new_tokens': len(tokens), 'target_calls': len(accepted) + 1,
      'accepted': accepted, 'drafted': drafted, 'gamma': out.gamma,
      'prefill_ms': 1e3 * out.prefill_seconds,
      'latency_ms': 1e3 * (out.prefill_seconds + out.decode_seconds),
      'decode_tokens_per_second': out.decode_tokens_per_second}


def show_texts(say, records, sampling) -> None:
  base = records['autoregressive']
  for k, r in enumerate(base):
    say(f'--- [{r["category"]}] {r["prompt"][:200]}\n{r["output"]}\n')
    for name, recs in records.items():
      if name == 'autoregressive':
        continue
      if recs[k]['tokens'] == r['tokens']:
        say(f'    {name}: identical output')
      elif sampling.greedy:
        say(f'    {name}: DIFFERENT output (near-tie?):\n{recs[k]["output"]}')
      else:
        say(f'    {name} (a different sample):\n{recs[k]["output"]}')


def count_near_ties(engine: Engine, encoded, recs, baseline, threshold: float = 1e-4) -> int:
  """How many greedy mismatches start where the target's top-2 logits are within `threshold`.

  A multi-token verify forward rounds differently from a one-token step, so outputs may
  legitimately part at a near-tie; any other mismatch is a bug.
  """
  ties = 0
  for ids, r, b in zip(encoded, recs, baseline):
    if r['tokens'] == b['tokens']:
      continue
    first = next((i for i, (x, y) in enumerate(zip(r['tokens'], b['tokens'])) if x != y),
                 min(len(r['tokens']), len(b['tokens'])))
    context = list(ids) + b['tokens'][:first]
    cache = KVCache.init(engine.cfg, 1, len(context), engine.params['embed'].dtype)
    logits, _ = llama.forward(engine.params, jnp.asarray([context]), cache, engine.cfg)
    top2 = np.sort(np.asarray(logits[0, -1]))[-2:]
    ties += bool(top2[1] - top2[0] < threshold)
  return ties


def method_summary(recs, baseline, compile_seconds) -> dict:
  new = sum(r['new_tokens'] for r in recs)
  lat = [r['latency_ms'] for r in recs]
  drafted = sum(sum(r['drafted']) for r in recs)
  tried = [a for r in recs for a, d in zip(r['accepted'], r['drafted']) if d > 0]
  return {
      'gamma': recs[0]['gamma'], 'new_tokens': new,
      'acceptance_rate': sum(sum(r['accepted']) for r in recs) / drafted if drafted else None,
      'tokens_per_call': new / max(sum(r['target_calls'] for r in recs), 1),
      'decode_tokens_per_second': float(np.median([r['decode_tokens_per_second'] for r in recs])),
      'tokens_per_second': new / max(sum(lat) / 1e3, 1e-9),
      'prefill_ms': percentiles([r['prefill_ms'] for r in recs]),
      'latency_ms': percentiles(lat),
      'latency_ms_per_token': percentiles([r['latency_ms'] / r['new_tokens'] for r in recs]),
      'zero_accept_fraction': tried.count(0) / len(tried) if tried else None,
      'greedy_mismatches': sum(r['tokens'] != b['tokens'] for r, b in zip(recs, baseline)),
      'compile_seconds': compile_seconds,
  }


def summarize(config, model, records, compile_seconds, drafts=None) -> dict:
  """Per method: acceptance, tokens per target call, speed, latency percentiles, speedup."""
  baseline = records['autoregressive']
  methods = {name: method_summary(recs, baseline, compile_seconds[name])
             for name, recs in records.items()}
  base_tps = methods['autoregressive']['tokens_per_second']
  categories = sorted({r['category'] for r in baseline})
  for name, m in methods.items():
    m['speedup'] = m['tokens_per_second'] / base_tps
    m['categories'] = {}
    for cat in categories:
      pick = [i for i, r in enumerate(baseline) if r['category'] == cat]
      sub = method_summary([records[name][i] for i in pick], [baseline[i] for i in pick], 0.0)
      del sub['compile_seconds']
      m['categories'][cat] = sub
  for m in methods.values():
    for cat, sub in m['categories'].items():
      sub['speedup'] = (sub['tokens_per_second']
                        / methods['autoregressive']['categories'][cat]['tokens_per_second'])
  return {'model': model.source, 'drafts': drafts or {}, 'verifier': config.verifier,
          'temperature': config.temperature, 'batch_size': config.batch_size,
          'num_prompts': len(baseline), 'methods': methods}


def format_table(summary) -> str:
  head = (f'{"method":<28}{"accept":>8}{"tok/call":>9}{"tok/s":>8}{"speedup":>8}'
          f'{"p50 ms":>9}{"p99 ms":>9}{"mismatch":>9}')
  lines = [head]
  for name, m in summary['methods'].items():
    acc = '-' if m['acceptance_rate'] is None else f'{m["acceptance_rate"]:.2f}'
    lines.append(f'{name:<28}{acc:>8}{m["tokens_per_call"]:>9.2f}{m["tokens_per_second"]:>8.1f}'
                 f'{m["speedup"]:>7.2f}x{m["latency_ms"]["p50"]:>9.0f}'
                 f'{m["latency_ms"]["p99"]:>9.0f}{m["greedy_mismatches"]:>9}')
  return '\n'.join(lines)


def write_results(out_dir: pathlib.Path, config, records, summary) -> None:
  (out_dir / 'config.json').write_text(config.to_json_best_effort(indent=2))
  with open(out_dir / 'generations.jsonl', 'w') as f:
    for recs in records.values():
      for r in recs:
        f.write(json.dumps(r, ensure_ascii=False) + '\n')
  (out_dir / 'results.json').write_text(json.dumps(summary, indent=2))
  report.write_csv(out_dir / 'results.csv', summary)
  report.plot_all(out_dir, records, summary)
