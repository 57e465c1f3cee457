"""The drafter interface.

A drafter is a static, hashable description (it is a jit static argument); whatever
arrays it needs (a draft model's weights) come in as `params`, and whatever it carries
between iterations (its own KV cache) is a pytree `draft state` that lives inside the
decoding loop's state. Three calls, all traced inside the jitted loop:

  init(params, prompt_tokens[B, P], prompt_lens[B], cache_size, constrain) -> draft state
  propose(params, draft_state, state, key, gamma, sampling)
      -> (tokens[B, gamma], q[B, gamma, V] or None, draft_state)
  rollback(draft_state, state) -> draft_state      # after the verifier's commit

`q` is the (warped) distribution each proposed token was drawn from; deterministic
drafters return None for one-hot q, which the loop then builds only for the iterations
that verify a draft. `state` is the loop's DecodeState (tokens so far, lengths).
"""

from __future__ import annotations

import abc
from typing import Any

import jax

from specjax.decode.sampling import SamplingConfig
from specjax.decode.state import DecodeState


class Drafter(abc.ABC):
  """Base class; subclasses are frozen dataclasses."""

  name: str = 'drafter'

  @property
  @abc.abstractmethod
  def vocab_size(self) -> int:
    """Size of the vocabulary the proposals are drawn from."""

  @abc.abstractmethod
  def init(
    self, params, prompt_tokens: jax.Array, prompt_lens: jax.Array, cache_size: int, constrain=None
  ) -> Any:
    """The draft state after the prompt."""

  @abc.abstractmethod
  def propose(
    self,
    params,
    draft_state,
    state: DecodeState,
    key: jax.Array,
    gamma: int,
    sampling: SamplingConfig,
  ) -> tuple[jax.Array, jax.Array, Any]:
    """gamma tokens per row, with the distributions they were drawn from."""

  @abc.abstractmethod
  def rollback(self, draft_state, state: DecodeState) -> Any:
    """Brings the draft state in line with the committed tokens of `state`."""

  def resyncing(self, window: int) -> Drafter:
    """This drafter, able to resume after up to `window` plain steps that skipped it.

    Adaptive control runs plain target steps without the drafter. Drafters whose state
    is derived from the emitted tokens (prompt lookup) need nothing; those with a cache
    of their own (draft models) return a variant that catches up.
    """
    del window
    return self

  def describe(self) -> str:
    return self.name
