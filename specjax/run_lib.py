"""The work behind `python -m specjax.run`: importable from notebooks and tests."""

from __future__ import annotations

import dataclasses
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
from specjax.control import cost_model
from specjax.control import costs as costs_lib
from specjax.control.adaptive import AdaptiveConfig
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
  config_lib.check(
    c.mesh.data >= 1 and c.mesh.model >= 1, 'mesh', c.mesh.to_dict(), 'data >= 1 and model >= 1'
  )
  for field in ('gammas', 'adaptive_gammas'):
    values = tuple(c.get(field, ()))
    config_lib.check(
      all(isinstance(g, int) and g >= 1 for g in values),
      field,
      values,
      'draft lengths, each an integer >= 1',
    )
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
    workdir = os.path.join(
      'runs', datetime.datetime.now(datetime.timezone.utc).strftime('%Y%m%d-%H%M%S')
    )
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


DRAFT_KINDS = (
  'ngram[:N]',
  'truncated:K',
  'layers:A-B,...',
  'distilled[:DIR]',
  'consensus:N',
  'a model spec (asset name, .gguf file, HF directory)',
)


@dataclasses.dataclass(frozen=True)
class MethodSpec:
  """One decoding method of a run: autoregressive, a fixed gamma, or adaptive."""

  name: str  # 'autoregressive', '<draft>@<gamma>' or '<draft>@adaptive'
  draft: str = ''
  gamma: int = 0
  adaptive: bool = False


def parse_method(text: str) -> MethodSpec:
  text = text.strip()
  if text == 'autoregressive':
    return MethodSpec('autoregressive')
  draft, at, setting = text.rpartition('@')
  if not at or not draft or not (setting == 'adaptive' or setting.isdigit()):
    raise ValueError(
      f'unknown method {text!r}: expected "autoregressive", "<draft>@<gamma>" or '
      f'"<draft>@adaptive", with a draft one of {", ".join(DRAFT_KINDS)}'
    )
  if setting == 'adaptive':
    return MethodSpec(text, draft, 0, True)
  gamma = int(setting)
  config_lib.check(gamma >= 1, 'methods', text, 'a draft length >= 1 after the @')
  return MethodSpec(text, draft, gamma)


def build_methods(config) -> list[MethodSpec]:
  """Autoregressive first, then every draft at every gamma (and adaptive), or config.methods.

  The declared set is config.drafts x config.gammas, plus '<draft>@adaptive' per draft
  when config.adaptive_gammas is set. config.methods (comma separated) picks a subset
  of those, or names others in the same syntax.
  """
  for spec in config.drafts:
    config_lib.check(
      isinstance(spec, str) and spec and '@' not in spec,
      'drafts',
      tuple(config.drafts),
      'non-empty draft specs (without @)',
    )
  declared = [MethodSpec('autoregressive')]
  for spec in config.drafts:
    declared += [MethodSpec(f'{spec}@{g}', spec, g) for g in config.gammas]
    if config.adaptive_gammas:
      declared.append(MethodSpec(f'{spec}@adaptive', spec, 0, True))
  if not config.methods:
    return declared
  known = {m.name: m for m in declared}
  chosen = [MethodSpec('autoregressive')]  # the baseline always runs
  for text in config.methods.split(','):
    if not text.strip():
      continue
    try:
      method = known.get(text.strip()) or parse_method(text)
    except ValueError as e:
      raise ValueError(f'config.methods: {e}; this config declares: {", ".join(known)}') from None
    if method.adaptive and not config.adaptive_gammas:
      raise ValueError(f'config.methods: {method.name} needs config.adaptive_gammas')
    if method.name not in {m.name for m in chosen}:
      chosen.append(method)
  return chosen


def build_engines(
  config, model: loader.LoadedModel, methods: list[MethodSpec]
) -> dict[str, tuple[Engine, str]]:
  """One engine per draft ('' for autoregressive only), all sharing the target's arrays."""
  mesh = None
  if config.mesh.data * config.mesh.model > 1:
    mesh = sharding_lib.make_mesh(config.mesh.data, config.mesh.model)
  params = (
    sharding_lib.shard_params(model.params, mesh)
    if mesh is not None
    else jax.device_put(model.params)
  )
  engines = {}
  for spec in dict.fromkeys(m.draft for m in methods):
    drafter, draft_params, label = None, None, ''
    if spec:
      try:
        drafter, draft_params, label = loader.load_draft(spec, model, config.dtype)
      except ValueError as e:
        if not str(e).startswith('unknown model'):
          raise
        raise ValueError(
          f'unknown draft {spec!r}: expected one of {", ".join(DRAFT_KINDS)}'
        ) from None
      if hasattr(drafter, 'check_batch'):
        drafter.check_batch(config.batch_size)
    engines[spec] = (
      Engine(
        params,
        model.cfg,
        eos_id=model.tokenizer.eos_id,
        cache_size=config.cache_size,
        mesh=mesh,
        drafter=drafter,
        draft_params=draft_params,
      ),
      label,
    )
  return engines


