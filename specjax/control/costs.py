"""Measured costs of the pieces of an iteration, for the cost model and the controller.

Each piece runs `inner` times inside one jitted fori_loop (so per-call dispatch, which
the decoding loop does not pay either, is left out) and every repetition depends on the
loop index, so XLA cannot hoist it out of the loop. Times are the fastest of `repeats`
runs: on a shared machine other work only ever adds time, so the minimum is the best
estimate of what a piece costs (and ratios of minima are stable under load).
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Sequence

import jax
import jax.numpy as jnp

from specjax.decode import loop
from specjax.decode.sampling import SamplingConfig
from specjax.models import llama
from specjax.models.kv_cache import KVCache


@dataclasses.dataclass(frozen=True)
class Costs:
  """Milliseconds per piece, measured at one batch size and cache size."""

  batch: int
  slots: int
  target_ms: float  # one plain step: a 1-token target forward per row
  draft_ms: dict[int, float]  # gamma -> proposing gamma tokens
  verify_ms: dict[int, float]  # gamma -> one (gamma + 1)-token target forward

  def units(self, gamma: int) -> tuple[float, float]:
    """(draft cost, verify cost) of gamma in units of a plain target step."""
    if gamma == 0:
      return 0.0, 1.0
    return self.draft_ms[gamma] / self.target_ms, self.verify_ms[gamma] / self.target_ms

  def table(self) -> dict[int, tuple[float, float]]:
    return {0: (0.0, 1.0), **{g: self.units(g) for g in sorted(self.draft_ms)}}

  @property
  def c(self) -> float:
    """Draft cost per drafted token over the target step's, at the largest gamma measured."""
    g = max(self.draft_ms)
    return self.draft_ms[g] / g / self.target_ms

  def to_json(self) -> dict:
    return {
      'batch': self.batch,
      'slots': self.slots,
      'target_ms': self.target_ms,
      'draft_ms': {str(g): v for g, v in self.draft_ms.items()},
      'verify_ms': {str(g): v for g, v in self.verify_ms.items()},
      'c': self.c,
    }


def _timer(fn, args, inner: int):
  """Compiles and warms `fn`; returns a function timing one run, in ms per inner call."""
  jax.block_until_ready(fn(*args))

  def run() -> float:
    start = time.perf_counter()
    jax.block_until_ready(fn(*args))
    return 1e3 * (time.perf_counter() - start) / inner

  return run


def timer_forward(
  params, cfg: llama.LlamaConfig, batch: int, tokens: int, slots: int, layers=None, inner: int = 8
):
  """A timer of one forward of `tokens` new tokens per row (cache half full)."""

  def many(p, x, cache):
    def body(i, acc):
      logits, _ = llama.forward(p, (x + i) % cfg.vocab_size, cache, cfg, layers)
      return acc + logits[:, -1, 0]

    return jax.lax.fori_loop(0, inner, body, jnp.zeros(x.shape[:1]))

  cache = KVCache.init(cfg, batch, slots, params['embed'].dtype)
  cache = cache.with_lengths(jnp.full((batch,), slots // 2))
  return _timer(jax.jit(many), (params, jnp.ones((batch, tokens), jnp.int32), cache), inner)


def forward_ms(
  params,
  cfg: llama.LlamaConfig,
  batch: int,
  tokens: int,
  slots: int,
  layers=None,
  inner: int = 8,
  repeats: int = 5,
) -> float:
  """Milliseconds of one forward of `tokens` new tokens per row: the fastest of `repeats`."""
  run = timer_forward(params, cfg, batch, tokens, slots, layers, inner)
  return min(run() for _ in range(repeats))


def timer_propose(
  drafter,
  draft_params,
  target_params,
  cfg: llama.LlamaConfig,
  batch: int,
  gamma: int,
  slots: int,
  sampling: SamplingConfig = SamplingConfig(),
  inner: int = 8,
):
  """A timer of one `drafter.propose` of gamma tokens, on a state after a short prompt."""
  prompt_len = min(32, slots // 4)
  prompt = (jnp.arange(batch * prompt_len).reshape(batch, prompt_len) * 7919) % cfg.vocab_size
  lens = jnp.full((batch,), prompt_len, jnp.int32)
  method = loop.Method(gamma=gamma, drafter=drafter)
  params = {'target': target_params, 'draft': draft_params}
  state = jax.jit(
    loop.prefill, static_argnames=('cfg', 'method', 'sampling', 'eos_id', 'cache_size', 'out_len')
  )(
    params,
    prompt.astype(jnp.int32),
    lens,
    lens,
    jax.random.key(0),
    cfg=cfg,
    method=method,
    sampling=sampling,
    eos_id=-1,
    cache_size=slots,
    out_len=slots // 2,
  )

  def many(draft_params, draft_state, state):
    def body(i, acc):
      moved = state.replace(tokens=(state.tokens + i) % cfg.vocab_size)
      tokens, q, _ = drafter.propose(
        draft_params, draft_state, moved, jax.random.fold_in(state.key, i), gamma, sampling
      )
      return acc + tokens[:, -1] + (0 if q is None else q[:, -1, 0] > 0.5)  # keep q live

    return jax.lax.fori_loop(0, inner, body, jnp.zeros((batch,), jnp.int32))

  return _timer(jax.jit(many), (draft_params, state.extra['draft'], state), inner)


def propose_ms(
  drafter,
  draft_params,
  target_params,
  cfg: llama.LlamaConfig,
  batch: int,
  gamma: int,
  slots: int,
  sampling: SamplingConfig = SamplingConfig(),
  inner: int = 8,
  repeats: int = 5,
) -> float:
  """Milliseconds of one `drafter.propose` of gamma tokens: the fastest of `repeats`."""
  run = timer_propose(
    drafter, draft_params, target_params, cfg, batch, gamma, slots, sampling, inner
  )
  return min(run() for _ in range(repeats))


def measure(
  engine,
  batch: int,
  slots: int,
  gammas: Sequence[int],
  sampling: SamplingConfig = SamplingConfig(),
  repeats: int = 5,
) -> Costs:
  """Costs of `engine`'s target and drafter for each gamma at this batch and cache size.

  The pieces are timed in rounds (every piece once per round), so a burst of other work
  on the machine hits them alike; each piece's cost is its fastest round.
  """
  if engine.drafter is None:
    raise ValueError('measuring draft costs needs an engine with a drafter')
  pieces = {('target', 0): timer_forward(engine.params, engine.cfg, batch, 1, slots)}
  for g in gammas:
    pieces['verify', g] = timer_forward(engine.params, engine.cfg, batch, g + 1, slots)
    pieces['draft', g] = timer_propose(
      engine.drafter, engine.draft_params, engine.params, engine.cfg, batch, g, slots, sampling
    )
  best = {k: float('inf') for k in pieces}
  for _ in range(repeats):
    for k, run in pieces.items():
      best[k] = min(best[k], run())
  return Costs(
    batch=batch,
    slots=slots,
    target_ms=best['target', 0],
    draft_ms={g: best['draft', g] for g in gammas},
    verify_ms={g: best['verify', g] for g in gammas},
  )
