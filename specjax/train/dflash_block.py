"""Training a DFlash-style block drafter (specjax/models/dflash.py) on cached target features.

DFlash's block objective (Chen et al. 2026, arXiv 2602.06036; the training wrapper of
SpecForge, specforge/core/dflash.py, which the DFlash authors point to): per training
sequence, `anchors` random positions a. Each anchor starts a block: position 0 holds the
token at a, positions 1 .. T - 1 the mask embedding; the block sees the context's fused
features at positions < a only (strictly: at decoding time the anchor is the last
committed token, whose target features are not known yet) and is bidirectional inside.
Block position k learns the token at a + k: the target's distribution p_{a + k - 1} (the
feature data's, renormalised on the draft vocabulary; DFlash's cross-entropy on the data
token is the divergence's special case for the target's own greedy answers). Position k's
loss weighs exp(-(k - 1) / gamma) (DFlash: gamma 7 for blocks of 16, 4 for blocks of 8):
an early miss ends the accepted prefix, so early positions matter more.

**Training-time blocks are decode-time blocks.** Every sequence's context keys and values
are written once (models/dflash.absorb, all positions); each anchor then runs
models/dflash.block_logits over that cache with its length set to the anchor, vmapped over
anchors (the cache is shared, not copied): the very function the drafter calls in the
decoding loop after catching up to the committed length a.

Evaluation on held-aside sequences at anchors every `eval_stride` positions, per block
position k: `greedy_k`, the share where the drafter's argmax is the target's argmax over
the full vocabulary, and `accept_t1_k`, sum over tokens of min(p, q); `chain`, the mean
number of draft tokens a greedy chain of the whole block keeps (the sum over k of the
product of the first k matches; blocks that lie wholly in learned positions), so
1 + chain estimates tokens per target call at gamma = block_size - 1; `chain_t1` the same
product over the T = 1 acceptances.
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np

from specjax import registry
from specjax.models import dflash as dflash_model
from specjax.models.dflash import DFlashConfig
from specjax.models.kv_cache import KVCache
from specjax.train import data as data_lib
from specjax.train import eagle_head, feature_data
from specjax.train.eagle_head import device_batch
from specjax.train.task import Task, make_optimizer, optimizer_step


def context_cache(params, features, cfg: DFlashConfig) -> KVCache:
  """Every layer's context keys and values of features[B, S, C * D] at positions 0 .. S - 1."""
  b, s, _ = features.shape
  cache = KVCache.init(cfg, b, s, params['fc'].dtype)
  positions = jnp.broadcast_to(jnp.arange(s, dtype=jnp.int32), (b, s))
  return dflash_model.absorb(params, cache, features, positions, positions >= 0, cfg)


def block_logits_at(params, embed, features, tokens, anchors, cfg: DFlashConfig) -> jax.Array:
  """Logits [B, N, T - 1, K] of the blocks at anchors[B, N] of sequences tokens[B, S] with
  target features[B, S, C * D]: block n of row b is what the drafter proposes after the
  context tokens[b, :a] (features known) and the anchor tokens[b, a], a = anchors[b, n]."""
  states = block_states_at(params, embed, features, tokens, anchors, cfg)
  return dflash_model.head_logits(params, states)


def block_states_at(params, embed, features, tokens, anchors, cfg: DFlashConfig) -> jax.Array:
  """block_logits_at's final states [B, N, T - 1, D], before the output head."""
  cache = context_cache(params, features, cfg)

  def one(anchor):  # [B] positions
    token = jnp.take_along_axis(tokens, anchor[:, None], axis=1)[:, 0]
    return dflash_model.block_states(params, embed, token, cache.with_lengths(anchor), cfg)

  return jax.vmap(one, in_axes=1, out_axes=1)(anchors)


def label_positions(anchors, mask, block_size: int):
  """(pos, valid) [B, N, T - 1]: block position k + 1 learns the target's distribution at
  position a + k (of token a + k + 1); valid where that position is learned (mask)."""
  pos = anchors[..., None] + jnp.arange(block_size - 1, dtype=jnp.int32)
  inside = pos < mask.shape[1]
  pos = jnp.minimum(pos, mask.shape[1] - 1)
  b = jnp.arange(mask.shape[0])[:, None, None]
  return pos, inside & mask[b, pos]


def teacher_at(frozen, batch, pos):
  """The target's next-token probabilities at positions pos[B, N, T - 1] on the draft
  vocabulary [B, N, T - 1, K]: as they are (a sub-distribution) and renormalised."""
  b = jnp.arange(pos.shape[0])[:, None, None]
  hidden = batch['hidden'][b, pos].astype(jnp.float32)
  p = jnp.exp(hidden @ frozen['head_w'] - batch['lse'][b, pos][..., None])
  return p, p / jnp.maximum(p.sum(-1, keepdims=True), 1e-9)