COST_GAMMAS = (1, 2, 4)  # always measured (with every gamma a method uses) for the cost model


def measure_costs(config, engines, methods, slots: int, say) -> dict[str, costs_lib.Costs]:
  """Per draft: the measured cost of proposing and verifying each gamma (target shared).

  Every piece is timed alone inside a jitted loop, in rounds (each piece once per round,
  so a burst of other work hits them alike), and costs its fastest round.
  """
  sampling = SamplingConfig(config.temperature, config.top_k, config.top_p)
  b = config.batch_size
  start = time.perf_counter()
  gammas, pieces = {}, {}
  base, _ = engines['']
  pieces['step', 0] = costs_lib.timer_forward(base.params, base.cfg, b, 1, slots)
  for spec, (engine, _) in engines.items():
    if not spec:
      continue
    wanted = (
      set(COST_GAMMAS)
      | set(config.adaptive_gammas)
      | {m.gamma for m in methods if m.draft == spec and m.gamma}
    )
    gammas[spec] = sorted(g for g in wanted if g + 1 < slots)
    for g in gammas[spec]:
      if ('verify', g) not in pieces:
        pieces['verify', g] = costs_lib.timer_forward(base.params, base.cfg, b, g + 1, slots)
      pieces[spec, g] = costs_lib.timer_propose(
        engine.drafter, engine.draft_params, engine.params, engine.cfg, b, g, slots, sampling
      )
  best = {k: float('inf') for k in pieces}
  for _ in range(5):
    for k, run in pieces.items():
      best[k] = min(best[k], run())
  out = {
    spec: costs_lib.Costs(
      batch=b,
      slots=slots,
      target_ms=best['step', 0],
      draft_ms={g: best[spec, g] for g in gs},
      verify_ms={g: best['verify', g] for g in gs},
    )
    for spec, gs in gammas.items()
  }
  if out:
    say(
      f'costs measured in {time.perf_counter() - start:.0f} s (batch {b}, {slots} slots): '
      f'target step {best["step", 0]:.2f} ms; verify/step '
      + ', '.join(
        f'{g}: {best["verify", g] / best["step", 0]:.2f}'
        for g in sorted(k[1] for k in pieces if k[0] == 'verify')
      )
    )
  for spec, c in out.items():
    say(
      f'  {spec}: c = {c.c:.3f}; draft/step '
      + ', '.join(f'{g}: {c.units(g)[0]:.2f}' for g in gammas[spec])
    )
  return out


def load_workload(config) -> list[prompts_lib.Prompt]:
  if config.prompt:
    return [prompts_lib.Prompt(id='prompt', text=config.prompt, category='prompt')]
  return prompts_lib.load_prompts(config.prompts, config.num_prompts)


