r"""Calibrates self-speculative layer skipping: which layers the draft skips, and gamma.

  python -m specjax.calibrate_skip --config configs/calibrate_skip.py  # SmolLM2-135M-Instruct
  python -m specjax.calibrate_skip --config configs/calibrate_skip.py:tiny \
      --config.out=/tmp/layerskip_tiny.json

A config-driven job that writes JSON (configs/layerskip_smollm2.json for the default):
configs/layerskip_smollm2.py reads the chosen skip set from it. The draft is the target
running a subset of its layers (draft spec 'layers:...', `specjax/drafters/model.py`).
The search, on calibration prompts kept apart from the evaluation sets
(`CALIBRATION_PROMPTS`: none of them is a HumanEval, MT-bench or code-editing prompt):

  1. the target decodes the calibration prompts greedily once;
  2. every candidate skip set (one contiguous block of layers, for each block length and
     start) runs teacher-forced over those texts in one masked forward (the model's own
     layer body, `llama.layer`). Where the draft's argmax agrees with the target's token
     a greedy draft is accepted, and with the draft's own cache fed the accepted tokens,
     runs of agreement are exactly the accepted draft lengths: simulating the loop over
     them gives tokens per target call for every gamma, with no decoding;
  3. the cost model (`specjax/control/cost_model.py`) turns that into a predicted
     speedup from measured costs (`specjax/bench/costs.py`): a target step, each
     (gamma + 1)-token verification, and a draft step of k kept layers, interpolated
     between a 1-layer and an all-layer forward (the embedding and output head are the
     fixed part);
  4. the best few candidates (each at its best gamma) are measured for real, decoding
     the calibration prompts with the Engine against autoregressive decoding, and the
     fastest in tokens/s is written as the chosen one.
"""

from __future__ import annotations

import dataclasses
import json
import pathlib
import time

import jax
import jax.numpy as jnp
import numpy as np

from specjax import config_lib
from specjax.bench import costs as costs_lib
from specjax.bench import metrics, provenance
from specjax.checkpoints import loader
from specjax.control import cost_model
from specjax.decode.engine import Engine
from specjax.decode.method import Method
from specjax.drafters.model import ModelDrafter
from specjax.models import llama

# Written for calibration only; deliberately unlike the evaluation prompt sets.
CALIBRATION_PROMPTS = (
  'Explain in a few sentences how a refrigerator keeps food cold.',
  'Write a short Python function that returns the n-th Fibonacci number, with a docstring.',
  'Give three tips for keeping a small vegetable garden healthy in summer.',
  'Describe the water cycle to a ten-year-old.',
  'Write a Python class Stack with push, pop and peek methods.',
  'What are the main differences between a list and a tuple in Python?',
)


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
  is true, over whole sequences (causal, no cache), with the model's own layer body."""
  b, t = tokens.shape
  positions = jnp.broadcast_to(jnp.arange(t), (b, t))
  valid = positions < lengths[:, None]
  mask = (positions[:, None, :] <= positions[:, :, None]) & valid[:, None, :]  # [B, T, T]
  cos, sin = llama.rope_tables(positions, cfg.head_dim, cfg.rope_base)
  heads_first = lambda a: a.transpose(0, 2, 1, 3)  # [B, G, T, H], as attention takes it
  attend = lambda q, k, v: llama.attention(q, heads_first(k), heads_first(v), mask)
  x = jnp.take(params['embed'], tokens, axis=0)
  for i, p in enumerate(params['layers']):  # skipped layers cost nothing on CPU
    x = jax.lax.cond(
      keep[i], lambda x, p=p: llama.layer(p, x, cos, sin, cfg, attend), lambda x: x, x
    )
  x = llama.rms_norm(x, params['final_norm'], cfg.norm_eps)
  return jnp.argmax(cfg.family.logits(params, x, cfg), -1)


def simulate(agree: np.ndarray, gamma: int) -> float:
  """Tokens per target call of greedy speculation over one text whose draft-target
  agreement per position is `agree` (runs of agreement are the accepted lengths)."""
  return len(agree) / max(cost_model.greedy_calls(agree, gamma), 1)


