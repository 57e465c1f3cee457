"""Token trees: many candidate continuations verified in one target forward.

A tree draft of N nodes (N static) is three arrays per row:

  tokens[B, N]   the draft token of node i (nodes are numbered 1..N; node 0, the root, is
                 the last emitted token, already known);
  parents[B, N]  node i's parent, in [0, i): nodes come in topological order, so a parent
                 always precedes its children; -1 marks an unused slot (never accepted);
  q[B, N, V]     the distribution node i's token was drawn from, given its parent's context
                 and its earlier siblings (None: deterministic, one-hot).

Siblings are tried in node order, so a drafter puts its most promising child first.
Everything is derived from `parents` with array code (no host round trip): the ancestor
matrix, each node's depth, and so the positions and the attention mask of the target's
tree forward (each node sees the committed context and its own ancestors).

A `TreeShape` is a static tree: the nodes as paths of sibling ranks from the root (the
Medusa / EAGLE "choices" notation: (0,) is the root's best child, (0, 1) that child's
second best). Drafters fill a shape with tokens; lookup tries and dynamic (EAGLE-2) trees
build their own `parents` per row.

This module is part of the bottom layer: it imports nothing from specjax but core.
"""

from __future__ import annotations

import dataclasses
import math
import re
from collections.abc import Sequence

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct


@struct.dataclass
class TreeDraft:
  """A proposed tree (see the module docstring)."""

  tokens: jax.Array  # [B, N] int32
  parents: jax.Array  # [B, N] int32, in [0, i) for node i (1-based), -1 unused
  q: jax.Array | None = None  # [B, N, V] or None (one-hot)
  # [B, N] where a drafter with a cache of its own wrote each node (-1: nowhere), for its
  # `accept_path`; None for drafters without one.
  cache_slots: jax.Array | None = None

  @property
  def size(self) -> int:
    return self.tokens.shape[1]


def ancestors(parents: jax.Array) -> jax.Array:
  """[B, N+1, N+1] bool: anc[b, i, j] when node j is node i or one of its ancestors.

  Unused nodes (parent -1) are their own only ancestor. Computed by doubling the
  reach of the parent relation, log2(N) small matrix products.
  """
  b, n = parents.shape
  full = jnp.concatenate([jnp.full((b, 1), -1, parents.dtype), parents], axis=1)  # [B, N+1]
  step = jax.nn.one_hot(full, n + 1, dtype=jnp.int32)  # i -> parent(i); -1: no edge
  reach = jnp.eye(n + 1, dtype=jnp.int32)[None] + step
  hops = 1
  while hops < n:
    reach = jnp.minimum(jnp.einsum('bij,bjk->bik', reach, reach), 1)
    hops *= 2
  return reach > 0


def depths(anc: jax.Array, parents: jax.Array) -> jax.Array:
  """[B, N+1] int32 depth of each node (root 0; unused nodes 1, so that they stay apart)."""
  d = jnp.sum(anc, axis=-1).astype(jnp.int32) - 1
  unused = jnp.concatenate([jnp.zeros_like(parents[:, :1]), (parents < 0).astype(jnp.int32)], 1)
  return jnp.where(unused > 0, 1, d)


def path_to(anc: jax.Array, depth: jax.Array, node: jax.Array, max_depth: int) -> jax.Array:
  """[B, max_depth + 1] the nodes from the root to node[b] (by depth; 0 past its depth)."""
  on_path = jnp.take_along_axis(anc, node[:, None, None], axis=1)[:, 0]  # [B, N+1]
  levels = jnp.arange(max_depth + 1)
  hit = on_path[:, None, :] & (depth[:, None, :] == levels[None, :, None])  # [B, D+1, N+1]
  return jnp.argmax(hit, axis=-1).astype(jnp.int32)


def tree_mask(anc: jax.Array, start: jax.Array, cache_size: int) -> jax.Array:
  """[B, N+1, S] which cache slots each node of a tree written at slots start[b] + i sees:
  the committed context (slots < start) and its own ancestors (itself included)."""
  n1 = anc.shape[-1]
  offset = jnp.arange(cache_size)[None, :] - start[:, None]  # [B, S]
  inside = (offset >= 0) & (offset < n1)
  tree = jnp.take_along_axis(anc, jnp.clip(offset, 0, n1 - 1)[:, None, :], axis=2)  # [B, N+1, S]
  return (offset < 0)[:, None, :] | (inside[:, None, :] & tree)