def main(
  config: ml_collections.ConfigDict, workdir: str | None = None, verbose: bool = True
) -> dict:
  """Loads the model, runs every method on the workload, writes results; returns them.

  Methods run interleaved batch by batch (every method on a batch before the next
  batch), so drift of a shared machine hits them alike. Each method's first batch of a
  shape is preceded by an explicit warm-up that compiles; that time is reported as
  compile_seconds and kept out of every timing.
  """
  say = print if verbose else (lambda *a, **k: None)
  validate(config)
  out_dir = make_workdir(workdir)
  workload = load_workload(config)
  methods = build_methods(config)
  start = time.perf_counter()
  model = loader.load_model(config.model, config.dtype)
  say(
    f'model {model.source}: {model.cfg.num_params / 1e6:.1f} M parameters, '
    f'{model.cfg.n_layers} layers, loaded in {time.perf_counter() - start:.1f} s'
  )
  engines = build_engines(config, model, methods)
  for spec, (_, label) in engines.items():
    if spec:
      say(
        f'draft {spec}: {label}'
        + ('  (an untrained stand-in: expect low acceptance)' if 'untrained' in label else '')
      )
  sampling = SamplingConfig(config.temperature, config.top_k, config.top_p)
  encoded = []
  for p in workload:
    try:
      encoded.append(model.tokenizer.encode_chat(p.text))
    except ValueError as e:
      raise ValueError(f'prompt {p.id!r}: {e}') from None
  base_engine = engines[''][0]
  slots = base_engine.prepare(encoded[: config.batch_size], config.max_new_tokens)[4]
  costs = measure_costs(config, engines, methods, slots, say) if config.measure_costs else {}
  adaptive = {}
  for m in methods:
    if m.adaptive:
      adaptive[m.name] = (
        AdaptiveConfig.from_costs(costs[m.draft], config.adaptive_gammas)
        if m.draft in costs
        else AdaptiveConfig(gammas=config.adaptive_gammas)
      )
  records = {m.name: [] for m in methods}
  compile_seconds = {m.name: 0.0 for m in methods}
  for i in range(0, len(workload), config.batch_size):
    batch = list(range(i, min(i + config.batch_size, len(workload))))
    for m in methods:
      out = engines[m.draft][0].generate(
        [encoded[j] for j in batch],
        config.max_new_tokens,
        sampling,
        seed=config.seed + i,
        gamma=m.gamma,
        verifier=config.verifier,
        adaptive=adaptive.get(m.name),
      )
      compile_seconds[m.name] += out.compile_seconds
      for row, j in enumerate(batch):
        records[m.name].append(
          _record(
            workload[j], encoded[j], out, row, model.tokenizer, m.name, i // config.batch_size
          )
        )
    say(
      f'[{len(batch) + i}/{len(workload)}] '
      + ', '.join(
        f'{m.name}: {records[m.name][-1]["decode_tokens_per_second"]:.1f} tok/s' for m in methods
      )
    )
  drafts = {spec: label for spec, (_, label) in engines.items() if spec}
  summary = summarize(config, model, records, compile_seconds, drafts, methods, costs)
  if sampling.greedy:
    for name, m in summary['methods'].items():
      m['near_ties'] = count_near_ties(
        base_engine, encoded, records[name], records['autoregressive']
      )
  write_results(out_dir, config, records, summary)
  if config.prompt or (verbose and len(workload) <= 4):
    show_texts(say, records, sampling)
  say(format_table(summary))
  say(format_best_gamma(summary))
  say(f'results in {out_dir}  (advice: python -m specjax.advise {out_dir})')
  return summary


def _record(prompt, ids, out, row, tokenizer, method, batch) -> dict:
  tokens = out.tokens[row]
  accepted = out.accepted[row] if out.accepted else []
  drafted = out.drafted[row] if out.drafted else []
  return {
    'method': method,
    'id': prompt.id,
    'category': prompt.category,
    'prompt': prompt.text,
    'output': tokenizer.decode(tokens),
    'tokens': tokens,
    'prompt_tokens': len(ids),
    'new_tokens': len(tokens),
    'target_calls': len(accepted) + 1,
    'accepted': accepted,
    'drafted': drafted,
    'gamma': out.gamma,
    'batch': batch,
    'prefill_ms': 1e3 * out.prefill_seconds,
    'decode_ms': 1e3 * out.decode_seconds,
    'batch_steps': out.steps,
    'switches': out.switches,
    'latency_ms': 1e3 * (out.prefill_seconds + out.decode_seconds),
    'decode_tokens_per_second': out.decode_tokens_per_second,
  }


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
    first = next(
      (i for i, (x, y) in enumerate(zip(r['tokens'], b['tokens'])) if x != y),
      min(len(r['tokens']), len(b['tokens'])),
    )
    context = list(ids) + b['tokens'][:first]
    cache = KVCache.init(engine.cfg, 1, len(context), engine.params['embed'].dtype)
    logits, _ = llama.forward(engine.params, jnp.asarray([context]), cache, engine.cfg)
    top2 = np.sort(np.asarray(logits[0, -1]))[-2:]
    ties += bool(top2[1] - top2[0] < threshold)
  return ties


def per_token_alpha(recs) -> float | None:
  """The per-token acceptance probability alpha of the cost model (None without drafts).

  Under its model each draft token is accepted with probability alpha until the first
  rejection, so an iteration that kept k of gamma is k successes and (k < gamma) one
  failure, and successes / (successes + failures) is the maximum-likelihood alpha.
  (acceptance_rate, accepted / drafted, also counts the positions after a rejection,
  which were never tested, and is lower.)
  """
  pairs = [(a, d) for r in recs for a, d in zip(r['accepted'], r['drafted']) if d > 0]
  if not pairs:
    return None
  successes = sum(a for a, _ in pairs)
  return successes / max(successes + sum(a < d for a, d in pairs), 1)


