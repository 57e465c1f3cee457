"""The DFlash-style block drafter as a drafter (the model: specjax/models/dflash.py).

One forward pass of a small drafter at the target's width fills a block after the last
emitted token (the anchor): every drafted position at once, from the target's own
features. Its chain proposal of gamma <= block_size - 1 tokens is the block's first
gamma positions: argmax each when greedy; when sampling, each position drawn from its
own distribution, which is the q handed to the verifier (the positions are drawn
independently, and a proposal's q may be any distribution fixed before it is drawn, so
rejection and block verification stay lossless). Its draft vocabulary may be reduced
(q = 0 outside it).

**Features without a second target pass.** Like the EAGLE head (drafters/eagle.py) it
declares `capture`; the loop's target forwards capture those layers and `update` keeps the
committed positions' features in a small ring. The drafter's cache holds, per layer, the
keys and values of the committed context's fused features: a function of a position's
features alone, never of the drafter's own guesses. A proposal first writes the pending
positions' (those committed since the last proposal) from the ring, then runs the block
forward, which leaves the cache as it was; so the cache only ever holds committed
positions and rollback has nothing to undo.

Draft specs: `dflash` (the drafter shipped for SmolLM2-135M-Instruct,
specjax/drafts/smollm2-135m-instruct-dflash, whose DSpark heads `dspark` adds; an
untrained one, named so, where that directory is missing),
`dflash:random[,block=B,layers=N,seed=S]` (untrained, for tests and as a training
start) or `dflash:DIR` (a drafter in DFlash's checkpoint layout,
specjax/checkpoints/dflash.py).
"""

from __future__ import annotations

import dataclasses
import os

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct

from specjax.checkpoints import dflash as dflash_ckpt
from specjax.core import sampling as sampling_lib
from specjax.core.contract import DraftKind, TargetOut
from specjax.drafters import tree_build
from specjax.drafters.eagle import FeatureDrafter, check_target, committed_length, to_full_vocab
from specjax.models import dflash as dflash_model
from specjax.models import quant, sharding
from specjax.models.dflash import DFlashConfig
from specjax.models.kv_cache import KVCache


@struct.dataclass
class DFlashState:
  # Per draft layer, the keys and values of the committed context's fused target
  # features; lengths = the positions written (the target cache's length, once caught up).
  cache: KVCache
  ring: jax.Array  # [B, W, C * D] committed features; position p at slot p % W


