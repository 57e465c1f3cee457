"""The speculative decoding cost model (Leviathan et al. 2023), in plain-step units.

With per-token acceptance alpha (each draft token accepted independently with
probability alpha, so the first rejection ends the run), one iteration of gamma draft
tokens emits on average

    E(alpha, gamma) = (1 - alpha^(gamma + 1)) / (1 - alpha)

tokens (the verifier always adds one). It costs the draft's gamma proposals plus one
(gamma + 1)-token target forward. Measured in units of one plain target step:

    cost(gamma) = draft(gamma) + verify(gamma),  with draft(gamma) ~= gamma * c,

so the predicted speedup over autoregressive decoding (one token per unit cost) is
E / cost. Where the loop's own work in an iteration was measured (`Costs.overhead_ms`: the
verifier, the commit, the drafter's update), the unit is a plain iteration (the target's
step and its overhead) and each speculative iteration's overhead is counted with its
verification (3.4-4.7 ms of a 67-70 ms quantized@8 iteration on BENCHMARKS.md's Xeon). Plain
decoding is gamma = 0: E = 1, cost = 1. Everything here works elementwise on NumPy arrays;
the jitted controller (`specjax/control/adaptive.py`) calls the same functions with
xp=jax.numpy, and layer-skip calibration with simulated tokens per call. `Costs` holds the
measured pieces (specjax/bench/costs.py measures them).
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Mapping

import numpy as np


@dataclasses.dataclass(frozen=True)
class Costs:
  """Milliseconds per piece, measured at one batch size and cache size."""

  batch: int
  cache_size: int
  target_ms: float  # one plain step: a 1-token target forward per row
  draft_ms: dict[int, float]  # gamma -> proposing gamma tokens
  verify_ms: dict[int, float]  # gamma -> one (gamma + 1)-token target forward
  # Static trees by TreeShape.text -> (ms proposing it, ms of its (N + 1)-token forward).
  tree_ms: dict[str, tuple[float, float]] = dataclasses.field(default_factory=dict)
  # gamma -> ms of the loop's own work in an iteration beyond the proposal and the target's
  # forward (verifier, commit, the drafter's update, the loop's dispatch); 0: a plain
  # step's beyond its forward. Empty where not measured (then taken as 0).
  overhead_ms: dict[int, float] = dataclasses.field(default_factory=dict)
  # A multi-level drafter's steps ('first', 'narrow', 'wide': drafters/multilevel.py) ->
  # ms, and its lower level's tokens per round; empty and 0 for other drafts.
  level_ms: dict[str, float] = dataclasses.field(default_factory=dict)
  level_k: int = 0

  @property
  def plain_ms(self) -> float:
    """One plain iteration of the loop: the target's step and its own overhead (the unit)."""
    return self.target_ms + self.overhead_ms.get(0, 0.0)

  def loop_units(self, gamma: int | None) -> float:
    """The loop's own work in an iteration of gamma, in plain-iteration units (None, a
    tree's: taken as the largest chain's)."""
    if gamma == 0:
      return self.overhead_ms.get(0, 0.0) / self.plain_ms
    chains = [g for g in self.overhead_ms if g]
    ms = self.overhead_ms.get(gamma, self.overhead_ms[max(chains)] if chains else 0.0)
    return ms / self.plain_ms

  def units(self, gamma: int) -> tuple[float, float]:
    """(draft cost, verify cost) of gamma in units of a plain iteration; the verify cost
    includes the loop's own work (loop_units)."""
    if gamma == 0:
      return 0.0, 1.0
    verify = self.verify_ms[gamma] / self.plain_ms + self.loop_units(gamma)
    return self.draft_ms[gamma] / self.plain_ms, verify

  def tree_units(self, shape) -> tuple[float, float]:
    """(draft cost, verify cost) of a static tree (a TreeShape) in plain-iteration units."""
    if shape.text not in self.tree_ms:
      raise ValueError(
        f'no measured cost for the tree {shape.text!r} ({shape.describe()}); measured: '
        f'{sorted(self.tree_ms) or "none"}'
      )
    draft, verify = self.tree_ms[shape.text]
    return draft / self.plain_ms, verify / self.plain_ms + self.loop_units(None)

  def table(self) -> dict[int, tuple[float, float]]:
    return {0: (0.0, 1.0), **{g: self.units(g) for g in sorted(self.draft_ms)}}

  @property
  def c(self) -> float:
    """Draft cost per drafted token over the target step's, at the largest gamma measured."""
    g = max(self.draft_ms)
    return self.draft_ms[g] / g / self.target_ms

  @classmethod
  def from_json(cls, data: dict) -> Costs:
    """The inverse of to_json (batch 1 and cache size 0 where a hand-written entry has none)."""
    return cls(
      batch=data.get('batch', 1),
      cache_size=data.get('cache_size', 0),
      target_ms=data['target_ms'],
      draft_ms={int(g): v for g, v in data['draft_ms'].items()},
      verify_ms={int(g): v for g, v in data['verify_ms'].items()},
      tree_ms={k: tuple(v) for k, v in data.get('tree_ms', {}).items()},
      overhead_ms={int(g): v for g, v in data.get('overhead_ms', {}).items()},
      level_ms=dict(data.get('level_ms', {})),
      level_k=int(data.get('level_k', 0)),
    )

  def to_json(self) -> dict:
    return {
      'batch': self.batch,
      'cache_size': self.cache_size,
      'target_ms': self.target_ms,
      'draft_ms': {str(g): v for g, v in self.draft_ms.items()},
      'verify_ms': {str(g): v for g, v in self.verify_ms.items()},
      'tree_ms': {k: list(v) for k, v in self.tree_ms.items()},
      'overhead_ms': {str(g): v for g, v in self.overhead_ms.items()},
      'level_ms': dict(self.level_ms),
      'level_k': self.level_k,
      'c': self.c,
    }


