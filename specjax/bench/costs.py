"""Measured costs of the pieces of an iteration, for the cost model and the controller.

Each piece runs `inner` times inside one jitted fori_loop (so per-call dispatch, which
the decoding loop does not pay either, is left out) and every repetition depends on the
loop index, so XLA cannot hoist it out of the loop. Times are the fastest of `repeats`
runs: on a shared machine other work only ever adds time, so the minimum is the best
estimate of what a piece costs (and ratios of minima are stable under load). Pieces are
timed in rounds (every piece once per round), so a burst of other work hits them alike.

A draft with weights of its own is also timed as the decoding loop runs it, at its largest
gamma: each proposal followed by the target's verification of it, less the verification's
own time. Alone, a small draft's weights stay in a large last-level cache between
proposals; in the loop the target's weights stream through that cache in between. On an
Intel Xeon VM that reports 480 MB of L3, the quantized draft's 98 MB of weights made its
proposals 1.1-1.5x faster alone than in the loop (BENCHMARKS.md, issue 29). Every gamma's
time is scaled by that ratio when it exceeds 1.

`measure_drafts` is the one measurement (the harness, layer-skip calibration and
`measure` for one engine use it); the numbers go into a control.cost_model.Costs.
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Mapping, Sequence

import jax
import jax.numpy as jnp

from specjax.control.cost_model import Costs
from specjax.core.contract import TargetOut
from specjax.core.sampling import SamplingConfig
from specjax.core.tree import TreeSpec
from specjax.decode import loop as decode_loop
from specjax.decode import prefill as prefill_lib
from specjax.decode.method import Method
from specjax.kernels import cpu as cpu_kernels


def _timer(fn, args, inner: int):
  """Compiles and warms `fn(*args) -> (value, state)`, whose last argument (the state: a
  cache, a draft's state) it donates; returns a function timing one run, in ms per inner
  call. Each run is handed the state the last returned, so it is updated in place as
  in the decoding loop (a state read from a loop-invariant argument would be copied on
  every call: 2 ms a forward for SmolLM2's 24 MB cache, 9% of its step)."""
  args = list(args)

  def call():
    value, args[-1] = fn(*args)
    jax.block_until_ready(value)

  call()  # compiles
  call()  # and runs once on the state a call returns, as every timed run does

  def run() -> float:
    start = time.perf_counter()
    call()
    return 1e3 * (time.perf_counter() - start) / inner

  return run


LEVEL_STEPS = ('first', 'narrow', 'wide')  # a multi-level drafter's steps (Costs.level_ms)


def timer_forward(
  params, cfg, batch: int, tokens: int, cache_size: int, layers=None, inner: int = 8, forward=None
):
  """A timer of one forward of `tokens` new tokens per row (cache half full): the family's,
  or `forward(params, tokens, cache) -> (logits, cache)` (a draft's own, e.g.
  ModelDrafter.forward)."""
  if forward is None:
    forward = lambda p, x, cache: cfg.family.forward(p, x, cache, cfg, layers)[:2]  # noqa: E731

  def many(p, x, cache):
    lengths = cache.lengths

    def body(i, carry):  # the cache carried, each forward written over the last one's slots
      acc, cache = carry
      logits, cache = forward(p, (x + i) % cfg.vocab_size, cache)
      return acc + logits[:, -1, 0], cache.with_lengths(lengths)

    return jax.lax.fori_loop(0, inner, body, (jnp.zeros(x.shape[:1]), cache))

  cache = cfg.family.init_cache(cfg, batch, cache_size, params['embed'].dtype)
  cache = cache.with_lengths(jnp.full((batch,), cache_size // 2))
  fn = jax.jit(many, donate_argnums=2)
  return _timer(fn, (params, jnp.ones((batch, tokens), jnp.int32), cache), inner)


def forward_ms(
  params,
  cfg,
  batch: int,
  tokens: int,
  cache_size: int,
  layers=None,
  inner: int = 8,
  repeats: int = 5,
) -> float:
  """Milliseconds of one forward of `tokens` new tokens per row: the fastest of `repeats`."""
  run = timer_forward(params, cfg, batch, tokens, cache_size, layers, inner)
  return min(run() for _ in range(repeats))


def _prefilled(drafter, draft_params, target_params, cfg, batch, cache_size, sampling, method):
  """A decoding state after a prompt that fills half the cache (as timer_forward's: a draft
  model then attends over as many slots as the target does; its attention was 12% of a
  decoding iteration's time, iteration_profile.py)."""
  prompt_len = cache_size // 2
  prompt = (jnp.arange(batch * prompt_len).reshape(batch, prompt_len) * 7919) % cfg.vocab_size
  lens = jnp.full((batch,), prompt_len, jnp.int32)
  params = {'target': target_params, 'draft': draft_params}
  return jax.jit(
    prefill_lib.prefill,
    static_argnames=('cfg', 'method', 'drafter', 'sampling', 'eos_id', 'cache_size', 'out_len'),
  )(
    params,
    prompt.astype(jnp.int32),
    lens,
    lens,
    jax.random.key(0),
    cfg=cfg,
    method=method,
    drafter=drafter,
    sampling=sampling,
    eos_id=-1,
    cache_size=cache_size,
    out_len=max(1, cache_size // 4),
  )


def timer_propose(
  drafter,
  draft_params,
  target_params,
  cfg,
  batch: int,
  gamma: int,
  cache_size: int,
  sampling: SamplingConfig = SamplingConfig(),
  inner: int = 8,
  tree=None,
  verified: bool = False,
):
  """A timer of one `drafter.propose` of gamma tokens (with `tree`, a TreeSpec: one
  `propose_tree`, gamma ignored), on a state after a prompt that fills half the cache
  (_prefilled). `verified`
  (chains): each proposal followed by the target's (gamma + 1)-token forward over it, as
  in the decoding loop, timed together."""
  method = Method.chain(gamma) if tree is None else Method.tree(tree)
  state = _prefilled(drafter, draft_params, target_params, cfg, batch, cache_size, sampling, method)

  def verify(target_params, state, tokens, cache):
    """The target over [last token, proposal], its cache rolled back after."""
    inputs = jnp.concatenate([state.last_tokens[:, None], tokens], axis=1)
    out = cfg.family.forward(target_params, inputs, cache, cfg)
    return (out.logits[:, -1, 0] > 0).astype(jnp.int32), out.cache.with_lengths(cache.lengths)

  def many(draft_params, target_params, state, carried):
    def body(i, carry):  # the draft's state carried, rolled back after each proposal
      acc, (draft_state, cache) = carry
      moved = state.replace(tokens=(state.tokens + i) % cfg.vocab_size)
      key = jax.random.fold_in(state.key, i)
      if tree is not None:
        draft, after = drafter.propose_tree(draft_params, draft_state, moved, key, tree, sampling)
        tokens, q = draft.tokens, draft.q
      else:
        tokens, q, after = drafter.propose(draft_params, draft_state, moved, key, gamma, sampling)
      acc = acc + tokens[:, -1] + (0 if q is None else q[:, -1, 0] > 0.5)  # keep q live
      if verified:
        seen, cache = verify(target_params, moved, tokens, cache)
        acc = acc + seen
      return acc, (drafter.update(after, state, TargetOut()), cache)

    zeros = jnp.zeros((batch,), jnp.int32)
    return jax.lax.fori_loop(0, inner, body, (zeros, carried))

  fn = jax.jit(many, donate_argnums=3)
  # The draft's state and the target's cache are donated, so carried in place.
  detached = state.replace(spec=state.spec.replace(draft=None), cache=None)
  read = target_params if verified and tree is None else None  # the target's weights, if run
  return _timer(fn, (draft_params, read, detached, (state.spec.draft, state.cache)), inner)


def timer_iteration(
  drafter,
  draft_params,
  target_params,
  cfg,
  batch: int,
  gamma: int,
  cache_size: int,
  sampling: SamplingConfig = SamplingConfig(),
  verifier: str = 'rejection',
  inner: int = 8,
  runner: bool = False,
):
  """A timer of one whole iteration of the decoding loop at gamma (0: a plain step, and
  `drafter` None), as decode.loop runs it: the proposal, the target's forward over it,
  the verifier, the commit and the drafter's update. Each repetition starts from the same
  state (the target's cache and the draft's state rolled back), after a prompt that fills
  half the cache (_prefilled). Less the proposal and the forward, what is left is the
  loop's own work in an iteration, which the pieces above leave out (3-5 ms of a 70 ms
  quantized@8 iteration on the Xeon of BENCHMARKS.md). `runner`: (fn, args) instead, fn
  (jitted, its last argument donated) returning (acc, the carried draft state and cache)."""
  method = Method.chain(gamma, verifier)
  drafter = drafter if gamma else None
  state = _prefilled(drafter, draft_params, target_params, cfg, batch, cache_size, sampling, method)

  def many(draft_params, target_params, state, carried):
    params = {'target': target_params, 'draft': draft_params}

    def body(i, carry):
      acc, (draft_state, cache) = carry
      moved = state.replace(
        tokens=(state.tokens + i) % cfg.vocab_size,
        key=jax.random.fold_in(state.key, i),
        cache=cache,
        spec=state.spec.replace(draft=draft_state),
      )
      out = decode_loop.iteration(
        params, moved, cfg=cfg, method=method, sampling=sampling, eos_id=-1, drafter=drafter
      )
      if drafter is not None:  # rolled back to the state the iteration started from
        draft_state = drafter.update(out.spec.draft, moved, TargetOut())
      return acc + out.num_generated, (draft_state, out.cache.with_lengths(cache.lengths))

    return jax.lax.fori_loop(0, inner, body, (jnp.zeros((batch,), jnp.int32), carried))

  fn = jax.jit(many, donate_argnums=3)
  detached = state.replace(spec=state.spec.replace(draft=None), cache=None)
  args = (draft_params if gamma else None, target_params, detached, (state.spec.draft, state.cache))
  return (fn, args) if runner else _timer(fn, args, inner)


def timer_level_step(
  drafter,
  draft_params,
  target_params,
  cfg,
  batch: int,
  gamma: int,
  cache_size: int,
  kind: str,
  sampling: SamplingConfig = SamplingConfig(),
  inner: int = 8,
):
  """A timer of one `kind` step ('first', 'narrow', 'wide') of a multi-level drafter's
  proposal (drafters/multilevel.py `step_for_timing`), on a state after a prompt that
  fills half the cache (_prefilled). The per-level cost model
  (cost_model.multilevel_draft_units) counts proposals in these steps."""
  method = Method.chain(gamma)
  state = _prefilled(drafter, draft_params, target_params, cfg, batch, cache_size, sampling, method)

  def many(draft_params, state, draft_state):
    step, carry = drafter.step_for_timing(draft_params, draft_state, state, gamma, sampling, kind)

    def body(i, carried):
      c, acc = carried
      c, lower_token = step(c.replace(key=jax.random.fold_in(c.key, i)))
      return c, acc + lower_token

    zeros = jnp.zeros((state.tokens.shape[0],), jnp.int32)
    out, acc = jax.lax.fori_loop(0, inner, body, (carry, zeros))
    acc = acc + out.toks[:, 0] + out.counts[:, 0] + (out.qs[:, 0, 0] > 0.5)  # all kept live
    upper = draft_state.upper.replace(cache=out.cache)
    return acc, draft_state.replace(upper=upper, lower=out.lower)

  fn = jax.jit(many, donate_argnums=2)
  detached = state.replace(spec=state.spec.replace(draft=None), cache=None)
  return _timer(fn, (draft_params, detached, state.spec.draft), inner)


def fastest(pieces: Mapping, repeats: int = 5) -> dict:
  """{key: ms} the fastest of `repeats` rounds of the timers `pieces` ({key: timer}); each
  round runs every piece once, so a burst of other work on the machine hits them alike."""
  best = {k: float('inf') for k in pieces}
  for _ in range(repeats):
    for k, run in pieces.items():
      best[k] = min(best[k], run())
  return best


def model_key(params) -> str:
  """A short key of a parameter tree's structure, shapes and dtypes (block formats
  included): the model whose forwards a kernel choice was measured on."""
  leaves, treedef = jax.tree_util.tree_flatten(params)
  text = str(treedef) + ';'.join(f'{x.shape}{x.dtype}' for x in leaves)
  return hashlib.sha256(text.encode()).hexdigest()[:12]


def tune_forwards(
  params,
  cfg,
  batch: int,
  tokens: Sequence[int],
  cache_size: int,
  repeats: int = 5,
  forward=None,
  name: str = '',
) -> dict:
  """Times this model's forward (the family's, or `forward` as timer_forward takes it) of
  each `tokens` count under every kernel policy this CPU allows (kernels.cpu.policies:
  per-product dispatch, each ISA's kernels throughout, XLA throughout), in interleaved
  rounds, and keeps the fastest per row bucket for every product of that forward
  (kernels.cpu.tune; `name` tells apart two forwards of one parameter tree). Choices
  already recorded on this machine are reused untimed (unless timed on a busy machine and
  this one is quiet now: kernels.cpu.BUSY); a forward whose products another
  model's choice already holds (a layer-skip draft's are the target's) is not timed.
  Returns {rows bucket: {'ms': {policy: ms}, 'use': policy, ...}}."""
  policies = cpu_kernels.policies()
  if len(policies) < 2:
    return {}
  model = model_key(params) + (f'-{name}' if name else '')
  wanted = {cpu_kernels.bucket(batch * t): t for t in sorted(set(tokens))}  # largest t
  out, pieces, products = {}, {}, {}
  for rows, t in wanted.items():
    if rows > cpu_kernels.MAX_ROWS:
      continue
    record = cpu_kernels.tuned(model, rows)
    if record is not None:
      out[rows] = record
      continue
    for policy in policies:  # 'auto' first: a forward with no product a kernel takes
      with cpu_kernels.forcing(policy) as keys:  # traced (and compiled) under the policy
        timer = timer_forward(params, cfg, batch, t, cache_size, forward=forward)
      if not keys or cpu_kernels.held_elsewhere(model, keys):  # nothing to choose
        break
      pieces[rows, policy] = timer
      products.setdefault(rows, set()).update(keys)
  with cpu_kernels.others_load() as load:  # a busy machine's choice is timed again later
    best = fastest(pieces, repeats) if pieces else {}
  busy = load[0] if load else None
  for rows, keys in products.items():
    out[rows] = cpu_kernels.tune(model, rows, {p: best[rows, p] for p in policies}, keys, busy)
  return dict(sorted(out.items()))


def measure_drafts(
  target_params,
  cfg,
  drafts: Mapping[str, tuple],
  batch: int,
  cache_size: int,
  sampling: SamplingConfig = SamplingConfig(),
  repeats: int = 5,
  verifier: str = 'rejection',
) -> tuple[float, dict[str, Costs]]:
  """(target step ms, {name: Costs}) for drafts {name: (drafter, draft params, gammas[,
  trees])}, trees being static TreeShapes.

  The target's step and each (gamma + 1)-token verification are timed once and shared
  by every draft; each draft's proposals are timed at each of its gammas. A tree of N
  nodes is verified by an (N + 1)-token forward, timed once per N, and its proposal is
  timed per draft. A plain iteration of the loop, and each draft's iteration at its
  smallest and largest gamma (with `verifier`), are timed whole for the loop's own work
  (_overheads).
  """
  pieces = {
    ('step', 0): timer_forward(target_params, cfg, batch, 1, cache_size),
    ('iteration', 0): timer_iteration(
      None, None, target_params, cfg, batch, 0, cache_size, sampling, verifier
    ),
  }
  for name, (drafter, draft_params, gammas, *rest) in drafts.items():
    trees = rest[0] if rest else ()
    for n in [*gammas, *(t.size for t in trees)]:
      if ('verify', n) not in pieces:
        pieces['verify', n] = timer_forward(target_params, cfg, batch, n + 1, cache_size)
    for g in gammas:
      pieces[name, g] = timer_propose(
        drafter, draft_params, target_params, cfg, batch, g, cache_size, sampling
      )
    if draft_params is not None and gammas:  # weights of its own, which the target's evict
      pieces[name, 'verified', max(gammas)] = timer_propose(
        drafter, draft_params, target_params, cfg, batch, max(gammas), cache_size, sampling,
        verified=True,
      )  # fmt: skip
    for g in {min(gammas), max(gammas)} if gammas else ():  # (14 s each for the q4 draft)
      pieces[name, 'iteration', g] = timer_iteration(
        drafter, draft_params, target_params, cfg, batch, g, cache_size, sampling, verifier
      )
    if hasattr(drafter, 'step_for_timing') and gammas:  # a multi-level drafter's steps
      for kind in LEVEL_STEPS:
        pieces[name, 'level', kind] = timer_level_step(
          drafter, draft_params, target_params, cfg, batch, max(gammas), cache_size, kind,
          sampling,
        )  # fmt: skip
    for t in trees:
      pieces[name, t.text] = timer_propose(
        drafter,
        draft_params,
        target_params,
        cfg,
        batch,
        t.depth,
        cache_size,
        sampling,
        tree=TreeSpec(shape=t),
      )
  best = fastest(pieces, repeats)
  out = {name: _costs(best, name, draft, batch, cache_size) for name, draft in drafts.items()}
  return best['step', 0], out


def _costs(best: dict, name: str, draft: tuple, batch: int, cache_size: int) -> Costs:
  """The Costs of the draft `name` = (drafter, params, gammas[, trees]) from the timings."""
  drafter, _, gammas, *rest = draft
  trees = rest[0] if rest else ()
  ratio = _in_loop(best, name, gammas)
  return Costs(
    batch=batch,
    cache_size=cache_size,
    target_ms=best['step', 0],
    draft_ms={g: best[name, g] * ratio for g in gammas},
    verify_ms={g: best['verify', g] for g in gammas},
    tree_ms={t.text: (best[name, t.text], best['verify', t.size]) for t in trees},
    overhead_ms=_overheads(best, name, gammas),
    level_ms={k: best[name, 'level', k] * ratio for k in LEVEL_STEPS if (name, 'level', k) in best},
    level_k=drafter.k if hasattr(drafter, 'step_for_timing') else 0,
  )


def _overheads(best: dict, name: str, gammas) -> dict[int, float]:
  """{0: a plain iteration less the target's step; each gamma: the draft's iteration less
  its proposal (as the loop runs it: _in_loop) and the target's forward over it}, in ms, at
  least 0. Iterations are timed at the smallest and the largest gamma; the others take the
  largest's figure. Timed at each of 1, 2, 4, 8 and 12, the q4 draft's was 2.0, 3.4, 3.7,
  3.4 and 4.0 ms, and each timer took 14 s to compile and run."""
  out = {0: max(0.0, best['iteration', 0] - best['step', 0])}
  timed = sorted(g for g in gammas if (name, 'iteration', g) in best)
  ratio = _in_loop(best, name, gammas)
  for g in gammas if timed else ():
    t = g if g in timed else timed[-1]
    seen = best[name, t] * ratio + best['verify', t]
    out[g] = max(0.0, best[name, 'iteration', t] - seen)
  return out


def _in_loop(best: dict, name: str, gammas) -> float:
  """How much slower a draft's proposals run in the loop than alone (at least 1): at its
  largest gamma, the proposal and its verification, less the verification, over the
  proposal alone. One ratio for every gamma: on the Xeon above the quantized draft's
  proposals of 1, 2, 4 and 8 tokens were 1.49, 1.14, 1.28 and 1.51x slower in the loop
  (experiments/cpu_paths/in_loop_costs.py), so not only its first forward is slower."""
  g = max(gammas, default=0)
  if (name, 'verified', g) not in best:
    return 1.0
  return max(1.0, (best[name, 'verified', g] - best['verify', g]) / best[name, g])


def measure(
  engine,
  batch: int,
  cache_size: int,
  gammas: Sequence[int],
  sampling: SamplingConfig = SamplingConfig(),
  repeats: int = 5,
  verifier: str = 'rejection',
) -> Costs:
  """Costs of `engine`'s target and drafter for each gamma at this batch and cache size
  (the loop's own work timed with `verifier`)."""
  if engine.drafter is None:
    raise ValueError('measuring draft costs needs an engine with a drafter')
  drafts = {'draft': (engine.drafter, engine.draft_params, tuple(gammas))}
  _, out = measure_drafts(
    engine.params, engine.cfg, drafts, batch, cache_size, sampling, repeats, verifier
  )
  return out['draft']
