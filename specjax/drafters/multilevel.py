"""Multi-level speculation: a draft model that is itself decoded speculatively.

ML-SpecQD (Georganas et al. 2025) drafts for a 16-bit target with the target's own weights
in 4 bits, and speeds that draft up with a still smaller draft; Cascade drafting (Chen et
al. 2023) and TriForce (Sun et al. 2024) stack levels the same way. Here the upper level
is a draft model (`quantized`: the target's GGUF blocks) and the lower level any drafter
(`ngram` prompt lookup, another model, or a multi-level drafter again). A proposal:

  1. the upper model's first step feeds the text's last two tokens (its cache holds the
     text but those, as ModelDrafter's does) and draws one token from its distribution q1;
     from then on its cache holds the whole text but the last token;
  2. after each step the lower level proposes k tokens after the text so far (context +
     this proposal's tokens), with its distributions q2 (one-hot for a deterministic
     lookup). Where it has some for a row, a round: the upper model scores [the last
     token, those k] in one forward of k + 1 rows, which gives q1 at the k + 1 positions
     after the text, and rejection sampling of the k tokens against q1
     (verify/rejection.py) keeps a prefix and draws the next token: a + 1 new tokens, each
     an exact sample of q1 given the text before it (greedy: q1's argmax). Where no row has
     any (a lookup that found nothing), a narrow step instead: the last token alone, one
     row, one token drawn from q1, as the upper draft alone would;
  3. every token is recorded with the q1 it was drawn from, for the target's verifier.

Steps repeat, in `lax.while_loop`s of static shapes, until every row has gamma tokens. So
the target's verifier sees the same (p, q1) as with the upper draft alone, and the output
stays exactly the target's whatever the lower level does. A round costs one upper forward
of k + 1 rows for 1..k+1 tokens; a miss costs what a token of the upper draft alone does.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import jax
import jax.numpy as jnp
from flax import struct

from specjax.core import sampling as sampling_lib
from specjax.core.contract import Drafter, DraftKind, TargetOut
from specjax.drafters.model import ModelDrafter, last_two_tokens
from specjax.models import sharding
from specjax.verify import common, rejection

# The columns of MultiLevelState.counts (MultiLevelDrafter.counters names them).
COUNTS = ('first', 'narrow', 'wide', 'lower_kept', 'lower_rejected')


@struct.dataclass
class MultiLevelState:
  upper: Any  # the upper draft model's state (ModelDraftState)
  lower: Any  # the lower level's own state
  # [B, len(COUNTS)] int32, summed over the decode: the upper model's first, narrow and
  # wide steps (the batch's, in every row), and per row the lower level's tokens the wide
  # steps kept and the wide steps that rejected one (while the row was still drafting).
  counts: Any = None


@dataclasses.dataclass(frozen=True)
class MultiLevelDrafter(Drafter):
  """`upper` (a draft model) drafts for the target; `lower` drafts for `upper`, k tokens a
  round. Parameters: {'upper': ..., 'lower': ...}."""

  upper: ModelDrafter
  lower: Drafter
  k: int = 3
  name: str = dataclasses.field(default='multilevel', compare=False)

  def __post_init__(self):
    if not isinstance(self.k, int) or self.k < 1:
      raise ValueError(f'multilevel: k (lower-level tokens per round) must be >= 1, got {self.k}')
    if self.lower.vocab_size != self.upper.vocab_size:
      raise ValueError(
        f'multilevel: the lower level ({self.lower.name}) drafts over {self.lower.vocab_size} '
        f'tokens but the upper ({self.upper.name}) over {self.upper.vocab_size}'
      )
    if self.lower.capture:
      raise ValueError(
        f"multilevel: {self.lower.name} reads the target's features, which the upper draft "
        'model does not give; use it as the draft itself'
      )

  @property
  def vocab_size(self) -> int:
    return self.upper.vocab_size

  def init(
    self, params, prompt_tokens, prompt_lens, cache_size, constrain=None, target=TargetOut()
  ):
    def one(drafter, p):
      return drafter.init(p, prompt_tokens, prompt_lens, cache_size, constrain, target)

    return MultiLevelState(
      upper=one(self.upper, params['upper']),
      lower=one(self.lower, params['lower']),
      counts=jnp.zeros((prompt_tokens.shape[0], len(COUNTS)), jnp.int32),
    )

  def counters(self, draft_state) -> dict[str, jax.Array]:
    """{name: [B] int32} of MultiLevelState.counts (COUNTS): what the cost model's
    per-level prediction reads (control/cost_model.multilevel_draft_units)."""
    return {name: draft_state.counts[:, i] for i, name in enumerate(COUNTS)}

  def _start(self, params, draft_state, state, gamma, sampling, filled, lower, key):
    """(steps, carry) a proposal starts from: `filled` tokens drawn per row, the lower
    level's state `lower` (after its opening proposal), the upper cache caught up."""
    b, up = state.tokens.shape[0], self.upper
    upper_state = draft_state.upper
    cache = up.caught_up(params['upper'], upper_state, state) if up.resync else upper_state.cache
    width = gamma + self.k + 1  # a round past gamma - 1 writes up to k + 1 more
    carry = _Carry(
      filled=jnp.full((b,), filled, jnp.int32),
      toks=jnp.zeros((b, width), jnp.int32),
      qs=jnp.zeros((b, width, up.vocab_size), jnp.float32),
      cache=cache,
      lower=lower,
      key=key,
      proposal=(jnp.zeros((b, self.k), jnp.int32), None),
      counts=draft_state.counts,
    )
    return _Steps(self, params, state, gamma, sampling), carry

  def propose(self, params, draft_state, state, key, gamma, sampling):
    upper_state = draft_state.upper
    # The lower level proposes once on the text as it stands, before the first step adds a
    # token: a draft model of its own then feeds the text's last two tokens where they
    # belong (its cache, like the upper's, holds all of the text but those). This proposal
    # is not checked; the steps' own are.
    key, k_lower = jax.random.split(key)
    lower = self.lower.propose(params['lower'], draft_state.lower, state, k_lower, self.k, sampling)
    run, carry = self._start(params, draft_state, state, gamma, sampling, 0, lower[2], key)

    def until_found(carry):  # narrow steps while no row's lower level proposes anything
      def empty(c):
        return ~self.lower.has_proposals(c.lower) & jnp.any(c.filled < gamma)

      return jax.lax.while_loop(empty, run.narrow, carry)

    # The upper cache holds the text but its last two tokens (ModelDrafter's convention):
    # the first step feeds both and draws one token; from then on it holds all but the
    # last, and each step feeds that token (and a round the lower level's k after it).
    carry = until_found(run.first(carry, last_two_tokens(upper_state, state)))
    carry = jax.lax.while_loop(
      lambda c: jnp.any(c.filled < gamma), lambda c: until_found(run.wide(c)), carry
    )
    out = MultiLevelState(
      upper=upper_state.replace(cache=carry.cache), lower=carry.lower, counts=carry.counts
    )
    return carry.toks[:, :gamma], carry.qs[:, :gamma], out

  def step_for_timing(self, params, draft_state, state, gamma, sampling, kind: str):
    """(step, carry): one `kind` step of a proposal ('first': the two-row forward that
    starts it, 'narrow': one row, 'wide': the k + 1-row round), each followed by the lower
    level's update and proposal, as `propose` runs them; `step(carry)` is (a carry from
    which the same step runs again: the proposal's length and its lower proposal kept, the
    caches and the lower level's state carried; [B] int32 of the new lower proposal, to
    keep it live), for bench/costs to time a step alone."""
    if kind not in ('first', 'narrow', 'wide'):
      raise ValueError(f"multilevel step: kind must be 'first', 'narrow' or 'wide', got {kind!r}")
    filled = int(kind != 'first')  # a first step starts a proposal; the others continue one
    run, carry = self._start(
      params, draft_state, state, gamma, sampling, filled, draft_state.lower, state.key
    )
    last_two = last_two_tokens(draft_state.upper, state)
    once = {
      'first': lambda c: run.first(c, last_two),
      'narrow': run.narrow,
      'wide': run.wide,
    }[kind]

    def step(c: _Carry) -> tuple[_Carry, jax.Array]:
      after = once(c)
      return after.replace(filled=c.filled, proposal=c.proposal), after.proposal[0][:, -1]

    return step, carry

  def update(self, draft_state, state, target=TargetOut()):
    return MultiLevelState(
      upper=self.upper.update(draft_state.upper, state, target),
      lower=self.lower.update(draft_state.lower, state, target),
      counts=draft_state.counts,
    )