@dataclasses.dataclass(frozen=True)
class SkipCosts:
  """Measured costs in target steps: a draft step of k kept layers is
  fixed + k * per_layer (fixed: embedding and output head), verify[gamma] one
  (gamma + 1)-token target forward."""

  fixed: float
  per_layer: float
  verify: dict[int, float]
  step_ms: float

  def draft_step(self, kept: int) -> float:
    return self.fixed + kept * self.per_layer


def measure_skip_costs(model, gammas, cache_size: int = 256, repeats: int = 5) -> SkipCosts:
  """Times a target step, a 1-layer step and each verification (bench/costs.py timers)."""
  params, cfg = jax.device_put(model.params), model.cfg
  pieces = {'step': costs_lib.timer_forward(params, cfg, 1, 1, cache_size)}
  pieces['one_layer'] = costs_lib.timer_forward(params, cfg, 1, 1, cache_size, layers=(0,))
  for g in gammas:
    pieces[g] = costs_lib.timer_forward(params, cfg, 1, g + 1, cache_size)
  best = costs_lib.fastest(pieces, repeats)
  step, one = best['step'], best['one_layer']
  per_layer = max(step - one, 0.0) / max(cfg.n_layers - 1, 1) / step
  return SkipCosts(
    fixed=one / step - per_layer,
    per_layer=per_layer,
    verify={g: best[g] / step for g in gammas},
    step_ms=step,
  )


def predicted_speedup(tokens_per_call: float, kept: int, gamma: int, costs: SkipCosts) -> float:
  """The cost model's speedup of a skip set keeping `kept` layers at `gamma`."""
  draft = gamma * costs.draft_step(kept)
  return float(cost_model.speedup(tokens_per_call, draft, costs.verify[gamma]))


def reference_texts(engine: Engine, prompts, max_new: int):
  """(tokens[B, T], lengths[B], start[B]): prompt + the target's greedy continuation."""
  out = engine.generate(prompts, max_new_tokens=max_new)
  seqs = [list(p) + t for p, t in zip(prompts, out.tokens)]
  width = max(map(len, seqs))
  tokens = np.zeros((len(seqs), width), np.int32)
  for i, s in enumerate(seqs):
    tokens[i, : len(s)] = s
  return tokens, np.array([len(s) for s in seqs]), np.array([len(p) for p in prompts])


def score_candidates(model, candidates, tokens, lengths, starts, gammas, costs, say=print):
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
      cand.predicted[g] = predicted_speedup(cand.tokens_per_call[g], len(cand.kept), g, costs)
    if (i + 1) % 10 == 0 or i + 1 == len(candidates):
      say(f'scored {i + 1}/{len(candidates)} skip sets')


def measure(model, cand: Candidate, prompts, max_new: int, base: Engine) -> dict:
  """Greedy decoding of the calibration prompts, speculative vs autoregressive, batch 1."""
  drafter = ModelDrafter(model.cfg, name=cand.spec, layers=cand.kept)
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
    o = engine.generate([p], Method.chain(gamma, 'greedy'), max_new_tokens=max_new)
    spec['tokens'] += o.num_generated
    spec['seconds'] += o.prefill_seconds + o.decode_seconds
    spec['calls'] += o.target_calls
    a = base.generate([p], max_new_tokens=max_new)
    plain['tokens'] += a.num_generated
    plain['seconds'] += a.prefill_seconds + a.decode_seconds
  tps, base_tps = spec['tokens'] / spec['seconds'], plain['tokens'] / plain['seconds']
  return {
    'gamma': gamma,
    'tokens_per_second': tps,
    'autoregressive_tokens_per_second': base_tps,
    'speedup': tps / base_tps,
    'tokens_per_call': metrics.tokens_per_call(spec['tokens'], spec['calls']),
  }


def validate(c) -> None:
  """Checks the calibration config before any model loads."""
  config_lib.check(c.measure_top >= 1, 'measure_top', c.measure_top, 'an integer >= 1')
  config_lib.check(
    1 <= c.num_prompts <= len(CALIBRATION_PROMPTS),
    'num_prompts',
    c.num_prompts,
    f'an integer in [1, {len(CALIBRATION_PROMPTS)}]',
  )
  gammas = tuple(c.gammas)
  config_lib.check(
    bool(gammas) and all(isinstance(g, int) and g >= 1 for g in gammas),
    'gammas',
    gammas,
    'draft lengths, each an integer >= 1',
  )
  for field in ('max_new', 'min_skip', 'stride'):
    config_lib.check(c[field] >= 1, field, c[field], 'an integer >= 1')
  config_lib.check(str(c.out).endswith('.json'), 'out', c.out, 'a path ending in .json')
  loader.check_model_spec(c.model)


