"""Drafting token trees with any step-by-step draft (a draft model, a feature head).

Both builders drive one function the drafter supplies,

  feed(carry, tokens[B, W], parent_states[B, W, E], positions[B, W], slots[B, W],
       mask[B, W, S]) -> (logits[B, W, V'], states[B, W, E], carry)

which runs the draft on W tree nodes at once: node tokens at RoPE `positions`, their
keys and values written at the draft cache's `slots`, each attending to the slots `mask`
allows (the committed context and the node's own ancestors). `states` is whatever a
child needs from its parent besides the cache (a feature head's output state; E = 0 for
a draft model). A node of depth d sits at position base + d - 1, base[b] being where the
drafter's tree region starts (for a draft model, the context length).

  static_tree   fills a TreeShape level by level: each parent's children are its draft's
                top tokens in rank order (greedy), or tokens drawn without replacement
                (sampling; q of the i-th child is the draft's distribution with the
                earlier siblings removed, which keeps tree verification exact);
  dynamic_tree  EAGLE-2 (Li et al. 2024): every level expands the `width` candidates of
                highest cumulative draft log-probability by their `width` best children,
                and the tree keeps the `size` best candidates overall. Children are
                deterministic top tokens (q one-hot), so the choice of tree never biases a
                sampled token: lossless at any temperature.

Both return a TreeDraft whose cache_slots say where each node fed to the draft was
written (-1: a leaf, never fed), for the drafter's `accept_path`.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from specjax.core import sampling as sampling_lib
from specjax.core import tree as tree_lib


def children(logits, k: int, key, sampling, sampled: bool, ids=None, vocab: int = 0):
  """The k children of each node from draft logits[B, M, V'].

  Returns (tokens [B, M, k] target ids, log-probabilities [B, M, k], q [B, M, k, V] or
  None). `ids` maps draft-vocabulary indices to target ids (a reduced draft vocabulary;
  q is then spread over `vocab` target ids, zero elsewhere). Greedy, or `sampled`
  False: the top k in order (q one-hot: None). Otherwise a draw without replacement
  (Gumbel top-k), q of the i-th child being the distribution without the earlier ones.
  """
  logp = jax.nn.log_softmax(logits, axis=-1)
  to_ids = (lambda x: x) if ids is None else (lambda x: jnp.asarray(ids)[x])
  if sampling.greedy or not sampled:
    scores, local = sampling_lib.top_k(logp, k)
    return to_ids(local), scores, None
  probs = sampling_lib.probabilities(logits, sampling)
  gumbel = jax.random.gumbel(key, probs.shape, probs.dtype)
  keyed = jnp.where(probs > 0, jnp.log(jnp.where(probs > 0, probs, 1.0)) + gumbel, -jnp.inf)
  _, local = sampling_lib.top_k(keyed, k)  # [B, M, k]: a draw without replacement, in order
  earlier = jnp.cumsum(jax.nn.one_hot(local, probs.shape[-1], dtype=probs.dtype), axis=-2)
  earlier = jnp.concatenate([jnp.zeros_like(earlier[..., :1, :]), earlier[..., :-1, :]], -2)
  q = probs[..., None, :] * (1.0 - earlier)
  q = q / jnp.maximum(jnp.sum(q, -1, keepdims=True), 1e-30)
  if ids is not None:
    q = jnp.zeros(q.shape[:-1] + (vocab,), q.dtype).at[..., jnp.asarray(ids)].set(q)
  return to_ids(local), jnp.take_along_axis(logp, local, -1), q


def _mask(ancestor_slots, base, cache_size: int):
  """[B, W, S]: the context (slots < base) and, past base, the slots set in
  ancestor_slots[B, W, R] (R slots of the tree region)."""
  b, w, r = ancestor_slots.shape
  offset = jnp.arange(cache_size)[None] - base[:, None]  # [B, S]
  index = jnp.broadcast_to(jnp.clip(offset, 0, r - 1)[:, None], (b, w, cache_size))
  inside = jnp.take_along_axis(ancestor_slots, index, axis=2)
  return (offset < 0)[:, None] | (((offset >= 0) & (offset < r))[:, None] & inside)


def static_tree(
  feed, carry, root_logits, root_state, base, cache_size, shape, key, sampling, **ids
):
  """Fills `shape` (a TreeShape); node i (1-based) is written at slot base + i - 1.

  Returns (TreeDraft, carry).
  """
  b, n = root_logits.shape[0], shape.size
  anc = shape.ancestor_matrix()[:, 1:]  # [N+1, N]: which nodes 1..N are ancestors-or-self
  kids = {u: [i + 1 for i, p in enumerate(shape.parents) if p == u] for u in range(n + 1)}
  logits_at, states_at = {0: root_logits}, {0: root_state}
  tokens, qs = [None] * (n + 1), [None] * (n + 1)
  keys = jax.random.split(key, shape.depth)
  slots = -np.ones(n, np.int32)
  for d, level in enumerate(shape.levels):
    parents = sorted({shape.parents[i - 1] for i in level})
    width = max(len(kids[u]) for u in parents)
    stacked = jnp.stack([logits_at[u] for u in parents], axis=1)  # [B, M, V']
    toks, _, q = children(stacked, width, keys[d], sampling, True, **ids)
    for m, u in enumerate(parents):
      for r, i in enumerate(kids[u]):
        tokens[i] = toks[:, m, r]
        qs[i] = None if q is None else q[:, m, r]
    fed = [i for i in level if kids[i]]
    if not fed:
      continue
    slots[np.asarray(fed) - 1] = np.asarray(fed) - 1
    node_slots = base[:, None] + jnp.asarray(np.asarray(fed) - 1, jnp.int32)[None]
    mask = _mask(jnp.broadcast_to(jnp.asarray(anc[fed]), (b, len(fed), n)), base, cache_size)
    positions = jnp.broadcast_to((base + d)[:, None], node_slots.shape)  # depth d + 1
    parent_states = jnp.stack([states_at[shape.parents[i - 1]] for i in fed], axis=1)
    feed_tokens = jnp.stack([tokens[i] for i in fed], axis=1)
    out, states, carry = feed(carry, feed_tokens, parent_states, positions, node_slots, mask)
    for w, i in enumerate(fed):
      logits_at[i], states_at[i] = out[:, w], states[:, w]
  draft = tree_lib.TreeDraft(
    tokens=jnp.stack(tokens[1:], axis=1).astype(jnp.int32),
    parents=shape.parents_array(b),
    q=None if qs[1] is None else jnp.stack(qs[1:], axis=1),
    cache_slots=jnp.where(jnp.asarray(slots) >= 0, base[:, None] + jnp.asarray(slots), -1),
  )
  return draft, carry


def dynamic_tree(feed, carry, root_logits, root_state, base, cache_size, spec, sampling, **ids):
  """EAGLE-2's dynamic tree of spec.size nodes (see the module docstring); the frontier
  of depth d is written at slots base + (d - 1) * width + j. Returns (TreeDraft, carry)."""
  k, n, depth = spec.width, spec.size, spec.depth
  b = root_logits.shape[0]
  rows = jnp.arange(b)[:, None]
  span = max(depth - 1, 1) * k  # slots the fed levels use
  toks, scores, _ = children(root_logits[:, None], k, None, sampling, False, **ids)
  pool = {
    'tokens': [toks[:, 0]],
    'scores': [scores[:, 0]],
    'parents': [jnp.full((b, k), -1, jnp.int32)],  # pool indices; -1: the root
    'depths': [jnp.ones((b, k), jnp.int32)],
    'slots': [jnp.full((b, k), -1, jnp.int32)],
  }
  frontier = jnp.broadcast_to(jnp.arange(k, dtype=jnp.int32), (b, k))  # pool indices
  seen = jnp.zeros((b, k, span), bool)  # each frontier node's ancestors' slots
  states = jnp.broadcast_to(root_state[:, None], (b, k) + root_state.shape[1:])
  for d in range(1, depth):
    size = k + (d - 1) * k * k  # pool so far

    def take(field, f=frontier):
      return jnp.take_along_axis(jnp.concatenate(pool[field], 1), f, axis=1)

    own = (d - 1) * k + jnp.arange(k, dtype=jnp.int32)  # this level's slots past base
    seen = seen | jax.nn.one_hot(own, span, dtype=bool)[None]
    slots = base[:, None] + own[None]
    positions = jnp.broadcast_to((base + d - 1)[:, None], slots.shape)  # depth d
    mask = _mask(seen, base, cache_size)
    logits, out_states, carry = feed(carry, take('tokens'), states, positions, slots, mask)
    pool['slots'] = [jnp.concatenate(pool['slots'], 1).at[rows, frontier].set(slots)]
    kid_toks, kid_scores, _ = children(logits, k, None, sampling, False, **ids)
    kid_scores = take('scores')[:, :, None] + kid_scores  # cumulative, [B, K, K]
    pool['tokens'].append(kid_toks.reshape(b, k * k))
    pool['scores'].append(kid_scores.reshape(b, k * k))
    pool['parents'].append(jnp.repeat(frontier, k, axis=1))
    pool['depths'].append(jnp.full((b, k * k), d + 1, jnp.int32))
    pool['slots'].append(jnp.full((b, k * k), -1, jnp.int32))
    # The next frontier: the k best new candidates, with their parents' slots and states.
    _, best = jax.lax.top_k(kid_scores.reshape(b, k * k), k)
    seen = jnp.take_along_axis(seen, (best // k)[..., None], axis=1)
    idx = (best // k).reshape((b, k) + (1,) * (out_states.ndim - 2))
    states = jnp.take_along_axis(out_states, idx, axis=1)
    frontier = size + best
  tokens, scores, parents, depths, slots = (
    jnp.concatenate(pool[f], 1) for f in ('tokens', 'scores', 'parents', 'depths', 'slots')
  )
  # A child never scores above its parent; the depth term breaks ties in its favour.
  _, chosen = jax.lax.top_k(scores - 1e-4 * depths.astype(scores.dtype), n)
  order = jnp.argsort(jnp.take_along_axis(depths, chosen, 1) * tokens.shape[1] + chosen, axis=1)
  chosen = jnp.take_along_axis(chosen, order, axis=1)  # parents before children
  node_of = (
    jnp.zeros(tokens.shape, jnp.int32).at[rows, chosen].set(jnp.arange(1, n + 1, dtype=jnp.int32))
  )
  parent_pool = jnp.take_along_axis(parents, chosen, 1)
  tree_parents = jnp.where(
    parent_pool < 0, 0, jnp.take_along_axis(node_of, jnp.maximum(parent_pool, 0), 1)
  )
  draft = tree_lib.TreeDraft(
    tokens=jnp.take_along_axis(tokens, chosen, 1).astype(jnp.int32),
    parents=tree_parents,
    cache_slots=jnp.take_along_axis(slots, chosen, 1),
  )
  return draft, carry


def dynamic_pool(spec) -> int:
  """How many candidates a dynamic tree of `spec` chooses its nodes from."""
  return spec.width + (spec.depth - 1) * spec.width**2


def check_tree(name: str, spec) -> None:
  if spec.shape is None and spec.size > dynamic_pool(spec):
    raise ValueError(
      f'{name}: a dynamic tree of depth {spec.depth} and width {spec.width} has '
      f'{dynamic_pool(spec)} candidates, fewer than its size {spec.size}'
    )