@struct.dataclass
class _Carry:
  """A proposal in progress: `filled` tokens of `toks` drawn per row, with the upper
  model's distributions `qs` they were drawn from; the lower level's state and its latest
  `proposal` (tokens, distributions or None) after the text so far."""

  filled: jax.Array  # [B]
  toks: jax.Array  # [B, gamma + k + 1]
  qs: jax.Array  # [B, gamma + k + 1, V]
  cache: Any
  lower: Any
  key: jax.Array
  proposal: Any
  counts: jax.Array  # MultiLevelState.counts


@dataclasses.dataclass(frozen=True)
class _Steps:
  """The steps of MultiLevelDrafter.propose, each one forward of the upper model."""

  drafter: MultiLevelDrafter
  params: Any
  state: Any  # the decode state the proposal starts from
  gamma: int
  sampling: Any

  def view(self, filled, toks):
    """The decode state with this proposal's first `filled` tokens emitted."""
    state, b = self.state, toks.shape[0]
    cols = state.num_generated[:, None] + jnp.arange(toks.shape[1])
    tokens = state.tokens.at[jnp.arange(b)[:, None], cols].set(toks, mode='drop')
    return state.replace(tokens=tokens, num_generated=state.num_generated + filled)

  def step(self, c: _Carry, inputs, drafted=None, q2=None) -> _Carry:
    """The upper model over `inputs` (the text's last len(inputs) - len(drafted) tokens,
    then `drafted`, the lower level's k): rejection sampling keeps a prefix of `drafted`
    and draws the next token (greedy: q1's argmax); without `drafted` the next token is
    drawn from q1 after the inputs. Then the lower level proposes after the new text."""
    d, b = self.drafter, c.toks.shape[0]
    rows = jnp.arange(b)[:, None]
    key, k_upper, k_lower = jax.random.split(c.key, 3)
    start = self.state.prompt_lens + self.state.num_generated + c.filled - inputs.shape[1]
    if drafted is not None:
      start = start + drafted.shape[1]
    logits, cache = d.upper.forward(self.params['upper'], inputs, c.cache.with_lengths(start))
    n = 1 if drafted is None else d.k + 1  # the tokens this step may emit
    q1 = sampling_lib.probabilities(logits[:, -n:], self.sampling)  # [B, n, V]
    if drafted is None:
      kept = jnp.zeros((b,), jnp.int32)
      new = sampling_lib.sample(logits[:, -1], k_upper, self.sampling)[:, None].astype(jnp.int32)
    else:
      if q2 is None:  # a deterministic lower level: one-hot
        q2 = jax.nn.one_hot(drafted, q1.shape[-1], dtype=q1.dtype)
      kept, nxt = common.run_plan(rejection.rejection_plan(q1, q2, drafted), k_upper)
      new = jnp.concatenate([drafted, jnp.zeros((b, 1), drafted.dtype)], axis=1)
      new = new.at[jnp.arange(b), kept].set(nxt.astype(new.dtype))  # drafted[:kept], next
    live = c.filled < self.gamma  # rows already done keep what they have
    cols = c.filled[:, None] + jnp.arange(n)
    write = live[:, None] & (jnp.arange(n)[None] <= kept[:, None])
    old = jnp.take_along_axis(c.toks, cols, axis=1)
    toks = c.toks.at[rows, cols].set(jnp.where(write, new, old))
    old_q = jnp.take_along_axis(c.qs, cols[..., None], axis=1)
    qs = c.qs.at[rows, cols].set(jnp.where(write[..., None], q1, old_q))
    filled = jnp.where(live, c.filled + kept + 1, c.filled)
    kind = 2 if drafted is not None else (0 if inputs.shape[1] == 2 else 1)  # COUNTS' order
    counts = c.counts.at[:, kind].add(1)
    if drafted is not None:  # rows still drafting, in a text not yet finished
      drafting = live & ~self.state.done
      counts = counts.at[:, 3].add(jnp.where(drafting, kept, 0))
      counts = counts.at[:, 4].add((drafting & (kept < d.k)).astype(jnp.int32))
    text = self.view(filled, toks)
    lower = d.lower.update(c.lower, text, TargetOut())
    drafted, q2, lower = d.lower.propose(
      self.params['lower'], lower, text, k_lower, d.k, self.sampling
    )
    return _Carry(filled, toks, qs, cache, lower, key, (drafted, q2), counts)

  def last(self, c: _Carry) -> jax.Array:
    """[B, 1]: the text's last token (one this proposal drew: filled >= 1)."""
    return jnp.take_along_axis(c.toks, jnp.maximum(c.filled - 1, 0)[:, None], axis=1)

  def first(self, c: _Carry, last_two) -> _Carry:
    """One token from a two-row forward of the text's last two tokens."""
    return self.step(c, last_two)

  def narrow(self, c: _Carry) -> _Carry:
    """One token from a one-row forward of the text's last token."""
    return self.step(c, self.last(c))

  def wide(self, c: _Carry) -> _Carry:
    """The lower level's k tokens checked in one forward of k + 1 rows."""
    drafted, q2 = c.proposal
    return self.step(c, jnp.concatenate([self.last(c), drafted], axis=1), drafted, q2)


