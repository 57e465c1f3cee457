"""Sampling settings and the logit warps shared by every decoding method.

Greedy decoding is temperature 0. Otherwise logits are divided by the temperature,
then restricted to the top-k tokens and to the smallest set whose probability
reaches top-p. Speculative verifiers warp the target's and the draft's logits with
the same function, so "lossless" always means: distributed as the *warped* target.
"""

from __future__ import annotations

import dataclasses
import math

import jax
import jax.numpy as jnp

from specjax.kernels import cpu as cpu_kernels

NEG_INF = -1e30


# The smallest positive temperature: logits / 1e-40 overflow float32 to inf (NaN output).
MIN_TEMPERATURE = 1e-4


@dataclasses.dataclass(frozen=True)
class SamplingConfig:
  """Static sampling settings. temperature 0 means greedy (argmax)."""

  temperature: float = 0.0
  top_k: int = 0  # 0: no top-k restriction
  top_p: float = 1.0  # 1: no nucleus restriction

  def __post_init__(self):
    if not (self.temperature == 0 or MIN_TEMPERATURE <= self.temperature < math.inf):
      raise ValueError(
        f'sampling temperature must be 0 (greedy) or in [{MIN_TEMPERATURE:g}, inf), got '
        f'{self.temperature} (below {MIN_TEMPERATURE:g} the scaled logits overflow float32)'
      )
    if not isinstance(self.top_k, int) or self.top_k < 0:
      raise ValueError(f'sampling top_k must be an integer >= 0, got {self.top_k!r}')
    if not 0 < self.top_p <= 1:
      raise ValueError(f'sampling top_p must be in (0, 1], got {self.top_p}')

  @property
  def greedy(self) -> bool:
    return self.temperature == 0


def top_k(x: jax.Array, k: int) -> tuple[jax.Array, jax.Array]:
  """jax.lax.top_k over the last axis, on a 2-D view: XLA:CPU then runs its TopK kernel
  (on rank-3 operands it fell back to sorting all 49152 tokens of each row, 10-30 ms)."""
  values, index = jax.lax.top_k(x.reshape(-1, x.shape[-1]), k)
  return values.reshape(x.shape[:-1] + (k,)), index.reshape(x.shape[:-1] + (k,))


def _xla_argmax(x: jax.Array) -> jax.Array:
  v = x.shape[-1]
  index = jnp.arange(v)
  top = jnp.max(x, axis=-1, keepdims=True)
  first_top = jnp.min(jnp.where(x == top, index, v - 1), axis=-1)
  # XLA:CPU's maximum skips NaN or not depending on its loop: a NaN is found apart.
  first_nan = jnp.min(jnp.where(jnp.isnan(x), index, v), axis=-1)
  return jnp.where(first_nan < v, first_nan, first_top).astype(jnp.int32)


def argmax(x: jax.Array) -> jax.Array:
  """First index of the maximum over the last axis (of the first NaN in a row holding
  one), as int32: jnp.argmax's result.

  On XLA:CPU jnp.argmax's reduction over (value, index) pairs ran 1.2-1.7x slower over a
  49k vocabulary than max and min reductions (`_xla_argmax`; 1-9 rows, a 2-core Xeon), and
  specjax's kernel 3-5x faster than those (kernels/cpu.py `argmax`, chosen by measurement
  on each machine); other backends run jnp.argmax.
  """
  if jax.default_backend() != 'cpu':
    return jnp.argmax(x, axis=-1).astype(jnp.int32)
  out = cpu_kernels.argmax(x, _xla_argmax)
  return _xla_argmax(x) if out is None else out


def one_hot_argmax(x: jax.Array) -> jax.Array:
  return (jnp.arange(x.shape[-1]) == argmax(x)[..., None]).astype(jnp.float32)


def sample_probs(probs: jax.Array, key: jax.Array) -> jax.Array:
  """Draws one index per row of probs [..., V] (rows need not be normalised) by inverting
  the cumulative distribution with one uniform number per row.

  jax.random.categorical would draw V Gumbel numbers per row: ~5x slower here.
  """
  cdf = jnp.cumsum(probs.astype(jnp.float32), axis=-1)
  u = jax.random.uniform(key, probs.shape[:-1] + (1,), jnp.float32) * cdf[..., -1:]
  index = jnp.sum(cdf <= u, axis=-1)
  # u * total can round up to the total: never step past the last token with mass.
  last = jnp.max(jnp.where(probs > 0, jnp.arange(probs.shape[-1]), 0), axis=-1)
  return jnp.minimum(index, last).astype(jnp.int32)


def warp_logits(logits: jax.Array, sampling: SamplingConfig) -> jax.Array:
  """Applies temperature, top-k and top-p to logits [..., V]; removed tokens get NEG_INF.

  For greedy sampling every token but the argmax is removed.
  """
  logits = logits.astype(jnp.float32)
  if sampling.greedy:
    return jnp.where(one_hot_argmax(logits) > 0, 0.0, NEG_INF)
  logits = logits / sampling.temperature
  if 0 < sampling.top_k < logits.shape[-1]:
    kth = top_k(logits, sampling.top_k)[0][..., -1:]
    logits = jnp.where(logits < kth, NEG_INF, logits)
  if sampling.top_p < 1:
    sorted_logits = jnp.sort(logits, axis=-1)[..., ::-1]
    probs = jax.nn.softmax(sorted_logits, axis=-1)
    # Keep a sorted token while the mass before it is below top_p; the first always stays
    # (a top_p below float32's smallest number would otherwise keep none).
    mass_before = jnp.cumsum(probs, axis=-1) - probs
    first = jnp.arange(probs.shape[-1]) == 0
    kept = jnp.where((mass_before < sampling.top_p) | first, sorted_logits, jnp.inf)
    threshold = jnp.min(kept, axis=-1, keepdims=True)
    logits = jnp.where(logits < threshold, NEG_INF, logits)
  return logits


def probabilities(logits: jax.Array, sampling: SamplingConfig) -> jax.Array:
  """The warped distribution [..., V] that a sampler draws from (one-hot when greedy)."""
  if sampling.greedy:
    return one_hot_argmax(logits)
  return jax.nn.softmax(warp_logits(logits, sampling), axis=-1)


def sample(logits: jax.Array, key: jax.Array, sampling: SamplingConfig) -> jax.Array:
  """Draws one token per row from logits [..., V] (argmax when greedy)."""
  if sampling.greedy:
    return argmax(logits)
  return sample_probs(probabilities(logits, sampling), key)
