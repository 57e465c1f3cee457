"""The decoding loop shared by every method: speculative for gamma >= 1, plain
autoregressive for gamma = 0. Same state, same sampling, same stopping rules (`commit`),
so comparisons between methods are fair.

One iteration of speculative decoding, per row:
  1. the drafter proposes gamma tokens with their distributions q;
  2. the target runs once over [last emitted token, draft tokens] (gamma + 1 positions);
  3. the verifier keeps a prefix of the draft and picks one more token from p;
  4. `commit` appends them (EOS and max_new apply), the target cache is rolled back to
     the committed length, and the drafter rolls back its own state.
A row near the end of its cache writes some draft positions past the last slot; those
writes are dropped and the tokens they would verify lie past the row's max_new, so they
are never emitted (no slots need to be reserved for verification).

The code reads as rounds and schedules. A round is one iteration from its key to its
emit step (`_emit`: record, commit, bring the drafter up to date): `_plain` (one target
token), `_chain` and `_tree` (draft, one target forward, verify). A schedule says which
round runs when, and every decoding method is one of three: `_every_iteration` (the
method's round each iteration), `_until_proposal` (drafters that may find nothing to
propose, prompt lookup and consensus: plain steps in an inner loop until some row has a
proposal, so a miss costs an ordinary decoding step) and `_adaptive` (adaptive control
picks off, a chain or a tree each iteration; its arms are fixed methods built once, and
each runs in an inner loop of its own for as long as the controller keeps it, the arms'
loops one after another, so both caches are updated in place, even when the setting changes).
`LoopSpec` carries the static settings every round reads: the method (a frozen
`specjax.decode.method.Method`, as the config named it), the drafter that runs it, the
sampling.

The target is called through its family (`cfg.family`, specjax/core/contract.py) and the
verifier through the registry, so the loop names no architecture and no verifier. The
state's speculative part is a typed SpecState (specjax/core/state.py); prefill.py builds it.
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp

from specjax import registry
from specjax.control import adaptive as adaptive_lib
from specjax.control import scheduled as scheduled_lib
from specjax.core import contract
from specjax.core import sampling as sampling_lib
from specjax.core import tree as tree_lib
from specjax.core.contract import Drafter, TargetOut
from specjax.core.state import DecodeState, commit
from specjax.decode import method as method_lib
from specjax.decode.method import Method
from specjax.verify import common as verify_common
from specjax.verify import tree as tree_verify


def _verify(logits, draft, q, key, *, method: Method, sampling, max_gamma: int):
  """Verifies draft[B, K] against the target's logits[B, K+1, V] over [last token, draft].

  Returns (new tokens [B, max_gamma + 1] of which accepted + 1 count, accepted [B],
  drafted [B], untrusted [B]: whether a draft position's q was not to be trusted).
  """
  gamma = draft.shape[1]
  # The greedy verifier reads only the argmax, which the logits give as the one-hot p would:
  # one pass over [B, K+1, V] instead of two.
  greedy = method.verifier == 'greedy'
  p = logits if greedy else sampling_lib.probabilities(logits, sampling)
  # A deterministic drafter's q is one-hot: built here, only when a draft is verified.
  dists = jax.nn.one_hot(draft, p.shape[-1], dtype=p.dtype) if q is None else q
  accepted, nxt = registry.VERIFIERS.get(method.verifier).verify(p, dists, draft, key)
  untrusted = None
  if q is not None and not greedy:
    untrusted = jnp.any(verify_common.untrusted(q, draft), -1)
  offsets = jnp.arange(gamma + 1)
  new_tokens = jnp.where(
    offsets < accepted[:, None], jnp.pad(draft, ((0, 0), (0, 1))), nxt[:, None]
  )
  new_tokens = jnp.pad(new_tokens, ((0, 0), (0, max_gamma - gamma)))
  return new_tokens, accepted, jnp.full_like(accepted, gamma), untrusted


@dataclasses.dataclass(frozen=True)
class LoopSpec:
  """What a compiled loop decodes with: the target's config, the method, the drafter that
  runs it (None: autoregressive decoding), the sampling and the EOS id (the jitted loop's
  static arguments). Every round and schedule reads its settings here."""

  cfg: object
  method: Method
  sampling: sampling_lib.SamplingConfig
  eos_id: int
  drafter: Drafter | None = None

  def __post_init__(self):
    method_lib.check(self.method, self.drafter)

  def with_method(self, method: Method) -> LoopSpec:
    return dataclasses.replace(self, method=method)


# The emit step, shared by every round.


def _emit(
  state: DecodeState,
  spec: LoopSpec,
  new_tokens,
  accepted,
  drafted,
  cache,
  draft_state,
  *,
  counted=True,
  features=None,
  stop=None,
  untrusted=None,
) -> DecodeState:
  """Records the iteration, commits its tokens and brings the drafter up to date.

  `counted` False (a traced bool) leaves the iteration count as it was. `features` are
  the target's captured features of this iteration's forward (feature drafters). `stop`
  is a tree iteration's stopping node (tree methods record 0 for plain steps);
  `untrusted` [B] bool, rows whose draft handed the verifier an untrusted q (counted).
  """
  drafter = spec.drafter
  start = state.cache.lengths
  record = lambda buf, x: buf.at[:, state.step].set(jnp.where(state.done, -1, x), mode='drop')
  ss = state.spec.replace(
    accepted=record(state.spec.accepted, accepted), drafted=record(state.spec.drafted, drafted)
  )
  if ss.stops is not None:
    ss = ss.replace(stops=record(ss.stops, jnp.zeros_like(accepted) if stop is None else stop))
  if untrusted is not None and ss.untrusted is not None:
    ss = ss.replace(untrusted=ss.untrusted + (untrusted & ~state.done).astype(jnp.int32))
  state = state.replace(cache=cache, step=state.step + jnp.asarray(counted, jnp.int32))
  state = commit(state, new_tokens, accepted + 1, spec.eos_id)
  if drafter is not None:
    draft_state = drafter.update(draft_state, state, TargetOut(features, start))
  return state.replace(spec=ss.replace(draft=draft_state))


def target_forward(params, tokens, cache, cfg, drafter: Drafter | None):
  """The target over tokens[B, T]: (logits, cache, features or None).

  Captures the layers the drafter reads (its `capture`) when it has some.
  """
  capture = drafter.capture if drafter is not None else ()
  return cfg.family.forward(params, tokens, cache, cfg, capture=capture)[:3]


def _split(state: DecodeState):
  """(state with its key advanced, the draft's key, the verifier's key): every round
  splits the state's key once, here. Drafters are handed the state as it was before the
  split (they draw from the key they are given, never from state.key)."""
  key, sub = jax.random.split(state.key)
  k_draft, k_verify = jax.random.split(sub)
  return state.replace(key=key), k_draft, k_verify


def _propose(params, state: DecodeState, key, spec: LoopSpec):
  """The drafter's proposal: (draft, q, draft state); for a tree, draft is a TreeDraft
  (its q inside) and q is None."""
  method, drafter = spec.method, spec.drafter
  if method.tree_spec is not None:
    draft, draft_state = drafter.propose_tree(
      params['draft'], state.spec.draft, state, key, method.tree_spec, spec.sampling
    )
    return draft, None, draft_state
  return drafter.propose(params['draft'], state.spec.draft, state, key, method.depth, spec.sampling)


# Rounds: a plain step, a chain and a tree, each from its key to its emit.


def _plain(params, state: DecodeState, key, draft_state, spec: LoopSpec) -> DecodeState:
  """One target token after the last, sampled with `key`; the drafter's state (which may
  be a proposal left unverified) is brought up to date by the emit step."""
  logits, cache, feats = target_forward(
    params['target'], state.last_tokens[:, None], state.cache, spec.cfg, spec.drafter
  )
  token = sampling_lib.sample(logits[:, 0], key, spec.sampling)[:, None]
  zeros = jnp.zeros_like(state.num_generated)
  token = jnp.pad(token, ((0, 0), (0, spec.method.depth)))
  return _emit(state, spec, token, zeros, zeros, cache, draft_state, features=feats)


def _chain(params, state, draft, q, draft_state, key, spec: LoopSpec, counted=True):
  """Verifies a chain draft[B, K] in one target forward over [last token, draft]."""
  method = spec.method
  logits, cache, feats = target_forward(
    params['target'],
    jnp.concatenate([state.last_tokens[:, None], draft], 1),
    state.cache,
    spec.cfg,
    spec.drafter,
  )
  new_tokens, accepted, drafted, untrusted = _verify(
    logits, draft, q, key, method=method, sampling=spec.sampling, max_gamma=method.depth
  )
  return _emit(
    state,
    spec,
    new_tokens,
    accepted,
    drafted,
    cache,
    draft_state,
    counted=counted,
    features=feats,
    untrusted=untrusted,
  )


def _tree(params, state, draft, draft_state, key, spec: LoopSpec, counted=True) -> DecodeState:
  """Verifies a tree draft in one target forward and commits its accepted path.

  The target runs over [last token, the N nodes] at slots lengths .. lengths + N, each
  node at position lengths + its depth, attending to the context and its ancestors. The
  accepted path's keys and values are then moved to contiguous slots (per row), the
  rest left past the committed length, and the drafter told the path.
  """
  method, cfg, sampling = spec.method, spec.cfg, spec.sampling
  target, model = params['target'], cfg.family
  b, n = draft.tokens.shape
  anc = tree_lib.ancestors(draft.parents)
  depth = tree_lib.depths(anc, draft.parents)
  start = state.cache.lengths
  tokens = jnp.concatenate([state.last_tokens[:, None], draft.tokens], axis=1)  # [B, N+1]
  slots = start[:, None] + jnp.arange(n + 1, dtype=jnp.int32)
  mask = tree_lib.tree_mask(anc, start, state.cache.cache_size)
  capture = spec.drafter.capture
  at = contract.At(start[:, None] + depth, slots, mask)
  out = model.forward(target, tokens, state.cache, cfg, capture=capture, at=at)
  logits, cache = out.logits, out.cache
  # Greedy trees read only the argmax: the logits' is the one-hot p's.
  p = logits if sampling.greedy else sampling_lib.probabilities(logits, sampling)
  path, accepted, nxt = tree_verify.verify_tree(
    p, draft.q, draft, key, greedy=sampling.greedy, max_depth=method.depth, anc=anc, depth=depth
  )
  d = method.depth
  kept = jnp.take_along_axis(tokens, path[:, 1:], axis=1)  # [B, D]
  offsets = jnp.arange(d + 1)
  new_tokens = jnp.where(offsets < accepted[:, None], jnp.pad(kept, ((0, 0), (0, 1))), nxt[:, None])
  cache = model.move_slots(cache, start[:, None] + path, start[:, None] + offsets)
  feats = None
  if capture:
    feats = jnp.take_along_axis(out.features, path[..., None], axis=1)  # the path's, in order
  draft_state = spec.drafter.accept_path(draft_state, draft, path, accepted)
  drafted = jnp.sum(draft.parents >= 0, axis=1).astype(jnp.int32)
  untrusted = None
  if draft.q is not None and not sampling.greedy:
    bad = verify_common.untrusted(draft.q, draft.tokens) & (draft.parents >= 0)
    # A sampled sibling past its parent's support has q all zero: an honest draft with
    # nothing left to propose there. The verifier rejects it; it is not counted as broken.
    exhausted = jnp.all(draft.q == 0, axis=-1)
    untrusted = jnp.any(bad & ~exhausted, -1)
  return _emit(
    state,
    spec,
    new_tokens,
    accepted,
    drafted,
    cache,
    draft_state,
    counted=counted,
    features=feats,
    stop=jnp.take_along_axis(path, accepted[:, None], axis=1)[:, 0],
    untrusted=untrusted,
  )


def _verified(params, state, proposal, key, spec: LoopSpec, counted=True) -> DecodeState:
  """The chain or tree round that verifies `proposal` (_propose's)."""
  draft, q, draft_state = proposal
  if spec.method.tree_spec is not None:
    return _tree(params, state, draft, draft_state, key, spec, counted)
  return _chain(params, state, draft, q, draft_state, key, spec, counted)


# Schedules: which round runs when. A fixed method runs one kind of round every
# iteration, or (drafters that may find nothing) plain steps until a proposal; adaptive
# control picks among fixed methods, its arms, each iteration.


def _every_iteration(params, state: DecodeState, spec: LoopSpec) -> DecodeState:
  """One round of the method: a plain step (gamma 0), or draft and verify."""
  after, k_draft, k_verify = _split(state)
  if not spec.method.speculative:
    return _plain(params, after, k_verify, state.spec.draft, spec)
  return _verified(params, after, _propose(params, state, k_draft, spec), k_verify, spec)


def _until_proposal(params, state: DecodeState, spec: LoopSpec) -> DecodeState:
  """A drafter that may find nothing to propose (`skip_when_empty`): plain steps in a loop
  of their own while no row of the batch has a proposal, then one verification. Neither
  sits inside a branch, so both update the target cache in place (inside a lax.cond XLA
  would copy it). Each plain step counts as one iteration."""
  drafter = spec.drafter

  def propose(s):
    after, k_draft, k_verify = _split(s)
    return after, (_propose(params, s, k_draft, spec), k_verify)

  def empty(carry):
    s, ((_, _, draft_state), _) = carry
    return ~drafter.has_proposals(draft_state) & ~jnp.all(s.done)

  def plain(carry):
    s, ((_, _, draft_state), k_verify) = carry
    return propose(_plain(params, s, k_verify, draft_state, spec))

  state, (proposal, k_verify) = jax.lax.while_loop(empty, plain, propose(state))
  # If every row finished during the plain steps, this verification changes nothing and
  # is not counted.
  return _verified(params, state, proposal, k_verify, spec, counted=~jnp.all(state.done))


def _fixed(spec: LoopSpec):
  """The schedule of a method without adaptive control: f(params, state) -> state."""
  if spec.method.speculative and spec.drafter.skip_when_empty:
    return functools.partial(_until_proposal, spec=spec)
  return functools.partial(_every_iteration, spec=spec)


def _controlled(params, state: DecodeState, *, run, arm: int, spec: LoopSpec) -> DecodeState:
  """One iteration of adaptive arm `arm` (its fixed schedule `run`), then the
  controller's update from what it recorded; under a confidence schedule, the next
  iteration's arm from the drafter's confidences (_scheduled)."""
  config = spec.method.adaptive_config
  before = state.step
  state = run(params, state)
  last = jnp.maximum(state.step - 1, 0)
  counted = state.step > before  # not a verification after every row ended
  ss = state.spec
  drafted = jnp.where(counted, ss.drafted[:, last], 0)
  stops = None if ss.stops is None else ss.stops[:, last]
  control = adaptive_lib.update(config, ss.control, arm, ss.accepted[:, last], drafted, stops)
  state = state.replace(spec=ss.replace(control=control))
  return _scheduled(params, state, spec) if config.schedule == 'confidence' else state


def _scheduled(params, state: DecodeState, spec: LoopSpec) -> DecodeState:
  """Chooses the next iteration's arm from the drafter's confidences in the block it will
  propose then (read before any token of it is drawn; its cache caught up here, which a
  proposal would do anyway, so plain steps never leave it behind)."""
  config, drafter = spec.method.adaptive_config, spec.drafter
  conf, draft_state = drafter.confidences(params['draft'], state.spec.draft, state, config.depth)
  choice = scheduled_lib.choose(config, conf, state.done)
  control = state.spec.control.replace(choice=choice)
  return state.replace(spec=state.spec.replace(draft=draft_state, control=control))


def _arms(spec: LoopSpec) -> list:
  """Adaptive control's arms, by setting index: f(params, state) -> state, one iteration
  of that fixed setting and the controller's update."""
  return [
    functools.partial(_controlled, run=_fixed(spec.with_method(arm)), arm=i, spec=spec)
    for i, arm in enumerate(spec.method.arms)
  ]


def _adaptive(params, state: DecodeState, spec: LoopSpec) -> DecodeState:
  """Adaptive control's loop: each setting runs its own inner while_loop for as long as the
  controller keeps choosing it, and the settings' loops follow one another in one pass of
  the outer loop (a setting not chosen runs none of its iterations). No lax.switch: a switch
  between settings copied both models' caches (about 19 ms a change with the q4 self-draft,
  3% of a HumanEval run), where consecutive while_loops update them in place.

  Every iteration runs the setting the controller chooses at that moment, as a switch per
  iteration would; each pass of the outer loop runs at least one iteration (the setting
  chosen at the end of one setting's loop comes later in this pass or first in the next)."""
  config, arms = spec.method.adaptive_config, _arms(spec)
  # (clipped, as lax.switch clips its index: an arm outside the range never runs, and the
  # outer loop would spin)
  choose = lambda s: jnp.clip(adaptive_lib.choose(config, s.spec.control), 0, len(arms) - 1)

  def segment(s, arm, run):
    stay = lambda c: ~jnp.all(c.done) & (choose(c) == arm)
    return jax.lax.while_loop(stay, functools.partial(run, params), s)

  def body(s):
    for arm, run in enumerate(arms):
      s = segment(s, arm, run)
    return s

  if config.schedule == 'confidence':  # the first iteration's arm too
    state = _scheduled(params, state, spec)
  return jax.lax.while_loop(lambda s: ~jnp.all(s.done), body, state)


def step(
  params,
  state: DecodeState,
  *,
  cfg,
  method: Method,
  sampling: sampling_lib.SamplingConfig,
  eos_id: int,
  drafter: Drafter | None = None,
) -> DecodeState:
  """One iteration for every row (done rows compute but do not change). Under adaptive
  control, one iteration of the setting the controller picks (a lax.switch, so the arms
  copy the target cache; `decode` avoids that)."""
  spec = LoopSpec(cfg, method, sampling, eos_id, drafter)
  if method.is_adaptive:
    arms = [functools.partial(arm, params) for arm in _arms(spec)]
    choice = adaptive_lib.choose(method.adaptive_config, state.spec.control)
    return jax.lax.switch(choice, arms, state)
  return _fixed(spec)(params, state)


def iteration(
  params,
  state: DecodeState,
  *,
  cfg,
  method: Method,
  sampling: sampling_lib.SamplingConfig,
  eos_id: int,
  drafter: Drafter | None = None,
) -> DecodeState:
  """One round of a fixed method as the loop runs it, without the plain steps a lookup
  drafter takes while it has nothing to propose (bench/costs.py times it: the loop's work
  beside the proposal and the target's forward). A fixed method only: adaptive control
  chooses among such iterations."""
  if method.is_adaptive:
    raise ValueError(f'iteration runs one fixed method, not adaptive control ({method.name})')
  return _every_iteration(params, state, LoopSpec(cfg, method, sampling, eos_id, drafter))


def decode(
  params,
  state: DecodeState,
  *,
  cfg,
  method: Method,
  sampling: sampling_lib.SamplingConfig,
  eos_id: int,
  drafter: Drafter | None = None,
) -> DecodeState:
  """Runs the method's schedule inside one lax.while_loop until every row is done."""
  spec = LoopSpec(cfg, method, sampling, eos_id, drafter)
  if method.is_adaptive:
    return _adaptive(params, state, spec)
  body = functools.partial(_fixed(spec), params)
  return jax.lax.while_loop(lambda s: ~jnp.all(s.done), body, state)
