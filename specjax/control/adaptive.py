"""Adaptive speculation: pick the setting every iteration among off (a plain step), chains
of several draft lengths and static token trees.

The controller keeps exponentially decayed counts of draft-node successes and failures by
depth d and sibling rank r (Sequoia's acceptance model, Chen et al. 2024): whenever a
node's parent was reached (the root, or an accepted node), the node was a trial of
(d, r), and a success when it was accepted too. A chain is a tree of rank-0 nodes, so an
iteration that drafted gamma tokens and kept k is a success at depths 1..k and, if
k < gamma, a failure at depth k + 1 (later ones were never tried). Each cell's
acceptance is a posterior mean shrunk toward its rank's pooled rate (over all depths),
and that toward a prior: `prior_alpha` for rank 0, the rank-0 rate times
`rank_prior`^r for later ranks; so cells never tried take their rank's rate. The expected
tokens of a chain of gamma are 1 + sum_k prod_{j<=k} a[j, 0] (no geometric assumption:
prompt lookup's bimodal runs, a copied span kept whole or a miss at once, are predicted
right), and of a tree 1 + the sum over its nodes of the chance of reaching them (the
product of a[d, r] along the node's path). Each iteration the controller predicts the
speedup of every setting from those and the measured costs
(`specjax/control/cost_model.py`) and moves to the best one only when it beats the
current choice by a factor 1 + `hysteresis`: speculation turns off when no setting pays
by that margin, and back on only when one does, so estimates near break-even do not flap
(between two speculative settings the smaller `retune_hysteresis` applies).

While off, nothing is learned, so at the first iteration (`probe_first`: the prior knows
nothing of this draft) and then after `probe_every` plain steps the controller runs
one speculative iteration with the setting it predicts best (a probe: the setting it
would turn back on with, so the evidence is the evidence that matters); each probe that leaves
it off doubles the wait before the next (up to `probe_every * probe_backoff` steps) unless it
paid for itself, so a draft that never pays costs little more than plain decoding. A draft
whose costs cannot beat plain decoding by the margin even if every draft token were
accepted (`AdaptiveConfig.can_pay`: a chain of gamma emits at most gamma + 1 tokens, so a
draft token costing a target step or more never pays) is never probed; it starts on only
where, in step with the prompt (no catch-up), it would pay.
A draft with a cache of its own skips plain steps and catches up on them when it drafts
again (specjax/drafters/model.py); the controller charges that as `catch_up_cost` per
iteration on turning on (a catch-up of L skipped tokens spread over as many iterations),
in its turn-on decisions, its probes and `can_pay`. While a chain runs, ranks
past 0 are never seen, so every `explore_every` iterations the largest tree runs once
(a tree probe) to keep their estimates honest. Everything is jnp code inside the jitted
loop: no host decision. The loop (specjax/decode/loop.py) runs each setting's ordinary
iteration, in place, for as long as the controller keeps it.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct

from specjax.control import cost_model
from specjax.core.tree import TreeShape


@dataclasses.dataclass(frozen=True)
class AdaptiveConfig:
  """Static controller settings (a jit static argument, so it must stay hashable).

  gammas: the chain draft lengths compiled into the loop; 0 (off) is always added.
  trees: static tree shapes compiled into the loop (specjax.core.tree.TreeShape).
  draft_cost, verify_cost: per gamma, in units of one plain target step (measured with
    `specjax.bench.costs.measure`); the defaults describe a free draft.
  tree_draft_cost, tree_verify_cost: the same per tree; the default verification cost
    1 + 0.05 N for N nodes is this 2-core CPU's measured slope (BENCHMARKS.md).
  catch_up_cost: what feeding one skipped token costs a draft with a cache of its own
    (target steps; 0: a draft that never lags, such as prompt lookup). Turning on after
    L plain steps costs L of them, charged as one per iteration (see the module docstring).
  """

  gammas: tuple[int, ...] = (1, 2, 4)
  draft_cost: tuple[float, ...] | None = None
  verify_cost: tuple[float, ...] | None = None
  trees: tuple[TreeShape, ...] = ()
  tree_draft_cost: tuple[float, ...] | None = None
  tree_verify_cost: tuple[float, ...] | None = None
  decay: float = 0.97  # weight of older evidence per observed iteration (~33 iterations)
  prior_alpha: float = 0.5
  prior_weight: float = 0.5
  # How many observations' weight a cell's (depth > 1, rank) estimate gives its rank's
  # pooled rate: a cell with a few failures and nothing since (its depth no longer drafted)
  # is not left below the rest on that alone. At 0.5 two misses at depth 2 of a draft
  # accepting 0.97 held quantized@adaptive at gamma 1 for 43 iterations (HumanEval, issue 27).
  cell_weight: float = 4.0
  rank_prior: float = 0.5  # prior of a rank-r child's acceptance: rank 0's times this^r
  hysteresis: float = 0.1
  # The margin between two speculative settings (a longer chain, a tree): no catch-up or
  # probe hangs on such a move, and the full margin kept the quantized draft at gamma 2
  # where gamma 4 paid 7% more (1.43x against 1.62x fixed, HumanEval, issue 27).
  retune_hysteresis: float = 0.025
  probe_every: int = 16
  probe_backoff: int = 8  # the wait between probes grows up to probe_every * probe_backoff
  probe_largest: bool = False  # probe with the largest gamma, not the best predicted setting
  explore_every: int = 32  # while on a chain, run the largest tree once this often (0: never)
  start_on: bool = True  # start at the best predicted setting where it beats off by the margin
  # Where the prior leaves it off, probe at the first iteration rather than after
  # probe_every plain steps: the draft is still in step with the prompt, so the probe costs
  # no catch-up, and the prior (alpha 0.5) says nothing about this draft on this prompt.
  # Waiting cost quantized@adaptive 16 plain steps of 128 tokens, 0.91-0.95 of gamma 4
  # (HumanEval, issue 27).
  probe_first: bool = True
  catch_up_cost: float = 0.0
  # 'controller': the setting from the acceptance seen so far (this module); 'confidence':
  # from the drafter's confidences for the proposal it is about to make (control/scheduled.py;
  # drafters with a confidence head, chains only).
  schedule: str = 'controller'

  def __post_init__(self):
    gammas = tuple(self.gammas)
    if any(not isinstance(g, int) or g < 1 for g in gammas) or (
      list(gammas) != sorted(set(gammas))
    ):
      raise ValueError(f'adaptive gammas must be increasing integers >= 1, got {self.gammas}')
    trees = tuple(self.trees)
    if any(not isinstance(t, TreeShape) for t in trees):
      raise ValueError(
        'adaptive trees must be static shapes (specjax.core.tree.TreeShape, e.g. '
        f"parse_shape('4x2x1')): dynamic trees have no shape to predict, got {self.trees}"
      )
    if len(set(trees)) != len(trees):
      raise ValueError(f'adaptive trees must be distinct, got {[t.describe() for t in trees]}')
    if not gammas and not trees:
      raise ValueError('adaptive control needs at least one draft length or tree to choose')
    object.__setattr__(self, 'gammas', gammas)
    object.__setattr__(self, 'trees', trees)
    for name, count, default in (
      ('draft_cost', gammas, lambda g: 0.0),
      ('verify_cost', gammas, lambda g: 1.0),
      ('tree_draft_cost', trees, lambda t: 0.0),
      ('tree_verify_cost', trees, lambda t: 1.0 + 0.05 * t.size),
    ):
      value = getattr(self, name)
      if value is None:
        value = tuple(default(x) for x in count)
      value = tuple(float(v) for v in value)
      per = 'gamma' if name in ('draft_cost', 'verify_cost') else 'tree'
      if len(value) != len(count) or any(v < 0 for v in value):
        raise ValueError(
          f'adaptive {name} needs one non-negative cost per {per} '
          f'{gammas if per == "gamma" else len(trees)}, got {getattr(self, name)}'
        )
      object.__setattr__(self, name, value)
    if not 0 < self.decay <= 1:
      raise ValueError(f'adaptive decay must lie in (0, 1], got {self.decay}')
    if not 0 <= self.prior_alpha <= 1 or self.prior_weight <= 0 or self.cell_weight <= 0:
      raise ValueError(
        'adaptive prior needs 0 <= prior_alpha <= 1, prior_weight > 0 and cell_weight > 0'
      )
    if not 0 <= self.rank_prior <= 1:
      raise ValueError(f'adaptive rank_prior must lie in [0, 1], got {self.rank_prior}')
    if (
      min(self.hysteresis, self.retune_hysteresis) < 0
      or min(self.probe_every, self.probe_backoff) < 1
    ):
      raise ValueError('adaptive hysteresis must be >= 0, probe_every and probe_backoff >= 1')
    if self.explore_every < 0:
      raise ValueError(f'adaptive explore_every must be >= 0, got {self.explore_every}')
    if self.catch_up_cost < 0:
      raise ValueError(f'adaptive catch_up_cost must be >= 0, got {self.catch_up_cost}')
    if self.schedule not in ('controller', 'confidence'):
      raise ValueError(f"adaptive schedule is 'controller' or 'confidence', got {self.schedule!r}")
    if self.schedule == 'confidence' and trees:
      raise ValueError('a confidence schedule chooses among chains: give no trees')

  @classmethod
  def from_costs(cls, costs, gammas=None, trees=(), **kwargs) -> AdaptiveConfig:
    """Settings with the measured `costs` (a specjax.control.cost_model.Costs); each tree
    needs its costs measured under its shape's describe() name (Costs.tree_ms)."""
    gammas = tuple(sorted(costs.draft_ms) if gammas is None else gammas)
    units = [costs.units(g) for g in gammas]
    tree_units = [costs.tree_units(t) for t in trees]
    return cls(
      gammas=gammas,
      draft_cost=tuple(round(d, 4) for d, _ in units),
      verify_cost=tuple(round(v, 4) for _, v in units),
      trees=tuple(trees),
      tree_draft_cost=tuple(round(d, 4) for d, _ in tree_units) if trees else None,
      tree_verify_cost=tuple(round(v, 4) for _, v in tree_units) if trees else None,
      **kwargs,
    )

  @property
  def max_wait(self) -> int:
    """The most plain steps in a row (a draft model's cache may lag this far behind)."""
    return self.probe_every * self.probe_backoff

  @property
  def arms(self) -> tuple[int | TreeShape, ...]:
    """Setting index -> 0 (off), a chain's gamma, or a tree shape."""
    return (0, *self.gammas, *self.trees)

  @property
  def choices(self) -> tuple[int, ...]:
    """Setting index -> the tokens it drafts along its deepest path (0: off)."""
    return tuple(a if isinstance(a, int) else a.depth for a in self.arms)

  @property
  def depth(self) -> int:
    """The deepest draft of any setting."""
    return max(self.choices)

  @property
  def costs(self) -> np.ndarray:
    """Setting index -> the cost of one iteration in target steps (off: 1)."""
    chains = [d + v for d, v in zip(self.draft_cost, self.verify_cost)]
    trees = [d + v for d, v in zip(self.tree_draft_cost, self.tree_verify_cost)]
    return np.array([1.0, *chains, *trees])

  @property
  def ceilings(self) -> np.ndarray:
    """Per speculative setting (arms[1:]), the best speedup it could reach if every draft
    token were accepted (depth d emits at most d + 1 tokens), its catch-up charged."""
    tokens = np.asarray(self.choices[1:]) + 1.0
    return tokens / np.maximum(self.costs[1:] + self.catch_up_cost, 1e-9)

  @property
  def ceiling(self) -> float:
    """The best of `ceilings`: what turning on could reach at all."""
    return float(np.max(self.ceilings))

  @property
  def can_pay(self) -> bool:
    """False: no acceptance makes turning on beat plain decoding by the hysteresis margin,
    so the controller never probes. It may still start on: at the start the draft is in
    step with the prompt, with no catch-up to pay (`init`), and it stays on while that
    pays."""
    return self.ceiling > 1 + self.hysteresis

  @property
  def ranks(self) -> int:
    """Sibling ranks tracked: 1 + the largest rank of any tree (1 with chains only)."""
    return 1 + max((max(t.ranks) for t in self.trees), default=0)


