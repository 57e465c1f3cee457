"""What verifiers share: the Plan, its exact stopping distribution, and its sampler."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import jax
import jax.numpy as jnp
from flax import struct

from specjax.core import sampling as sampling_lib

TINY = 1e-12


@dataclasses.dataclass(frozen=True)
class Verifier:
  """A verifier as the registry knows it: the jitted function and its deterministic plan.

  verify(p[B, K+1, V], q[B, K, V], draft[B, K], key) -> (accepted[B], next_token[B]);
  plan(p, q, draft) -> Plan. `greedy_only`: lossless only for greedy decoding.
  """

  name: str
  verify: Callable[..., tuple[jax.Array, jax.Array]]
  plan: Callable[..., Plan]
  greedy_only: bool = False


@struct.dataclass
class Plan:
  """A verifier's decision rule for one drafted block.

  thresholds[B, K]: the probability attached to each draft position;
  residuals[B, K+1, V]: the next token's distribution if `k` draft tokens are kept;
  rule (static): 'first_failure' keeps draft tokens until the first position whose
    uniform draw exceeds its threshold (token-level verification); 'last_success' keeps
    up to the last position whose draw is below its threshold (block verification).
  """

  thresholds: jax.Array
  residuals: jax.Array
  rule: str = struct.field(pytree_node=False, default='first_failure')


def stop_distribution(plan: Plan) -> jax.Array:
  """Exact P(accepted = k) for k = 0..K, [B, K+1], from independent uniform draws."""
  h = plan.thresholds
  ones = jnp.ones(h.shape[:-1] + (1,), h.dtype)
  if plan.rule == 'first_failure':
    survive = jnp.cumprod(jnp.concatenate([ones, h], -1), -1)  # P(first k accepted)
    fail = jnp.concatenate([1 - h, ones], -1)
    return survive * fail
  # last_success: k is chosen when draw k succeeds and every later draw fails (k=0: all fail).
  later_fail = jnp.cumprod(jnp.concatenate([ones, (1 - h)[..., ::-1]], -1), -1)[..., ::-1]
  return jnp.concatenate([ones, h], -1) * later_fail


def sample_stop(plan: Plan, key: jax.Array) -> jax.Array:
  """Draws the number of kept draft tokens [B] with the law of `stop_distribution`."""
  h = plan.thresholds
  u = jax.random.uniform(key, h.shape, h.dtype)
  ok = u < h
  if plan.rule == 'first_failure':
    return jnp.sum(jnp.cumprod(ok.astype(jnp.int32), -1), -1)
  positions = jnp.arange(1, h.shape[-1] + 1)
  return jnp.max(jnp.where(ok, positions, 0), -1).astype(jnp.int32)


def normalise_or(residual: jax.Array, fallback: jax.Array) -> jax.Array:
  """residual / its sum, or `fallback` where the residual has (numerically) no mass."""
  total = jnp.sum(residual, -1, keepdims=True)
  return jnp.where(total > TINY, residual / jnp.maximum(total, TINY), fallback)


def untrusted(q: jax.Array, tokens: jax.Array) -> jax.Array:
  """[B, K] True where the draft's distribution q[B, K, V] cannot be the one its token
  tokens[B, K] was drawn from: a non-finite or negative entry, a total that overflows
  float32, or the proposed token at probability 0 (a draft sampling from q never proposes one).

  Verifiers reject such a position outright and draw from the target's own distribution
  there, so a broken draft (a diverged head) costs speed, never exactness; a draft whose
  tokens are samples of q is never affected.
  """
  finite = jnp.all(jnp.isfinite(q) & (q >= 0), axis=-1)
  safe = jnp.where(finite[..., None], q, 0)
  # Finite entries whose total overflows (exp of logits without the divide) would
  # normalise to all zeros, a ratio of inf: accepted every time.
  total = jnp.sum(safe.astype(jnp.float32), axis=-1)
  at = draft_token_probs(safe, tokens)
  return ~finite | ~jnp.isfinite(total) | ~(at > 0)


def trusted(q: jax.Array, tokens: jax.Array) -> tuple[jax.Array, jax.Array]:
  """(q normalised to sum 1 per position, zero where `untrusted`; that mask [B, K]).

  Samplers draw in proportion to q, so a row that sums to other than 1 (a draft's float
  rounding, or a missing softmax) is its normalised self.
  """
  bad = untrusted(q, tokens)
  safe = jnp.where(bad[..., None], 0.0, q)
  total = jnp.sum(safe.astype(jnp.float32), -1, keepdims=True).astype(q.dtype)
  return jnp.where(bad[..., None], 0.0, safe / jnp.where(bad[..., None], 1.0, total)), bad


def ratio(p: jax.Array, q: jax.Array) -> jax.Array:
  """p / q with q = 0 read as an unbounded ratio where p > 0 and as 0 where p = 0."""
  return jnp.where(q > 0, p / jnp.where(q > 0, q, 1.0), jnp.where(p > 0, jnp.inf, 0.0))


def sample_next(plan: Plan, accepted: jax.Array, key: jax.Array) -> jax.Array:
  """Draws the token that follows the kept draft tokens from the plan's residual."""
  dist = jnp.take_along_axis(plan.residuals, accepted[:, None, None], axis=1)[:, 0]  # [B, V]
  return sampling_lib.sample_probs(dist, key)


def run_plan(plan: Plan, key: jax.Array) -> tuple[jax.Array, jax.Array]:
  k_stop, k_next = jax.random.split(key)
  accepted = sample_stop(plan, k_stop)
  return accepted, sample_next(plan, accepted, k_next)


def draft_token_probs(dist: jax.Array, tokens: jax.Array) -> jax.Array:
  """dist[B, K, V] evaluated at tokens[B, K] -> [B, K]."""
  return jnp.take_along_axis(dist, tokens[..., None], axis=-1)[..., 0]
