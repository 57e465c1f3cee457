"""Consensus drafts across parallel samples (Li et al. 2025, arXiv 2503.05330).

When N samples of one prompt are decoded as one batch (self-consistency, best-of-N),
the paths tend to say the same things, often at different offsets. Rows come in groups
of `group` consecutive rows sharing a prompt (shape letter M: the rows of a group;
C: candidates). Each row drafts from its group:

  1. its last k tokens are matched against every other row of the group, at every
     position whose continuation is that row's generated text, allowing up to
     `max_mismatches` differing tokens; per other row the best match is kept (fewest
     mismatches, then the most continuation tokens available, then the most recent);
  2. the row's own context is searched too, as prompt lookup does (exact n-grams of
     `n_max` down to 1 tokens, the most recent earlier occurrence): the fallback when no
     other path matches, and one more vote when some do;
  3. the candidate continuations (up to `gamma` tokens each) are merged into a trie whose
     edges are weighted by the paths that support them (weight 1 / (1 + mismatches) for
     another path, `self_weight` for the row's own lookup); the draft is the heaviest
     path, followed greedily from the root while some candidate supports it.

With `proposal='mode'` the draft is a deterministic function of the tokens decoded so
far (q is one-hot); with `proposal='sample'` (temperature > 0 only) the path is drawn
edge by edge in proportion to the votes and q is the vote distribution. Either way
every verifier keeps each row distributed exactly as the target, and the rows stay
independent: a draft depends on the other rows' past, never on their future, and each
row's verification uses its own randomness. Iterations in which no row of the batch
has a candidate run a plain one-token step (`skip_when_empty`). All array code with
static shapes, traced inside the decoding loop.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

from specjax.core.contract import DraftKind, TargetOut
from specjax.drafters.ngram import TrieDrafter, context, lookup, trie


def group_candidates(
  ctx: jax.Array,
  length: jax.Array,
  prompt_lens: jax.Array,
  group: int,
  k: int,
  max_mismatches: int,
  gamma: int,
):
  """Per row, the best match of its last k tokens in each row of its group.

  Args:
    ctx: [B, S] prompt + emitted tokens, -1 past `length`.
    length: [B] context lengths.
    prompt_lens: [B] prompt lengths (continuations must start in generated text).
    group: rows per group (B % group == 0).
    k, max_mismatches: the window matched and how many of its tokens may differ.
    gamma: the most continuation tokens wanted.

  Returns:
    (end[B, M] the match's last position in row (b's group, g), -1 if none or g is b
     itself; mismatches[B, M]).
  """
  b, s = ctx.shape
  others = jnp.repeat(ctx.reshape(b // group, group, s), group, axis=0)  # [B, M, S]
  other_len = jnp.repeat(length.reshape(-1, group), group, axis=0)  # [B, M]
  other_prompt = jnp.repeat(prompt_lens.reshape(-1, group), group, axis=0)  # [B, M]
  pattern = jnp.take_along_axis(ctx, jnp.maximum(length[:, None] - k + jnp.arange(k), 0), 1)
  ends = jnp.arange(s)
  mismatches = jnp.zeros((b, group, s), jnp.int32)
  for i in range(k):  # others[..., j - i] against pattern[k - 1 - i] for every end j
    shifted = jnp.roll(others, i, axis=2)
    mismatches += (shifted != pattern[:, None, k - 1 - i : k - i]).astype(jnp.int32)
  avail = jnp.minimum(other_len[..., None] - 1 - ends, gamma)  # [B, M, S] tokens after j
  ok = (
    (mismatches <= max_mismatches)
    & (ends >= k - 1)
    & (avail >= 1)
    & (ends + 1 >= other_prompt[..., None])
    & (length[:, None, None] >= k)
  )
  itself = (jnp.arange(b) % group)[:, None] == jnp.arange(group)[None]  # [B, M]
  ok &= ~itself[..., None]
  score = ((max_mismatches - mismatches) * (gamma + 1) + avail) * s + ends
  best = jnp.argmax(jnp.where(ok, score, -1), axis=2)  # [B, M]
  found = jnp.any(ok, axis=2)
  mism = jnp.take_along_axis(mismatches, best[..., None], 2)[..., 0]
  return jnp.where(found, best, -1), jnp.where(found, mism, 0)


def heaviest_path(
  cand: jax.Array, valid: jax.Array, weight: jax.Array
) -> tuple[jax.Array, jax.Array]:
  """Greedy heaviest path through the trie of candidate continuations.

  Args:
    cand: [B, C, K] candidate continuations.
    valid: [B, C, K] which of their tokens exist.
    weight: [B, C] each candidate's support (0 for none).

  Returns:
    (tokens[B, K], supported[B, K]: whether some candidate supports the path there).
  """
  alive = weight > 0  # [B, C]: candidates agreeing with the path so far
  tokens, supported = [], []
  prev = jnp.zeros(cand.shape[:1], jnp.int32)
  for t in range(cand.shape[2]):
    live = alive & valid[:, :, t]
    w = jnp.where(live, weight, 0.0)
    same = cand[:, :, t, None] == cand[:, None, :, t]  # [B, C, C]
    votes = jnp.einsum('bcd,bd->bc', same.astype(w.dtype), w)
    votes = jnp.where(live, votes, -1.0)
    best = jnp.argmax(votes, axis=1)
    has = jnp.any(live, axis=1)
    token = jnp.take_along_axis(cand[:, :, t], best[:, None], 1)[:, 0]
    token = jnp.where(has, token, prev)  # unsupported tail: any token, it is rejected anyway
    alive = live & (cand[:, :, t] == token[:, None])
    tokens.append(token)
    supported.append(has)
    prev = token
  return jnp.stack(tokens, 1).astype(jnp.int32), jnp.stack(supported, 1)


def sampled_path(
  cand: jax.Array, valid: jax.Array, weight: jax.Array, key: jax.Array, vocab: int
) -> tuple[jax.Array, jax.Array, jax.Array]:
  """A path through the trie drawn edge by edge in proportion to the paths' support.

  At each depth the next token is drawn from the candidates that agree with the path so
  far, with probability proportional to their weights; q at that depth is that vote
  distribution over the vocabulary (one-hot on a filler token where no candidate is
  left). When the vote resembles the target's distribution, the rejection verifier
  accepts sum_x min(p(x), q(x)) per token instead of p(mode).

  Returns:
    (tokens[B, K], q[B, K, V], supported[B, K]).
  """
  b, c, k = cand.shape
  rows = jnp.arange(b)[:, None]
  alive = weight > 0
  tokens, dists, supported = [], [], []
  prev = jnp.zeros((b,), jnp.int32)
  for t, key_t in enumerate(jax.random.split(key, k)):
    live = alive & valid[:, :, t]
    w = jnp.where(live, weight, 0.0)
    has = jnp.any(live, axis=1)
    pick = jax.random.categorical(key_t, jnp.log(jnp.where(live, w, 1e-30)), axis=1)
    token = jnp.where(has, jnp.take_along_axis(cand[:, :, t], pick[:, None], 1)[:, 0], prev)
    token = jnp.maximum(token, 0).astype(jnp.int32)
    votes = jnp.zeros((b, vocab)).at[rows, jnp.maximum(cand[:, :, t], 0)].add(w)
    q = jnp.where(
      has[:, None],
      votes / jnp.maximum(w.sum(1, keepdims=True), 1e-30),
      jax.nn.one_hot(token, vocab),
    )
    alive = live & (cand[:, :, t] == token[:, None])
    tokens.append(token)
    dists.append(q)
    supported.append(has)
    prev = token
  return jnp.stack(tokens, 1), jnp.stack(dists, 1), jnp.stack(supported, 1)


@dataclasses.dataclass(frozen=True)
class ConsensusDrafter(TrieDrafter):
  """Drafts each row from the other rows of its group of `group` samples of one prompt.

  Attributes:
    vocab: vocabulary size (q is one-hot over it).
    group: N, the consecutive rows that share a prompt; the batch must be a multiple.
    k: how many of the row's last tokens are matched against the other paths.
    max_mismatches: how many of those k may differ in a match.
    n_max: longest n-gram of the row's own-context lookup (down to 1); 0 disables it.
    self_weight: the vote of the row's own lookup (another path's is 1 / (1 + mismatches)).
    proposal: 'mode' proposes the heaviest path (q one-hot); 'sample' draws the path in
      proportion to the votes, q being the vote distribution (`sampled_path`); greedy
      decoding always uses 'mode'.
  """

  group: int
  k: int = 4
  max_mismatches: int = 1
  n_max: int = 3
  self_weight: float = 0.75
  proposal: str = 'mode'

  def __post_init__(self):
    if self.group < 1:
      raise ValueError(f'consensus drafter needs a group size >= 1, got {self.group}')
    if self.k < 1 or not 0 <= self.max_mismatches < self.k:
      raise ValueError(
        f'consensus drafter needs k >= 1 and 0 <= max_mismatches < k, got '
        f'k={self.k}, max_mismatches={self.max_mismatches}'
      )
    if self.n_max < 0:
      raise ValueError(f'consensus drafter needs n_max >= 0, got {self.n_max}')
    if self.proposal not in ('mode', 'sample'):
      raise ValueError(
        f"consensus drafter proposal must be 'mode' or 'sample', got {self.proposal!r}"
      )

  @property
  def name(self) -> str:
    return f'consensus(N={self.group}, k={self.k}, m={self.max_mismatches}, n<={self.n_max}' + (
      ', sampled)' if self.proposal == 'sample' else ')'
    )

  def check_batch(self, batch: int) -> None:
    """Raises ValueError unless a batch of `batch` rows is whole groups (its kind's `group`
    checks a config before anything loads; this, a batch built in code)."""
    if batch % self.group:
      raise ValueError(
        f'the consensus drafter groups {self.group} consecutive rows per prompt, '
        f'but the batch has {batch} rows (not a multiple of {self.group})'
      )

  def init(
    self, params, prompt_tokens, prompt_lens, cache_size, constrain=None, target=TargetOut()
  ):
    self.check_batch(prompt_tokens.shape[0])
    return super().init(params, prompt_tokens, prompt_lens, cache_size, constrain, target)

  def candidates(self, ctx, length, prompt_lens, gamma):
    """([B, C, gamma] candidate continuations, [B, C, gamma] valid, [B, C] weights).

    Candidates 0..M-1 are the rows of the group (none for the row itself); candidate M
    is the row's own-context lookup.
    """
    b, s = ctx.shape
    end, mism = group_candidates(
      ctx, length, prompt_lens, self.group, self.k, self.max_mismatches, gamma
    )
    others = jnp.repeat(ctx.reshape(b // self.group, self.group, s), self.group, axis=0)
    positions = end[..., None] + 1 + jnp.arange(gamma)  # [B, M, K]
    cand = jnp.take_along_axis(others, jnp.clip(positions, 0, s - 1), 2)
    valid = (end[..., None] >= 0) & (positions < s) & (cand >= 0)
    weight = jnp.where(end >= 0, 1.0 / (1.0 + mism), 0.0)
    own_end = lookup(ctx, length, 1, self.n_max) if self.n_max else jnp.full(length.shape, -1)
    own_pos = own_end[:, None] + 1 + jnp.arange(gamma)
    own = jnp.take_along_axis(ctx, jnp.clip(own_pos, 0, s - 1), 1)
    own_valid = (own_end[:, None] >= 0) & (own_pos < length[:, None]) & (own >= 0)
    own_weight = jnp.where(own_end >= 0, self.self_weight, 0.0)
    return (
      jnp.concatenate([cand, own[:, None]], 1),
      jnp.concatenate([valid, own_valid[:, None]], 1),
      jnp.concatenate([weight, own_weight[:, None]], 1),
    )

  def propose(self, params, draft_state, state, key, gamma, sampling):
    ctx, length = context(draft_state, state)
    cand, valid, weight = self.candidates(ctx, length, state.prompt_lens, gamma)
    if self.proposal == 'sample' and not sampling.greedy:
      tokens, q, supported = sampled_path(cand, valid, weight, key, self.vocab)
      return tokens, q, draft_state.replace(found=supported[:, 0])
    tokens, supported = heaviest_path(cand, valid, weight)
    return self.deterministic(tokens, supported[:, 0], draft_state)

  def propose_tree(self, params, draft_state, state, key, spec, sampling):
    """A trie of the candidate continuations: the heaviest path whole, then the other
    candidates by support, `spec.width` in all (deterministic, q one-hot: lossless at any
    temperature), `spec.size` nodes, `spec.depth` tokens deep."""
    ctx, length = context(draft_state, state)
    cand, valid, weight = self.candidates(ctx, length, state.prompt_lens, spec.depth)
    path, supported = heaviest_path(cand, valid, weight)
    order = jnp.argsort(-weight, axis=1)[:, : max(spec.width - 1, 0)]
    take = lambda x: jnp.take_along_axis(x, order.reshape(order.shape + (1,) * (x.ndim - 2)), 1)
    conts = jnp.concatenate([path[:, None], take(cand)], 1)
    live = take(valid) & (take(weight) > 0)[..., None]
    draft = trie(conts, jnp.concatenate([supported[:, None], live], 1), spec.size)
    return draft, draft_state.replace(found=jnp.any(draft.parents >= 0, axis=1))


CONSENSUS_USAGE = 'consensus:<N>[,k=<int>,m=<int>,n=<int>,w=<float>,q=mode|sample]'
_OPTIONS = {
  'k': ('k', int),
  'm': ('max_mismatches', int),
  'n': ('n_max', int),
  'w': ('self_weight', float),
  'q': ('proposal', str),
}


def _parse(spec) -> dict:
  """'consensus:8' or 'consensus:8,k=4,m=1,n=3,w=0.75' -> ConsensusDrafter settings."""
  if len(spec.args) != 1 or not spec.args[0].isdigit():
    raise spec.error(CONSENSUS_USAGE)
  settings = {'group': int(spec.args[0]), **spec.option_dict(_OPTIONS, CONSENSUS_USAGE)}
  try:
    ConsensusDrafter(1, **settings)  # the settings' own checks, before any model loads
  except ValueError as e:
    raise ValueError(f'draft {spec.text!r}: {e}') from None
  return settings


CONSENSUS = DraftKind(
  usage=CONSENSUS_USAGE,
  parse=_parse,
  build=lambda settings, target, dtype: (ConsensusDrafter(target.cfg.vocab_size, **settings), None),
  group=lambda settings: settings['group'],
)
