"""The EAGLE-3-style feature draft head as a drafter (the head: specjax/models/eagle.py).

A head drafts from the target's own features rather than from tokens alone; its draft
vocabulary is the K tokens the target emits most, and q = 0 outside it keeps
verification lossless.

**Features without a second target pass.** The drafter declares `capture`; the loop's
target forwards (prefill and every verification, through the model contract's `capture=`)
return those layers' streams, handed to it as `TargetOut.features`, and `update` keeps the
committed positions' features in a small ring buffer. The head's KV cache holds the
positions it has run with true target features; each proposal first runs the pending ones
(the tokens committed since the last proposal: static width gamma + 1, masked), then
gamma - 1 steps on its own output states. Rolling back is setting the head cache's length back
to where its own states began (`base`), whatever the verifier kept.

Draft specs: `eagle` (the head shipped for SmolLM2-135M-Instruct) or `eagle:DIR` (a head
in EAGLE-3's checkpoint layout, e.g. one written by `python -m specjax.train_draft
--config configs/eagle_smollm2.py`).
"""

from __future__ import annotations

import dataclasses
import functools
import os

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct

from specjax.checkpoints import eagle3
from specjax.core import sampling as sampling_lib
from specjax.core.contract import DraftKind, TargetOut, TreeDrafter
from specjax.drafters import tree_build
from specjax.models import eagle as eagle_model
from specjax.models import llama, sharding
from specjax.models.eagle import EagleConfig, cached_step, head_logits
from specjax.models.kv_cache import KVCache


@struct.dataclass
class EagleState:
  cache: KVCache  # the head's: lengths = positions run with the target's features
  ring: jax.Array  # [B, W, C * D] committed features; position p at slot p % W
  base: jax.Array  # [B] where the last proposal's own states began (rollback point)


def to_full_vocab(values, vocab_ids, vocab_size: int):
  out = jnp.zeros(values.shape[:-1] + (vocab_size,), values.dtype)
  return out.at[..., vocab_ids].set(values)


def committed_length(state) -> jax.Array:
  """[B] the target cache's length: the positions whose features the target computed."""
  return state.prompt_lens + state.num_generated - 1


class FeatureDrafter(TreeDrafter):
  """What the feature drafters share (EagleDrafter, drafters/dflash.DFlashDrafter): a
  shape `cfg` (models/eagle.FeatureConfig) and, in the draft state, a `ring` [B, W, C * D]
  of committed positions' features (position p at slot p % W), which `update` fills from
  each target forward before `_trim` drops what the draft guessed past the commit."""

  @property
  def vocab_size(self) -> int:
    return self.cfg.vocab_size

  @property
  def capture(self) -> tuple[int, ...]:
    return self.cfg.capture

  def update(self, draft_state, state, target=TargetOut()):
    if target.features is not None:
      draft_state = self._absorb(draft_state, target.features, target.start, state)
    return self._trim(draft_state, state)

  def _absorb(self, draft_state, features, start, state):
    """Keeps features[B, T, C*D] of positions start + t that are now committed."""
    b, t, _ = features.shape
    w = draft_state.ring.shape[1]
    positions = start[:, None] + jnp.arange(t, dtype=jnp.int32)
    slots = jnp.where(positions < committed_length(state)[:, None], positions % w, w)
    ring = draft_state.ring.at[jnp.arange(b)[:, None], slots].set(
      features.astype(draft_state.ring.dtype), mode='drop'
    )  # the others dropped
    return draft_state.replace(ring=ring)


def check_target(what: str, cfg, target) -> None:
  """Raises ValueError unless the feature drafter `what` (shape cfg) was made for a target
  with `target`'s vocabulary and width, and reads layers it has."""
  if cfg.vocab_size != target.cfg.vocab_size or cfg.d_model != target.cfg.d_model:
    raise ValueError(
      f'{what} was made for a target with vocabulary {cfg.vocab_size} and width '
      f'{cfg.d_model}; {target.source!r} has {target.cfg.vocab_size} and {target.cfg.d_model}'
    )
  llama.check_capture(target.cfg, cfg.capture)


