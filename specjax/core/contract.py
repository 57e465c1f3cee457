"""The two contracts the decoding loop is written against: a model family and a drafter.

**A model family** is a `Family`: a named set of pure functions over a parameter pytree
and a static, hashable config. The config names its family (`cfg.family`), so the
loop, the drafters and the cost timers call `cfg.family.forward(...)` and never a
particular architecture by name:

  forward(params, tokens[B, T], cache, cfg, layers=None, *, capture=(), at=None, head=True)
      -> ForwardOut(logits[B, T, V] float32, cache, features, hidden[B, T, D])
  logits(params, hidden[..., D], cfg) -> float32 logits[..., V]   (the head alone)
  init_cache(cfg, batch, cache_size, dtype) -> an empty cache (lengths 0)
  check_params(cfg, params, source) -> None       raises ValueError naming a bad tensor
  move_slots(cache, src[B, K], dst[B, K]) -> cache   copies slots (an accepted tree path)

`tokens` are written at each row's own position (`cache.lengths`); the returned cache
has every row's length advanced by T, and rolling a row back is lowering its length.
With `at` (an `At`: token trees) they go to the given RoPE positions and cache slots,
attending to the slots its mask allows, and the lengths stay as they were. `layers`
(static) runs a subset of the layers, for self-speculative drafts; `capture=(i, ...)`
(static) also returns the residual stream entering those layers, concatenated
(features[B, T, len(capture) * D]; None without); head=False leaves `logits` None (the
caller applies its own head to `hidden`, the final-normed states).

**A drafter** is a static, hashable description (a jit static argument); whatever
arrays it needs (a draft model's weights) come in as `params`, and whatever it carries
between iterations (its own KV cache) is a pytree `draft state` inside the loop's
`SpecState`. Three calls, all traced inside the jitted loop:

  init(params, prompt_tokens[B, P], prompt_lens[B], cache_size, constrain) -> draft state
  propose(params, draft_state, state, key, gamma, sampling)
      -> (tokens[B, gamma], q[B, gamma, V] or None, draft_state)
  rollback(draft_state, state) -> draft_state      # after the verifier's commit

`q` is the (warped) distribution each proposed token was drawn from; deterministic
drafters return None for one-hot q, which the loop then builds only for the iterations
that verify a draft. `state` is the loop's DecodeState (tokens so far, lengths). Every
optional hook is declared on `Drafter` with its default, so the loop never has to ask
whether a drafter has one.

This module is part of the bottom layer: it imports nothing from specjax but core.
"""

from __future__ import annotations

import abc
import dataclasses
from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp

from specjax.core.sampling import SamplingConfig
from specjax.core.state import DecodeState


class At(NamedTuple):
  """Where a forward's tokens[B, T] go (token trees): RoPE positions[B, T], cache
  slots[B, T] written (past the end: dropped), and mask[B, T, S], the slots each token
  attends to after the write."""

  positions: jax.Array
  slots: jax.Array
  mask: jax.Array


class ForwardOut(NamedTuple):
  """What a family's forward returns: float32 logits[B, T, V] (None with head=False), the
  cache, the captured features[B, T, C * D] (None without `capture`) and the final-normed
  hidden states[B, T, D]."""

  logits: jax.Array | None
  cache: Any
  features: jax.Array | None = None
  hidden: jax.Array | None = None


@dataclasses.dataclass(frozen=True)
class Family:
  """A model family's functions (see the module docstring for their signatures)."""

  name: str
  forward: Callable[..., ForwardOut]
  logits: Callable[..., Any]
  init_cache: Callable[..., Any]
  check_params: Callable[..., Any]
  move_slots: Callable[..., Any]