def sample_anchors(key, mask, count: int):
  """(anchors, keep) [B, count]: distinct random positions a >= 1 with mask[a] (block
  position 1 learned; a context of at least one position, as at decoding time), in random
  order; a row with fewer such positions fills up with others, keep False (weighed 0)."""
  b, s = mask.shape
  eligible = mask & (jnp.arange(s) >= 1)[None]
  score = eligible + jax.random.uniform(key, (b, s)) * 0.5
  _, anchors = jax.lax.top_k(score, min(count, s))
  return anchors.astype(jnp.int32), jnp.take_along_axis(eligible, anchors, axis=1)


def position_weights(block_size: int, gamma: float) -> jax.Array:
  """[T - 1] DFlash's loss weight of block positions 1 .. T - 1 (gamma 0: all 1)."""
  k = jnp.arange(block_size - 1, dtype=jnp.float32)
  return jnp.exp(-k / gamma) if gamma > 0 else jnp.ones_like(k)


def loss_fn(params, frozen, batch, key, cfg: DFlashConfig, anchors: int, gamma, divergence):
  """The weighted block loss over `anchors` random blocks per sequence."""
  at, keep = sample_anchors(key, batch['mask'], anchors)
  logits = block_logits_at(params, frozen['embed'], batch['features'], batch['tokens'], at, cfg)
  pos, valid = label_positions(at, batch['mask'], cfg.block_size)
  valid = valid & keep[..., None]
  _, p = teacher_at(frozen, batch, pos)
  div = registry.DIVERGENCES.get(divergence)(p, logits)  # [B, N, T - 1]
  w = valid * position_weights(cfg.block_size, gamma)
  loss = jnp.sum(div * w) / jnp.maximum(w.sum(), 1e-6)
  agree = (jnp.argmax(logits, -1) == jnp.argmax(p, -1)) & valid
  per_k = agree.sum((0, 1)) / jnp.maximum(valid.sum((0, 1)), 1)
  return loss, {'agree': agree.sum() / jnp.maximum(valid.sum(), 1), 'agree_1': per_k[0]}


def make_train_step(cfg, optimizer, anchors: int, gamma: float, divergence: str):
  """A jitted (state, frozen, batch, key) -> (state, metrics)."""
  loss = functools.partial(loss_fn, cfg=cfg, anchors=anchors, gamma=gamma, divergence=divergence)
  return optimizer_step(loss, optimizer)


def make_eval_step(cfg: DFlashConfig):
  """(params, frozen, batch, anchors[B, N]) -> greedy match and T=1 acceptance [B, N, T - 1]
  (batch['target_top'][B, S]: the target's argmax token after each position)."""

  @jax.jit
  def step(params, frozen, batch, anchors):
    logits = block_logits_at(
      params, frozen['embed'], batch['features'], batch['tokens'], anchors, cfg
    )
    q = jax.nn.softmax(logits, -1)
    pos, _ = label_positions(anchors, batch['mask'], cfg.block_size)
    accept = jnp.sum(jnp.minimum(teacher_at(frozen, batch, pos)[0], q), -1)
    b = jnp.arange(pos.shape[0])[:, None, None]
    greedy = frozen['vocab_ids'][jnp.argmax(logits, -1)] == batch['target_top'][b, pos]
    return greedy.astype(jnp.float32), accept

  return step


def target_argmax(frozen, dataset, batch_size: int) -> np.ndarray:
  """[N, S] the target's greedy token after each position (full vocabulary)."""
  return eagle_head.target_argmax(frozen, dataset, batch_size, first=0)


def eval_anchors(seq_len: int, stride: int) -> np.ndarray:
  return np.arange(1, seq_len, stride, dtype=np.int32)


def evaluate(eval_step, params, frozen, dataset, batch_size: int, stride: int, top, block: int):
  """Held-aside metrics (the module doc) at anchors every `stride` positions."""
  seq_len = dataset.tokens.shape[1]
  anchors = eval_anchors(seq_len, stride)
  greedy, accept = [], []
  for rows, batch in eagle_head.eval_batches(dataset, batch_size, top):
    at = jnp.broadcast_to(jnp.asarray(anchors), (len(rows), len(anchors)))
    g, a = eval_step(params, frozen, batch, at)
    greedy.append(np.asarray(g))
    accept.append(np.asarray(a))
  greedy, accept = np.concatenate(greedy), np.concatenate(accept)  # [N, A, T - 1]
  mask = dataset.mask[dataset.rows]
  _, valid = label_positions(jnp.asarray(anchors)[None], jnp.asarray(mask), block)
  return summarize(greedy, accept, np.asarray(valid), dataset.source[dataset.rows])