@dataclasses.dataclass(frozen=True)
class EagleDrafter(FeatureDrafter):
  """Drafts with a feature head `cfg`; params {'head': ..., 'embed': target [V, D]}.

  `ring` is how many committed positions of features it keeps (at least gamma + 1);
  under adaptive control (its kind's `resync`) plain target steps leave features pending, and a
  proposal runs up to `ring` of them at once.
  """

  cfg: EagleConfig
  name: str = dataclasses.field(default='EAGLE-3 feature head', compare=False)
  ring: int = 16
  resync: int = 0

  def init(
    self, params, prompt_tokens, prompt_lens, cache_size, constrain=None, target=TargetOut()
  ):
    features = target.features
    if features is None:
      raise ValueError('an EAGLE head needs the target features of the prompt (prefill capture)')
    head, embed = params['head'], params['embed']
    b, p = prompt_tokens.shape
    cache = KVCache.init(self.cfg, b, cache_size, head['fc'].dtype)
    if constrain is not None:
      cache = constrain(cache)
    positions = jnp.broadcast_to(jnp.arange(p, dtype=jnp.int32), (b, p))
    # Position t pairs the target's features at t with the prompt token at t + 1; the last
    # prompt position waits for the first emitted token (it stays pending in the ring).
    nxt = jnp.pad(prompt_tokens[:, 1:], ((0, 0), (0, 1)))
    valid = positions < (prompt_lens - 1)[:, None]
    _, cache = cached_step(
      head, embed, eagle_model.fuse(head, features), nxt, positions, valid, cache, self.cfg
    )
    w = self.ring
    last = jnp.take_along_axis(features, (prompt_lens - 1)[:, None, None], axis=1)  # [B, 1, CD]
    ring = jnp.zeros((b, w, features.shape[-1]), features.dtype)
    ring = ring.at[jnp.arange(b)[:, None], ((prompt_lens - 1) % w)[:, None]].set(last)
    lengths = (prompt_lens - 1).astype(jnp.int32)
    return EagleState(cache=cache.with_lengths(lengths), ring=ring, base=lengths)

  def _catch_up(self, params, draft_state: EagleState, state, width: int):
    """Runs the pending positions (the last `width` before the target's length) with their
    features. Returns (out state at the last position [B, D], cache with lengths = L)."""
    head, embed = params['head'], params['embed']
    cache, w = draft_state.cache, draft_state.ring.shape[1]
    target_len = committed_length(state)  # L: features known below
    positions = target_len[:, None] - width + jnp.arange(width, dtype=jnp.int32)  # [B, width]
    valid = positions >= cache.lengths[:, None]
    feats = jnp.take_along_axis(draft_state.ring, (positions % w)[:, :, None], axis=1)
    # The token after position p: emitted token p + 1 - prompt_len (p >= prompt_len - 1).
    idx = jnp.clip(positions + 1 - state.prompt_lens[:, None], 0, state.tokens.shape[1] - 1)
    nxt = jnp.take_along_axis(state.tokens, idx, axis=1)
    safe = jnp.maximum(positions, 0)
    out, cache = cached_step(
      head, embed, eagle_model.fuse(head, feats), nxt, safe, valid, cache, self.cfg
    )
    return out[:, -1], cache.with_lengths(target_len)

  def propose(self, params, draft_state: EagleState, state, key, gamma, sampling):
    if gamma + 1 > draft_state.ring.shape[1]:
      raise ValueError(
        f'an EAGLE head keeps features of {draft_state.ring.shape[1]} positions; gamma '
        f'{gamma} needs {gamma + 1}: build it with a larger ring'
      )
    head, embed, ids = params['head'], params['embed'], jnp.asarray(params['head']['vocab_ids'])
    widths = [gamma + 1] + ([self.resync] if self.resync > gamma + 1 else [])
    if len(widths) == 1:
      out, cache = self._catch_up(params, draft_state, state, widths[0])
    else:
      lag = jnp.max(committed_length(state) - draft_state.cache.lengths)
      branches = [
        functools.partial(lambda w, _: self._catch_up(params, draft_state, state, w), w)
        for w in widths
      ]
      out, cache = jax.lax.switch((lag > widths[0]).astype(jnp.int32), branches, None)
    base = cache.lengths
    tokens, dists = [], []
    for i, k in enumerate(jax.random.split(key, gamma)):
      logits = head_logits(head, out, self.cfg)  # [B, K]
      token = ids[sampling_lib.sample(logits, k, sampling)]
      dists.append(
        to_full_vocab(sampling_lib.probabilities(logits, sampling), ids, self.vocab_size)
      )
      tokens.append(token)
      if i + 1 < gamma:
        pos = (base + i)[:, None]
        valid = jnp.ones_like(pos, bool)
        out, cache = cached_step(
          head, embed, out[:, None], token[:, None], pos, valid, cache, self.cfg
        )
        out = out[:, 0]
    return jnp.stack(tokens, 1), jnp.stack(dists, 1), draft_state.replace(cache=cache, base=base)

  def check_tree(self, spec) -> None:
    tree_build.check_tree(self.name, spec)
    if spec.max_depth + 1 > self.ring:
      raise ValueError(
        f'an EAGLE head keeps features of {self.ring} positions; a tree of depth '
        f'{spec.max_depth} needs {spec.max_depth + 1}'
      )

  def propose_tree(self, params, draft_state: EagleState, state, key, spec, sampling):
    """A tree drafted on the head's own output states (drafters/tree_build.py): each node
    is fed its parent's output state and its own token; rollback drops them all."""
    head, embed, ids = params['head'], params['embed'], jnp.asarray(params['head']['vocab_ids'])
    out, cache = self._catch_up(params, draft_state, state, spec.max_depth + 1)
    base = cache.lengths

    def feed(cache, tokens, parent_states, positions, slots, mask):
      o, cache = cached_step(
        head, embed, parent_states, tokens, positions, None, cache, self.cfg, slots, mask
      )
      return head_logits(head, o, self.cfg), o, cache

    args = (feed, cache, head_logits(head, out, self.cfg), out, base, cache.cache_size)
    extra = {'ids': ids, 'vocab': self.vocab_size}
    if spec.shape is not None:
      draft, cache = tree_build.static_tree(*args, spec.shape, key, sampling, **extra)
    else:
      draft, cache = tree_build.dynamic_tree(*args, spec, sampling, **extra)
    return draft, draft_state.replace(cache=cache, base=base)

  def _trim(self, draft_state: EagleState, state) -> EagleState:
    # Only entries run with the target's features stay: its own states were guesses.
    lengths = jnp.minimum(draft_state.cache.lengths, draft_state.base)
    return draft_state.replace(cache=draft_state.cache.with_lengths(lengths))


