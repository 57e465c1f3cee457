"""Host-side generation: validation, bucketing, sharding, jit and timing.

The device side is two jitted calls per batch, prefill and a `lax.while_loop` that
decodes every row to the end; nothing returns to the host between tokens.
"""

from __future__ import annotations

import collections
import dataclasses
import functools
import time
from collections.abc import Sequence

import jax
import jax.numpy as jnp
import numpy as np

from specjax import registry
from specjax.control import adaptive as adaptive_lib
from specjax.core.contract import Drafter
from specjax.core.sampling import SamplingConfig
from specjax.decode import loop
from specjax.decode import method as method_lib
from specjax.decode import prefill as prefill_lib
from specjax.decode.method import AUTOREGRESSIVE, Method
from specjax.models import sharding as sharding_lib

# Shapes (prompt bucket, cache bucket, output buffer) per method and sampling whose
# compiled executables an engine keeps alive, the least recently used dropped first: a
# batch needs one shape per method and turn, so a run's batches never evict each
# other's current shapes, and memory stays bounded over any number of prompts.
MAX_COMPILED = 4


class NonFiniteLogits(ValueError):
  """The target's logits were NaN or infinite: its output cannot be trusted or sampled."""


@dataclasses.dataclass
class GenerationOutput:
  """Generated ids per row (EOS included when emitted) and wall-clock timings."""

  tokens: list[list[int]]
  prompt_lens: list[int]
  prefill_seconds: float
  decode_seconds: float
  steps: int  # loop iterations: target forward passes after the prefill
  accepted: list[list[int]] = dataclasses.field(default_factory=list)  # per row, per iteration
  drafted: list[list[int]] = dataclasses.field(default_factory=list)  # gamma, or 0 if skipped
  gamma: int = 0  # the largest draft length (adaptive methods choose per iteration)
  compile_seconds: float = 0.0  # first call for this shape (compile + a 1-token warm-up run)
  switches: int = 0  # adaptive control: changes of draft length during this batch
  stops: list[list[int]] = dataclasses.field(default_factory=list)  # tree methods: the node
  # each iteration stopped at, per row (0: the root or a plain step)
  # Per row: iterations whose draft handed the verifier an untrusted distribution (NaN,
  # negative, an overflowing total, or 0 at its own proposal); those positions were rejected.
  untrusted: list[int] = dataclasses.field(default_factory=list)
  # Per row: what the drafter counted (Drafter.counters), e.g. a multi-level drafter's steps.
  draft_counts: list[dict[str, int]] = dataclasses.field(default_factory=list)

  @property
  def num_generated(self) -> int:
    return sum(len(t) for t in self.tokens)

  @property
  def target_calls(self) -> int:
    """Target forward passes, the prefill included (one per batch, not per row)."""
    return self.steps + 1

  @property
  def acceptance_rate(self) -> float:
    """Accepted draft tokens / drafted tokens over every row's iterations (nan if none)."""
    drafted = sum(sum(d) for d in self.drafted)
    return sum(sum(a) for a in self.accepted) / drafted if drafted else float('nan')

  @property
  def decode_tokens_per_second(self) -> float:
    """Tokens produced by the decode loop (all but the prefill's first) per second."""
    return (self.num_generated - len(self.tokens)) / max(self.decode_seconds, 1e-9)


def default_buckets(cache_size: int) -> tuple[int, ...]:
  """Powers of two from 16 up to the cache size (which is always a bucket)."""
  buckets, b = [], 16
  while b < cache_size:
    buckets.append(b)
    b *= 2
  return tuple(buckets) + (cache_size,)


def bucket_for(n: int, buckets: Sequence[int]) -> int:
  for b in sorted(buckets):
    if b >= n:
      return b
  raise ValueError(f'length {n} exceeds the largest bucket {max(buckets)}')