def expected_tokens(alpha, gamma, xp=np):
  """Mean tokens emitted per iteration: (1 - alpha^(gamma+1)) / (1 - alpha).

  Elementwise over arrays; `xp` is the array module (jax.numpy inside jitted code).
  """
  alpha = xp.clip(xp.asarray(alpha, xp.float64 if xp is np else xp.float32), 0.0, 1.0)
  gamma = xp.asarray(gamma)
  near_one = alpha >= 1 - 1e-6
  safe = xp.where(near_one, 0.5, alpha)
  return xp.where(near_one, gamma + 1.0, (1 - safe ** (gamma + 1)) / (1 - safe))


def position_acceptance(pairs, max_gamma: int) -> np.ndarray:
  """Per-position acceptance [max_gamma] from (accepted, drafted) per iteration.

  a_k = P(draft token k accepted | tokens 1..k-1 were, and token k was drafted): the
  product-limit estimate of the run of accepted tokens, with no assumption on its shape
  (prompt lookup's runs are bimodal: a copied span is kept whole, a miss fails at once,
  which a single geometric alpha turns into the wrong mean). nan where never tried.
  """
  pairs = np.asarray(list(pairs), np.int64).reshape(-1, 2)
  k = np.arange(1, max_gamma + 1)[None]
  acc, drafted = pairs[:, :1], pairs[:, 1:]
  trials = np.sum((drafted >= k) & (acc >= k - 1), axis=0)
  kept = np.sum((drafted >= k) & (acc >= k), axis=0)
  return np.where(trials > 0, kept / np.maximum(trials, 1), np.nan)


def expected_tokens_by_position(accept, gamma: int, fallback: float = 0.0) -> float:
  """Mean tokens emitted per iteration of `gamma` draft tokens, 1 + sum_k prod_{j<=k} a_j,
  from per-position acceptance `accept` (position_acceptance); positions past its end or
  never tried take the last measured one (`fallback` if none was)."""
  accept = np.asarray(accept, np.float64)
  known = accept[~np.isnan(accept)]
  last = float(known[-1]) if known.size else fallback
  a = np.array(
    [accept[i] if i < accept.size and not np.isnan(accept[i]) else last for i in range(gamma)]
  )
  return float(1.0 + np.sum(np.cumprod(a)))


