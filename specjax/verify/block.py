"""Block verification (Sun et al., "Block Verification Accelerates Speculative Decoding",
ICLR 2025): the drafted block is judged jointly rather than token by token.

Along the block a weight w_i is carried, w_0 = 1 and
    w_i = min(1, w_{i-1} * p_{i-1}(x_{i-1}) / q_{i-1}(x_{i-1})),
the (capped) likelihood ratio of the first i draft tokens. Keeping exactly i tokens
(0 < i < K) is allowed with probability
    h_i = S_i / (S_i + 1 - w_i),   S_i = sum_x max(0, w_i p_i(x) - q_i(x)),
and h_K = w_K. The number kept is the LAST i whose uniform draw falls below h_i (0 if
none), and the next token comes from the normalised max(0, w_i p_i - q_i), or from p_K
after the whole block. The output is distributed exactly as the target's, and the
expected number kept is never below token-level verification's.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from specjax.verify import common


def block_plan(p: jax.Array, q: jax.Array, draft: jax.Array) -> common.Plan:
  k = draft.shape[-1]
  # From the first untrusted position j on (common.untrusted), the block is verified as
  # a block of j tokens: h_j = w_j, nothing kept past j, the next token from p_j.
  q, bad = common.trusted(q, draft)
  cut = jnp.argmax(jnp.concatenate([bad, jnp.ones_like(bad[:, :1])], -1), -1)  # [B]: j or K
  step = common.ratio(
    common.draft_token_probs(p[:, :k], draft), common.draft_token_probs(q, draft)
  )  # [B, K]

  def carry_weight(w, r):
    w = jnp.minimum(1.0, w * r)
    return w, w

  _, w = jax.lax.scan(carry_weight, jnp.ones(step.shape[:1], p.dtype), step.T)
  w = jnp.concatenate([jnp.ones_like(w[:1]), w], axis=0).T  # [B, K+1]: w_0 .. w_K
  q_ext = jnp.concatenate([q, jnp.zeros_like(p[:, :1])], axis=1)
  excess = jnp.maximum(w[..., None] * p - q_ext, 0.0)  # [B, K+1, V]
  mass = jnp.sum(excess, -1)  # S_i
  denom = mass + 1.0 - w
  h = jnp.where(denom > common.TINY, mass / jnp.maximum(denom, common.TINY), 0.0)
  thresholds = jnp.concatenate([h[:, 1:k], w[:, k:]], axis=1)  # h_1..h_{K-1}, h_K = w_K
  residuals = jnp.concatenate([common.normalise_or(excess[:, :k], p[:, :k]), p[:, k:]], axis=1)
  i = jnp.arange(1, k + 1)
  thresholds = jnp.where(
    i < cut[:, None], thresholds, jnp.where(i == cut[:, None], w[:, 1:], 0.0)
  )  # fmt: skip
  at_cut = jnp.arange(k + 1) == cut[:, None]
  residuals = jnp.where(at_cut[..., None], p, residuals)
  return common.Plan(thresholds=thresholds, residuals=residuals, rule='last_success')


def block_verify(p, q, draft, key) -> tuple[jax.Array, jax.Array]:
  return common.run_plan(block_plan(p, q, draft), key)


VERIFIER = common.Verifier('block', block_verify, block_plan)
