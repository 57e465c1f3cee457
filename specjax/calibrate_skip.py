r"""Calibrates self-speculative layer skipping: which layers the draft skips, and gamma.

  python -m specjax.calibrate_skip  # SmolLM2-135M-Instruct, writes configs/layerskip_smollm2.py
  python -m specjax.calibrate_skip --model tiny --out /tmp/layerskip_tiny.py --measure 1

The draft is the target running a subset of its layers (draft spec 'layers:...',
`specjax/drafters/model.py`). The search, on calibration prompts kept apart from the
evaluation sets (`CALIBRATION_PROMPTS`: none of them is a HumanEval, MT-bench or
code-editing prompt):

  1. the target decodes the calibration prompts greedily once;
  2. every candidate skip set (one contiguous block of layers, for each block length and
     start) runs teacher-forced over those texts in one masked forward. Where the
     draft's argmax agrees with the target's token a greedy draft is accepted, and with
     the draft's own cache fed the accepted tokens, runs of agreement are exactly the
     accepted draft lengths: simulating the loop over them gives tokens per target call
     for every gamma, with no decoding;
  3. a cost model turns that into a predicted speedup: an iteration costs gamma draft
     steps of (kept layers + head) / (layers + head) of a target step each, plus one
     verification of gamma + 1 tokens (1 + `VERIFY_SLOPE` * gamma target steps);
  4. the best few candidates (each at its best gamma) are measured for real, decoding
     the calibration prompts with the Engine against autoregressive decoding, and the
     fastest in tokens/s is written into a config file and a JSON report.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import json
import pathlib
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np

from specjax.decode.engine import Engine
from specjax.drafters.model import ModelDrafter
from specjax.models import llama, loader

# Written for calibration only; deliberately unlike the evaluation prompt sets.
CALIBRATION_PROMPTS = (
  'Explain in a few sentences how a refrigerator keeps food cold.',
  'Write a short Python function that returns the n-th Fibonacci number, with a docstring.',
  'Give three tips for keeping a small vegetable garden healthy in summer.',
  'Describe the water cycle to a ten-year-old.',
  'Write a Python class Stack with push, pop and peek methods.',
  'What are the main differences between a list and a tuple in Python?',
)
VERIFY_SLOPE = 0.065  # one forward of gamma+1 tokens costs ~1 + 0.065 gamma steps (FACTS.md)
HEAD_LAYERS = 4.5  # the output head costs about as much as 4.5 of SmolLM2's 30 layers


@dataclasses.dataclass
class Candidate:
  skipped: tuple[int, ...]
  kept: tuple[int, ...]
  agreement: float = 0.0
  tokens_per_call: dict = dataclasses.field(default_factory=dict)  # gamma -> simulated
  predicted: dict = dataclasses.field(default_factory=dict)  # gamma -> predicted speedup
  measured: dict | None = None

  @property
  def spec(self) -> str:
    return 'layers:' + layer_ranges(self.kept)

  def best_gamma(self) -> int:
    return max(self.predicted, key=self.predicted.get)


def layer_ranges(layers) -> str:
  """(0, 1, 2, 5, 6) -> '0-2,5-6'."""
  parts, start = [], None
  for i, x in enumerate(layers):
    if start is None:
      start = x
    if i + 1 == len(layers) or layers[i + 1] != x + 1:
      parts.append(f'{start}-{x}' if x > start else f'{start}')
      start = None
  return ','.join(parts)


def contiguous_skips(
  n_layers: int, min_skip: int = 1, max_skip: int | None = None, stride: int = 1
) -> list[tuple[int, ...]]:
  """Blocks of consecutive layers to skip (lengths min_skip, min_skip + stride, ... up to
  max_skip, default half the layers; starts every `stride` layers), never the first or the
  last layer."""
  max_skip = max_skip or max(n_layers // 2, min_skip)
  out = []
  for length in range(min_skip, max_skip + 1, stride):
    for start in range(1, n_layers - length, stride):
      out.append(tuple(range(start, start + length)))
  if not out and n_layers >= 2:  # a model too shallow to keep both ends
    out = [(i,) for i in range(n_layers)]
  return out


def masked_forward(params, tokens, lengths, keep, cfg: llama.LlamaConfig) -> jax.Array:
  """Greedy next-token predictions [B, T] of the target running only layers where keep[L]
  is true, over whole sequences (causal, no cache)."""
  b, t = tokens.shape
  n, g, h = cfg.n_heads, cfg.n_kv_heads, cfg.head_dim
  positions = jnp.broadcast_to(jnp.arange(t), (b, t))
  valid = positions < lengths[:, None]
  mask = (positions[:, None, :] <= positions[:, :, None]) & valid[:, None, :]  # [B, T, T]
  cos, sin = llama.rope_tables(positions, h, cfg.rope_base)
  x = jnp.take(params['embed'], tokens, axis=0)

  def block(p, x):
    y = llama.rms_norm(x, p['attn_norm'], cfg.norm_eps)
    q = llama.apply_rope((y @ p['wq']).reshape(b, t, n, h), cos, sin)
    k = llama.apply_rope((y @ p['wk']).reshape(b, t, g, h), cos, sin)
    v = (y @ p['wv']).reshape(b, t, g, h)
    heads_first = lambda a: a.transpose(0, 2, 1, 3)  # [B, G, T, H], as attention takes
    x = x + llama.attention(q, heads_first(k), heads_first(v), mask).reshape(b, t, n * h) @ p['wo']
    y = llama.rms_norm(x, p['mlp_norm'], cfg.norm_eps)
    return x + (jax.nn.silu(y @ p['w_gate']) * (y @ p['w_up'])) @ p['w_down']

  for i, p in enumerate(params['layers']):  # skipped layers cost nothing on CPU
    x = jax.lax.cond(keep[i], lambda x, p=p: block(p, x), lambda x: x, x)
  x = llama.rms_norm(x, params['final_norm'], cfg.norm_eps)
  return jnp.argmax(llama.logits_from_hidden(params, x, cfg), -1)


def simulate(agree: np.ndarray, gamma: int) -> float:
  """Tokens per target call of greedy speculation over one text whose draft-target
  agreement per position is `agree` (runs of agreement are the accepted lengths)."""
  t, calls, n = 0, 0, len(agree)
  while t < n:
    accepted = 0
    while accepted < gamma and t + accepted < n and agree[t + accepted]:
      accepted += 1
    t += accepted + 1
    calls += 1
  return n / max(calls, 1)


def predicted_speedup(
  tokens_per_call: float, kept: int, n_layers: int, gamma: int, head: float = HEAD_LAYERS
) -> float:
  draft = (kept + head) / (n_layers + head)
  return tokens_per_call / (gamma * draft + 1 + VERIFY_SLOPE * gamma)


def reference_texts(engine: Engine, prompts, max_new: int):
  """(tokens[B, T], lengths[B], start[B]): prompt + the target's greedy continuation."""
  out = engine.generate(prompts, max_new)
  seqs = [list(p) + t for p, t in zip(prompts, out.tokens)]
  width = max(map(len, seqs))
  tokens = np.zeros((len(seqs), width), np.int32)
  for i, s in enumerate(seqs):
    tokens[i, : len(s)] = s
  return tokens, np.array([len(s) for s in seqs]), np.array([len(p) for p in prompts])