@struct.dataclass
class ControlState:
  successes: jax.Array  # [D, R] float32 per depth and sibling rank, decayed
  failures: jax.Array  # [D, R] float32, decayed
  choice: jax.Array  # [] int32 index into config.arms: the current setting
  since_probe: jax.Array  # [] int32 plain steps since the last speculative iteration
  wait: jax.Array  # [] int32 plain steps before the next probe
  switches: jax.Array  # [] int32 changes of setting so far
  toggles: jax.Array  # [] int32 of which between off and on
  since_tree: jax.Array  # [] int32 iterations since a tree last ran


def pooled_alpha(config: AdaptiveConfig, ctrl: ControlState) -> jax.Array:
  """Posterior mean acceptance of rank 0 over every depth (the geometric model's alpha)."""
  s, f = jnp.sum(ctrl.successes[:, 0]), jnp.sum(ctrl.failures[:, 0])
  return (s + config.prior_alpha * config.prior_weight) / (s + f + config.prior_weight)


def alpha(config: AdaptiveConfig, ctrl: ControlState) -> jax.Array:
  """[D, R] posterior mean acceptance per depth and rank, shrunk toward the rank's rate."""
  w = config.prior_weight
  base = pooled_alpha(config, ctrl)
  prior = base * config.rank_prior ** jnp.arange(ctrl.successes.shape[1], dtype=jnp.float32)
  s, f = jnp.sum(ctrl.successes, 0), jnp.sum(ctrl.failures, 0)
  rank = jnp.where(jnp.arange(s.shape[0]) == 0, base, (s + prior * w) / (s + f + w))
  # Depth 1 is tried by every draft, so its own evidence leads (a collapse turns speculation
  # off at once); deeper cells go untried while shorter chains run, and lean on the rank.
  cell = jnp.where(jnp.arange(ctrl.successes.shape[0])[:, None] == 0, w, config.cell_weight)
  return (ctrl.successes + rank * cell) / (ctrl.successes + ctrl.failures + cell)