SHIPPED = os.path.join(
  os.path.dirname(os.path.dirname(__file__)), 'drafts', 'smollm2-135m-instruct-eagle3'
)
USAGE = 'eagle (the head shipped for SmolLM2-135M-Instruct) or eagle:<directory>'


def _parse(spec) -> str:
  if spec.options or len(spec.args) > 1:
    raise spec.error(USAGE)
  path = spec.args[0] if spec.args else SHIPPED
  if not eagle3.is_head_dir(path):
    raise ValueError(
      f'draft {spec.text!r}: no EAGLE-3 head at {path} (no config.json with '
      f'draft_vocab_size and model.safetensors; train one with python -m specjax.train_draft '
      f'--config configs/eagle_smollm2.py)'
    )
  return path


def _build(path, target, dtype):
  cfg, head, _ = eagle3.load(path)
  check_target(f'EAGLE head {path}', cfg, target)
  embed = target.params['embed']
  head = jax.tree.map(
    lambda a: a if a.dtype == np.int32 else np.asarray(a, np.asarray(embed).dtype), head
  )
  name = f'EAGLE-3 head ({cfg.draft_vocab}-token vocabulary, target layers {list(cfg.capture)})'
  return EagleDrafter(cfg, name=name), {'head': head, 'embed': embed}


def _resync(drafter: EagleDrafter, window: int) -> EagleDrafter:
  return dataclasses.replace(drafter, resync=window, ring=max(drafter.ring, window))


EAGLE = DraftKind(
  usage=USAGE,
  parse=_parse,
  build=_build,
  max_depth=EagleDrafter.ring - 1,
  classes=(EagleDrafter,),
  partition_rules=sharding.EAGLE_RULES,
  resync=_resync,
)
