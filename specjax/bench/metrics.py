"""Typed summaries of a run: what every report, plot, the advisor and self-consistency read.

A run produces one *record* per (method, prompt) (`record`: the generated tokens, per
iteration what was drafted and accepted, timings). `summarize_method` turns a method's
records into a `Summary` — the one place where tokens per call, acceptance, the per-token
acceptance alpha and the latency percentiles are computed — and `summarize` does it for
every method, overall and per category, with the cost model's prediction when costs were
measured, the per-position acceptance counts (`position_counts`) and a bootstrap interval
over prompts for each speedup and acceptance figure (`bootstrap_ci`, `confidence_intervals`).
results.json holds `Summary.to_json()` per method; `Summary.from_json` reads it back.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from specjax.control import cost_model


def percentiles(values, qs=(50, 90, 99)) -> dict[str, float]:
  return {f'p{q}': float(np.percentile(values, q)) for q in qs}


def tokens_per_call(new_tokens: int, target_calls: int) -> float:
  """Tokens emitted per target forward pass (the prefill counts as one)."""
  return new_tokens / max(target_calls, 1)


def per_token_alpha(pairs: Sequence[tuple[int, int]]) -> float | None:
  """The per-token acceptance probability alpha of the cost model (None without drafts).

  `pairs` are (accepted, drafted) per iteration that drafted. Under the cost model each
  draft token is accepted with probability alpha until the first rejection, so an
  iteration that kept k of gamma is k successes and (k < gamma) one failure, and
  successes / (successes + failures) is the maximum-likelihood alpha. (acceptance_rate,
  accepted / drafted, also counts the positions after a rejection, which were never
  tested, and is lower.)
  """
  if not pairs:
    return None
  successes = sum(a for a, _ in pairs)
  return successes / max(successes + sum(a < d for a, d in pairs), 1)


def position_counts(recs) -> tuple[list[int], list[int]]:
  """(proposed, accepted) per draft position i = 1..gamma over the records' iterations:
  how many drafted a token at position i (drafted >= i) and how many accepted it
  (accepted >= i). Counts, so runs pool by adding them; their ratio is the curve of
  acceptance_by_position.png. (A tree's iterations draft every depth up to gamma.)"""
  gamma = max((r['gamma'] for r in recs), default=0)
  pairs = [(a, d) for r in recs for a, d in zip(r['accepted'], r['drafted']) if d > 0]
  pairs = np.asarray(pairs, np.int64).reshape(-1, 2)
  i = np.arange(1, gamma + 1)[None]  # [1, gamma]
  drafted = pairs[:, 1:] >= i
  return drafted.sum(0).tolist(), (drafted & (pairs[:, :1] >= i)).sum(0).tolist()


BOOTSTRAP_RESAMPLES = 1000
BOOTSTRAP_SEED = 0


def bootstrap_ci(
  per_unit, figure, resamples: int = BOOTSTRAP_RESAMPLES, seed: int = BOOTSTRAP_SEED
) -> list[float] | None:
  """The 95% percentile bootstrap interval [lo, hi] of a figure of column totals.

  `per_unit` [n, k]: each unit's (prompt's) sums of k quantities; `figure` maps totals
  [..., k] to the figure [...] (e.g. a ratio of two totals, as the run computes its
  figures over all prompts). Each of `resamples` resamples draws n units with replacement
  (numpy's default_rng(seed): the same interval for the same input); the interval is the
  2.5th and 97.5th percentiles of the figure over the resamples where it is finite (None
  if it is nowhere).
  """
  x = np.asarray(per_unit, np.float64)
  n = len(x)
  if not n:
    return None
  picks = np.random.default_rng(seed).integers(0, n, (resamples, n))
  flat = (picks + n * np.arange(resamples)[:, None]).ravel()
  weights = np.bincount(flat, minlength=resamples * n).reshape(resamples, n)  # [R, n]
  with np.errstate(divide='ignore', invalid='ignore'):
    values = np.asarray(figure(weights @ x), np.float64)  # [R]
  values = values[np.isfinite(values)]
  if not values.size:
    return None
  lo, hi = np.percentile(values, [2.5, 97.5])
  return [float(lo), float(hi)]


# The columns of prompt_units, and each figure as a function of their totals t [..., k].
UNIT_COLUMNS = (
  'new_tokens',
  'seconds',  # the prompt's share of its batches' time (prefill included)
  'decode_tokens',  # new tokens after the prefill's
  'decode_seconds',  # its share of its batches' decode-loop time
  'base_new_tokens',
  'base_seconds',
  'base_decode_tokens',
  'base_decode_seconds',
  'target_calls',
  'accepted',
  'drafted',
  'successes',  # per_token_alpha's
  'failures',
)
CI_FIGURES = {
  'speedup': lambda t: (t[..., 0] / t[..., 1]) / (t[..., 4] / t[..., 5]),
  'decode_speedup': lambda t: (t[..., 2] / t[..., 3]) / (t[..., 6] / t[..., 7]),
  'tokens_per_call': lambda t: t[..., 0] / t[..., 8],
  'acceptance_rate': lambda t: t[..., 9] / t[..., 10],
  'alpha': lambda t: t[..., 11] / (t[..., 11] + t[..., 12]),
}


def _shares(recs, key: str) -> list[float]:
  """Each record's share of its batch's time `key` (the batch's rows among `recs` split it
  evenly), so shares add up to the time summarize_method counts for `recs`."""
  rows: dict = {}
  for r in recs:
    rows[r['batch']] = rows.get(r['batch'], 0) + 1
  return [r[key] / 1e3 / rows[r['batch']] for r in recs]


def prompt_units(recs, baseline) -> np.ndarray:
  """[prompts, UNIT_COLUMNS] sums per prompt (every turn of a multi-turn prompt is one
  unit: records of the same category and id) of a method's records and the baseline's,
  aligned. Their column totals give back summarize_method's figures."""
  units: dict = {}
  columns = zip(
    recs,
    baseline,
    _shares(recs, 'latency_ms'),
    _shares(recs, 'decode_ms'),
    _shares(baseline, 'latency_ms'),
    _shares(baseline, 'decode_ms'),
  )
  for k, (r, b, sec, dec, bsec, bdec) in enumerate(columns):
    pairs = [(a, d) for a, d in zip(r['accepted'], r['drafted']) if d > 0]
    row = [
      r['new_tokens'],
      sec,
      r['new_tokens'] - 1,
      dec,
      b['new_tokens'],
      bsec,
      b['new_tokens'] - 1,
      bdec,
      r['target_calls'],
      sum(r['accepted']),
      sum(r['drafted']),
      sum(a for a, _ in pairs),
      sum(a < d for a, d in pairs),
    ]
    key = (r.get('category'), r.get('id', k))
    units[key] = [x + y for x, y in zip(units.get(key, [0.0] * len(row)), row)]
  return np.asarray(list(units.values()), np.float64).reshape(-1, len(UNIT_COLUMNS))


def confidence_intervals(m: Summary, recs, baseline, compared: bool = True) -> None:
  """Sets m's *_ci95 (in place): bootstrap_ci over the prompts of `recs` for each figure
  the Summary has (speedups only when `compared` with autoregressive `baseline`)."""
  units = prompt_units(recs, baseline)
  for name, figure in CI_FIGURES.items():
    ci = None
    if getattr(m, name) is not None and (compared or 'speedup' not in name):
      ci = bootstrap_ci(units, figure)
    setattr(m, f'{name}_ci95', ci)


def row_record(out, row: int, method: str = '', batch: int = 0) -> dict:
  """The numbers of row `row` of a GenerationOutput: tokens, per-iteration accepted and
  drafted counts, target calls and timings (the batch's)."""
  tokens = out.tokens[row]
  accepted = out.accepted[row] if out.accepted else []
  drafted = out.drafted[row] if out.drafted else []
  return {
    'method': method,
    'tokens': tokens,
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
    'untrusted': out.untrusted[row] if out.untrusted else 0,
    'draft_counts': out.draft_counts[row] if out.draft_counts else {},
    'latency_ms': 1e3 * (out.prefill_seconds + out.decode_seconds),
    'decode_tokens_per_second': out.decode_tokens_per_second,
  }


def record(prompt, ids, out, row: int, tokenizer, method: str, batch: int) -> dict:
  """One (method, prompt) record: row_record plus the prompt and the generated text."""
  rec = row_record(out, row, method, batch)
  text = {'id': prompt.id, 'category': prompt.category, 'prompt': prompt.text}
  text.update(output=tokenizer.decode(rec['tokens']), prompt_tokens=len(ids))
  return {'method': method, **text, **{k: v for k, v in rec.items() if k != 'method'}}


def summarize_output(out) -> Summary:
  """A Summary of one batch (all its rows), e.g. N paths of one prompt."""
  recs = [row_record(out, row) for row in range(len(out.tokens))]
  return summarize_method(recs, recs, out.compile_seconds)


@dataclasses.dataclass
class Summary:
  """One method's figures over a set of records (all prompts, or one category)."""

  gamma: int
  new_tokens: int
  drafted_tokens: int
  acceptance_rate: float | None  # accepted / drafted tokens
  alpha: float | None  # per-token acceptance probability (per_token_alpha)
  tokens_per_call: float
  decode_tokens_per_second: float
  tokens_per_second: float  # prefill included
  iteration_ms: float
  verified_fraction: float | None  # iterations that verified a draft
  prefill_ms: dict[str, float]
  latency_ms: dict[str, float]
  latency_ms_per_token: dict[str, float]
  zero_accept_fraction: float | None
  greedy_mismatches: int | None  # None: no autoregressive run to compare with
  switches: int
  compile_seconds: float | None = None  # overall only
  speedup: float | None = 1.0  # tokens_per_second over autoregressive decoding's
  decode_speedup: float | None = 1.0
  # With measured costs (specjax.control.cost_model):
  draft: str | None = None
  adaptive: bool | None = None
  tree: str | None = None  # a tree method's tree (the cost model then predicts nothing)
  c: float | None = None
  predicted_speedup: float | None = None
  time_split_ms: dict[str, float] | None = None
  # A multi-level drafter's levels as the run counted them (level_stats): the lower
  # level's hit rate and acceptance, and the upper model's steps per proposal, counted
  # beside what the cost model expects from those rates (cost_model.multilevel_steps).
  levels: dict[str, float] | None = None
  near_ties: int | None = None  # greedy mismatches that start at a near-tie
  # Per draft position i = 1..gamma (position_counts): iterations that drafted a token at
  # position i, those that accepted it, and their ratio (None where never drafted).
  proposed_by_position: list[int] | None = None
  accepted_by_position: list[int] | None = None
  acceptance_by_position: list[float | None] | None = None
  # 95% bootstrap intervals over prompts, [lo, hi] (confidence_intervals; None: no figure).
  speedup_ci95: list[float] | None = None
  decode_speedup_ci95: list[float] | None = None
  tokens_per_call_ci95: list[float] | None = None
  acceptance_rate_ci95: list[float] | None = None
  alpha_ci95: list[float] | None = None
  categories: dict[str, Summary] = dataclasses.field(default_factory=dict)

  def to_json(self) -> dict:
    out = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
    out['categories'] = {k: v.to_json() for k, v in self.categories.items()}
    return out

  @classmethod
  def from_json(cls, data: Mapping[str, Any]) -> Summary:
    fields = {f.name for f in dataclasses.fields(cls)}
    kwargs = {k: v for k, v in data.items() if k in fields}
    kwargs['categories'] = {k: cls.from_json(v) for k, v in data.get('categories', {}).items()}
    return cls(**kwargs)


def summarize_method(recs, baseline, compile_seconds: float | None = None) -> Summary:
  """A Summary of one method's records; `baseline` are autoregressive decoding's, aligned."""
  new = sum(r['new_tokens'] for r in recs)
  pairs = [(a, d) for r in recs for a, d in zip(r['accepted'], r['drafted']) if d > 0]
  drafted = sum(sum(r['drafted']) for r in recs)
  batches = {r['batch']: r for r in recs}.values()  # the decode loop's time is per batch
  decode_s = sum(r['decode_ms'] for r in batches) / 1e3
  tried = [a for a, _ in pairs]
  proposed, accepted = position_counts(recs)
  return Summary(
    gamma=recs[0]['gamma'],
    new_tokens=new,
    drafted_tokens=drafted,
    acceptance_rate=sum(sum(r['accepted']) for r in recs) / drafted if drafted else None,
    alpha=per_token_alpha(pairs),
    tokens_per_call=tokens_per_call(new, sum(r['target_calls'] for r in recs)),
    decode_tokens_per_second=(new - len(recs)) / max(decode_s, 1e-9),
    tokens_per_second=new / max(sum(r['latency_ms'] for r in batches) / 1e3, 1e-9),
    iteration_ms=1e3 * decode_s / max(sum(r['batch_steps'] for r in batches), 1),
    verified_fraction=(
      len(tried) / max(sum(len(r['drafted']) for r in recs), 1) if recs[0]['gamma'] else None
    ),
    prefill_ms=percentiles([r['prefill_ms'] for r in recs]),
    latency_ms=percentiles([r['latency_ms'] for r in recs]),
    latency_ms_per_token=percentiles([r['latency_ms'] / r['new_tokens'] for r in recs]),
    zero_accept_fraction=tried.count(0) / len(tried) if tried else None,
    greedy_mismatches=sum(r['tokens'] != b['tokens'] for r, b in zip(recs, baseline)),
    switches=sum(r['switches'] for r in batches),
    compile_seconds=compile_seconds,
    proposed_by_position=proposed,
    accepted_by_position=accepted,
    acceptance_by_position=[a / p if p else None for a, p in zip(accepted, proposed)],
  )


def predict(
  m: Summary, recs, costs: cost_model.Costs, gamma: int, adaptive: bool, plain_ms=None
) -> None:
  """Fills in the cost model's speedup and time split for a method (in place).

  Iterations are weighted as they ran: one that verified d drafts emits the tokens the
  per-position acceptance predicts (cost_model.position_acceptance) at cost draft(d) +
  verify(d); one that did not (a plain step of adaptive
  control, or a prompt lookup with no match) emits 1 token at cost 1 (plus the search,
  for a fixed-gamma lookup). The same units give the predicted split of an iteration's
  time into draft, verify, the loop's own work (Costs.overhead_ms) and the rest.

  Tokens an iteration kept past the end of its text (an EOS, or max_new_tokens) are not
  output: the predicted tokens are scaled by the fraction of kept tokens that were (the
  records' new tokens, less the prefill's one, over their iterations' accepted + 1). On
  HumanEval at 128 tokens counting them overstated the speedup by ~3%.

  `plain_ms`: the run's own plain iteration (autoregressive decoding's iteration_ms), the
  unit instead of the plain iteration timed before the run: every timed piece is scaled
  by their ratio. Timed before decoding, the target's step ran 4% slower than in the
  run's own loop on the Xeon of BENCHMARKS.md (20.11 against 19.33 ms), which put every
  prediction about that much too high.
  """
  alpha = m.alpha or 0.0
  scale = costs.plain_ms / plain_ms if plain_ms else 1.0  # timed units -> the run's
  table = {d: (dc * scale, vc * scale if d else vc) for d, (dc, vc) in costs.table().items()}
  levels = level_stats(recs, costs)
  m.levels = levels
  pairs = [(a, d) for r in recs for a, d in zip(r['accepted'], r['drafted']) if d > 0]
  accept = cost_model.position_acceptance(pairs, max(table))
  tokens = draft = verify = loop = 0.0  # in plain iterations (Costs.units)
  n = 0
  for r in recs:
    for d in r['drafted']:
      if d and d not in table:
        continue  # a tree's node count: trees have no chain cost (the model predicts chains)
      n += 1
      if d:
        dc, vc = table[d]
        if levels:  # a multi-level drafter: its steps at its levels' measured rates
          dc = scale * cost_model.multilevel_draft_units(
            costs, d, levels['hit'], levels['alpha_lower']
          )
        tokens += cost_model.expected_tokens_by_position(accept, d, alpha)
      else:
        dc, vc = (0.0 if adaptive else table[gamma][0]), 1.0
        tokens += 1
      draft += dc
      verify += vc
      loop += costs.loop_units(d) * scale  # (counted within vc)
  kept = sum(a + 1 for r in recs for a in r['accepted'])
  if kept:
    tokens *= min(1.0, sum(r['new_tokens'] - 1 for r in recs) / kept)
  per_iter = lambda units: units * (plain_ms or costs.plain_ms) / max(n, 1)
  m.c = costs.c
  m.predicted_speedup = float(cost_model.speedup(tokens, draft, verify)) if n else 0.0
  m.time_split_ms = {
    'draft': per_iter(draft),
    'verify': per_iter(verify - loop),
    'loop': per_iter(loop),
    'other': m.iteration_ms - per_iter(draft + verify),
  }


def level_stats(recs, costs: cost_model.Costs) -> dict[str, float] | None:
  """A multi-level drafter's counts over `recs` (their `draft_counts`, Drafter.counters):
  `hit`, the share of the upper model's steps after a proposal's first at which the lower
  level proposed (wide steps); `alpha_lower`, the share of the lower level's tokens the
  upper model kept, as a per-token rate (kept / (kept + rounds that rejected one)); the
  counted narrow and wide steps per proposal beside those the cost model expects at the
  run's gammas from the two rates. None unless the records and `costs` have them."""
  counts = [r.get('draft_counts') or {} for r in recs]
  steps_timed = {'first', 'narrow', 'wide'} <= set(costs.level_ms)
  if not costs.level_k or not steps_timed or not counts or not all('wide' in c for c in counts):
    return None
  # Steps are the batch's (every row of a batch holds the same): once per batch; tokens
  # per row. (At batch > 1 a row whose lookup found nothing in a round counts a rejection.)
  batches = {r['batch']: r['draft_counts'] for r in recs}.values()
  total = {k: sum(c[k] for c in batches) for k in ('first', 'narrow', 'wide')}
  total |= {k: sum(c[k] for c in counts) for k in ('lower_kept', 'lower_rejected')}
  steps = total['narrow'] + total['wide']
  trials = total['lower_kept'] + total['lower_rejected']
  hit = total['wide'] / steps if steps else 0.0
  alpha_lower = total['lower_kept'] / trials if trials else 0.0
  proposals = max(total['first'], 1)
  expected = [
    cost_model.multilevel_steps(d, costs.level_k, hit, alpha_lower)
    for r in recs
    for d in r['drafted']
    if d
  ]
  n = max(len(expected), 1)
  return {
    'hit': hit,
    'alpha_lower': alpha_lower,
    'k': costs.level_k,
    'narrow_per_proposal': total['narrow'] / proposals,
    'wide_per_proposal': total['wide'] / proposals,
    'expected_narrow_per_proposal': sum(e[0] for e in expected) / n,
    'expected_wide_per_proposal': sum(e[1] for e in expected) / n,
  }


def best_gamma_per_category(methods: Mapping[str, Summary], costs, categories, records=None):
  """Per draft and category: the cost model's best gamma from the category's per-position
  acceptance, pooled over the draft's chain methods (alpha when `records` is not given:
  {method: records} of the run)."""
  out = {}
  for spec, c in costs.items():
    out[spec] = {}
    table = c.table()
    for cat in ['all', *categories]:
      successes = trials = 0.0
      pairs = []
      for name, m in methods.items():
        sub = m if cat == 'all' else m.categories[cat]
        if name.startswith(spec + '@') and sub.alpha is not None:
          successes += sub.alpha * sub.drafted_tokens
          trials += sub.drafted_tokens
          for r in (records or {}).get(name, []):
            if cat in ('all', r['category']):
              pairs += [(a, d) for a, d in zip(r['accepted'], r['drafted']) if d > 0]
      if not trials:
        continue
      alpha = successes / trials
      if pairs:
        accept = cost_model.position_acceptance(pairs, max(table))
        best = (0, 1.0)
        for g, (draft, verify) in sorted(table.items()):
          s = cost_model.expected_tokens_by_position(accept, g, alpha) / (draft + verify)
          if g > 0 and s > best[1]:
            best = (g, float(s))
      else:
        best = cost_model.best_gamma(alpha, table)
      out[spec][cat] = {'alpha': alpha, 'gamma': best[0], 'predicted_speedup': best[1]}
  return out


def safe_ratio(a: float, b: float) -> float:
  """a / b, nan where b is 0 (e.g. no decode steps at max_new_tokens=1)."""
  return a / b if b else float('nan')


def summarize(records: Mapping[str, list[dict]], compile_seconds, plans=None, costs=None):
  """{method: Summary} overall and per category, speedups against 'autoregressive', each
  figure with its bootstrap interval over prompts (confidence_intervals).

  Without an 'autoregressive' method (the Python API's uncompared runs) speedups and
  greedy mismatches are None. `plans` maps a method name to its Method
  (specjax.decode.method); with measured `costs` (draft spec -> Costs) the cost model's
  prediction of a chain method is filled in too. Tree methods get no per-token alpha (a
  chain's notion).
  """
  costs, plans = costs or {}, plans or {}
  compared = 'autoregressive' in records
  first = records['autoregressive'] if compared else next(iter(records.values()))
  categories = sorted({r['category'] for r in first})
  out = {}
  plain_ms = None
  if compared:  # the run's own plain iteration: the cost model's unit (predict)
    plain_ms = summarize_method(first, first, compile_seconds['autoregressive']).iteration_ms
  for name, recs in records.items():
    baseline = first if compared else recs
    m = out[name] = summarize_method(recs, baseline, compile_seconds[name])
    plan = plans.get(name)
    tree = plan.name.rpartition('@')[2] if plan is not None and plan.tree_spec else None
    if tree:
      m.draft, m.tree, m.alpha = plan.draft, tree, None
    elif plan is not None and plan.draft in costs:
      m.draft, m.adaptive = plan.draft, plan.is_adaptive
      predict(m, recs, costs[plan.draft], plan.gamma, plan.is_adaptive, plain_ms)
    for cat in categories:
      pick = [i for i, r in enumerate(baseline) if r['category'] == cat]
      sub = summarize_method([recs[i] for i in pick], [baseline[i] for i in pick])
      if tree:
        sub.alpha = None
      elif plan is not None and plan.draft in costs:
        predict(
          sub, [recs[i] for i in pick], costs[plan.draft], plan.gamma, plan.is_adaptive, plain_ms
        )
        sub.c = sub.time_split_ms = sub.levels = None
      m.categories[cat] = sub
  if not compared:
    for m in out.values():
      for sub in (m, *m.categories.values()):
        sub.speedup = sub.decode_speedup = sub.greedy_mismatches = None
  else:
    base = out['autoregressive']
    for m in out.values():
      for sub, ref in [(m, base), *((m.categories[c], base.categories[c]) for c in categories)]:
        sub.speedup = safe_ratio(sub.tokens_per_second, ref.tokens_per_second)
        sub.decode_speedup = safe_ratio(sub.decode_tokens_per_second, ref.decode_tokens_per_second)
  for name, recs in records.items():
    baseline = first if compared else recs
    confidence_intervals(out[name], recs, baseline, compared)
    for cat in categories:
      pick = [i for i, r in enumerate(baseline) if r['category'] == cat]
      sub_recs, sub_base = [recs[i] for i in pick], [baseline[i] for i in pick]
      confidence_intervals(out[name].categories[cat], sub_recs, sub_base, compared)
  return out, categories


# What counts as a near-tie of the top two logits, per parameter dtype: an absolute gap
# in float32; in 16-bit formats a gap relative to the top logit (bfloat16 keeps 8
# significant bits, so a verify forward and a one-token step that round one hidden
# state differently move a logit by a few 2^-8 of its size).
NEAR_TIE = {'float32': (1e-4, 0.0), 'bfloat16': (0.0, 2.0**-6), 'float16': (0.0, 2.0**-9)}


def near_tie(top2, dtype) -> bool:
  """Are the two largest logits top2 = (second, first) a near-tie for parameters of `dtype`?"""
  absolute, relative = NEAR_TIE.get(np.dtype(dtype).name, NEAR_TIE['float32'])
  gap = float(top2[1] - top2[0])
  return gap < absolute or gap < relative * max(1.0, abs(float(top2[1])))


def count_near_ties(engine, encoded, recs, baseline, threshold: float | None = None) -> int:
  """How many greedy mismatches start at a near-tie of the target's top-2 logits: within
  `threshold`, or by default `near_tie` for the target's parameter dtype (NEAR_TIE).

  A multi-token verify forward rounds differently from a one-token step, so outputs may
  legitimately part at a near-tie; any other mismatch is a bug.
  """
  dtype = getattr(engine.params['embed'], 'dtype', np.float32)
  ties = 0
  for ids, r, b in zip(encoded, recs, baseline):
    if r['tokens'] == b['tokens']:
      continue
    first = next(
      (i for i, (x, y) in enumerate(zip(r['tokens'], b['tokens'])) if x != y),
      min(len(r['tokens']), len(b['tokens'])),
    )
    top2 = np.sort(engine.next_logits(list(ids) + b['tokens'][:first]))[-2:]
    ties += bool(top2[1] - top2[0] < threshold) if threshold is not None else near_tie(top2, dtype)
  return ties