@dataclasses.dataclass(frozen=True)
class DFlashDrafter(FeatureDrafter):
  """Drafts with a block drafter `cfg`; params {'block': ..., 'embed': target [V, D]}.

  `ring` is how many committed positions of features it keeps (0: the block size, enough
  for any chain); under adaptive control (its kind's `resync`) plain target steps leave features
  pending, and a proposal then writes up to `ring` of them at once.
  """

  cfg: DFlashConfig
  name: str = dataclasses.field(default='DFlash block drafter', compare=False)
  ring: int = 0
  resync: int = 0
  kind = 'DFlash'  # (a class constant: what errors call it)

  @property
  def ring_size(self) -> int:
    return max(self.ring, self.cfg.block_size)

  def init(
    self, params, prompt_tokens, prompt_lens, cache_size, constrain=None, target=TargetOut()
  ):
    features = target.features
    if features is None:
      raise ValueError('a DFlash drafter needs the target features of the prompt (prefill capture)')
    block = params['block']
    b, p = prompt_tokens.shape
    cache = KVCache.init(self.cfg, b, cache_size, block['fc'].dtype)
    if constrain is not None:
      cache = constrain(cache)
    positions = jnp.broadcast_to(jnp.arange(p, dtype=jnp.int32), (b, p))
    valid = positions < prompt_lens[:, None]
    cache = dflash_model.absorb(block, cache, features, positions, valid, self.cfg)
    ring = jnp.zeros((b, self.ring_size, features.shape[-1]), features.dtype)
    return DFlashState(cache=cache.with_lengths(prompt_lens), ring=ring)

  def _catch_up(self, block, draft_state: DFlashState, state, width: int) -> KVCache:
    """Writes the pending positions (among the last `width` before the target's length)
    from the ring; returns the cache with lengths = the target's."""
    cache, w = draft_state.cache, draft_state.ring.shape[1]
    target_len = committed_length(state)
    positions = target_len[:, None] - width + jnp.arange(width, dtype=jnp.int32)  # [B, width]
    valid = positions >= cache.lengths[:, None]
    feats = jnp.take_along_axis(draft_state.ring, (positions % w)[:, :, None], axis=1)
    cache = dflash_model.absorb(block, cache, feats, positions, valid, self.cfg)
    return cache.with_lengths(target_len)

  def context(self, params, draft_state: DFlashState, state, gamma: int) -> KVCache:
    """The cache with every committed position written (the pending ones from the ring),
    after checking that gamma fits the block."""
    if gamma > self.cfg.block_size - 1:
      raise ValueError(
        f'a {self.kind} drafter with blocks of {self.cfg.block_size} drafts at most '
        f'{self.cfg.block_size - 1} tokens; gamma {gamma} asks for more'
      )
    block = params['block']
    widths = [self.cfg.block_size] + ([self.ring_size] if self.resync else [])
    if len(widths) == 1:
      return self._catch_up(block, draft_state, state, widths[0])
    lag = jnp.max(committed_length(state) - draft_state.cache.lengths)
    branches = [lambda _, w=w: self._catch_up(block, draft_state, state, w) for w in widths]
    return jax.lax.switch((lag > widths[0]).astype(jnp.int32), branches, None)

  def propose(self, params, draft_state: DFlashState, state, key, gamma, sampling):
    block, embed = params['block'], params['embed']
    cache = self.context(params, draft_state, state, gamma)
    logits = dflash_model.block_logits(block, embed, state.last_tokens, cache, self.cfg, gamma)
    ids = jnp.asarray(block['vocab_ids'])
    tokens = ids[sampling_lib.sample(logits, key, sampling)]
    q = to_full_vocab(sampling_lib.probabilities(logits, sampling), ids, self.vocab_size)
    return tokens, q, draft_state.replace(cache=cache)

  def check_tree(self, spec) -> None:
    tree_build.check_tree(self.name, spec)
    if spec.max_depth > self.cfg.block_size - 1:
      raise ValueError(
        f'a {self.kind} drafter with blocks of {self.cfg.block_size} drafts trees of depth '
        f'at most {self.cfg.block_size - 1}; this one is {spec.max_depth} deep'
      )

  def child_logits(self, params, logits: jax.Array, parents: jax.Array) -> jax.Array:
    """Logits [B, W, K] of the children of tree nodes whose tokens are parents[B, W] (target
    ids), from the block's logits at the children's depth [B, W, K]: the block's marginals
    do not depend on the path, so every node at a depth gets the same."""
    del params, parents
    return logits

  def propose_tree(self, params, draft_state: DFlashState, state, key, spec, sampling):
    """A tree from the block's per-position distributions (DDTree-style): one block
    forward; a node at depth d gets its children from position d + 1's distribution
    (top tokens in order, or drawn without replacement when sampling a static shape:
    drafters/tree_build.py), so the tree costs no draft forward per level."""
    block = params['block']
    depth = spec.max_depth
    cache = self.context(params, draft_state, state, depth)
    logits = dflash_model.block_logits(
      block, params['embed'], state.last_tokens, cache, self.cfg, depth
    )
    base = cache.lengths
    pad = jnp.pad(logits, ((0, 0), (0, 1), (0, 0)))  # (the deepest level has no children)

    def feed(carry, tokens, parent_states, positions, slots, mask):
      del slots, mask
      at = jnp.take_along_axis(pad, (positions - base[:, None] + 1)[..., None], axis=1)
      return self.child_logits(params, at, tokens), parent_states, carry

    root = self.child_logits(params, logits[:, :1], state.last_tokens[:, None])[:, 0]
    zero = jnp.zeros((logits.shape[0], 0), logits.dtype)
    args = (feed, None, root, zero, base, cache.cache_size)
    extra = {'ids': jnp.asarray(block['vocab_ids']), 'vocab': self.vocab_size}
    if spec.shape is not None:
      draft, _ = tree_build.static_tree(*args, spec.shape, key, sampling, **extra)
    else:
      draft, _ = tree_build.dynamic_tree(*args, spec, sampling, **extra)
    return draft, draft_state.replace(cache=cache)

  def _trim(self, draft_state: DFlashState, state) -> DFlashState:
    # The cache holds committed positions only; a target that rolled back past them
    # (never in the loop) would need them written again.
    lengths = jnp.minimum(draft_state.cache.lengths, committed_length(state))
    return draft_state.replace(cache=draft_state.cache.with_lengths(lengths))


