"""Greedy verification: keep draft tokens while each is the target's argmax."""

from __future__ import annotations

import jax
import jax.numpy as jnp

from specjax.core.sampling import argmax
from specjax.verify import common


def greedy_plan(p: jax.Array, q: jax.Array, draft: jax.Array) -> common.Plan:
  del q  # the draft's distribution does not matter to a greedy target
  k = draft.shape[-1]
  top = argmax(p)  # [B, K+1]
  keep = (draft == top[:, :k]).astype(p.dtype)
  residuals = jax.nn.one_hot(top, p.shape[-1], dtype=p.dtype)
  return common.Plan(thresholds=keep, residuals=residuals, rule='first_failure')


def greedy_verify(p, q, draft, key) -> tuple[jax.Array, jax.Array]:
  """Deterministic: (number of leading draft tokens equal to the argmax, next argmax)."""
  del key
  k = draft.shape[-1]
  top = argmax(p)  # [B, K+1]
  accepted = jnp.sum(jnp.cumprod((draft == top[:, :k]).astype(jnp.int32), -1), -1)
  return accepted, jnp.take_along_axis(top, accepted[:, None], axis=1)[:, 0]


VERIFIER = common.Verifier('greedy', greedy_verify, greedy_plan, greedy_only=True)
