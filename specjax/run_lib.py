"""The work behind `python -m specjax.run`: importable from notebooks and tests."""

from __future__ import annotations

import datetime
import json
import os
import pathlib
import time

import ml_collections
import numpy as np

from specjax import config_lib
from specjax.data import prompts as prompts_lib
from specjax.decode.engine import Engine
from specjax.decode.sampling import SamplingConfig
from specjax.models import loader
from specjax.models import sharding as sharding_lib


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


def build_engine(config, model: loader.LoadedModel) -> Engine:
  mesh = None
  if config.mesh.data * config.mesh.model > 1:
    mesh = sharding_lib.make_mesh(config.mesh.data, config.mesh.model)
  return Engine(model.params, model.cfg, eos_id=model.tokenizer.eos_id,
                cache_size=config.cache_size, mesh=mesh)


def load_workload(config) -> list[prompts_lib.Prompt]:
  if config.prompt:
    return [prompts_lib.Prompt(id='prompt', text=config.prompt, category='prompt')]
  return prompts_lib.load_prompts(config.prompts, config.num_prompts)


def main(config: ml_collections.ConfigDict, workdir: str | None = None,
         verbose: bool = True) -> dict:
  """Loads the model, generates for the workload, writes results; returns the summary."""
  say = print if verbose else (lambda *a, **k: None)
  validate(config)
  out_dir = make_workdir(workdir)
  workload = load_workload(config)
  start = time.perf_counter()
  model = loader.load_model(config.model, config.dtype)
  say(f'model {model.source}: {model.cfg.num_params / 1e6:.1f} M parameters, '
      f'{model.cfg.n_layers} layers, loaded in {time.perf_counter() - start:.1f} s')
  engine = build_engine(config, model)
  sampling = SamplingConfig(config.temperature, config.top_k, config.top_p)
  encoded = []
  for p in workload:
    try:
      encoded.append(model.tokenizer.encode_chat(p.text))
    except ValueError as e:
      raise ValueError(f'prompt {p.id!r}: {e}') from None
  records, compile_seconds = [], 0.0
  for i in range(0, len(workload), config.batch_size):
    batch = list(range(i, min(i + config.batch_size, len(workload))))
    out = engine.generate([encoded[j] for j in batch], config.max_new_tokens, sampling,
                          seed=config.seed + i)
    compile_seconds += out.compile_seconds
    for j, tokens in zip(batch, out.tokens):
      p = workload[j]
      records.append({
          'id': p.id, 'category': p.category, 'prompt': p.text,
          'output': model.tokenizer.decode(tokens), 'prompt_tokens': len(encoded[j]),
          'new_tokens': len(tokens), 'prefill_ms': 1e3 * out.prefill_seconds,
          'latency_ms': 1e3 * (out.prefill_seconds + out.decode_seconds),
          'decode_tokens_per_second': out.decode_tokens_per_second})
      if config.prompt or verbose and len(workload) <= 8:
        say(f'--- [{p.category}] {p.text[:200]}\n{records[-1]["output"]}\n')
    say(f'[{len(records)}/{len(workload)}] {out.decode_tokens_per_second:.1f} tok/s decode, '
        f'prefill {1e3 * out.prefill_seconds:.0f} ms')
  summary = summarize(config, model, records, compile_seconds)
  write_results(out_dir, config, records, summary)
  say(f'{summary["new_tokens"]} tokens from {len(records)} prompts: '
      f'{summary["decode_tokens_per_second"]:.1f} tok/s decode, prefill p50 '
      f'{summary["prefill_ms"]["p50"]:.0f} ms, compile {compile_seconds:.1f} s '
      f'(excluded). Results in {out_dir}')
  return summary


def summarize(config, model, records, compile_seconds) -> dict:
  new = sum(r['new_tokens'] for r in records)
  decode_s = sum(r['latency_ms'] - r['prefill_ms'] for r in records) / 1e3
  lat = [r['latency_ms'] for r in records]
  return {
      'model': model.source, 'method': 'autoregressive', 'num_prompts': len(records),
      'batch_size': config.batch_size, 'new_tokens': new,
      'decode_tokens_per_second': float(np.median([r['decode_tokens_per_second']
                                                   for r in records])),
      'tokens_per_second': new / max(sum(lat) / 1e3, 1e-9) * config.batch_size,
      'decode_seconds': decode_s,
      'prefill_ms': percentiles([r['prefill_ms'] for r in records]),
      'latency_ms': percentiles(lat),
      'compile_seconds': compile_seconds,
  }


def write_results(out_dir: pathlib.Path, config, records, summary) -> None:
  (out_dir / 'config.json').write_text(config.to_json_best_effort(indent=2))
  with open(out_dir / 'generations.jsonl', 'w') as f:
    for r in records:
      f.write(json.dumps(r, ensure_ascii=False) + '\n')
  (out_dir / 'results.json').write_text(json.dumps(summary, indent=2))