def calibrate(config, workdir=None, say=print) -> dict:
  """Runs the search on `config` (configs/calibrate_skip.py); writes and returns the report.

  `workdir` is unused (the report goes to config.out); it keeps the entry-point signature.
  """
  del workdir
  c = config
  validate(c)
  start = time.perf_counter()
  model = loader.load_model(c.model)
  if model.cfg.n_layers < 2:
    raise ValueError(f'{c.model} has {model.cfg.n_layers} layer: nothing to skip')
  gammas = tuple(c.gammas)
  prompts = [model.tokenizer.encode_chat(p) for p in CALIBRATION_PROMPTS[: c.num_prompts]]
  base = Engine(
    model.params,
    model.cfg,
    eos_id=model.tokenizer.eos_id,
    cache_size=min(1024, model.cfg.max_seq_len),
  )
  tokens, lengths, starts = reference_texts(base, prompts, c.max_new)
  costs = measure_skip_costs(model, gammas)
  say(
    f'costs (target steps): draft step {costs.fixed:.3f} + {costs.per_layer:.4f} per layer; '
    'verify ' + ', '.join(f'{g}: {v:.2f}' for g, v in costs.verify.items())
  )
  n_layers = model.cfg.n_layers
  skips = contiguous_skips(n_layers, min_skip=min(c.min_skip, n_layers - 1), stride=c.stride)
  candidates = [Candidate(s, tuple(i for i in range(n_layers) if i not in s)) for s in skips]
  say(
    f'{len(candidates)} skip sets, {len(prompts)} calibration prompts, {int(lengths.sum())} tokens'
  )
  score_candidates(model, candidates, tokens, lengths, starts, gammas, costs, say)
  ranked = sorted(candidates, key=lambda cand: -cand.predicted[cand.best_gamma()])
  for cand in ranked[: c.measure_top]:
    cand.measured = measure(model, cand, prompts, c.max_new, base)
    say(
      f'{cand.spec} gamma={cand.measured["gamma"]}: predicted '
      f'{cand.predicted[cand.best_gamma()]:.2f}x, measured {cand.measured["speedup"]:.2f}x'
    )
  # Ranked by the speedup over autoregressive decoding measured prompt by prompt alongside
  # it: absolute tokens/s drift with the machine's load between candidates.
  best = max(ranked[: c.measure_top], key=lambda cand: cand.measured['speedup'])
  result = {
    'model': c.model,
    'source': model.source,
    'calibration_prompts': list(CALIBRATION_PROMPTS[: c.num_prompts]),
    'max_new': c.max_new,
    'costs': dataclasses.asdict(costs),
    'chosen': {
      'draft': best.spec,
      'skipped': list(best.skipped),
      'gamma': best.best_gamma(),
      'predicted': best.predicted[best.best_gamma()],
      'measured': best.measured,
      'beats_autoregressive': best.measured['speedup'] > 1.0,
    },
    'seconds': time.perf_counter() - start,
    'provenance': provenance.provenance(),
    'candidates': [dataclasses.asdict(cand) | {'spec': cand.spec} for cand in ranked],
  }
  path = pathlib.Path(c.out)
  path.parent.mkdir(parents=True, exist_ok=True)
  path.write_text(json.dumps(result, indent=1))
  if best.measured['speedup'] <= 1:
    say('no skip set beat autoregressive decoding on the calibration prompts')
  say(
    f'chose {best.spec} (skips {layer_ranges(best.skipped)}) at gamma={best.best_gamma()}: '
    f'{best.measured["speedup"]:.2f}x measured; wrote {path} in {result["seconds"]:.0f} s'
  )
  return result


if __name__ == '__main__':
  config_lib.run_cli(calibrate, 'configs/calibrate_skip.py')
