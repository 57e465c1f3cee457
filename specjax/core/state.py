"""The decoding state shared by autoregressive and speculative loops.

Invariants, per row b, after every step:
  * tokens[b, :num_generated[b]] are the tokens emitted so far;
  * the target cache holds the prompt and every emitted token but the last one, so
    cache.lengths[b] == prompt_lens[b] + num_generated[b] - 1: the last emitted token
    is the next model input;
  * done[b] once the row emitted EOS or reached max_new[b]; a done row never changes.
`commit` is the one place that enforces them (stopping rules included), so every
decoding method advances rows the same way.

The speculative part of the state is a `SpecState`: the drafter's own state, what each
iteration kept and drafted, and the adaptive controller's state.
"""

from __future__ import annotations

from typing import Any, Protocol

import jax
import jax.numpy as jnp
from flax import struct


class Cache(Protocol):
  """What the loop needs of a model family's cache (specjax.models.kv_cache.KVCache)."""

  lengths: jax.Array  # [B] int32 filled slots per row

  def with_lengths(self, lengths: jax.Array) -> Cache: ...


@struct.dataclass
class SpecState:
  """The speculative part of the loop state (autoregressive decoding records zeros)."""

  accepted: jax.Array  # [B, O] int32 draft tokens kept per iteration; -1 past the last
  drafted: jax.Array  # [B, O] int32 tokens drafted per iteration (0: a plain step); -1 past
  draft: Any = None  # the drafter's own state (its type is the drafter's; None without one)
  control: Any = None  # specjax.control.adaptive.ControlState under adaptive control
  # Tree methods: [B, O] int32 the tree node each iteration stopped at (0: the root, or a
  # plain step), -1 past the last; None otherwise.
  stops: jax.Array | None = None
  # [B] int32 iterations whose draft handed the verifier an untrusted distribution
  # (verify.common.untrusted: NaN, negative, an overflowing total, or 0 at its proposal).
  untrusted: jax.Array | None = None
  # [B] bool: the target's logits at the end of the prompt were finite (prefill). False
  # means its activations overflow in this dtype: the engine refuses to report that run.
  target_finite: jax.Array | None = None


@struct.dataclass
class DecodeState:
  tokens: jax.Array  # [B, O] int32 emitted tokens, `pad` past num_generated
  num_generated: jax.Array  # [B] int32
  done: jax.Array  # [B] bool
  prompt_lens: jax.Array  # [B] int32
  max_new: jax.Array  # [B] int32
  cache: Cache  # the target's cache
  key: jax.Array  # PRNG key, split once per step
  step: jax.Array  # [] int32, loop iterations so far (prefill excluded)
  spec: SpecState | None = None  # set by the loop's prefill

  @property
  def last_tokens(self) -> jax.Array:
    """[B] the last emitted token of each row: the next input of the target."""
    idx = jnp.maximum(self.num_generated - 1, 0)
    return jnp.take_along_axis(self.tokens, idx[:, None], axis=1)[:, 0]


def commit(
  state: DecodeState, new_tokens: jax.Array, counts: jax.Array, eos_id: int
) -> DecodeState:
  """Appends new_tokens[b, :counts[b]] to each row, applying EOS and max_new.

  new_tokens is [B, K]; rows that are done take nothing. A row stops at (and keeps)
  its first EOS among the appended tokens. Returns the state with the target cache
  rolled back or forward to the invariant length.
  """
  b, k = new_tokens.shape
  offsets = jnp.arange(k, dtype=jnp.int32)
  room = state.max_new - state.num_generated
  counts = jnp.where(state.done, 0, jnp.minimum(counts.astype(jnp.int32), room))
  is_eos = (new_tokens == eos_id) & (offsets[None, :] < counts[:, None])
  hit_eos = jnp.any(is_eos, axis=1)
  counts = jnp.where(hit_eos, jnp.argmax(is_eos, axis=1) + 1, counts)
  positions = state.num_generated[:, None] + offsets[None, :]
  positions = jnp.where(offsets[None, :] < counts[:, None], positions, state.tokens.shape[1])
  rows = jnp.arange(b)[:, None]
  tokens = state.tokens.at[rows, positions].set(new_tokens.astype(jnp.int32), mode='drop')
  num_generated = state.num_generated + counts
  done = state.done | hit_eos | (num_generated >= state.max_new)
  cache = state.cache.with_lengths(state.prompt_lens + num_generated - 1)
  return state.replace(tokens=tokens, num_generated=num_generated, done=done, cache=cache)
