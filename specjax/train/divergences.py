"""Divergences between a teacher distribution p and a student's logits, per position.

DistillSpec (Zhou et al., ICLR 2024) trains the draft q to match the target p under a
chosen divergence; which one works best depends on the decoding strategy:

  forward_kl  KL(p || q) = sum p (log p - log q)      mass-covering; plain distillation
  reverse_kl  KL(q || p) = sum q (log q - log p)      mode-seeking; needs p > 0 (smoothed)
  jsd         (KL(p || m) + KL(q || m)) / 2, m = (p + q) / 2   bounded by log 2
  tvd         sum |p - q| / 2 = 1 - sum min(p, q)     one minus the acceptance rate of
                                                      token-level rejection sampling

Every function takes p [..., V] (probabilities; rows may hold zeros) and student logits
[..., V], and returns [...]. Pure jnp, differentiable in the logits. The registry
(specjax/registry.py DIVERGENCES) names them.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

# Reverse KL is infinite where q > 0 = p; a teacher known only on its top-k tokens is
# mixed with this much of the uniform distribution first.
REVERSE_KL_SMOOTHING = 1e-4


def _xlogy_ratio(a: jax.Array, log_a: jax.Array, log_b: jax.Array) -> jax.Array:
  """sum a (log a - log b) over the last axis, with 0 log 0 = 0."""
  return jnp.sum(jnp.where(a > 0, a * (log_a - log_b), 0.0), axis=-1)


def forward_kl(p: jax.Array, logits: jax.Array) -> jax.Array:
  log_q = jax.nn.log_softmax(logits.astype(jnp.float32), axis=-1)
  log_p = jnp.log(jnp.where(p > 0, p, 1.0))
  return _xlogy_ratio(p, log_p, log_q)


def reverse_kl(
  p: jax.Array, logits: jax.Array, smoothing: float = REVERSE_KL_SMOOTHING
) -> jax.Array:
  log_q = jax.nn.log_softmax(logits.astype(jnp.float32), axis=-1)
  p = (1 - smoothing) * p + smoothing / p.shape[-1]
  return jnp.sum(jnp.exp(log_q) * (log_q - jnp.log(p)), axis=-1)


def jsd(p: jax.Array, logits: jax.Array) -> jax.Array:
  log_q = jax.nn.log_softmax(logits.astype(jnp.float32), axis=-1)
  q = jnp.exp(log_q)
  m = 0.5 * (p + q)
  log_m = jnp.log(jnp.where(m > 0, m, 1.0))
  log_p = jnp.log(jnp.where(p > 0, p, 1.0))
  return 0.5 * (_xlogy_ratio(p, log_p, log_m) + _xlogy_ratio(q, log_q, log_m))


def tvd(p: jax.Array, logits: jax.Array) -> jax.Array:
  q = jax.nn.softmax(logits.astype(jnp.float32), axis=-1)
  return 0.5 * jnp.sum(jnp.abs(p - q), axis=-1)