# ---- the registry's kind: multilevel:UPPER,LOWER[,k=K] ---------------------------------

MULTILEVEL_USAGE = (
  'multilevel:<upper draft model>,<lower draft>[,k=<lower tokens per round>] or, deeper and '
  'inside a method list, multilevel:<upper>+<middle>+...+<lowest> (e.g. '
  'multilevel:quantized,ngram, multilevel:quantized+ngram@4, multilevel:quantized,ngram:2-4,k=4)'
)


def _parse(spec) -> tuple[Any, Any, int]:
  from specjax import registry  # noqa: PLC0415 - the registry names every draft kind

  options = dict(spec.options)
  levels = spec.args[0].split('+') if len(spec.args) == 1 else list(spec.args)
  if len(levels) < 2 or (len(spec.args) > 2) or set(options) - {'k'} or not all(levels):
    raise spec.error(MULTILEVEL_USAGE)
  try:
    k = int(options.get('k', 3))
  except ValueError:
    raise spec.error(MULTILEVEL_USAGE) from None
  if k < 1:
    raise spec.error(MULTILEVEL_USAGE + ' with k >= 1')
  # Deeper chains: the lower level is itself multilevel over the rest.
  texts = (levels[0], levels[1] if len(levels) == 2 else 'multilevel:' + '+'.join(levels[1:]))
  upper, lower = (registry.parse_draft(a) for a in texts)
  if upper[0] in [
    registry.DRAFTS.get(n)
    for n in ('ngram', 'consensus', 'eagle', 'dflash', 'dspark', 'multilevel')
  ]:
    raise spec.error(
      f'{MULTILEVEL_USAGE}: the upper level {levels[0]!r} must be a draft model (quantized, '
      'layers, truncated, distilled or a model path)'
    )
  return texts, (upper, lower), k


