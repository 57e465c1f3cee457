"""Prompt lookup: propose what followed the last time the recent text occurred.

The context is the prompt plus every emitted token. For n from `n_max` down to `n_min`,
the last n tokens are searched for in the earlier context; at the most recent earlier
occurrence of the longest n that has one, the gamma tokens that followed it are
proposed (deterministically: q is one-hot). Rows without any match propose nothing
useful, and when no row of the batch has a match the loop runs a plain one-token step
instead of a (gamma + 1)-token verification (`skip_when_empty`), so a miss costs no
more than autoregressive decoding. Everything is array code with static shapes.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
from flax import struct

from specjax.core import tree as tree_lib
from specjax.core.contract import Drafter, DraftKind, TargetOut, TreeDrafter


@struct.dataclass
class NgramState:
  prompt: jax.Array  # [B, S] prompt tokens, -1 past each row's prompt
  found: jax.Array  # [B] bool: did the last proposal come from a match


def context(draft_state: NgramState, state) -> tuple[jax.Array, jax.Array]:
  """([B, S] prompt + emitted tokens, -1 elsewhere; [B] its length)."""
  b, out_len = state.tokens.shape
  offsets = jnp.arange(out_len)
  positions = state.prompt_lens[:, None] + offsets
  emitted = jnp.where(offsets < state.num_generated[:, None], state.tokens, -1)
  ctx = draft_state.prompt.at[jnp.arange(b)[:, None], positions].set(emitted, mode='drop')
  return ctx, state.prompt_lens + state.num_generated


def match_lengths(ctx: jax.Array, length: jax.Array, n_max: int) -> jax.Array:
  """[B, S]: at every end j before the last token, how many of the context's last tokens
  (up to n_max) equal the tokens ending at j, counted back from the end; 0 elsewhere."""
  s = ctx.shape[1]
  ends = jnp.arange(s)
  pattern = jnp.take_along_axis(ctx, jnp.maximum(length[:, None] - n_max + jnp.arange(n_max), 0), 1)
  run = ends[None] < length[:, None] - 1
  total = jnp.zeros(ctx.shape, jnp.int32)
  for k in range(n_max):  # ctx[j - k] == the k-th last token, for every end j
    shifted = jnp.roll(ctx, k, axis=1)
    run &= (shifted == pattern[:, n_max - 1 - k : n_max - k]) & (ends[None] >= k)
    run &= length[:, None] > k
    total += run
  return total


def lookup(ctx: jax.Array, length: jax.Array, n_min: int, n_max: int) -> jax.Array:
  """[B] end index of the most recent earlier occurrence of the longest n-gram (n_max down to
  n_min tokens) that ends the context, or -1 when even the last n_min tokens occur nowhere."""
  s = ctx.shape[1]
  total = match_lengths(ctx, length, n_max)
  best = jnp.max(jnp.where(total >= n_min, total * s + jnp.arange(s)[None], -1), axis=1)
  return jnp.where(best >= 0, best % s, -1)


def recent_matches(ctx: jax.Array, length: jax.Array, n_min: int, n_max: int, k: int) -> jax.Array:
  """[B, k] end indices of the k best earlier occurrences of the context's last tokens
  (longest match first, then most recent; at least n_min tokens), -1 past the last."""
  s = ctx.shape[1]
  total = match_lengths(ctx, length, n_max)
  score = jnp.where(total >= n_min, total * s + jnp.arange(s)[None], -1)
  best, _ = jax.lax.top_k(score, k)
  return jnp.where(best >= 0, best % s, -1)


def trie(
  continuations: jax.Array, valid: jax.Array, size: int, rank_major: bool = True
) -> tree_lib.TreeDraft:
  """A token trie of `size` nodes from continuations[B, M, D] (valid[B, M, D]: a prefix
  of each), in rank order: equal prefixes share nodes and the first continuation's child
  comes first. When the trie has more than `size` nodes, `rank_major` keeps the best
  continuation whole, then what the next ones add where they diverge from it, and so on
  (nodes numbered by (rank, depth)); otherwise the shallowest nodes (by (depth, rank)).
  Either way a kept node's parent is kept and numbered before it."""
  b, m, d = continuations.shape
  valid = jnp.cumprod(valid.astype(jnp.int32), axis=2) > 0
  equal = continuations[:, :, None, :] == continuations[:, None, :, :]  # [B, M, M', D]
  same = (jnp.cumprod(equal.astype(jnp.int32), axis=3) > 0) & valid[:, :, None] & valid[:, None]
  first = jnp.argmax(same, axis=2)  # [B, M, D] the first continuation sharing the prefix
  is_node = valid & (first == jnp.arange(m)[None, :, None])
  depth_ids, rank_ids = jnp.arange(d)[None, None, :], jnp.arange(m)[None, :, None]
  order_key = rank_ids * d + depth_ids if rank_major else depth_ids * m + rank_ids
  key = jnp.where(is_node, order_key, m * d)
  order = jnp.argsort(key.reshape(b, m * d), axis=1)[:, :size]  # flat (rank, depth) ids
  kept = jnp.take_along_axis(key.reshape(b, m * d), order, axis=1) < m * d
  rows = jnp.arange(b)[:, None]
  node = jnp.zeros((b, m * d), jnp.int32).at[rows, order].set(jnp.arange(1, size + 1))
  node = node.reshape(b, m, d)
  rank, depth = order // d, order % d
  rep = jnp.take_along_axis(first.reshape(b, m * d), rank * d + jnp.maximum(depth - 1, 0), 1)
  parent = jnp.take_along_axis(node.reshape(b, m * d), rep * d + jnp.maximum(depth - 1, 0), 1)
  parent = jnp.where(depth == 0, 0, parent)
  tokens = jnp.take_along_axis(continuations.reshape(b, m * d), order, axis=1)
  return tree_lib.TreeDraft(
    tokens=jnp.where(kept, tokens, 0).astype(jnp.int32), parents=jnp.where(kept, parent, -1)
  )


