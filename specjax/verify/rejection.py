"""Token-level speculative sampling (Leviathan et al. 2023; Chen et al. 2023).

Draft token x_i is kept with probability min(1, p_i(x_i) / q_i(x_i)); at the first
rejection the next token is drawn from the normalised max(0, p_i - q_i); when all K are
kept, a bonus token is drawn from p_K.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from specjax.verify import common


def rejection_plan(p: jax.Array, q: jax.Array, draft: jax.Array) -> common.Plan:
  k = draft.shape[-1]
  # An untrusted position (common.untrusted) is rejected, its residual p itself.
  q, bad = common.trusted(q, draft)
  accept = jnp.minimum(
    1.0, common.ratio(common.draft_token_probs(p[:, :k], draft), common.draft_token_probs(q, draft))
  )
  accept = jnp.where(bad, 0.0, accept)
  q_ext = jnp.concatenate([q, jnp.zeros_like(p[:, :1])], axis=1)  # nothing to subtract at K
  residuals = common.normalise_or(jnp.maximum(p - q_ext, 0.0), p)
  return common.Plan(thresholds=accept, residuals=residuals, rule='first_failure')


def rejection_verify(p, q, draft, key) -> tuple[jax.Array, jax.Array]:
  return common.run_plan(rejection_plan(p, q, draft), key)


VERIFIER = common.Verifier('rejection', rejection_verify, rejection_plan)