@dataclasses.dataclass(frozen=True)
class TreeShape:
  """A static tree: `paths` are its nodes as tuples of sibling ranks from the root.

  Every prefix of a path is a node, and a node's earlier siblings exist ((0, 2) needs
  (0, 1)). Nodes are numbered by (depth, path), which is topological and puts siblings
  in rank order.
  """

  paths: tuple[tuple[int, ...], ...]

  def __post_init__(self):
    paths = tuple(sorted({tuple(int(r) for r in p) for p in self.paths}, key=lambda p: (len(p), p)))
    if not paths or len(paths) != len(self.paths):
      raise ValueError(f'a tree needs distinct non-empty paths, got {self.paths}')
    known = set(paths)
    for p in paths:
      if not p or min(p) < 0:
        raise ValueError(f'tree path {p}: expected a non-empty tuple of ranks >= 0')
      if len(p) > 1 and p[:-1] not in known:
        raise ValueError(f'tree path {p}: its parent {p[:-1]} is not in the tree')
      if p[-1] > 0 and p[:-1] + (p[-1] - 1,) not in known:
        raise ValueError(f'tree path {p}: its earlier sibling {p[:-1] + (p[-1] - 1,)} is missing')
    object.__setattr__(self, 'paths', paths)

  @classmethod
  def chain(cls, gamma: int) -> TreeShape:
    return cls(tuple((0,) * d for d in range(1, gamma + 1)))

  @classmethod
  def branching(cls, widths: Sequence[int]) -> TreeShape:
    """Every node at depth d has widths[d] children: '3x2x1' is 3 + 6 + 6 nodes."""
    paths, level = [], [()]
    for w in widths:
      level = [p + (r,) for p in level for r in range(w)]
      paths += level
    return cls(tuple(paths))

  @property
  def size(self) -> int:
    return len(self.paths)

  @property
  def depth(self) -> int:
    return max(len(p) for p in self.paths)

  @property
  def parents(self) -> tuple[int, ...]:
    """Parent of each node 1..N (0: the root)."""
    index = {p: i + 1 for i, p in enumerate(self.paths)}
    return tuple(index.get(p[:-1], 0) for p in self.paths)

  @property
  def ranks(self) -> tuple[int, ...]:
    return tuple(p[-1] for p in self.paths)

  @property
  def levels(self) -> tuple[tuple[int, ...], ...]:
    """Node numbers (1-based) at each depth 1..D."""
    return tuple(
      tuple(i + 1 for i, p in enumerate(self.paths) if len(p) == d)
      for d in range(1, self.depth + 1)
    )

  def ancestor_matrix(self) -> np.ndarray:
    """[N+1, N+1] bool (numpy, static): as `ancestors` for this shape."""
    anc = np.eye(self.size + 1, dtype=bool)
    for i, p in enumerate(self.parents):
      anc[i + 1] |= anc[p]
    return anc

  def parents_array(self, batch: int) -> jax.Array:
    return jnp.broadcast_to(jnp.asarray(self.parents, jnp.int32), (batch, self.size))

  def expected_accepted(self, accept: np.ndarray) -> float:
    """Expected accepted draft tokens when the child of rank r is accepted with probability
    accept[d, r] given its parent was reached (rows: depth 1.., clipped to the last)."""
    accept = np.atleast_2d(np.asarray(accept, np.float64))
    reach = {(): 1.0}
    for p in self.paths:
      d, r = min(len(p), accept.shape[0]) - 1, p[-1]
      reach[p] = reach[p[:-1]] * (accept[d, r] if r < accept.shape[1] else 0.0)
    return float(sum(reach[p] for p in self.paths))

  @property
  def text(self) -> str:
    """The paths as parse_shape reads them ('0;1;0.0'): a canonical name."""
    return ';'.join('.'.join(str(r) for r in p) for p in self.paths)

  def describe(self) -> str:
    widths = [len(level) for level in self.levels]
    return f'tree of {self.size} nodes, depth {self.depth} (per level {widths})'


@dataclasses.dataclass(frozen=True)
class TreeSpec:
  """How a method drafts trees (a static part of decoding methods).

  shape: a static tree the drafter fills (model drafters: the draft's top children in
    rank order, or children sampled without replacement when sampling);
  otherwise a dynamic tree of `size` nodes and at most `depth` levels, each expanding
    `width` nodes (EAGLE-2 for draft models; for prompt lookup, a trie of the
    continuations after up to `width` earlier matches).
  """

  shape: TreeShape | None = None
  size: int = 0
  depth: int = 0
  width: int = 0

  def __post_init__(self):
    if self.shape is None and not (self.size >= 1 and self.depth >= 1 and self.width >= 1):
      raise ValueError(
        f'a dynamic tree needs size, depth and width >= 1, got size={self.size}, '
        f'depth={self.depth}, width={self.width}'
      )

  @property
  def nodes(self) -> int:
    return self.shape.size if self.shape is not None else self.size

  @property
  def max_depth(self) -> int:
    return self.shape.depth if self.shape is not None else self.depth

  def describe(self) -> str:
    if self.shape is not None:
      return self.shape.describe()
    return f'dynamic tree of {self.size} nodes, depth {self.depth}, width {self.width}'


