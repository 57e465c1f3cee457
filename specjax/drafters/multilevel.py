"""Multi-level speculation: a draft model that is itself decoded speculatively.

ML-SpecQD (Georganas et al. 2025) drafts for a 16-bit target with the target's own weights
in 4 bits, and speeds that draft up with a still smaller draft; Cascade drafting (Chen et
al. 2023) and TriForce (Sun et al. 2024) stack levels the same way. Here the upper level
is a draft model (`quantized`: the target's GGUF blocks) and the lower level any drafter
(`ngram` prompt lookup, another model, or a multi-level drafter again). Each round:

  1. the lower level proposes k tokens after the text so far (context + this proposal's
     tokens), with its distributions q2 (one-hot for a deterministic lookup);
  2. the upper model scores [the last two tokens, those k] in one forward of k + 2 rows
     (its cache holds the text but its last two tokens, as ModelDrafter's does), which
     gives its distributions q1 at the k + 1 positions after the text;
  3. rejection sampling of the k tokens against q1 (verify/rejection.py) keeps a prefix
     and draws the next token: a + 1 new tokens, each an exact sample of q1 given the text
     before it (greedy: q1's argmax), with that q1 recorded for the target's verifier.

Rounds repeat, in one `lax.while_loop` of static shapes, until every row has gamma tokens
(at most gamma rounds). So the target's verifier sees the same (p, q1) as with the upper
draft alone, and the output stays exactly the target's whatever the lower level does. A
round costs one upper forward of k + 2 rows for 1..k+1 tokens, where the upper draft alone
costs a forward per token.
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
from specjax.verify import common, rejection


@struct.dataclass
class MultiLevelState:
  upper: Any  # the upper draft model's state (ModelDraftState)
  lower: Any  # the lower level's own state


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
      upper=one(self.upper, params['upper']), lower=one(self.lower, params['lower'])
    )

  def propose(self, params, draft_state, state, key, gamma, sampling):
    k, b = self.k, state.tokens.shape[0]
    rows = jnp.arange(b)[:, None]
    width = gamma + k + 1  # a round past gamma - 1 writes up to k + 1 more
    base, pos = state.num_generated, state.prompt_lens + state.num_generated
    upper_state = draft_state.upper

    def view(filled, toks):
      """The decode state with this proposal's first `filled` tokens emitted."""
      cols = base[:, None] + jnp.arange(width)
      tokens = state.tokens.at[rows, cols].set(toks, mode='drop')
      return state.replace(tokens=tokens, num_generated=base + filled)

    def round_(carry):
      filled, toks, qs, cache, lower, key = carry
      key, k_lower, k_upper = jax.random.split(key, 3)
      text = view(filled, toks)
      drafted, q2, lower = self.lower.propose(params['lower'], lower, text, k_lower, k, sampling)
      inputs = jnp.concatenate([last_two_tokens(upper_state, text), drafted], axis=1)
      logits, cache = self.upper.forward(
        params['upper'], inputs, cache.with_lengths(pos + filled - 2)
      )
      q1 = sampling_lib.probabilities(logits[:, 1:], sampling)  # [B, k + 1, V]
      if q2 is None:  # a deterministic lower level: one-hot
        q2 = jax.nn.one_hot(drafted, q1.shape[-1], dtype=q1.dtype)
      kept, nxt = common.run_plan(rejection.rejection_plan(q1, q2, drafted), k_upper)
      new = jnp.concatenate([drafted, jnp.zeros((b, 1), drafted.dtype)], axis=1)
      new = new.at[jnp.arange(b), kept].set(nxt.astype(new.dtype))  # drafted[:kept], next
      live = filled < gamma  # rows already done keep what they have
      cols = filled[:, None] + jnp.arange(k + 1)
      write = live[:, None] & (jnp.arange(k + 1)[None] <= kept[:, None])
      old = jnp.take_along_axis(toks, cols, axis=1)
      toks = toks.at[rows, cols].set(jnp.where(write, new, old))
      old_q = jnp.take_along_axis(qs, cols[..., None], axis=1)
      qs = qs.at[rows, cols].set(jnp.where(write[..., None], q1, old_q))
      filled = jnp.where(live, filled + kept + 1, filled)
      lower = self.lower.update(lower, view(filled, toks), TargetOut())
      return filled, toks, qs, cache, lower, key

    up = self.upper
    cache = up.caught_up(params['upper'], upper_state, state) if up.resync else upper_state.cache
    vocab = self.upper.vocab_size
    carry = (
      jnp.zeros((b,), jnp.int32),
      jnp.zeros((b, width), jnp.int32),
      jnp.zeros((b, width, vocab), jnp.float32),
      cache,
      draft_state.lower,
      key,
    )
    filled, toks, qs, cache, lower, _ = jax.lax.while_loop(
      lambda c: jnp.any(c[0] < gamma), round_, carry
    )
    del filled
    out = MultiLevelState(upper=upper_state.replace(cache=cache), lower=lower)
    return toks[:, :gamma], qs[:, :gamma], out

  def update(self, draft_state, state, target=TargetOut()):
    return MultiLevelState(
      upper=self.upper.update(draft_state.upper, state, target),
      lower=self.lower.update(draft_state.lower, state, target),
    )


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


MULTILEVEL = DraftKind(
  usage=MULTILEVEL_USAGE,
  parse=_parse,
  build=_build,
  group=_group,
  classes=(MultiLevelDrafter,),
  resync=_resync,
)
