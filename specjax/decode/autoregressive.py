"""Prefill and the loop driver. Autoregressive decoding itself is `loop.step` with gamma 0."""

from __future__ import annotations

import jax
import jax.numpy as jnp

from specjax.decode import sampling as sampling_lib
from specjax.decode.state import DecodeState, commit
from specjax.models import llama
from specjax.models.kv_cache import KVCache


def prefill(
  params,
  prompt_tokens: jax.Array,
  prompt_lens: jax.Array,
  max_new: jax.Array,
  key: jax.Array,
  *,
  cfg: llama.LlamaConfig,
  sampling: sampling_lib.SamplingConfig,
  eos_id: int,
  cache_size: int,
  out_len: int,
  pad_id: int = 0,
  constrain_cache=None,
) -> DecodeState:
  """Runs the prompts [B, P] (right-padded; real lengths prompt_lens[B]) and emits the first token.

  `constrain_cache`, if given, maps a KVCache to itself with sharding constraints.
  """
  b = prompt_tokens.shape[0]
  cache = KVCache.init(cfg, b, cache_size, params['embed'].dtype)
  if constrain_cache is not None:
    cache = constrain_cache(cache)
  hidden, cache = llama.forward_hidden(params, prompt_tokens, cache, cfg)  # [B, P, D]
  last = jnp.take_along_axis(hidden, (prompt_lens - 1)[:, None, None], axis=1)[:, 0]  # [B, D]
  logits = llama.logits_from_hidden(params, last, cfg)  # [B, V]
  key, sub = jax.random.split(key)
  first = sampling_lib.sample(logits, sub, sampling)
  state = DecodeState(
    tokens=jnp.full((b, out_len), pad_id, jnp.int32),
    num_generated=jnp.zeros((b,), jnp.int32),
    done=jnp.zeros((b,), bool),
    prompt_lens=prompt_lens.astype(jnp.int32),
    max_new=max_new.astype(jnp.int32),
    cache=cache,
    key=key,
    step=jnp.zeros((), jnp.int32),
  )
  return commit(state, first[:, None], jnp.ones((b,), jnp.int32), eos_id)


def run_until_done(state: DecodeState, body) -> DecodeState:
  """lax.while_loop of `body` until every row is done (the one loop driver)."""
  return jax.lax.while_loop(lambda s: ~jnp.all(s.done), body, state)
