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

Drafters that may find nothing to propose (prompt lookup, consensus: `skip_when_empty`)
run plain one-token steps in an inner loop until some row has a proposal, so a miss
costs an ordinary decoding step. Adaptive control picks 0 (a plain step) or a draft
length per iteration inside a lax.switch.
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp

from specjax import verify
from specjax.control import adaptive as adaptive_lib
from specjax.decode import autoregressive
from specjax.decode import sampling as sampling_lib
from specjax.decode.state import DecodeState, commit
from specjax.drafters.base import Drafter
from specjax.models import llama


@dataclasses.dataclass(frozen=True)
class Method:
  """Static description of a decoding method: gamma 0 is autoregressive decoding.

  With `adaptive` set, every iteration picks its draft length from 0 (a plain step) and
  adaptive.gammas (see specjax/control/adaptive.py); `gamma` is then the largest of them.
  """

  gamma: int = 0
  verifier: str = 'rejection'
  drafter: Drafter | None = None
  adaptive: adaptive_lib.AdaptiveConfig | None = None

  def __post_init__(self):
    if not isinstance(self.gamma, int) or self.gamma < 0:
      raise ValueError(f'gamma must be an integer >= 0 (0 = autoregressive), got {self.gamma!r}')
    if self.gamma > 0 and self.drafter is None:
      raise ValueError(f'gamma={self.gamma} needs a drafter')
    if self.adaptive is not None and self.gamma != max(self.adaptive.gammas):
      raise ValueError(
        f'an adaptive method has gamma = max(adaptive.gammas) = '
        f'{max(self.adaptive.gammas)}, got {self.gamma}'
      )
    verify.get(self.verifier)

  @property
  def name(self) -> str:
    if self.gamma == 0:
      return 'autoregressive'
    if self.adaptive is not None:
      return f'{self.drafter.describe()} adaptive gamma in {self.adaptive.choices} {self.verifier}'
    return f'{self.drafter.describe()} gamma={self.gamma} {self.verifier}'


def prefill(
  params,
  prompt_tokens,
  prompt_lens,
  max_new,
  key,
  control=None,
  *,
  cfg: llama.LlamaConfig,
  method: Method,
  sampling: sampling_lib.SamplingConfig,
  eos_id: int,
  cache_size: int,
  out_len: int,
  pad_id: int = 0,
  constrain_cache=None,
) -> DecodeState:
  """Target prefill and first token, the drafter's own prefill, empty statistics.

  `control` is the adaptive controller's starting state (e.g. where the previous batch
  left it); None starts from its prior.
  """
  state = autoregressive.prefill(
    params['target'],
    prompt_tokens,
    prompt_lens,
    max_new,
    key,
    cfg=cfg,
    sampling=sampling,
    eos_id=eos_id,
    cache_size=cache_size,
    out_len=out_len,
    pad_id=pad_id,
    constrain_cache=constrain_cache,
  )
  draft_state = None
  if method.gamma:
    draft_state = method.drafter.init(
      params['draft'], prompt_tokens, prompt_lens, cache_size, constrain_cache
    )
  history = jnp.full((prompt_tokens.shape[0], out_len), -1, jnp.int32)  # per row, iteration
  extra = {'draft': draft_state, 'accepted': history, 'drafted': history}
  if method.adaptive is not None:
    extra['control'] = adaptive_lib.init(method.adaptive) if control is None else control
  return state.replace(extra=extra)


def _verify(logits, draft, q, key, *, method: Method, sampling, width: int):
  """Verifies draft[B, K] against the target's logits[B, K+1, V] over [last token, draft].

  Returns (new tokens [B, width + 1] of which accepted + 1 count, accepted [B], drafted [B]).
  """
  gamma = draft.shape[1]
  p = sampling_lib.probabilities(logits, sampling)
  # A deterministic drafter's q is one-hot: built here, only when a draft is verified.
  dists = jax.nn.one_hot(draft, p.shape[-1], dtype=p.dtype) if q is None else q
  accepted, nxt = verify.get(method.verifier)(p, dists, draft, key)
  offsets = jnp.arange(gamma + 1)
  new_tokens = jnp.where(
    offsets < accepted[:, None], jnp.pad(draft, ((0, 0), (0, 1))), nxt[:, None]
  )
  new_tokens = jnp.pad(new_tokens, ((0, 0), (0, width - gamma)))
  return new_tokens, accepted, jnp.full_like(accepted, gamma)


