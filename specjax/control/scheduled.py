"""Confidence-scheduled verification (DSpark, DeepSeek 2026): how many drafted tokens to
verify, chosen every iteration from the drafter's own confidences instead of from the
acceptance seen so far.

A drafter with a confidence head (drafters/dspark.py) says, per drafted position i, the
probability c_i that the target accepts it given that it accepted the ones before. Then
verifying the first g positions emits, in expectation,

    E_g = 1 + sum_{k <= g} prod_{j <= k} c_j        (E_0 = 1: a plain step)

tokens, at a cost of draft(g) + verify(g) target steps (the adaptive config's measured
costs; a block drafter's draft cost hardly depends on g). The loop's verification widths
are static (the adaptive arms: off and each gamma), and a batch verifies one width, so
the schedule picks the arm with the most expected tokens over the batch's live rows per
unit cost: a shared verification budget. A row whose drafter is sure gets its long chain
verified when the batch can afford it; an unsure batch runs plain steps.
"""

from __future__ import annotations

import jax.numpy as jnp


def expected_tokens(conf: jnp.ndarray, gammas) -> jnp.ndarray:
  """conf [B, D] -> expected tokens [B, 1 + len(gammas)] of off and each gamma <= D."""
  reach = jnp.cumsum(jnp.cumprod(conf.astype(jnp.float32), axis=-1), axis=-1)  # [B, D]
  chains = 1.0 + reach[:, jnp.asarray(gammas) - 1]
  return jnp.concatenate([jnp.ones_like(chains[:, :1]), chains], axis=-1)


def choose(config, conf: jnp.ndarray, done: jnp.ndarray) -> jnp.ndarray:
  """The arm (0: off, i: config.gammas[i - 1]) with the most expected tokens over the
  live rows per unit of its cost (config.costs, target steps)."""
  tokens = jnp.where(done[:, None], 0.0, expected_tokens(conf, config.gammas))
  rate = jnp.sum(tokens, axis=0) / jnp.asarray(config.costs, jnp.float32)
  return jnp.argmax(rate).astype(jnp.int32)