def tree_tokens(shape: TreeShape, a: jax.Array) -> jax.Array:
  """Expected tokens of one iteration with `shape`: 1 + the chance of reaching each node."""
  reach = [jnp.ones(())]
  for p, parent in zip(shape.paths, shape.parents):
    reach.append(reach[parent] * a[len(p) - 1, p[-1]])
  return sum(reach)


def predicted(config: AdaptiveConfig, a: jax.Array, catch_up: bool = False) -> jax.Array:
  """Predicted speedup per setting (setting 0, plain decoding, is 1) from acceptance a[D, R];
  with `catch_up`, turning on from off: each draft setting also pays config.catch_up_cost."""
  extra = config.catch_up_cost if catch_up else 0.0
  out = [jnp.ones((1,))]
  if config.gammas:
    runs = 1.0 + jnp.cumsum(jnp.cumprod(a[:, 0]))  # expected tokens of gamma = 1..D
    tokens = runs[jnp.asarray(config.gammas) - 1]
    draft, verify = jnp.asarray(config.draft_cost) + extra, jnp.asarray(config.verify_cost)
    out.append(cost_model.speedup(tokens, draft, verify))
  if config.trees:
    # The rank priors of cells never tried can sum past 1; no tree emits more than depth + 1.
    tokens = jnp.stack([jnp.minimum(tree_tokens(t, a), t.depth + 1.0) for t in config.trees])
    draft = jnp.asarray(config.tree_draft_cost) + extra
    out.append(cost_model.speedup(tokens, draft, jnp.asarray(config.tree_verify_cost)))
  return jnp.concatenate(out)


