"""Tree verification: the longest acceptable path of a token tree, losslessly.

Multi-draft speculative sampling (SpecInfer, Miao et al. 2024, "multi-step speculative
sampling"): from the root, the children of the current node are tried in order. Child
x_i, drawn from q_i, is accepted with probability min(1, r(x_i) / q_i(x_i)), r being the
current residual (at first the target's p at the node); the walk then moves to the child
and r restarts from p there. A rejection replaces r with the normalised max(0, r - q_i)
and the next sibling is tried. When every child is rejected (or a leaf is reached) the
next token is drawn from r.

Why it is exact: given the history, each sibling's token is drawn from q_i (its own
proposal, which may depend on the earlier siblings), so one try is an ordinary
rejection-sampling step for r: it returns x_i with probability min(r, q_i)(x_i) and
otherwise leaves a draw from the normalised max(0, r - q_i), the next try's target.
Chained over the siblings, the token chosen at a node is distributed as p there;
chained over depth, the emitted path is distributed as the target's. This covers

  * sampled children, i.i.d. from the draft (with replacement: q_i = q);
  * children sampled without replacement (q_i = q with the earlier siblings removed);
  * deterministic children (lookup tries, top-k trees: q_i one-hot, q = None here): a
    try accepts with probability r(x_i), and a rejection zeroes x_i in r.

Greedy verification accepts a child when its token is the target's argmax at its parent.

As for chains, each verifier is a deterministic `TreePlan` (each node's acceptance
probability given that its parent was reached and its earlier siblings rejected, and
the next token's distribution for every stopping node) plus one small random walk, so
tests can enumerate a plan's output law exactly. Imports only core and verify.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import struct

from specjax.core import sampling as sampling_lib
from specjax.core import tree as tree_lib
from specjax.verify import common


@struct.dataclass
class TreePlan:
  thresholds: jax.Array  # [B, N] acceptance probability of node i (1-based) when tried
  residuals: jax.Array  # [B, N+1, V] next-token distribution when the walk stops at node j


def rejection_tree_plan(p, q, tokens, parents) -> TreePlan:
  """p[B, N+1, V] (the target at the root and at every node), q[B, N, V] or None."""
  b, n = tokens.shape
  rows = jnp.arange(b)

  def try_child(residual, i):
    parent = jnp.maximum(parents[:, i], 0)
    used = parents[:, i] >= 0
    r = residual[rows, parent]  # [B, V]
    x = tokens[:, i]
    rx = jnp.take_along_axis(r, x[:, None], 1)[:, 0]
    if q is None:  # one-hot proposal: accept with r(x), else remove x
      accept = rx
      rest = common.normalise_or(r * (jnp.arange(r.shape[-1]) != x[:, None]), r)
    else:
      # An untrusted child (common.untrusted) is never accepted and removes nothing.
      qi, bad = common.trusted(q[:, i][:, None], x[:, None])
      qi, bad = qi[:, 0], bad[:, 0]
      accept = jnp.minimum(1.0, common.ratio(rx, jnp.take_along_axis(qi, x[:, None], 1)[:, 0]))
      accept = jnp.where(bad, 0.0, accept)
      rest = common.normalise_or(jnp.maximum(r - qi, 0.0), r)
    residual = residual.at[rows, parent].set(jnp.where(used[:, None], rest, r))
    return residual, jnp.where(used, accept, 0.0)

  residuals, thresholds = jax.lax.scan(try_child, p, jnp.arange(n))
  return TreePlan(thresholds=thresholds.T, residuals=residuals)


def greedy_tree_plan(p, q, tokens, parents) -> TreePlan:
  del q
  top = sampling_lib.argmax(p)  # [B, N+1]
  at_parent = jnp.take_along_axis(top, jnp.maximum(parents, 0), axis=1)
  keep = ((tokens == at_parent) & (parents >= 0)).astype(p.dtype)
  return TreePlan(thresholds=keep, residuals=jax.nn.one_hot(top, p.shape[-1], dtype=p.dtype))


def stop_distribution(plan: TreePlan, parents) -> jax.Array:
  """Exact P(the walk stops at node j), [B, N+1], from independent uniform draws."""
  b, n = parents.shape
  rows = jnp.arange(b)

  def visit(survive, i):
    parent = jnp.maximum(parents[:, i], 0)
    used = parents[:, i] >= 0
    h = jnp.where(used, plan.thresholds[:, i], 0.0)
    reach = survive[rows, parent] * h
    survive = survive.at[rows, parent].multiply(1.0 - h)
    return survive.at[:, i + 1].set(reach), None

  start = jnp.zeros((b, n + 1), plan.thresholds.dtype).at[:, 0].set(1.0)
  return jax.lax.scan(visit, start, jnp.arange(n))[0]


def walk(thresholds, parents, uniforms) -> jax.Array:
  """[B] the node where the walk stops: children tried in order, u < threshold accepts."""
  take = uniforms < thresholds

  def visit(node, i):
    return jnp.where((parents[:, i] == node) & take[:, i], i + 1, node), None

  start = jnp.zeros(parents.shape[:1], jnp.int32)
  return jax.lax.scan(visit, start, jnp.arange(parents.shape[1]))[0]


def verify_tree(
  p, q, draft: tree_lib.TreeDraft, key, *, greedy: bool, max_depth: int, anc=None, depth=None
):
  """Verifies a tree draft against p[B, N+1, V] (the target's distributions at the root
  and every node, in node order); `anc` and `depth` (tree_lib.ancestors / depths of its
  parents) when the caller has them already.

  Returns (path[B, max_depth + 1]: the accepted nodes from the root, 0 past `accepted`;
  accepted[B] draft tokens kept; next_token[B]).
  """
  if anc is None:
    anc = tree_lib.ancestors(draft.parents)
    depth = tree_lib.depths(anc, draft.parents)
  if greedy:
    plan = greedy_tree_plan(p, None, draft.tokens, draft.parents)
    stop = walk(plan.thresholds, draft.parents, jnp.full(plan.thresholds.shape, 0.5))
    nxt = jnp.take_along_axis(sampling_lib.argmax(p), stop[:, None], 1)[:, 0]
  else:
    plan = rejection_tree_plan(p, q, draft.tokens, draft.parents)
    k_walk, k_next = jax.random.split(key)
    u = jax.random.uniform(k_walk, plan.thresholds.shape, plan.thresholds.dtype)
    stop = walk(plan.thresholds, draft.parents, u)
    dist = jnp.take_along_axis(plan.residuals, stop[:, None, None], axis=1)[:, 0]
    nxt = sampling_lib.sample_probs(dist, k_next)
  accepted = jnp.take_along_axis(depth, stop[:, None], 1)[:, 0]
  return tree_lib.path_to(anc, depth, stop, max_depth), accepted, nxt