def best_shape(accept: np.ndarray, size: int, max_depth: int = 16) -> TreeShape:
  """The `size`-node tree of most expected accepted tokens (Sequoia's objective under its
  depth/rank acceptance model): the nodes of largest reach probability, added greedily.

  With accept[d, r] decreasing in r, a node's reach never exceeds its parent's or its
  earlier sibling's, so the greedy choice is always a tree and is optimal.
  """
  accept = np.atleast_2d(np.asarray(accept, np.float64))
  frontier = {(0,): accept[0, 0]}
  chosen: dict[tuple[int, ...], float] = {}
  while len(chosen) < size and frontier:
    path = max(frontier, key=lambda p: (frontier[p], -len(p)))
    value = frontier.pop(path)
    chosen[path] = value
    d = min(len(path), accept.shape[0] - 1)
    if len(path) < max_depth:
      frontier[path + (0,)] = value * accept[d, 0]
    r = path[-1] + 1
    if r < accept.shape[1]:
      dd = min(len(path) - 1, accept.shape[0] - 1)
      frontier[path[:-1] + (r,)] = chosen.get(path[:-1], 1.0) * accept[dd, r]
  return TreeShape(tuple(chosen))


_SHAPE_USAGE = (
  "a tree shape: 'WxWx...' (every node at depth d has W_d children, e.g. 4x2x1x1), "
  "'chain:K', or paths like '0;1;0.0;0.1;1.0' (sibling ranks from the root, '.'-separated)"
)


TREE_USAGE = (
  "'dynamic:SIZE-DEPTH-WIDTH' (a dynamic tree of SIZE nodes, DEPTH levels, WIDTH expanded "
  'per level; for prompt lookup WIDTH earlier matches), or ' + _SHAPE_USAGE
)


# The most nodes a tree may have: checked before a shape is built ('chain:100000' would
# otherwise build 5e9 path entries); a verification writes every node into the KV cache.
MAX_NODES = 512


class TreeTooLarge(ValueError):
  pass


def _check_size(nodes: int, text: str) -> None:
  if nodes > MAX_NODES:
    raise TreeTooLarge(f'tree {text!r}: {nodes} nodes, more than the {MAX_NODES} a tree may have')


def parse_tree(text: str) -> TreeSpec:
  """'dynamic:16-6-4' or a static shape (see parse_shape) -> TreeSpec."""
  text = str(text).strip()
  if text.startswith('dynamic:'):
    parts = text[len('dynamic:') :].split('-')
    if len(parts) != 3 or not all(p.isdigit() and int(p) >= 1 for p in parts):
      raise ValueError(f'tree {text!r}: expected {TREE_USAGE}')
    size, depth, width = (int(p) for p in parts)
    _check_size(size, text)
    if depth > size or width > size:
      raise ValueError(f'tree {text!r}: DEPTH and WIDTH are at most SIZE = {size}')
    return TreeSpec(size=size, depth=depth, width=width)
  try:
    return TreeSpec(shape=parse_shape(text))
  except TreeTooLarge:
    raise
  except ValueError:
    raise ValueError(f'tree {text!r}: expected {TREE_USAGE}') from None


def parse_shape(text: str) -> TreeShape:
  """'4x2x1' (branching per depth), 'chain:4', or explicit paths '0;1;0.0' -> TreeShape."""
  text = str(text).strip()
  try:
    if re.fullmatch(r'\d+(x\d+)*', text):
      widths = [int(w) for w in text.split('x')]
      if min(widths) < 1:
        raise ValueError
      _check_size(sum(math.prod(widths[: d + 1]) for d in range(len(widths))), text)
      return TreeShape.branching(widths)
    if text.startswith('chain:'):
      gamma = int(text[len('chain:') :])
      _check_size(gamma, text)
      return TreeShape.chain(gamma)
    _check_size(text.count(';') + 1, text)
    paths = tuple(tuple(int(r) for r in part.split('.')) for part in text.split(';'))
    return TreeShape(paths)
  except TreeTooLarge:
    raise
  except ValueError as e:
    detail = f' ({e})' if str(e) else ''
    raise ValueError(f'tree shape {text!r}: expected {_SHAPE_USAGE}{detail}') from None