def last_match(ctx: jax.Array, length: jax.Array, n: int) -> jax.Array:
  """[B] end index of the most recent earlier occurrence of the last n tokens, or -1."""
  return lookup(ctx, length, n, n)


@dataclasses.dataclass(frozen=True)
class LookupDrafter(Drafter):
  """What model-free lookup drafters share: the prompt kept in the draft state (everything
  else is derived from the emitted tokens, so nothing to roll back), deterministic
  proposals, and a plain step when no row of the batch found anything."""

  vocab: int
  skip_when_empty = True  # a class attribute: the Drafter hook, not a field

  @property
  def vocab_size(self) -> int:
    return self.vocab

  def init(
    self, params, prompt_tokens, prompt_lens, cache_size, constrain=None, target=TargetOut()
  ):
    del target
    b, p = prompt_tokens.shape
    valid = jnp.arange(p)[None] < prompt_lens[:, None]
    prompt = jnp.full((b, cache_size), -1, jnp.int32)
    prompt = prompt.at[:, :p].set(jnp.where(valid, prompt_tokens, -1)[:, :cache_size])
    return NgramState(prompt=prompt, found=jnp.zeros((b,), bool))

  def deterministic(self, tokens: jax.Array, found: jax.Array, draft_state: NgramState):
    """(tokens, None: q one-hot, state) of a deterministic proposal; rows that found
    nothing propose token 0 (verification rejects it at no extra cost)."""
    tokens = jnp.where(found[:, None] & (tokens >= 0), tokens, 0).astype(jnp.int32)
    return tokens, None, draft_state.replace(found=found)

  def update(self, draft_state, state, target=TargetOut()):
    return draft_state

  def has_proposals(self, draft_state) -> jax.Array:
    return jnp.any(draft_state.found)


@dataclasses.dataclass(frozen=True)
class TrieDrafter(LookupDrafter, TreeDrafter):
  """A lookup drafter whose trees are tries of the continuations it finds (dynamic trees)."""

  def check_tree(self, spec) -> None:
    if spec.shape is not None:
      raise ValueError(
        f'{self.name} builds tries of continuations, not fixed shapes: give it a dynamic '
        f'tree (size, depth, width = how many continuations it merges)'
      )
    if spec.size > spec.width * spec.depth:
      raise ValueError(
        f'a trie of {spec.width} continuations of {spec.depth} tokens has at most '
        f'{spec.width * spec.depth} nodes, fewer than its size {spec.size}'
      )


@dataclasses.dataclass(frozen=True)
class NgramDrafter(TrieDrafter):
  """Prompt-lookup drafter over a `vocab`-token vocabulary."""

  n_max: int = 3
  n_min: int = 1

  def __post_init__(self):
    if not 1 <= self.n_min <= self.n_max:
      raise ValueError(
        f'ngram drafter needs 1 <= n_min <= n_max, got n_min={self.n_min}, n_max={self.n_max}'
      )

  @property
  def name(self) -> str:
    return f'prompt lookup ngram(n={self.n_min}..{self.n_max})'

  def propose_tree(self, params, draft_state, state, key, spec, sampling):
    """A trie of what followed the `spec.width` best earlier matches (longest, then most
    recent), `spec.depth` tokens each, `spec.size` nodes at most."""
    ctx, length = context(draft_state, state)
    ends = recent_matches(ctx, length, self.n_min, self.n_max, spec.width)  # [B, W]
    positions = ends[:, :, None] + 1 + jnp.arange(spec.depth)  # [B, W, D]
    valid = (ends[:, :, None] >= 0) & (positions < length[:, None, None])
    flat = jnp.clip(positions, 0, ctx.shape[1] - 1).reshape(ctx.shape[0], -1)
    conts = jnp.take_along_axis(ctx, flat, axis=1).reshape(positions.shape)
    draft = trie(conts, valid, spec.size)
    return draft, draft_state.replace(found=jnp.any(draft.parents >= 0, axis=1))

  def propose(self, params, draft_state, state, key, gamma, sampling):
    ctx, length = context(draft_state, state)
    end = lookup(ctx, length, self.n_min, self.n_max)  # the longest n with a match wins
    positions = end[:, None] + 1 + jnp.arange(gamma)
    positions = jnp.minimum(positions, length[:, None] - 1)  # repeat the last known token
    return self.deterministic(jnp.take_along_axis(ctx, positions, axis=1), end >= 0, draft_state)


def _parse(spec) -> tuple[int, int]:
  """ngram (n-grams of 3 down to 1 tokens), ngram:N (N down to 1), ngram:M-N (N down to M)."""
  if spec.options or len(spec.args) > 1:
    raise spec.error(NGRAM_USAGE)
  try:
    lo, _, hi = spec.args[0].rpartition('-') if spec.args else ('', '', '3')
    n_min, n_max = int(lo or 1), int(hi)
  except ValueError:
    raise spec.error(NGRAM_USAGE) from None
  if not 1 <= n_min <= n_max:
    raise spec.error(NGRAM_USAGE + ' with 1 <= shortest <= longest')
  return n_min, n_max


NGRAM_USAGE = 'ngram:<longest n-gram> or ngram:<shortest>-<longest> (ngram alone: 3 down to 1)'
NGRAM = DraftKind(
  usage=NGRAM_USAGE,
  parse=_parse,
  build=lambda n, target, dtype: (
    NgramDrafter(target.cfg.vocab_size, n_max=n[1], n_min=n[0]),
    None,
  ),
)