def _finish(
  state: DecodeState,
  new_tokens,
  accepted,
  drafted,
  cache,
  draft_state,
  *,
  method: Method,
  eos_id: int,
  counted=True,
) -> DecodeState:
  """Records the iteration's statistics, commits its tokens and rolls the drafter back.

  `counted` False (a traced bool) leaves the iteration count as it was.
  """
  extra = dict(state.extra)
  record = lambda buf, x: buf.at[:, state.step].set(jnp.where(state.done, -1, x), mode='drop')
  extra['accepted'] = record(extra['accepted'], accepted)
  extra['drafted'] = record(extra['drafted'], drafted)
  state = state.replace(cache=cache, step=state.step + jnp.asarray(counted, jnp.int32))
  state = commit(state, new_tokens, accepted + 1, eos_id)
  if method.gamma:
    draft_state = method.drafter.rollback(draft_state, state)
  extra['draft'] = draft_state
  return state.replace(extra=extra)


def _lookup_step(
  params,
  state: DecodeState,
  *,
  cfg: llama.LlamaConfig,
  method: Method,
  sampling: sampling_lib.SamplingConfig,
  eos_id: int,
) -> DecodeState:
  """An iteration of a drafter that may find nothing to propose (`skip_when_empty`).

  Plain steps run in a loop of their own while no row of the batch has a proposal, then
  one verification runs. Neither sits inside a branch, so both update the target cache in
  place at the cost of an ordinary forward pass (a lax.cond between them needs the
  read-only attention of `llama.forward_hidden_pending`, which costs ~8% more here).
  Each plain step counts as one iteration, as before.
  """
  drafter, target, width = method.drafter, params['target'], method.gamma

  def propose(s):
    key, sub = jax.random.split(s.key)
    k_draft, k_verify = jax.random.split(sub)
    draft, q, draft_state = drafter.propose(
      params['draft'], s.extra['draft'], s, k_draft, width, sampling
    )
    return s.replace(key=key), (draft, q, draft_state, k_verify)

  def empty(carry):
    s, (_, _, draft_state, _) = carry
    return ~drafter.has_proposals(draft_state) & ~jnp.all(s.done)

  def plain(carry):
    s, (_, _, draft_state, k_verify) = carry
    logits, cache = llama.forward(target, s.last_tokens[:, None], s.cache, cfg)
    token = sampling_lib.sample(logits[:, 0], k_verify, sampling)[:, None]
    zeros = jnp.zeros_like(s.num_generated)
    s = _finish(
      s,
      jnp.pad(token, ((0, 0), (0, width))),
      zeros,
      zeros,
      cache,
      draft_state,
      method=method,
      eos_id=eos_id,
    )
    return propose(s)

  state, (draft, q, draft_state, k_verify) = jax.lax.while_loop(empty, plain, propose(state))
  # If every row finished during the plain steps, this verification changes nothing and
  # is not counted.
  logits, cache = llama.forward(
    target, jnp.concatenate([state.last_tokens[:, None], draft], 1), state.cache, cfg
  )
  new_tokens, accepted, drafted = _verify(
    logits, draft, q, k_verify, method=method, sampling=sampling, width=width
  )
  return _finish(
    state,
    new_tokens,
    accepted,
    drafted,
    cache,
    draft_state,
    method=method,
    eos_id=eos_id,
    counted=~jnp.all(state.done),
  )