def summarize(greedy, accept, valid, source) -> dict:
  """Per block position and chain metrics of greedy, accept, valid [N, A, T - 1]."""
  out = {}
  for k in range(greedy.shape[-1]):
    m = valid[..., k]
    out[f'greedy_{k + 1}'] = float(greedy[..., k][m].mean()) if m.any() else float('nan')
    out[f'accept_t1_{k + 1}'] = float(accept[..., k][m].mean()) if m.any() else float('nan')
  full = valid.all(-1)  # blocks wholly in learned positions
  chain = np.cumprod(greedy, -1).sum(-1)
  out['chain'] = float(chain[full].mean()) if full.any() else float('nan')
  out['chain_t1'] = (
    float(np.cumprod(accept, -1).sum(-1)[full].mean()) if full.any() else float('nan')
  )
  return eagle_head.by_source(out, greedy[..., 0], valid[..., 0], chain, full, source)


def train_info(config, target, steps: int, evals, **extra) -> dict:
  """The `specjax` entry a trained block drafter's config.json records (`extra` before
  final_eval)."""
  return {
    'target': target.source,
    'steps': steps,
    'train_blocks': int(steps * config.batch_size * config.anchors),
    'anchors': config.anchors,
    'loss_decay': config.loss_decay,
    'divergence': config.divergence,
    **extra,
    'final_eval': evals[-1] if evals else {},
  }


@dataclasses.dataclass
class BlockSetup:
  target: object
  train_data: feature_data.FeatureSet
  eval_data: feature_data.FeatureSet
  cfg: DFlashConfig
  init_params: dict
  frozen: dict


def setup(config, progress=print) -> BlockSetup:
  """The target, the feature data (shared with the EAGLE head's when the data config and
  captured layers agree), the drafter's shape and starting parameters, the frozen arrays."""
  from specjax.checkpoints import dflash as dflash_ckpt
  from specjax.checkpoints.loader import load_model

  target = load_model(config.target, config.get('dtype', 'float32'))
  d = config.drafter
  cfg = DFlashConfig.for_target(target.cfg, d.vocab_size, tuple(d.capture), d.layers, d.block_size)
  train_data, eval_data = feature_data.build(target, config.data, cfg.capture, progress)
  if d.get('init_from'):  # continue from a saved drafter (its vocabulary too)
    start_cfg, params, _ = dflash_ckpt.load(d.init_from)
    if start_cfg != cfg:
      raise ValueError(
        f"drafter.init_from {d.init_from}: its shape {start_cfg} differs from the config's {cfg}"
      )
  else:
    vocab_ids = eagle_head.vocabulary(target, train_data, d.vocab_size)
    params = dflash_model.init_params(cfg, jax.random.key(config.seed), vocab_ids, target.params)
  frozen = eagle_head.frozen_arrays(target, params.pop('vocab_ids'))
  return BlockSetup(target, train_data, eval_data, cfg, jax.tree.map(jnp.asarray, params), frozen)


def task(config, progress=print) -> Task:
  """What specjax.train.trainer.train runs for a config of kind 'dflash'."""
  from specjax.checkpoints import dflash as dflash_ckpt

  s = setup(config, progress)
  optimizer = make_optimizer(config)
  eval_top = target_argmax(s.frozen, s.eval_data, config.eval_batch)
  eval_step = make_eval_step(s.cfg)

  def batch(step):
    idx = data_lib.batch_indices(len(s.train_data), config.batch_size, step, config.seed)
    return device_batch(s.train_data.batch(np.sort(idx)))

  def save(workdir, params, steps, evals):
    block = {**jax.tree.map(np.asarray, params), 'vocab_ids': np.asarray(s.frozen['vocab_ids'])}
    info = train_info(config, s.target, steps, evals)
    dflash_ckpt.save(workdir / 'drafter', s.cfg, block, info)

  describe = (
    f'{eagle_head.describe_data(s.train_data, s.eval_data)}; block drafter '
    f'{s.cfg.num_params / 1e6:.1f}M parameters, '
    f'{s.cfg.n_layers} layers, blocks of {s.cfg.block_size}, {s.cfg.draft_vocab}-token '
    f'vocabulary, target layers {list(s.cfg.capture)}; {config.anchors} blocks per sequence'
  )
  return Task(
    describe=describe,
    init_params=s.init_params,
    frozen=s.frozen,
    train_step=make_train_step(
      s.cfg, optimizer, config.anchors, config.loss_decay, config.divergence
    ),
    optimizer=optimizer,
    evaluate=lambda params: evaluate(
      eval_step,
      params,
      s.frozen,
      s.eval_data,
      config.eval_batch,
      config.eval_stride,
      eval_top,
      s.cfg.block_size,
    ),
    batch=batch,
    save=save,
    summary=eagle_head.summary,
  )