def method_summary(recs, baseline, compile_seconds) -> dict:
  new = sum(r['new_tokens'] for r in recs)
  lat = [r['latency_ms'] for r in recs]
  drafted = sum(sum(r['drafted']) for r in recs)
  tried = [a for r in recs for a, d in zip(r['accepted'], r['drafted']) if d > 0]
  batches = {r['batch']: r for r in recs}.values()  # the decode loop's time is per batch
  decode_s = sum(r['decode_ms'] for r in batches) / 1e3
  return {
    'gamma': recs[0]['gamma'],
    'new_tokens': new,
    'acceptance_rate': sum(sum(r['accepted']) for r in recs) / drafted if drafted else None,
    'alpha': per_token_alpha(recs),
    'tokens_per_call': new / max(sum(r['target_calls'] for r in recs), 1),
    'decode_tokens_per_second': (new - len(recs)) / max(decode_s, 1e-9),
    'tokens_per_second': new / max(sum(r['latency_ms'] for r in batches) / 1e3, 1e-9),
    'iteration_ms': 1e3 * decode_s / max(sum(r['batch_steps'] for r in batches), 1),
    'verified_fraction': (
      len(tried) / max(sum(len(r['drafted']) for r in recs), 1) if recs[0]['gamma'] else None
    ),
    'prefill_ms': percentiles([r['prefill_ms'] for r in recs]),
    'latency_ms': percentiles(lat),
    'latency_ms_per_token': percentiles([r['latency_ms'] / r['new_tokens'] for r in recs]),
    'zero_accept_fraction': tried.count(0) / len(tried) if tried else None,
    'greedy_mismatches': sum(r['tokens'] != b['tokens'] for r, b in zip(recs, baseline)),
    'switches': sum(r['switches'] for r in batches),
    'compile_seconds': compile_seconds,
  }


def predict(m: dict, recs, costs: costs_lib.Costs, method: MethodSpec) -> dict:
  """The cost model's speedup for a method, from its acceptance and the measured costs.

  Iterations are weighted as they ran: one that verified gamma drafts emits
  E(alpha, gamma) tokens at cost draft(gamma) + verify(gamma); one that did not (a plain
  step of adaptive control, or a prompt lookup with no match) emits 1 token at cost 1
  (plus the search, for a fixed-gamma lookup). The same units give the predicted split
  of an iteration's time into draft, verify and the rest.
  """
  alpha = m['alpha'] or 0.0
  table = costs.table()
  tokens = units = draft_ms = verify_ms = 0.0
  n = 0
  for r in recs:
    for d in r['drafted']:
      n += 1
      if d:
        dc, vc = table[d]
        tokens += float(cost_model.expected_tokens(alpha, d))
      else:
        dc, vc = (0.0 if method.adaptive else table[method.gamma][0]), 1.0
        tokens += 1
      units += dc + vc
      draft_ms += dc * costs.target_ms
      verify_ms += vc * costs.target_ms
  predicted = tokens / max(units, 1e-9)
  measured_ms = m['iteration_ms']
  per_iter = lambda x: x / max(n, 1)
  return {
    'c': costs.c,
    'predicted_speedup': predicted,
    'time_split_ms': {
      'draft': per_iter(draft_ms),
      'verify': per_iter(verify_ms),
      'other': measured_ms - per_iter(draft_ms + verify_ms),
    },
  }


def best_gamma_per_category(summary, costs) -> dict:
  """Per draft and category: the cost model's best gamma from the category's acceptance."""
  out = {}
  for spec, c in costs.items():
    table = c.table()
    out[spec] = {}
    for cat in ['all', *summary['methods']['autoregressive']['categories']]:
      successes = trials = 0.0
      for name, m in summary['methods'].items():
        if not name.startswith(spec + '@'):
          continue
        sub = m if cat == 'all' else m['categories'][cat]
        if sub['alpha'] is not None:  # pooled over the draft's methods, by drafted tokens
          successes += sub['alpha'] * sub['_drafted']
          trials += sub['_drafted']
      if not trials:
        continue
      alpha = successes / trials
      gamma, speedup = cost_model.best_gamma(alpha, table)
      out[spec][cat] = {'alpha': alpha, 'gamma': gamma, 'predicted_speedup': speedup}
  return out