def _build(settings, target, dtype):
  (upper_text, lower_text), (upper, lower), k = settings
  up, up_params = upper[0].build(upper[1], target, dtype)
  low, low_params = lower[0].build(lower[1], target, dtype)
  if not isinstance(up, ModelDrafter):
    raise ValueError(
      f'draft multilevel: the upper level {upper_text!r} must be a draft model (quantized, '
      f'layers, truncated, distilled or a model path), not {up.name}'
    )
  name = f'multilevel: {up.name}, its tokens drafted by {low.name} (k={k})'
  drafter = MultiLevelDrafter(up, low, k=k, name=name)
  return drafter, {'upper': up_params, 'lower': low_params}


def _resync(drafter: MultiLevelDrafter, window: int) -> MultiLevelDrafter:
  from specjax import registry  # noqa: PLC0415 - each level's own kind

  upper, lower = (registry.resync(d, window) for d in (drafter.upper, drafter.lower))
  return dataclasses.replace(drafter, upper=upper, lower=lower)


def _group(settings) -> int:
  """Rows drafted together: what both levels need (a consensus lower level groups)."""
  _, ((upper, up), (lower, low)), _ = settings
  return math.lcm(upper.group(up), lower.group(low))


# Each level's parameters lie under 'upper/' or 'lower/' (nested in deeper chains): a model
# level shards as the target does, by the default rules under its prefix.
LEVEL_RULES = tuple(
  (r'^(?:(?:upper|lower)/)+' + pattern[1:] if pattern.startswith('^') else pattern, spec)
  for pattern, spec in sharding.DEFAULT_RULES
)

MULTILEVEL = DraftKind(
  usage=MULTILEVEL_USAGE,
  partition_rules=LEVEL_RULES,
  parse=_parse,
  build=_build,
  group=_group,
  classes=(MultiLevelDrafter,),
  resync=_resync,
)