def _iteration(
  params,
  state: DecodeState,
  gamma: int,
  width: int,
  key,
  *,
  cfg,
  method: Method,
  sampling,
  pending: bool = False,
):
  """One draft-and-verify round with `gamma` draft tokens (0: a plain step).

  Returns (new tokens [B, width + 1] of which accepted + 1 count, accepted [B],
  drafted [B], target cache, draft state). With `pending` (inside a lax.cond or
  lax.switch), the target cache is only read, and the fourth output is the new keys and
  values of width + 1 slots (see llama.forward_hidden_pending), to be written after.
  """
  k_draft, k_verify = jax.random.split(key)
  last = state.last_tokens[:, None]  # [B, 1]
  draft_state = state.extra['draft']
  target = params['target']

  def target_forward(tokens):
    if not pending:
      return llama.forward(target, tokens, state.cache, cfg)
    hidden, (ks, vs) = llama.forward_hidden_pending(target, tokens, state.cache, cfg)
    pad = lambda x: jnp.pad(x, ((0, 0), (0, width + 1 - tokens.shape[1]), (0, 0), (0, 0)))
    return (
      llama.logits_from_hidden(target, hidden, cfg),
      ([pad(k) for k in ks], [pad(v) for v in vs]),
    )

  def plain(_):
    logits, cache = target_forward(last)
    token = sampling_lib.sample(logits[:, 0], k_verify, sampling)[:, None]
    zeros = jnp.zeros_like(state.num_generated)
    return jnp.pad(token, ((0, 0), (0, width))), zeros, zeros, cache

  if gamma == 0:
    return (*plain(None), draft_state)
  draft, q, draft_state = method.drafter.propose(
    params['draft'], draft_state, state, k_draft, gamma, sampling
  )

  def speculative(_):
    logits, cache = target_forward(jnp.concatenate([last, draft], 1))  # [B, K+1, V]
    return (
      *_verify(logits, draft, q, k_verify, method=method, sampling=sampling, width=width),
      cache,
    )

  if getattr(method.drafter, 'skip_when_empty', False):
    # Nothing proposed anywhere in the batch: a plain step costs less than verification.
    out = jax.lax.cond(method.drafter.has_proposals(draft_state), speculative, plain, None)
  else:
    out = speculative(None)
  return (*out, draft_state)


def step(
  params,
  state: DecodeState,
  *,
  cfg: llama.LlamaConfig,
  method: Method,
  sampling: sampling_lib.SamplingConfig,
  eos_id: int,
) -> DecodeState:
  """One iteration for every row (done rows compute but do not change)."""
  skips = getattr(method.drafter, 'skip_when_empty', False)
  if method.gamma and skips and method.adaptive is None:
    return _lookup_step(params, state, cfg=cfg, method=method, sampling=sampling, eos_id=eos_id)
  key, sub = jax.random.split(state.key)
  # Branching iterations leave the target cache read-only inside the branches and write
  # the new entries once after them: XLA would otherwise copy the whole cache.
  branching = method.adaptive is not None
  run = functools.partial(
    _iteration,
    params,
    state,
    width=method.gamma,
    key=sub,
    cfg=cfg,
    method=method,
    sampling=sampling,
    pending=branching,
  )
  if method.adaptive is None:
    new_tokens, accepted, drafted, cache, draft_state = run(method.gamma)
  else:
    ctrl = state.extra['control']
    ran = adaptive_lib.choose(method.adaptive, ctrl)
    branches = [functools.partial(lambda g, _: run(g), g) for g in method.adaptive.choices]
    new_tokens, accepted, drafted, cache, draft_state = jax.lax.switch(ran, branches, None)
    active = ~state.done
    control = adaptive_lib.update(
      method.adaptive, ctrl, ran, jnp.where(active, accepted, 0), jnp.where(active, drafted, 0)
    )
    state = state.replace(extra={**state.extra, 'control': control})
  if branching:
    cache = llama.write_pending(state.cache, cache)
  state = state.replace(key=key)
  return _finish(
    state, new_tokens, accepted, drafted, cache, draft_state, method=method, eos_id=eos_id
  )


def decode(
  params,
  state: DecodeState,
  *,
  cfg: llama.LlamaConfig,
  method: Method,
  sampling: sampling_lib.SamplingConfig,
  eos_id: int,
) -> DecodeState:
  """Runs `step` inside one lax.while_loop until every row is done."""
  return autoregressive.run_until_done(
    state, lambda s: step(params, s, cfg=cfg, method=method, sampling=sampling, eos_id=eos_id)
  )
