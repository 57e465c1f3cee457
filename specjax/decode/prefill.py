"""Prefill: the target runs the prompts and emits each row's first token; the drafter
reads the prompts into its own state; the speculative records start empty.
Everything after is `loop.decode`."""

from __future__ import annotations

import jax
import jax.numpy as jnp

from specjax.control import adaptive as adaptive_lib
from specjax.core import sampling as sampling_lib
from specjax.core.contract import Drafter, TargetOut
from specjax.core.state import DecodeState, SpecState, commit
from specjax.decode.method import Method


def prefill(
  params,
  prompt_tokens,
  prompt_lens,
  max_new,
  key,
  control=None,
  *,
  cfg,
  method: Method,
  sampling: sampling_lib.SamplingConfig,
  eos_id: int,
  cache_size: int,
  out_len: int,
  pad_id: int = 0,
  constrain_cache=None,
  drafter: Drafter | None = None,
) -> DecodeState:
  """Target prefill and first token, the drafter's own prefill, empty records.

  params is {'target': ..., 'draft': ... or None}; cfg the target's config. The prompts
  [B, P] are right-padded (real lengths prompt_lens[B]); `constrain_cache`, if given, maps
  a cache to itself with sharding constraints. `control` is the adaptive controller's
  starting state (e.g. where the previous batch left it); None starts from its prior.
  `drafter` runs the method's drafts (None: autoregressive decoding).
  """
  drafter = drafter if method.speculative else None
  target = params['target']
  b = prompt_tokens.shape[0]
  model = cfg.family
  cache = model.init_cache(cfg, b, cache_size, target['embed'].dtype)
  if constrain_cache is not None:
    cache = constrain_cache(cache)
  capture = drafter.capture if drafter is not None else ()
  out = model.forward(target, prompt_tokens, cache, cfg, capture=capture, head=False)
  hidden, cache = out.hidden, out.cache  # [B, P, D]
  last = jnp.take_along_axis(hidden, (prompt_lens - 1)[:, None, None], axis=1)[:, 0]  # [B, D]
  logits = model.logits(target, last, cfg)  # [B, V]
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
  state = commit(state, first[:, None], jnp.ones((b,), jnp.int32), eos_id)
  draft_state = None
  if drafter is not None:
    target_out = TargetOut(out.features, jnp.zeros((b,), jnp.int32), cache)
    draft_state = drafter.init(
      params['draft'], prompt_tokens, prompt_lens, cache_size, constrain_cache, target_out
    )
  if method.is_adaptive and control is None:
    control = adaptive_lib.init(method.adaptive_config)
  history = jnp.full((b, out_len), -1, jnp.int32)  # per row, iteration
  spec = SpecState(
    accepted=history,
    drafted=history,
    draft=draft_state,
    control=control if method.is_adaptive else None,
    stops=history if method.tree_specs else None,
    untrusted=jnp.zeros((b,), jnp.int32),
    target_finite=jnp.all(jnp.isfinite(logits), axis=-1),
  )
  return state.replace(spec=spec)