def fetch(tree):
  """Host numpy copies of device arrays; across processes (jax.distributed) every process
  gets the whole of each array, its rows gathered from the processes that hold them."""
  if all(x.is_fully_addressable for x in jax.tree.leaves(tree) if isinstance(x, jax.Array)):
    return jax.device_get(tree)
  from jax.experimental import multihost_utils  # noqa: PLC0415 (multi-process runs only)

  return jax.tree.map(np.asarray, multihost_utils.process_allgather(tree, tiled=True))


class Engine:
  """Generates from one model; compiled functions are cached per (batch, bucket) shape.

  Args:
    params: parameter tree (numpy or jax arrays) matching `cfg`.
    cfg: the model's config (its `family` is the model contract).
    eos_id: the token that ends a row (-1 for none).
    cache_size: the most KV slots a row may use: prompt + new tokens must fit. Each
      batch allocates only the smallest bucket that fits it.
    mesh: optional (data, model) mesh. Target parameters shard by `rules` and then the
      default rules, draft parameters by `draft_rules` and then the drafter's own
      (its registry kind's `partition_rules`, else the target's), and KV caches (target's and
      draft's) by `cache_spec` over [B, G, S, H]; specjax/models/sharding.py. A mesh
      axis that does not divide a dimension leaves it replicated.
    buckets: prompt lengths are right-padded up to one of these (default powers of 2).
    drafter, draft_params: what proposes tokens when `generate` is given a speculative
      method (its vocabulary must be the target's).
  """

  def __init__(
    self,
    params,
    cfg,
    *,
    eos_id: int,
    cache_size: int = 1024,
    mesh: jax.sharding.Mesh | None = None,
    buckets: Sequence[int] | None = None,
    pad_id: int = 0,
    drafter: Drafter | None = None,
    draft_params=None,
    rules: sharding_lib.Rules = (),
    draft_rules: sharding_lib.Rules = (),
    cache_spec: jax.sharding.PartitionSpec = sharding_lib.CACHE_SPEC,
  ):
    if not 0 < cache_size:
      raise ValueError(f'cache_size must be positive, got {cache_size}')
    if cache_size > cfg.max_seq_len:
      raise ValueError(f'cache_size {cache_size} exceeds the model context {cfg.max_seq_len}')
    cfg.family.check_params(cfg, params)
    if mesh is None:  # one device: joined weights, one product where there were three
      params = cfg.family.fuse(params)
    self.cfg, self.eos_id, self.cache_size, self.mesh, self.pad_id = (
      cfg,
      eos_id,
      cache_size,
      mesh,
      pad_id,
    )
    if buckets and (min(buckets) < 1 or max(buckets) > cache_size):
      raise ValueError(f'buckets must lie in [1, cache_size={cache_size}], got {sorted(buckets)}')
    self.buckets = (
      tuple(sorted(set(buckets) | {cache_size})) if buckets else default_buckets(cache_size)
    )
    if drafter is not None and drafter.vocab_size != cfg.vocab_size:
      raise ValueError(
        f'the drafter ({drafter.name}) has a vocabulary of '
        f'{drafter.vocab_size} tokens but the target ({cfg.name}) has '
        f'{cfg.vocab_size}: draft and target must share one vocabulary'
      )
    self.drafter = drafter
    target_rules = tuple(rules) + sharding_lib.DEFAULT_RULES
    own = None if drafter is None else registry.kind_of(drafter).partition_rules
    self.rules = {
      'target': target_rules,
      'draft': tuple(draft_rules) + (target_rules if own is None else tuple(own)),
    }

    def put(tree, rules):
      if mesh is None:
        return jax.device_put(tree)
      return sharding_lib.shard_params(tree, mesh, rules)

    self.params = put(params, self.rules['target'])
    self.draft_params = None if draft_params is None else put(draft_params, self.rules['draft'])
    constrain = (
      functools.partial(sharding_lib.constrain_cache, mesh=mesh, spec=cache_spec)
      if mesh is not None
      else None
    )
    self._constrain = constrain
    # Shape key -> its (prefill, decode) jitted functions. Each shape gets functions of its
    # own (fresh partials), so that dropping the least recently used frees its compiled
    # executables: a long run over many prompt buckets and methods compiled one pair per
    # (method, bucket) and kept them all, until an executable no longer fit in memory.
    self._compiled: collections.OrderedDict = collections.OrderedDict()
    self._warm: set = set()
    self._control: dict = {}  # adaptive method -> controller state after its last batch

  def _functions(self, shape_key):
    """The (prefill, decode) jitted functions of a shape, most recently used last; past
    MAX_COMPILED shapes of one method and sampling the oldest of them is dropped with its
    executables (it compiles again, with a warm-up, if it comes back)."""
    fns = self._compiled.pop(shape_key, None)
    if fns is None:
      prefill = jax.jit(
        functools.partial(prefill_lib.prefill, constrain_cache=self._constrain, pad_id=self.pad_id),
        static_argnames=('cfg', 'method', 'drafter', 'sampling', 'eos_id', 'cache_size', 'out_len'),
      )
      decode = jax.jit(
        functools.partial(loop.decode),
        static_argnames=('cfg', 'method', 'drafter', 'sampling', 'eos_id'),
        donate_argnames=('state',),
      )
      fns = (prefill, decode)
    self._compiled[shape_key] = fns
    mine = [k for k in self._compiled if k[3:] == shape_key[3:]]  # same sampling and method
    for old in mine[: max(0, len(mine) - MAX_COMPILED)]:
      del self._compiled[old]
      self._warm.discard(old)
    return fns

  def control_state(self, method: Method, sampling: SamplingConfig):
    """An adaptive method's controller state (host arrays) where its last batch left it,
    or None before its first batch."""
    return self._control.get((method, sampling))

  def restore_control(self, method: Method, sampling: SamplingConfig, leaves) -> None:
    """Sets an adaptive method's controller state from `leaves` (control_state's leaves,
    in order): a resumed run goes on from where the interrupted one left it."""
    template = jax.device_get(adaptive_lib.init(method.adaptive_config))
    leaves = [np.asarray(x, np.asarray(t).dtype) for x, t in zip(leaves, jax.tree.leaves(template))]
    state = jax.tree.unflatten(jax.tree.structure(template), leaves)
    self._control[(method, sampling)] = state

  def reset_control(self) -> None:
    """Forgets what adaptive control learned: the next batch starts from the prior."""
    self._control.clear()

  def next_logits(self, context: Sequence[int]) -> np.ndarray:
    """The target's float32 logits [V] after `context`: one full forward, no cache reuse."""
    model = self.cfg.family
    cache = model.init_cache(self.cfg, 1, len(context), self.params['embed'].dtype)
    logits = model.forward(self.params, jnp.asarray([list(context)]), cache, self.cfg).logits
    return np.asarray(logits[0, -1])

  def prepare(
    self, prompts: Sequence[Sequence[int]], max_new_tokens: int | Sequence[int], spare: int = 0
  ):
    """Validates and pads a batch (`spare`: extra cache slots a row needs, tree methods).

    Returns (tokens[B, P], lengths[B], max_new[B], out_len, cache_size): P is the prompt
    bucket, out_len the output buffer, and cache_size the slots this batch gets: the
    smallest bucket that holds its longest row (attention reads every slot, so a
    short batch should not pay for the engine's full cache_size). No slots are reserved
    for verification: see specjax/decode/loop.py.
    """
    if not prompts:
      raise ValueError('no prompts to generate from')
    max_new = np.broadcast_to(np.asarray(max_new_tokens, np.int64), (len(prompts),))
    lengths = np.array([len(p) for p in prompts], np.int64)
    for i, (p, n, m) in enumerate(zip(prompts, lengths, max_new)):
      if n == 0:
        raise ValueError(f'prompt {i} is empty: it needs at least one token')
      if m < 1:
        raise ValueError(f'max_new_tokens must be >= 1, got {m} for prompt {i}')
      if n + m + spare > self.cache_size:
        extra = f' and {spare} for the tree draft' if spare else ''
        raise ValueError(
          f'prompt {i} has {n} tokens; with max_new_tokens={m}{extra} it needs '
          f'{n + m + spare} cache slots, but cache_size is {self.cache_size}'
        )
      ids = np.asarray(p)
      if ids.min() < 0 or ids.max() >= self.cfg.vocab_size:
        raise ValueError(f'prompt {i} has token ids outside [0, {self.cfg.vocab_size})')
    cache_size = bucket_for(int((lengths + max_new).max()) + spare, self.buckets)
    width = min(bucket_for(int(lengths.max()), self.buckets), cache_size)
    tokens = np.full((len(prompts), width), self.pad_id, np.int32)
    for i, p in enumerate(prompts):
      tokens[i, : len(p)] = p
    out_len = bucket_for(int(max_new.max()), default_buckets(1 << 30))
    return tokens, lengths.astype(np.int32), max_new.astype(np.int32), out_len, cache_size

  def _put(self, x: np.ndarray) -> jax.Array:
    if self.mesh is None:
      return jnp.asarray(x)
    return jax.device_put(x, sharding_lib.batch_sharding(self.mesh, x.shape))

  def check(self, method: Method, sampling: SamplingConfig = SamplingConfig()) -> None:
    """One ValueError naming what this engine cannot do of `method` under `sampling`
    (no drafter, a tree it cannot draft, too deep for the cache, a greedy-only verifier
    when sampling), before any batch is prepared."""
    if not isinstance(method, Method):
      raise TypeError(
        f'generate takes a specjax.decode.method.Method (e.g. Method.chain(4), '
        f"Method.parse('ngram@4')), got {method!r}"
      )
    method_lib.check(method, self.drafter, sampling)
    if method.depth + 1 >= self.cache_size:
      raise ValueError(
        f'gamma={method.depth} is too large for cache_size {self.cache_size}: '
        f'verification needs gamma + 1 slots and room for the prompt ({method.name})'
      )

  def drafter_for(self, method: Method) -> Drafter | None:
    """The drafter that runs `method` in the loop: None for autoregressive decoding, and
    under adaptive control one that resyncs after its longest wait."""
    if not method.speculative:
      return None
    if method.is_adaptive:
      return registry.resync(self.drafter, method.adaptive_config.max_wait)
    return self.drafter

  def generate(
    self,
    prompts: Sequence[Sequence[int]],
    method: Method = AUTOREGRESSIVE,
    max_new_tokens: int | Sequence[int] = 64,
    sampling: SamplingConfig = SamplingConfig(),
    seed: int = 0,
  ) -> GenerationOutput:
    """Generates for a batch of token-id prompts (different lengths allowed).

    `method` (specjax.decode.method.Method) says how: autoregressive decoding, a chain
    of k tokens drafted per target call with the engine's drafter, a token tree verified
    in one target forward (rows then need its nodes as spare cache slots), or adaptive
    control choosing among off, chains and trees every iteration, checked by its
    verifier (rejection, block, or greedy for greedy decoding). An adaptive method's
    controller state carries over from one call to the next with the same method, so it
    keeps learning across a workload (`reset_control` forgets it).

    The first batch of a new shape (batch size, prompt bucket, output buffer, sampling)
    is preceded by a warm-up that compiles; its time is `compile_seconds` and is kept
    out of the prefill and decode timings.
    """
    self.check(method, sampling)
    tokens, lengths, max_new, out_len, cache_size = self.prepare(
      prompts, max_new_tokens, method.spare
    )
    shape_key = (tokens.shape, out_len, cache_size, sampling, method)
    self._functions(shape_key)  # most recently used: never the one dropped below
    compile_seconds = 0.0
    if shape_key not in self._warm:
      # The warm-up compiles, then runs one decode iteration: on XLA:CPU the first
      # execution of a loop body is ~2x slower than later ones, so a warm-up that ran no
      # iteration left that cost in the first timed batch. An adaptive method warms
      # every setting once (each starts one warm-up as the controller's choice).
      start = time.perf_counter()
      controls = [None]
      if method.is_adaptive:
        config = method.adaptive_config
        first = jax.device_get(adaptive_lib.init(config))
        controls = [first.replace(choice=np.int32(a)) for a in range(len(config.arms))]
      warm = np.minimum(max_new, 2)
      for control in controls:
        self._run(
          tokens, lengths, warm, out_len, cache_size, sampling, seed, method, shape_key, control
        )
      compile_seconds = time.perf_counter() - start
      self._warm.add(shape_key)
    out = self._run(
      tokens, lengths, max_new, out_len, cache_size, sampling, seed, method, shape_key
    )
    out.compile_seconds = compile_seconds
    return out

  def _run(
    self,
    tokens,
    lengths,
    max_new,
    out_len,
    cache_size,
    sampling,
    seed,
    method,
    shape_key,
    warm_control=None,
  ) -> GenerationOutput:
    """One batch; with `warm_control` (a warm-up run) the controller starts from it and
    what it learns is dropped."""
    prefill, decode = self._compiled[shape_key]
    start = time.perf_counter()
    drafter = self.drafter_for(method)
    params = {'target': self.params, 'draft': self.draft_params if drafter else None}
    control = self._control.get((method, sampling))  # host copies: decode donates its state
    if warm_control is not None:
      control = warm_control
    if method.is_adaptive and control is None:  # a state, never None: no recompile
      control = jax.device_get(adaptive_lib.init(method.adaptive_config))
    static = dict(
      cfg=self.cfg, method=method, drafter=drafter, sampling=sampling, eos_id=self.eos_id
    )
    state = prefill(
      params,
      self._put(tokens),
      self._put(lengths),
      self._put(max_new),
      jax.random.key(seed),
      control,
      cache_size=cache_size,
      out_len=out_len,
      **static,
    )
    jax.block_until_ready(state)
    mid = time.perf_counter()
    state = decode(params, state, **static)
    out_tokens, counts, steps, accepted, drafted, stops, untrusted, finite, counters = fetch(
      (
        state.tokens,
        state.num_generated,
        state.step,
        state.spec.accepted,
        state.spec.drafted,
        state.spec.stops,
        state.spec.untrusted,
        state.spec.target_finite,
        drafter.counters(state.spec.draft) if drafter is not None else {},
      )
    )
    end = time.perf_counter()
    self._check_finite(finite)
    switches = 0
    if method.is_adaptive:
      final = fetch(state.spec.control)
      switches = int(final.switches) - int(control.switches)
      if warm_control is None:  # not a warm-up run
        self._control[(method, sampling)] = final
    return GenerationOutput(
      tokens=[row[:n].tolist() for row, n in zip(out_tokens, counts)],
      prompt_lens=lengths.tolist(),
      prefill_seconds=mid - start,
      decode_seconds=end - mid,
      steps=int(steps),
      accepted=_rows(accepted),
      stops=[] if stops is None else [s[a >= 0].tolist() for s, a in zip(stops, accepted)],
      drafted=_rows(drafted),
      untrusted=[] if untrusted is None else untrusted.tolist(),
      draft_counts=[{k: int(v[r]) for k, v in counters.items()} for r in range(len(counts))]
      if counters
      else [],
      gamma=method.depth,
      switches=switches,
    )

  def _check_finite(self, finite) -> None:
    """Raises NonFiniteLogits unless every row's target logits at the prompt's end were
    finite (`finite`: [B] bool, or None where not recorded)."""
    if finite is None or finite.all():
      return
    dtype = jax.tree.leaves(self.params)[0].dtype
    rows = np.flatnonzero(~finite).tolist()
    raise NonFiniteLogits(
      f'the target model ({self.cfg.n_layers} layers, parameters in {dtype}) gave '
      f'non-finite logits at the end of the prompt of batch rows {rows}: its activations '
      'overflow (or its weights hold NaN/inf) in this dtype; use float32 or bfloat16'
    )


def _rows(per_step) -> list[list[int]]:
  """Per row, the recorded entries of a [B, steps] buffer (-1 marks steps not run)."""
  return [row[row >= 0].tolist() for row in per_step]
