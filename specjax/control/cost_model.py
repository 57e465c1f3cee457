"""The speculative decoding cost model (Leviathan et al. 2023), in target-step units.

With per-token acceptance alpha (each draft token accepted independently with
probability alpha, so the first rejection ends the run), one iteration of gamma draft
tokens emits on average

    E(alpha, gamma) = (1 - alpha^(gamma + 1)) / (1 - alpha)

tokens (the verifier always adds one). It costs the draft's gamma proposals plus one
(gamma + 1)-token target forward. Measured in units of one plain target step:

    cost(gamma) = draft(gamma) + verify(gamma),  with draft(gamma) ~= gamma * c,

so the predicted speedup over autoregressive decoding (one token per unit cost) is
E / cost. Plain decoding is gamma = 0: E = 1, cost = 1. Everything here is plain
Python / NumPy and works elementwise on arrays; the jitted controller has its own jnp
copy of the same two formulas (`specjax/control/adaptive.py`).
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np


def expected_tokens(alpha, gamma):
  """Mean tokens emitted per iteration: (1 - alpha^(gamma+1)) / (1 - alpha)."""
  alpha = np.clip(np.asarray(alpha, np.float64), 0.0, 1.0)
  gamma = np.asarray(gamma)
  near_one = alpha > 1 - 1e-9
  safe = np.where(near_one, 0.5, alpha)
  return np.where(near_one, gamma + 1.0, (1 - safe ** (gamma + 1)) / (1 - safe))


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
  """E(alpha, gamma) / (draft_cost + verify_cost), both in target-step units.

  `verified_fraction` < 1 models drafters that skip verification when they have
  nothing to propose (prompt lookup): those iterations are plain steps (one token at
  the cost of the draft's search plus one target step).
  """
  if gamma == 0:
    return np.ones_like(np.asarray(alpha, np.float64))
  f = verified_fraction
  tokens = f * expected_tokens(alpha, gamma) + (1 - f)
  cost = draft_cost + f * verify_cost + (1 - f) * 1.0
  return tokens / cost


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