def _decide(config: AdaptiveConfig, choice: jax.Array, a: jax.Array, catch_up=None) -> jax.Array:
  """The hysteresis rule: move to the best choice only if it beats the current by the margin.
  Turning on from off (`catch_up`, by default when choice is off) pays the catch-up."""
  catch_up = choice == 0 if catch_up is None else catch_up
  pred = jnp.where(catch_up, predicted(config, a, catch_up=True), predicted(config, a))
  best = jnp.argmax(pred).astype(jnp.int32)
  toggle = (choice == 0) | (best == 0)  # turning speculation on or off
  margin = jnp.where(toggle, config.hysteresis, config.retune_hysteresis)
  better = pred[best] > pred[choice] * (1 + margin)
  return jnp.where(better, best, choice)


def init(config: AdaptiveConfig) -> ControlState:
  zeros = jnp.zeros((config.depth, config.ranks), jnp.float32)
  scalar = lambda v: jnp.asarray(v, jnp.int32)
  ctrl = ControlState(
    successes=zeros,
    failures=zeros,
    choice=scalar(0),
    since_probe=scalar(0),
    wait=scalar(config.probe_every),
    switches=scalar(0),
    toggles=scalar(0),
    since_tree=scalar(0),
  )
  if config.start_on:  # the draft starts in step with the prompt: no catch-up to pay
    ctrl = ctrl.replace(choice=_decide(config, jnp.int32(0), alpha(config, ctrl), False))
  if config.probe_first:  # off at the start: the first iteration is a probe (no wait)
    ctrl = ctrl.replace(wait=jnp.where(ctrl.choice == 0, 0, ctrl.wait).astype(jnp.int32))
  return ctrl