def summarize(
  config, model, records, compile_seconds, drafts=None, methods=None, costs=None
) -> dict:
  """Per method: acceptance, tokens per target call, speed, latency percentiles, speedup,
  and (with measured costs) the cost model's prediction."""
  costs = costs or {}
  specs = {m.name: m for m in (methods or [])}
  baseline = records['autoregressive']
  out = {
    name: method_summary(recs, baseline, compile_seconds[name]) for name, recs in records.items()
  }
  base = out['autoregressive']
  categories = sorted({r['category'] for r in baseline})
  for name, m in out.items():
    m['speedup'] = m['tokens_per_second'] / base['tokens_per_second']
    m['decode_speedup'] = m['decode_tokens_per_second'] / base['decode_tokens_per_second']
    m['_drafted'] = sum(sum(r['drafted']) for r in records[name])
    spec = specs.get(name)
    if spec is not None and spec.draft in costs:
      m.update(predict(m, records[name], costs[spec.draft], spec))
      m['adaptive'] = spec.adaptive
      m['draft'] = spec.draft
    m['categories'] = {}
    for cat in categories:
      pick = [i for i, r in enumerate(baseline) if r['category'] == cat]
      sub = method_summary([records[name][i] for i in pick], [baseline[i] for i in pick], 0.0)
      del sub['compile_seconds']
      sub['_drafted'] = sum(sum(records[name][i]['drafted']) for i in pick)
      if spec is not None and spec.draft in costs:
        sub['predicted_speedup'] = predict(
          sub, [records[name][i] for i in pick], costs[spec.draft], spec
        )['predicted_speedup']
      m['categories'][cat] = sub
  for m in out.values():
    for cat, sub in m['categories'].items():
      ref = base['categories'][cat]
      sub['speedup'] = sub['tokens_per_second'] / ref['tokens_per_second']
      sub['decode_speedup'] = sub['decode_tokens_per_second'] / ref['decode_tokens_per_second']
  summary = {
    'model': model.source,
    'drafts': drafts or {},
    'verifier': config.verifier,
    'temperature': config.temperature,
    'batch_size': config.batch_size,
    'num_prompts': len(baseline),
    'methods': out,
    'costs': {spec: c.to_json() for spec, c in costs.items()},
  }
  summary['best_gamma'] = best_gamma_per_category(summary, costs)
  for m in out.values():
    m.pop('_drafted')
    for sub in m['categories'].values():
      sub.pop('_drafted')
  return summary


def format_table(summary) -> str:
  greedy = summary['temperature'] == 0
  head = (
    f'{"method":<26}{"accept":>7}{"alpha":>6}{"tok/call":>9}{"tok/s":>8}{"speedup":>8}'
    f'{"predicted":>10}{"p50 ms":>8}{"p99 ms":>8}{"ms/tok p99":>11}{"mismatch":>9}'
  )
  lines = [head]
  for name, m in summary['methods'].items():
    acc = '-' if m['acceptance_rate'] is None else f'{m["acceptance_rate"]:.2f}'
    alpha = '-' if m['alpha'] is None else f'{m["alpha"]:.2f}'
    pred = f'{m["predicted_speedup"]:.2f}x' if 'predicted_speedup' in m else '-'
    mismatch = m['greedy_mismatches'] if greedy else '-'
    lines.append(
      f'{name:<26}{acc:>7}{alpha:>6}{m["tokens_per_call"]:>9.2f}{m["tokens_per_second"]:>8.1f}'
      f'{m["speedup"]:>7.2f}x{pred:>10}{m["latency_ms"]["p50"]:>8.0f}'
      f'{m["latency_ms"]["p99"]:>8.0f}{m["latency_ms_per_token"]["p99"]:>11.1f}'
      f'{mismatch:>9}'
    )
  lines.append(
    '(accept: accepted / drafted tokens; alpha: per-token acceptance probability; '
    'speedup: end to end, prefill included; predicted: the cost model on the decode '
    'loop, compare with decode_speedup in results.json)'
  )
  return '\n'.join(lines)


def format_best_gamma(summary) -> str:
  lines = []
  for spec, cats in summary.get('best_gamma', {}).items():
    parts = [
      f'{cat}: '
      + ('off' if b['gamma'] == 0 else f'gamma={b["gamma"]} ({b["predicted_speedup"]:.2f}x)')
      + f' at alpha {b["alpha"]:.2f}'
      for cat, b in cats.items()
    ]
    lines.append(f'best gamma by the cost model, {spec}: ' + '; '.join(parts))
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