def rank_acceptance(shape, stops, max_rank: int | None = None) -> tuple[np.ndarray, np.ndarray]:
  """(accept[D, R], trials[D, R]) from tree iterations with a static `shape` (TreeShape).

  `stops` are the nodes those iterations stopped at (0: the root). A stop means every
  node on its path was accepted and all of the stopping node's children rejected, so each
  node visited is a trial of every child rank it has: accept[d, r] = P(the child of rank
  r is the one accepted | its parent at depth d was reached and has one). For a greedy
  target these are the chances that the target's token is the draft's r-th best: the
  depth/rank model of Sequoia (Chen et al. 2024). nan where never tried.
  """
  ranks = max_rank or 1 + max(shape.ranks)
  kids = {}
  for p in shape.paths:
    kids[p[:-1]] = max(kids.get(p[:-1], 0), p[-1] + 1)
  hits = np.zeros((shape.depth, ranks))
  trials = np.zeros((shape.depth, ranks))
  for stop in stops:
    path = shape.paths[stop - 1] if stop > 0 else ()
    for d in range(min(len(path) + 1, shape.depth)):  # the nodes visited, root first
      trials[d, : min(kids.get(path[:d], 0), ranks)] += 1
      if d < len(path):
        hits[d, path[d]] += 1
  with np.errstate(invalid='ignore', divide='ignore'):
    return np.where(trials > 0, hits / trials, np.nan), trials


def fill_acceptance(accept: np.ndarray) -> np.ndarray:
  """accept[D, R] with untried cells filled: from the depth above (or 0 for a rank never
  tried at any depth), then made non-increasing along ranks (the builder's assumption)."""
  a = np.array(accept, np.float64)
  for d in range(a.shape[0]):
    for r in range(a.shape[1]):
      if np.isnan(a[d, r]):
        a[d, r] = a[d - 1, r] if d > 0 and not np.isnan(a[d - 1, r]) else 0.0
  return np.minimum.accumulate(np.clip(a, 0.0, 1.0), axis=1)


def tree_speedup(shape, accept, draft_cost: float, verify_cost: float) -> float:
  """Predicted speedup of a static tree: (expected accepted + 1) / its cost in steps."""
  return (shape.expected_accepted(accept) + 1.0) / (draft_cost + verify_cost)


def greedy_calls(agree, gamma: int) -> int:
  """Target calls of greedy speculation at draft length `gamma` along one text whose
  draft-target agreement per position is `agree`: each call accepts the agreeing run of up
  to gamma drafted tokens and adds the target's own token."""
  n, t, calls = len(agree), 0, 0
  while t < n:
    run = 0
    while run < gamma and t + run < n and agree[t + run]:
      run += 1
    t += run + 1
    calls += 1
  return calls


def speedup(tokens, draft_cost, verify_cost):
  """Tokens per iteration over its cost in plain steps (Costs.units): the one speedup formula."""
  return tokens / (draft_cost + verify_cost)


def alpha_from_tokens_per_call(tokens_per_call: float, gamma: int) -> float:
  """Inverts E(alpha, gamma) = tokens_per_call for alpha (bisection; E is increasing)."""
  if gamma <= 0:
    return 0.0
  target = float(np.clip(tokens_per_call, 1.0, gamma + 1.0))
  lo, hi = 0.0, 1.0
  for _ in range(60):
    mid = (lo + hi) / 2
    lo, hi = (mid, hi) if expected_tokens(mid, gamma) < target else (lo, mid)
  return (lo + hi) / 2


def predicted_speedup(
  alpha, gamma: int, draft_cost: float, verify_cost: float, verified_fraction: float = 1.0
):
  """E(alpha, gamma) / (draft_cost + verify_cost), both in plain-step units (Costs.units).

  `verified_fraction` < 1 models drafters that skip verification when they have
  nothing to propose (prompt lookup): those iterations are plain steps (one token at
  the cost of the draft's search plus one target step).
  """
  if gamma == 0:
    return np.ones_like(np.asarray(alpha, np.float64))
  f = verified_fraction
  tokens = f * expected_tokens(alpha, gamma) + (1 - f)
  return speedup(tokens, draft_cost, f * verify_cost + (1 - f) * 1.0)


def best_gamma(alpha: float, costs: Mapping[int, tuple[float, float]]) -> tuple[int, float]:
  """(gamma, predicted speedup) maximising the prediction; costs[g] = (draft, verify).

  gamma 0 (plain decoding, speedup 1) is always a candidate, so a draft that does not
  pay gets 0.
  """
  best = (0, 1.0)
  for g, (draft, verify) in sorted(costs.items()):
    s = float(predicted_speedup(alpha, g, draft, verify))
    if g > 0 and s > best[1]:
      best = (g, s)
  return best