def _largest_tree(config: AdaptiveConfig) -> int:
  sizes = [t.size for t in config.trees]
  return 1 + len(config.gammas) + int(np.argmax(sizes))


def choose(config: AdaptiveConfig, ctrl: ControlState) -> jax.Array:
  """The setting to run this iteration: the current choice, a probe when off for long (never
  for a draft that cannot pay), or a tree probe when a chain has run for long. (A
  confidence schedule decided it after the last iteration, from the drafter: see
  loop._controlled.)"""
  if config.schedule == 'confidence':
    return ctrl.choice
  if config.probe_largest and config.gammas:
    probe = jnp.int32(len(config.gammas))
  else:
    pred = predicted(config, alpha(config, ctrl), catch_up=True)
    probe = jnp.argmax(pred[1:]).astype(jnp.int32) + 1
  due = (ctrl.choice == 0) & (ctrl.since_probe >= ctrl.wait) & config.can_pay
  ran = jnp.where(due, probe, ctrl.choice)
  if config.trees and config.explore_every:
    explore = (ctrl.choice > 0) & (ctrl.choice <= len(config.gammas))
    explore &= ctrl.since_tree >= config.explore_every
    ran = jnp.where(explore, jnp.int32(_largest_tree(config)), ran)
  return ran


def _chain_counts(config: AdaptiveConfig, accepted, drafted):
  """[D] successes and failures of chain iterations (rank 0)."""
  tried = drafted > 0
  k = jnp.arange(1, config.depth + 1)[None]  # draft depths
  at = tried[:, None] & (drafted[:, None] >= k) & (accepted[:, None] >= k - 1)  # [B, D] tried
  kept = at & (accepted[:, None] >= k)
  return jnp.sum(kept, axis=0).astype(jnp.float32), jnp.sum(at & ~kept, axis=0).astype(jnp.float32)


def _tree_counts(config: AdaptiveConfig, shape: TreeShape, stops, tried):
  """[D, R] successes and failures of iterations of `shape` that stopped at stops[B]."""
  anc = jnp.asarray(shape.ancestor_matrix())  # [N+1, N+1]: j is i or an ancestor of i
  on_path = anc[jnp.clip(stops, 0, shape.size)] & tried[:, None]  # [B, N+1]
  parents = np.asarray(shape.parents)
  reached = on_path[:, parents]  # [B, N]: the node's parent was on the path
  kept = on_path[:, 1:]
  cells = np.zeros((shape.size, config.depth * config.ranks), np.float32)  # node -> (d, r)
  for i, p in enumerate(shape.paths):
    cells[i, (len(p) - 1) * config.ranks + p[-1]] = 1
  cells = jnp.asarray(cells)
  to_grid = lambda x: (jnp.sum(x, 0).astype(jnp.float32) @ cells).reshape(config.depth, -1)
  return to_grid(reached & kept), to_grid(reached & ~kept)