def score_candidates(model, candidates, tokens, lengths, starts, gammas, say=print):
  """Fills in agreement, simulated tokens per call and predicted speedup (in place)."""
  cfg = model.cfg
  fn = jax.jit(lambda p, x, n, keep: masked_forward(p, x, n, keep, cfg))
  params = jax.device_put(model.params)
  x, n = jnp.asarray(tokens), jnp.asarray(lengths)
  for i, cand in enumerate(candidates):
    keep = np.isin(np.arange(cfg.n_layers), cand.kept)
    pred = np.asarray(fn(params, x, n, jnp.asarray(keep)))
    agrees = [
      pred[b, s - 1 : l - 1] == tokens[b, s:l] for b, (s, l) in enumerate(zip(starts, lengths))
    ]  # the prediction at j is for token j + 1
    cand.agreement = float(np.mean(np.concatenate(agrees)))
    for g in gammas:
      cand.tokens_per_call[g] = float(np.mean([simulate(a, g) for a in agrees]))
      cand.predicted[g] = predicted_speedup(
        cand.tokens_per_call[g], len(cand.kept), cfg.n_layers, g
      )
    if (i + 1) % 10 == 0 or i + 1 == len(candidates):
      say(f'scored {i + 1}/{len(candidates)} skip sets')


def measure(model, cand: Candidate, prompts, max_new: int, base: Engine) -> dict:
  """Greedy decoding of the calibration prompts, speculative vs autoregressive, batch 1."""
  drafter = ModelDrafter(model.cfg, label=cand.spec, layers=cand.kept)
  engine = Engine(
    base.params,
    model.cfg,
    eos_id=base.eos_id,
    cache_size=base.cache_size,
    drafter=drafter,
    draft_params=base.params,
  )
  gamma = cand.best_gamma()
  spec = {'tokens': 0, 'seconds': 0.0, 'calls': 0}
  plain = {'tokens': 0, 'seconds': 0.0}
  for p in prompts:  # interleaved prompt by prompt
    o = engine.generate([p], max_new, gamma=gamma, verifier='greedy')
    spec['tokens'] += o.num_generated
    spec['seconds'] += o.prefill_seconds + o.decode_seconds
    spec['calls'] += o.target_calls
    a = base.generate([p], max_new)
    plain['tokens'] += a.num_generated
    plain['seconds'] += a.prefill_seconds + a.decode_seconds
  tps, base_tps = spec['tokens'] / spec['seconds'], plain['tokens'] / plain['seconds']
  return {
    'gamma': gamma,
    'tokens_per_second': tps,
    'autoregressive_tokens_per_second': base_tps,
    'speedup': tps / base_tps,
    'tokens_per_call': spec['tokens'] / spec['calls'],
  }


