"""Host-side generation: validation, bucketing, sharding, jit and timing.

The device side is two jitted calls per batch, prefill and a `lax.while_loop` that
decodes every row to the end; nothing returns to the host between tokens.
"""

from __future__ import annotations

import dataclasses
import functools
import time
from collections.abc import Sequence

import jax
import jax.numpy as jnp
import numpy as np

from specjax.decode import autoregressive
from specjax.decode.sampling import SamplingConfig
from specjax.models import llama
from specjax.models import sharding as sharding_lib


@dataclasses.dataclass
class GenerationOutput:
  """Generated ids per row (EOS included when emitted) and wall-clock timings."""

  tokens: list[list[int]]
  prompt_lens: list[int]
  prefill_seconds: float
  decode_seconds: float
  steps: int
  compile_seconds: float = 0.0  # first call for this shape (compile + a 1-token warm-up run)

  @property
  def num_generated(self) -> int:
    return sum(len(t) for t in self.tokens)

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


class Engine:
  """Generates from one model; compiled functions are cached per (batch, bucket) shape.

  Args:
    params: parameter tree (numpy or jax arrays) matching `cfg`.
    cfg: the model's LlamaConfig.
    eos_id: the token that ends a row (-1 for none).
    cache_size: the most KV slots a row may use: prompt + new tokens must fit. Each
      batch allocates only the smallest bucket that fits it.
    mesh: optional (data, model) mesh; parameters are sharded by the default rules.
    buckets: prompt lengths are right-padded up to one of these (default powers of 2).
  """

  def __init__(self, params, cfg: llama.LlamaConfig, *, eos_id: int, cache_size: int = 1024,
               mesh: jax.sharding.Mesh | None = None, buckets: Sequence[int] | None = None,
               pad_id: int = 0):
    if not 0 < cache_size:
      raise ValueError(f'cache_size must be positive, got {cache_size}')
    if cache_size > cfg.max_seq_len:
      raise ValueError(f'cache_size {cache_size} exceeds the model context {cfg.max_seq_len}')
    llama.check_params(cfg, params)
    self.cfg, self.eos_id, self.cache_size, self.mesh, self.pad_id = (
        cfg, eos_id, cache_size, mesh, pad_id)
    if buckets and (min(buckets) < 1 or max(buckets) > cache_size):
      raise ValueError(f'buckets must lie in [1, cache_size={cache_size}], got {sorted(buckets)}')
    self.buckets = (tuple(sorted(set(buckets) | {cache_size})) if buckets
                    else default_buckets(cache_size))
    if mesh is not None:
      self.params = sharding_lib.shard_params(params, mesh)
      constrain = functools.partial(sharding_lib.constrain_cache, mesh=mesh)
    else:
      self.params = jax.device_put(params)
      constrain = None
    self._prefill = jax.jit(
        functools.partial(autoregressive.prefill, constrain_cache=constrain, pad_id=pad_id),
        static_argnames=('cfg', 'sampling', 'eos_id', 'cache_size', 'out_len'))
    self._decode = jax.jit(autoregressive.decode, static_argnames=('cfg', 'sampling', 'eos_id'),
                           donate_argnames=('state',))
    self._warm: set = set()

  def prepare(self, prompts: Sequence[Sequence[int]], max_new_tokens: int | Sequence[int],
              reserve: int = 0):
    """Validates and pads a batch.

    Returns (tokens[B, P], lengths[B], max_new[B], out_len, slots): P is the prompt
    bucket, out_len the output buffer, and slots the cache size this batch gets: the
    smallest bucket that holds its longest row (attention reads every slot, so a
    short batch should not pay for the engine's full cache_size). `reserve` extra
    slots stay free at the end of every row (a verifier writes past the last token).
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
      if n + m + reserve > self.cache_size:
        raise ValueError(
            f'prompt {i} has {n} tokens; with max_new_tokens={m}'
            + (f' and {reserve} reserved slots' if reserve else '')
            + f' it needs {n + m + reserve} cache slots, but cache_size is {self.cache_size}')
      ids = np.asarray(p)
      if ids.min() < 0 or ids.max() >= self.cfg.vocab_size:
        raise ValueError(f'prompt {i} has token ids outside [0, {self.cfg.vocab_size})')
    slots = bucket_for(int((lengths + max_new).max()) + reserve, self.buckets)
    width = min(bucket_for(int(lengths.max()), self.buckets), slots)
    tokens = np.full((len(prompts), width), self.pad_id, np.int32)
    for i, p in enumerate(prompts):
      tokens[i, :len(p)] = p
    out_len = bucket_for(int(max_new.max()), default_buckets(1 << 30))
    return tokens, lengths.astype(np.int32), max_new.astype(np.int32), out_len, slots

  def _put(self, x: np.ndarray) -> jax.Array:
    if self.mesh is None:
      return jnp.asarray(x)
    return jax.device_put(x, sharding_lib.batch_sharding(self.mesh, x.shape))

  def generate(self, prompts: Sequence[Sequence[int]], max_new_tokens: int | Sequence[int] = 64,
               sampling: SamplingConfig = SamplingConfig(), seed: int = 0) -> GenerationOutput:
    """Generates for a batch of token-id prompts (different lengths allowed).

    The first batch of a new shape (batch size, prompt bucket, output buffer, sampling)
    is preceded by a warm-up that compiles; its time is `compile_seconds` and is kept
    out of the prefill and decode timings.
    """
    tokens, lengths, max_new, out_len, slots = self.prepare(prompts, max_new_tokens)
    shape_key = (tokens.shape, out_len, slots, sampling)
    compile_seconds = 0.0
    if shape_key not in self._warm:
      start = time.perf_counter()
      self._run(tokens, lengths, np.ones_like(max_new), out_len, slots, sampling, seed)
      compile_seconds = time.perf_counter() - start
      self._warm.add(shape_key)
    out = self._run(tokens, lengths, max_new, out_len, slots, sampling, seed)
    out.compile_seconds = compile_seconds
    return out

  def _run(self, tokens, lengths, max_new, out_len, slots, sampling, seed) -> GenerationOutput:
    start = time.perf_counter()
    state = self._prefill(self.params, self._put(tokens), self._put(lengths), self._put(max_new),
                          jax.random.key(seed), cfg=self.cfg, sampling=sampling,
                          eos_id=self.eos_id, cache_size=slots, out_len=out_len)
    jax.block_until_ready(state)
    mid = time.perf_counter()
    state = self._decode(self.params, state, cfg=self.cfg, sampling=sampling, eos_id=self.eos_id)
    out_tokens, counts, steps = jax.device_get((state.tokens, state.num_generated, state.step))
    end = time.perf_counter()
    return GenerationOutput(
        tokens=[row[:n].tolist() for row, n in zip(out_tokens, counts)],
        prompt_lens=lengths.tolist(), prefill_seconds=mid - start, decode_seconds=end - mid,
        steps=int(steps))