SHIPPED = os.path.join(
  os.path.dirname(os.path.dirname(__file__)), 'drafts', 'smollm2-135m-instruct-dflash'
)
USAGE = (
  'dflash (the drafter shipped for SmolLM2-135M-Instruct; untrained without one), '
  'dflash:random[,block=B,layers=N,seed=S] (untrained) or dflash:<directory>'
)
RANDOM_OPTIONS = {'block': ('block', int), 'layers': ('layers', int), 'seed': ('seed', int)}


@dataclasses.dataclass(frozen=True)
class RandomSettings:
  """An untrained drafter: blocks of `block`, `layers` layers, weights from `seed`."""

  block: int = dflash_model.DEFAULT_BLOCK
  layers: int = 1
  seed: int = 0


def _parse(spec):
  """A directory (str) or RandomSettings; raises ValueError with USAGE for a bad spec."""
  if len(spec.args) > 1:
    raise spec.error(USAGE)
  if spec.args and spec.args[0] != 'random':
    if spec.options:
      raise spec.error(USAGE)
    path = spec.args[0]
    if not dflash_ckpt.is_dflash_dir(path):
      raise ValueError(
        f'draft {spec.text!r}: no DFlash drafter at {path} (no config.json with '
        f'dflash_config and model.safetensors)'
      )
    return path
  if not spec.args and not spec.options and dflash_ckpt.is_dflash_dir(SHIPPED):
    return SHIPPED
  settings = RandomSettings(**spec.option_dict(RANDOM_OPTIONS, USAGE))
  if settings.block < 2 or settings.layers < 1:
    raise ValueError(f'draft {spec.text!r}: needs block >= 2 and layers >= 1; expected {USAGE}')
  return settings


def _untrained(settings: RandomSettings, target):
  """(cfg, float32 params) of a randomly initialised drafter for `target`; its output
  head and norm start from the target's, over the whole vocabulary."""
  cfg = DFlashConfig.for_target(
    target.cfg, target.cfg.vocab_size, n_layers=settings.layers, block_size=settings.block
  )
  ids = np.arange(target.cfg.vocab_size)
  params = dflash_model.init_params(cfg, jax.random.key(settings.seed), ids, target.params)
  return cfg, params


def _build(settings, target, dtype):
  if isinstance(settings, RandomSettings):
    cfg, block = _untrained(settings, target)
    name = f'DFlash block drafter (untrained, blocks of {cfg.block_size})'
  else:
    cfg, block, _ = dflash_ckpt.load(settings)
    name = f'DFlash block drafter (blocks of {cfg.block_size}, target layers {list(cfg.capture)})'
  return DFlashDrafter(cfg, name=name), draft_params(cfg, block, settings, target, dtype)


def draft_params(cfg: DFlashConfig, block, source, target, dtype) -> dict:
  """{'block', 'embed'} for `target` of a block drafter's float32 params (checked against
  the target's vocabulary, width and layers; cast to the target's dtype)."""
  check_target(f'DFlash drafter {source}', cfg, target)
  embed = target.params['embed']
  dt = jnp.dtype(dtype) if quant.is_block(embed) else np.asarray(embed).dtype
  block = jax.tree.map(lambda a: a if a.dtype == np.int32 else np.asarray(a, dt), block)
  return {'block': block, 'embed': embed}


def resyncing(drafter: DFlashDrafter, window: int) -> DFlashDrafter:
  # Pending after a streak of plain steps: the last chain's tokens and the streak's.
  return dataclasses.replace(drafter, resync=window, ring=drafter.cfg.block_size + window)


DFLASH = DraftKind(
  usage=USAGE,
  parse=_parse,
  build=_build,
  classes=(DFlashDrafter,),
  partition_rules=sharding.DFLASH_RULES,
  resync=resyncing,
)