def update(
  config: AdaptiveConfig,
  ctrl: ControlState,
  ran: jax.Array | int,
  accepted: jax.Array,
  drafted: jax.Array,
  stops: jax.Array | None = None,
) -> ControlState:
  """Folds in one iteration of setting `ran` (per row: accepted, drafted (0: no draft, as
  for a finished row), and for trees the node it stopped at) and re-decides."""
  tried = drafted > 0
  observed = jnp.any(tried)
  # `ran` a Python int (the segmented loop's static arm): only that setting's counting is
  # traced; a traced `ran` counts under every setting and keeps the one that ran.
  static = isinstance(ran, (int, np.integer))
  is_chain = (ran >= 1) & (ran <= len(config.gammas))
  grid = jnp.zeros((config.depth, config.ranks), jnp.float32)
  succ = fail = grid
  if not static or is_chain:
    s_k, f_k = _chain_counts(config, accepted, drafted)
    succ = grid.at[:, 0].set(jnp.where(is_chain, s_k, 0.0))
    fail = grid.at[:, 0].set(jnp.where(is_chain, f_k, 0.0))
  for t, shape in enumerate(config.trees):
    this = ran == 1 + len(config.gammas) + t
    if static and not this:
      continue
    s_t, f_t = _tree_counts(
      config, shape, jnp.zeros_like(accepted) if stops is None else stops, tried
    )
    succ, fail = succ + jnp.where(this, s_t, 0.0), fail + jnp.where(this, f_t, 0.0)
  s = jnp.sum(succ)  # draft tokens kept, over the rows
  # Evidence ages with time, not only with observations: each plain step since the last
  # draft ages it a quarter as much as an observed iteration, so a probe after a long
  # gap weighs more against the stale counts (and a recovery is seen within a few probes).
  age = 1.0 + ctrl.since_probe.astype(jnp.float32) / 4
  decay = jnp.where(observed, config.decay**age, 1.0)
  ran_tree = ran > len(config.gammas)
  ran = jnp.int32(ran)
  ctrl = ctrl.replace(
    successes=decay * ctrl.successes + succ,
    failures=decay * ctrl.failures + fail,
    since_probe=jnp.where(ran == 0, ctrl.since_probe + 1, 0),
    since_tree=jnp.where(ran_tree, 0, ctrl.since_tree + 1),
  )
  new = _decide(config, ctrl.choice, alpha(config, ctrl))
  probed = (ctrl.choice == 0) & (ran != 0)
  # A probe that paid for itself at the price of turning on (its catch-up charged) asks
  # for another soon; one that did not backs off (keeping every token is not enough: a
  # draft costing more than a target step keeps them all and still loses).
  tokens = 1.0 + s / jnp.maximum(jnp.sum(tried), 1)  # per row that drafted
  cost = jnp.asarray(config.costs + config.catch_up_cost, jnp.float32)[ran]
  paid = tokens > (1 + config.hysteresis) * cost
  # (The first probe, `probe_first`, ran after no wait: it waits probe_every either way.)
  backoff = jnp.where(
    paid, config.probe_every, jnp.clip(2 * ctrl.wait, config.probe_every, config.max_wait)
  )
  wait = jnp.where(new != 0, config.probe_every, jnp.where(probed, backoff, ctrl.wait))
  return ctrl.replace(
    choice=new,
    wait=wait.astype(jnp.int32),
    switches=ctrl.switches + (new != ctrl.choice),
    toggles=ctrl.toggles + ((new == 0) != (ctrl.choice == 0)),
  )


def _walk(shape: TreeShape, p: jax.Array, draws: jax.Array) -> jax.Array:
  """Synthetic tree verification: each child reached is accepted with probability p, tried
  in rank order. Returns the node each row stopped at ([B] int32)."""
  parents = jnp.asarray(shape.parents)
  stop = jnp.zeros(draws.shape[:1], jnp.int32)
  for _ in range(shape.depth):
    ok = (parents[None] == stop[:, None]) & (draws < p)  # [B, N] accepted children of stop
    first = jnp.argmax(ok, axis=1)
    stop = jnp.where(jnp.any(ok, axis=1), first + 1, stop).astype(jnp.int32)
  return stop


def simulate(config: AdaptiveConfig, accept_prob, key: jax.Array, batch: int = 1):
  """Runs the controller on synthetic acceptance: accept_prob[t] is iteration t's alpha.

  Chains: each draft token is accepted with that probability until the first rejection.
  Trees: each child reached is accepted with it, siblings tried in rank order (rank r is
  the accepted one with probability alpha (1 - alpha)^r). Returns the setting index run
  at each iteration ([T] int32) and the final state; used by the tests and to tune the
  settings without a model.
  """
  depth = config.depth

  def chain(g, p, k):
    draws = jax.random.uniform(k, (batch, depth))
    ok = (draws < p) & (jnp.arange(depth) < g)
    zeros = jnp.zeros((batch,), jnp.int32)
    return jnp.sum(jnp.cumprod(ok, axis=1), axis=1), jnp.full((batch,), g), zeros

  def tree(shape, p, k):
    stop = _walk(shape, p, jax.random.uniform(k, (batch, shape.size)))
    depth_of = jnp.asarray([0] + [len(q) for q in shape.paths])
    return depth_of[stop], jnp.full((batch,), shape.size), stop

  branches = [lambda p, k: chain(0, p, k)]
  branches += [lambda p, k, g=g: chain(g, p, k) for g in config.gammas]
  branches += [lambda p, k, t=t: tree(t, p, k) for t in config.trees]

  def body(ctrl, inputs):
    p, k = inputs
    ran = choose(config, ctrl)
    accepted, drafted, stops = jax.lax.switch(ran, branches, p, k)
    return update(config, ctrl, ran, accepted, drafted, stops.astype(jnp.int32)), ran

  accept_prob = jnp.asarray(accept_prob, jnp.float32)
  keys = jax.random.split(key, accept_prob.shape[0])
  ctrl, ran = jax.lax.scan(body, init(config), (accept_prob, keys))
  return ran, ctrl
