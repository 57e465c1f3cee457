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

  init(params, prompt_tokens[B, P], prompt_lens[B], cache_size, constrain, target)
      -> draft state
  propose(params, draft_state, state, key, gamma, sampling)
      -> (tokens[B, gamma], q[B, gamma, V] or None, draft_state)
  update(draft_state, state, target) -> draft_state      # after the verifier's commit

`q` is the (warped) distribution each proposed token was drawn from; deterministic
drafters return None for one-hot q, which the loop then builds only for the iterations
that verify a draft. `state` is the loop's DecodeState (tokens so far, lengths). What the
target computed reaches a drafter as one value, a `TargetOut`: the features of the layers
it declares in `capture`, and, after the prompt, the target's KV cache. Two capabilities
are classes of their own, checked when a method binds its drafter (decode/method.check):
`TreeDrafter` (token trees) and `ConfidenceDrafter` (a confidence head). What the host
does with a drafter (shard its parameters, make it resume after skipped steps, check a
batch) is on its registry entry, a `DraftKind`, never on the traced class; a drafter's
`name` is for reports and is left out of its equality (and so of the jit cache key).

This module is part of the bottom layer: it imports nothing from specjax but core.
"""

from __future__ import annotations

import abc
import dataclasses
from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp

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
  # params -> the same weights joined for faster products on one device (the Llama family:
  # models/quant.fuse); an engine without a mesh applies it once.
  fuse: Callable[[Any], Any] = lambda params: params


class TargetOut(NamedTuple):
  """What the target's forward gives a drafter, as one value: its captured features[B, T,
  C * D] of positions start[B] + t (None unless the drafter declares `capture`), and, after
  the prompt only, the target's KV cache (a draft of the target's own architecture may
  start from it instead of a prefill of its own)."""

  features: jax.Array | None = None
  start: jax.Array | None = None
  cache: Any = None


class Drafter(abc.ABC):
  """Base class; subclasses are frozen dataclasses (jit static arguments).

  `name` says what the drafter is in reports ('prompt lookup ngram(n=1..3)'); `capture`,
  the target layers whose incoming residual stream it reads (the family's `capture=`: the
  loop's target forwards then hand it their features); `skip_when_empty`, True for
  drafters that may find nothing to propose (lookup): the loop then runs a plain step
  instead of verifying while no row `has_proposals`.
  """

  name: str = 'drafter'
  capture: tuple[int, ...] = ()
  skip_when_empty: bool = False

  @property
  @abc.abstractmethod
  def vocab_size(self) -> int:
    """Size of the vocabulary the proposals are drawn from."""

  @abc.abstractmethod
  def init(self, params, prompt_tokens, prompt_lens, cache_size, constrain, target: TargetOut):
    """The draft state after the prompt (`target`: the target's prefill)."""

  @abc.abstractmethod
  def propose(self, params, draft_state, state: DecodeState, key, gamma: int, sampling):
    """(tokens[B, gamma], the distributions q[B, gamma, V] they were drawn from or None
    for one-hot, the draft state)."""

  @abc.abstractmethod
  def update(self, draft_state, state: DecodeState, target: TargetOut):
    """The draft state in line with the committed tokens of `state`, after the verifier's
    commit; `target` is that iteration's target forward (features from position start)."""

  def has_proposals(self, draft_state) -> jax.Array:
    """[] bool: did the last proposal find anything for some row (see skip_when_empty)."""
    del draft_state
    return jnp.asarray(True)

  def counters(self, draft_state) -> dict[str, jax.Array]:
    """{name: [B] int} the drafter counted over a decode (its runs' records keep them as
    `draft_counts`): none by default; a multi-level drafter counts its levels' steps."""
    del draft_state
    return {}


class TreeDrafter(Drafter):
  """A drafter that also drafts token trees (tree methods need one: decode/method.check)."""

  def check_tree(self, spec) -> None:
    """Raises ValueError unless it can propose trees of `spec` (a core.tree.TreeSpec); a
    drafter refuses here the shapes it cannot fill (a trie drafter, fixed shapes)."""
    del spec

  @abc.abstractmethod
  def propose_tree(self, params, draft_state, state: DecodeState, key, spec, sampling):
    """A tree draft (core.tree.TreeDraft) of spec.nodes nodes, and the draft state."""

  def accept_path(self, draft_state, draft, path: jax.Array, accepted: jax.Array):
    """After a tree verification: the accepted nodes path[B, D + 1] (root first;
    accepted[B] draft tokens), before `update`; a drafter that wrote nodes into a cache
    of its own (draft.cache_slots) moves the accepted ones into place here."""
    del draft, path, accepted
    return draft_state


class ConfidenceDrafter(Drafter):
  """A drafter with a confidence head ('<draft>@scheduled': control/scheduled.py)."""

  @abc.abstractmethod
  def confidences(self, params, draft_state, state: DecodeState, gamma: int):
    """(each of the first gamma positions' survival probability [B, gamma], the draft state
    as a proposal would leave it)."""


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
  What the host does with its drafters, never traced:
  classes: the Drafter classes it builds (registry.kind_of finds a drafter's kind by them);
  partition_rules: how its parameters shard over a (data, model) mesh, ((regex,
    PartitionSpec), ...) over their paths (specjax/models/sharding.py); None: the target's
    (a draft model's tree has the target's names);
  resync(drafter, window) -> the drafter able to resume after up to `window` plain steps
    that skipped it (adaptive control); None: a drafter whose state is derived from the
    emitted tokens (prompt lookup) needs nothing;
  scheduled: its drafters are ConfidenceDrafters, so '<draft>@scheduled' parses.
  """

  usage: str
  parse: Callable[[Any], Any]
  build: Callable[[Any, Any, str], tuple[Drafter, Any]]
  max_depth: int = 0
  group: Callable[[Any], int] = lambda settings: 1
  classes: tuple[type, ...] = ()
  partition_rules: tuple | None = None
  resync: Callable[[Drafter, int], Drafter] | None = None
  scheduled: bool = False  # its drafters have a confidence head ('<draft>@scheduled')


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