def break_even_alpha(gamma: int, draft_cost: float, verify_cost: float) -> float:
  """The acceptance rate at which speculation with gamma exactly matches plain decoding."""
  lo, hi = 0.0, 1.0
  if predicted_speedup(1.0, gamma, draft_cost, verify_cost) < 1:
    return float('nan')  # never pays, even with every draft token accepted
  for _ in range(60):
    mid = (lo + hi) / 2
    lo, hi = (mid, hi) if predicted_speedup(mid, gamma, draft_cost, verify_cost) < 1 else (lo, mid)
  return (lo + hi) / 2


def multilevel_rounds(alpha: float, k: int, gamma: int) -> float:
  """Expected rounds (upper-model forwards of k + 1 rows) a multi-level drafter
  (specjax/drafters/multilevel.py) runs after its first step (one token) to draft gamma
  tokens, when the lower level always proposes and the upper model keeps each of its k
  tokens with probability `alpha` until its first rejection (kept j < k with probability
  alpha^j (1 - alpha), all k with alpha^k), adding one token of its own each round: between
  ceil((gamma - 1) / (k + 1)) (alpha 1) and gamma - 1 (0)."""
  kept = [alpha**j * (1 - alpha) for j in range(k)] + [alpha**k]
  rounds = np.zeros(gamma + k + 2)  # from `filled` tokens on; 0 once gamma are drafted
  for filled in range(gamma - 1, 0, -1):
    rounds[filled] = 1 + sum(p * rounds[filled + j + 1] for j, p in enumerate(kept))
  return float(rounds[1])


@functools.cache  # a run's records ask for the same few gammas at the same two rates
def multilevel_steps(gamma: int, k: int, hit: float, alpha_lower: float) -> tuple[float, float]:
  """(expected narrow steps, expected wide steps) of a multi-level drafter's proposal of
  gamma tokens after its first step (drafters/multilevel.py): at each step the lower level
  proposes k tokens with probability `hit` (a wide step: the upper model keeps j < k of
  them with probability alpha_lower^j (1 - alpha_lower), all k with alpha_lower^k, and adds
  one of its own) or finds none (a narrow step: one token). multilevel_rounds is hit = 1."""
  a = min(max(alpha_lower, 0.0), 1.0)
  kept = [a**j * (1 - a) for j in range(k)] + [a**k]
  narrow = np.zeros(gamma + k + 2)  # from `filled` tokens on; 0 once gamma are drafted
  wide = np.zeros(gamma + k + 2)
  for filled in range(gamma - 1, 0, -1):
    ahead = [filled + j + 1 for j in range(k + 1)]
    narrow[filled] = (1 - hit) * (1 + narrow[filled + 1]) + hit * sum(
      p * narrow[f] for p, f in zip(kept, ahead)
    )
    wide[filled] = (1 - hit) * wide[filled + 1] + hit * (
      1 + sum(p * wide[f] for p, f in zip(kept, ahead))
    )
  return float(narrow[1]), float(wide[1])


def multilevel_draft_units(
  costs: Costs, gamma: int, hit: float, alpha_lower: float
) -> float | None:
  """A multi-level drafter's proposal of gamma tokens in plain-iteration units, from its
  measured steps (Costs.level_ms) and its lower level's measured `hit` rate and
  acceptance (multilevel_steps): its first step (the whole proposal at gamma 1 where
  timed: the lower level's opening lookup included) and the expected narrow and wide
  steps after it. None without measured steps."""
  ms = costs.level_ms
  if not {'first', 'narrow', 'wide'} <= set(ms) or costs.level_k < 1:
    return None
  first = costs.draft_ms.get(1, ms['first'])
  narrow, wide = multilevel_steps(gamma, costs.level_k, hit, alpha_lower)
  return (first + narrow * ms['narrow'] + wide * ms['wide']) / costs.plain_ms


def multilevel_speedup(
  alpha: float,
  gamma: int,
  alpha_lower: float,
  k: int,
  first_cost: float,
  round_cost: float,
  verify_cost: float,
) -> float:
  """Predicted speedup of a multi-level drafter at gamma: the target keeps each drafted
  token with probability `alpha` (as with the upper model alone: the proposals are its
  exact samples), and drafting costs a first step (`first_cost` target steps: the upper
  model's two-row forward) and multilevel_rounds(alpha_lower, k, gamma) rounds of
  `round_cost` target steps each (the upper model's k + 1-row forward and the lower
  level's k tokens)."""
  draft = first_cost + multilevel_rounds(alpha_lower, k, gamma) * round_cost
  return float(speedup(expected_tokens(alpha, gamma), draft, verify_cost))