CONFIG_TEMPLATE = '''"""Self-speculative layer skipping for {model}: the calibrated skip set.

Written by `python -m specjax.calibrate_skip` on {date}; report:
{report}.
Skipped layers {skipped} of {n_layers}; predicted {predicted:.2f}x, measured {measured}
over autoregressive decoding on the calibration prompts (not the evaluation sets).{verdict}

  python -m specjax.run --config {path}
  python -m specjax.run --config {path} --config.prompts=humaneval
"""

from specjax import config_lib

MODEL = {model!r}
SKIPPED = {skipped!r}
DRAFT = {draft!r}
GAMMA = {gamma}


def get_config(arg: str | None = None):
  c = config_lib.load_config('smollm2.py', arg)
  c.model = MODEL
  c.drafts = (DRAFT,)
  c.gammas = (GAMMA,)
  c.verifier = 'greedy'  # calibrated for greedy decoding; rejection/block work too
  return c
'''


def calibrate(
  model_spec: str = 'smollm2-135m-instruct',
  out: str = 'configs/layerskip_smollm2.py',
  report: str | None = None,
  max_new: int = 48,
  num_prompts: int = 4,
  gammas=(1, 2, 3, 4, 6, 8),
  min_skip: int = 2,
  stride: int = 2,
  measure_top: int = 3,
  say=print,
) -> dict:
  """Runs the search; writes the config `out` and the JSON report; returns the report."""
  if measure_top < 1:
    raise ValueError(f'measure_top must be >= 1, got {measure_top}')
  if not 1 <= num_prompts <= len(CALIBRATION_PROMPTS):
    raise ValueError(f'num_prompts must lie in [1, {len(CALIBRATION_PROMPTS)}], got {num_prompts}')
  if not gammas or min(gammas) < 1:
    raise ValueError(f'gammas must be integers >= 1, got {gammas}')
  start = time.perf_counter()
  model = loader.load_model(model_spec)
  if model.cfg.n_layers < 2:
    raise ValueError(f'{model_spec} has {model.cfg.n_layers} layer: nothing to skip')
  prompts = [model.tokenizer.encode_chat(p) for p in CALIBRATION_PROMPTS[:num_prompts]]
  base = Engine(
    model.params,
    model.cfg,
    eos_id=model.tokenizer.eos_id,
    cache_size=min(1024, model.cfg.max_seq_len),
  )
  tokens, lengths, starts = reference_texts(base, prompts, max_new)
  skips = contiguous_skips(
    model.cfg.n_layers, min_skip=min(min_skip, model.cfg.n_layers - 1), stride=stride
  )
  candidates = [
    Candidate(s, tuple(i for i in range(model.cfg.n_layers) if i not in s)) for s in skips
  ]
  say(
    f'{len(candidates)} skip sets, {len(prompts)} calibration prompts, {int(lengths.sum())} tokens'
  )
  score_candidates(model, candidates, tokens, lengths, starts, gammas, say)
  ranked = sorted(candidates, key=lambda c: -c.predicted[c.best_gamma()])
  for cand in ranked[:measure_top]:
    cand.measured = measure(model, cand, prompts, max_new, base)
    say(
      f'{cand.spec} gamma={cand.measured["gamma"]}: predicted '
      f'{cand.predicted[cand.best_gamma()]:.2f}x, measured {cand.measured["speedup"]:.2f}x'
    )
  # Ranked by the speedup over autoregressive decoding measured prompt by prompt alongside
  # it: absolute tokens/s drift with the machine's load between candidates.
  best = max(ranked[:measure_top], key=lambda c: c.measured['speedup'])
  report_path = pathlib.Path(report or pathlib.Path(out).with_suffix('.json'))
  result = {
    'model': model.source,
    'date': datetime.date.today().isoformat(),
    'calibration_prompts': list(CALIBRATION_PROMPTS[:num_prompts]),
    'max_new': max_new,
    'cost_model': {'verify_slope': VERIFY_SLOPE, 'head_layers': HEAD_LAYERS},
    'chosen': {
      'draft': best.spec,
      'skipped': list(best.skipped),
      'gamma': best.best_gamma(),
      'measured': best.measured,
      'beats_autoregressive': best.measured['speedup'] > 1.0,
    },
    'seconds': time.perf_counter() - start,
    'candidates': [dataclasses.asdict(c) | {'spec': c.spec} for c in ranked],
  }
  path = pathlib.Path(out)
  path.parent.mkdir(parents=True, exist_ok=True)
  report_path.parent.mkdir(parents=True, exist_ok=True)
  report_path.write_text(json.dumps(result, indent=1))
  path.write_text(
    CONFIG_TEMPLATE.format(
      model=model_spec,
      date=result['date'],
      report=report_path,
      skipped=best.skipped,
      n_layers=model.cfg.n_layers,
      predicted=best.predicted[best.best_gamma()],
      measured=f'{best.measured["speedup"]:.2f}x',
      path=path,
      draft=best.spec,
      verdict=''
      if best.measured['speedup'] > 1
      else ('\nNo skip set beat autoregressive decoding: this is the least slow one.'),
      gamma=best.best_gamma(),
    )
  )
  if best.measured['speedup'] <= 1:
    say('no skip set beat autoregressive decoding on the calibration prompts')
  say(
    f'chose {best.spec} (skips {layer_ranges(best.skipped)}) at gamma={best.best_gamma()}: '
    f'{best.measured["speedup"]:.2f}x measured; wrote {path} and {report_path} '
    f'in {result["seconds"]:.0f} s'
  )
  return result


def main(argv=None):
  parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  parser.add_argument('--model', default='smollm2-135m-instruct')
  parser.add_argument('--out', default='configs/layerskip_smollm2.py')
  parser.add_argument('--report', default=None, help='JSON report (default: next to --out)')
  parser.add_argument('--max_new', type=int, default=48)
  parser.add_argument('--num_prompts', type=int, default=4)
  parser.add_argument('--gammas', default='1,2,3,4,6,8')
  parser.add_argument('--min_skip', type=int, default=2)
  parser.add_argument('--stride', type=int, default=2)
  parser.add_argument('--measure', type=int, default=3, help='candidates measured for real')
  args = parser.parse_args(argv)
  try:
    calibrate(
      args.model,
      args.out,
      args.report,
      args.max_new,
      args.num_prompts,
      tuple(int(g) for g in args.gammas.split(',')),
      args.min_skip,
      args.stride,
      args.measure,
    )
  except ValueError as e:
    print(f'error: {e}', file=sys.stderr)
    sys.exit(2)


if __name__ == '__main__':
  main()