class Drafter(abc.ABC):
  """Base class; subclasses are frozen dataclasses.

  `name` says what the drafter is in reports ('prompt lookup ngram(n=1..3)').
  """

  name: str = 'drafter'
  # True for drafters that may find nothing to propose (lookup): the loop then runs a
  # plain one-token step instead of verifying, while no row `has_proposals`.
  skip_when_empty: bool = False

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
  ) -> tuple[jax.Array, jax.Array | None, Any]:
    """gamma tokens per row, with the distributions they were drawn from (None: one-hot)."""

  @abc.abstractmethod
  def rollback(self, draft_state, state: DecodeState) -> Any:
    """Brings the draft state in line with the committed tokens of `state`."""

  @property
  def feature_layers(self) -> tuple[int, ...]:
    """Target layers whose incoming residual stream the drafter reads (feature heads).

    Non-empty: the loop's target forwards capture them (the model contract's `capture`),
    `init` gets the prompt's as `features=` and `absorb` each verification's.
    """
    return ()

  @property
  def reads_target_cache(self) -> bool:
    """True: `init` also gets the target's KV cache after the prompt as `target_cache=`
    (a draft of the target's own architecture can start from it instead of its own
    prefill; the quantized target does)."""
    return False

  def absorb(self, draft_state, features: jax.Array, start: jax.Array, state: DecodeState):
    """Takes the target's features[B, T, C * D] of positions start[B] + t (called after
    the verifier's commit, before `rollback`, only when `feature_layers` is non-empty)."""
    del features, start, state
    return draft_state

  def check_tree(self, spec) -> None:
    """Raises ValueError unless this drafter can propose trees of `spec` (a TreeSpec)."""
    raise ValueError(f'the {self.name} drafter cannot propose token trees')

  def propose_tree(self, params, draft_state, state: DecodeState, key, spec, sampling):
    """A tree draft (specjax.core.tree.TreeDraft) of spec.nodes nodes, and the draft state."""
    raise NotImplementedError(f'{self.name} proposes no trees')

  def accept_path(self, draft_state, draft, path: jax.Array, accepted: jax.Array):
    """After a tree verification of `draft` (a TreeDraft): the accepted nodes path[B, D + 1]
    (root first; accepted[B] draft tokens). Called before `rollback`; drafters that wrote
    tree nodes into a cache of their own (draft.cache_slots) move the accepted ones into
    place here."""
    del draft, path, accepted
    return draft_state

  def has_proposals(self, draft_state) -> jax.Array:
    """[] bool: did the last proposal find anything for some row (see skip_when_empty)."""
    del draft_state
    return jnp.asarray(True)

  def check_batch(self, batch: int) -> None:
    """Raises ValueError if this drafter cannot serve a batch of `batch` rows."""
    del batch

  @property
  def partition_rules(self) -> tuple | None:
    """How its parameters shard over a (data, model) mesh: ((regex, PartitionSpec), ...)
    over their paths (specjax/models/sharding.py); None: the target's rules (a draft
    model's tree has the target's names)."""
    return None

  def resyncing(self, window: int) -> Drafter:
    """This drafter, able to resume after up to `window` plain steps that skipped it.

    Adaptive control runs plain target steps without the drafter. Drafters whose state
    is derived from the emitted tokens (prompt lookup) need nothing; those with a cache
    of their own (draft models) return a variant that catches up.
    """
    del window
    return self


@dataclasses.dataclass(frozen=True)
class DraftKind:
  """A kind of draft as the registry knows it (specjax/registry.py DRAFTS).

  parse(spec: core.registry.Spec) -> settings: checks the spec's arguments without loading
    anything (config validation calls it before any model loads) and raises ValueError
    with `usage` for a bad one.
  build(settings, target, dtype: str) -> (Drafter, draft params or None): `target` is the
    loaded target (specjax.checkpoints.loader.LoadedModel: cfg, params, tokenizer, source).
  max_depth: the longest chain (or tree depth) it can draft, 0 for no limit; and
  group(settings): how many consecutive rows it drafts together (every batch a multiple):
    both checked against a run config before any model loads.
  """

  usage: str
  parse: Callable[[Any], Any]
  build: Callable[[Any, Any, str], tuple[Drafter, Any]]
  max_depth: int = 0
  group: Callable[[Any], int] = lambda settings: 1


@dataclasses.dataclass(frozen=True)
class ModelSource:
  """A kind of model spec the loader reads besides its own (pinned assets, .gguf files,
  Hugging Face directories): the test stand-ins, registered in specjax/registry.py
  MODEL_SOURCES.

  matches(spec) -> bool: whether `spec` is this source's (ValueError for a malformed one).
  load(spec, dtype) -> (cfg, params, tokenizer, source description), params cast to dtype.
  """

  usage: str
  matches: Callable[[str], bool]
  load: Callable[[str, Any], tuple]
