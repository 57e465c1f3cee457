"""Training a DSpark drafter (specjax/models/dspark.py on a DFlash block) on cached target
features: trainer kind 'dspark'.

The objectives follow DeepSeek's reference trainer (deepseek-ai/DeepSpec,
`deepspec/modeling/dspark/qwen3/modeling.py` forward and `deepspec/modeling/dspark/loss.py`):

* **Block + Markov head, teacher-forced.** The blocks and anchors are DFlash's
  (specjax/train/dflash_block.py); block position k's logits get the Markov bias of the
  *true* previous token, the one at a + k - 1 (the anchor for k = 1), as DeepSpec's
  `prev_token_ids = [anchor, target_ids[:-1]]`; the loss is the divergence to the
  target's distribution with DFlash's exp(-(k - 1) / gamma) decay.

* **Confidence head, BCE on measured acceptance.** DeepSpec's label is the teacher-forced
  position's T = 1 acceptance rate, 1 - TV(q, p), per position. specjax's c_k means "the
  drafted token at k survives given the ones before did" (what scheduled verification
  multiplies into prefix products), so its label here is the greedy event itself: the
  drafter's argmax at k (after the Markov bias) is the target's argmax, counted only where
  every earlier position matched *and* the data token there is the target's argmax. On
  such a prefix the teacher-forced previous tokens are exactly the tokens a greedy loop
  drafted and committed, so the label is the loop's own conditional event. The head reads
  the block's states through a stop-gradient: the BCE trains conf_w and conf_b only and
  leaves the block objective as it is (DeepSpec lets it reach the backbone, weighted by
  `confidence_head_alpha`); `conf_weight` scales it in the reported loss.

Evaluation (held aside, anchors every `eval_stride` positions): dflash_block's metrics for
the teacher-forced Markov chain (`greedy_k`, `accept_t1_k`, `chain`, `chain_t1`), and the
confidence head's calibration on the counted positions: `ece_k` per block position and
`ece` over all of them (expected calibration error, 10 equal-width bins: the
count-weighted mean of |mean confidence - share accepted| per bin), with `conf_k` and
`hit_k` (mean confidence and share accepted) and `counted_k` (positions labelled).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import optax

from specjax import registry
from specjax.models import dflash as dflash_model
from specjax.models import dspark as dspark_model
from specjax.models.dflash import DFlashConfig
from specjax.train import data as data_lib
from specjax.train import dflash_block, eagle_head
from specjax.train.task import Task, make_optimizer, optimizer_step

ECE_BINS = 10


def markov_logits_at(params, embed, features, tokens, anchors, prev, cfg: DFlashConfig):
  """(Markov logits [B, N, T - 1, K], final states [B, N, T - 1, D]) of the blocks at
  anchors[B, N] (dflash_block.block_logits_at) with block position k's previous token
  prev[B, N, T - 1] (target ids): what DSparkDrafter draws from in the decoding loop after
  drafting prev."""
  states = dflash_block.block_states_at(params['block'], embed, features, tokens, anchors, cfg)
  base = dflash_model.head_logits(params['block'], states)
  return dspark_model.step(params['heads'], base, prev), states


def around(tokens, pos):
  """(prev, next) [B, N, T - 1]: the data tokens at pos (the previous token of block
  position k, pos = a + k - 1) and at pos + 1 (the token position k learns)."""
  b = jnp.arange(tokens.shape[0])[:, None, None]
  return tokens[b, pos], tokens[b, jnp.minimum(pos + 1, tokens.shape[1] - 1)]


def confidence_labels(draft_top, target_top, data_next, valid):
  """(label, counted) [..., T - 1] of the drafter's greedy tokens draft_top, the target's
  argmax target_top and the data tokens data_next at each block position (target ids):
  label where the draft is the target's argmax; counted where valid and every earlier
  position's draft and data token were both the target's argmax (module doc)."""
  hit = draft_top == target_top
  greedy_prefix = jnp.cumprod(hit & (data_next == target_top), axis=-1).astype(bool)
  before = jnp.concatenate([jnp.ones_like(hit[..., :1]), greedy_prefix[..., :-1]], axis=-1)
  return hit, valid & before


def with_block(params, frozen):
  """params with the block: its own, or frozen['block'] when only the heads train."""
  return params if 'block' in params else {**params, 'block': frozen['block']}


def heads_forward(params, frozen, batch, anchors, cfg: DFlashConfig):
  """What loss and evaluation share at anchors[B, N]: (Markov logits, states, label
  positions, valid, confidence labels, counted)."""
  params = with_block(params, frozen)
  pos, valid = dflash_block.label_positions(anchors, batch['mask'], cfg.block_size)
  prev, data_next = around(batch['tokens'], pos)
  logits, states = markov_logits_at(
    params, frozen['embed'], batch['features'], batch['tokens'], anchors, prev, cfg
  )
  b = jnp.arange(pos.shape[0])[:, None, None]
  draft_top = frozen['vocab_ids'][jnp.argmax(logits, -1)]
  label, counted = confidence_labels(draft_top, batch['target_top'][b, pos], data_next, valid)
  return logits, states, pos, valid, label, counted


def loss_fn(params, frozen, batch, key, cfg: DFlashConfig, anchors: int, gamma, divergence, conf_w):
  """The weighted block loss (teacher-forced Markov logits) + conf_w * the confidence BCE."""
  at, keep = dflash_block.sample_anchors(key, batch['mask'], anchors)
  logits, states, pos, valid, label, counted = heads_forward(params, frozen, batch, at, cfg)
  valid, counted = valid & keep[..., None], counted & keep[..., None]
  _, p = dflash_block.teacher_at(frozen, batch, pos)
  div = registry.DIVERGENCES.get(divergence)(p, logits)  # [B, N, T - 1]
  w = valid * dflash_block.position_weights(cfg.block_size, gamma)
  block_loss = jnp.sum(div * w) / jnp.maximum(w.sum(), 1e-6)
  logit = dspark_model.confidence_logit(params['heads'], jax.lax.stop_gradient(states))
  bce = optax.sigmoid_binary_cross_entropy(logit, label.astype(jnp.float32))
  conf_loss = jnp.sum(bce * counted) / jnp.maximum(counted.sum(), 1)
  agree = (jnp.argmax(logits, -1) == jnp.argmax(p, -1)) & valid
  per_k = agree.sum((0, 1)) / jnp.maximum(valid.sum((0, 1)), 1)
  metrics = {
    'block_loss': block_loss,
    'conf_bce': conf_loss,
    'conf_counted': counted.sum() / jnp.maximum(valid.sum(), 1),
    'agree': agree.sum() / jnp.maximum(valid.sum(), 1),
    'agree_1': per_k[0],
  }
  return block_loss + conf_w * conf_loss, metrics


def make_train_step(cfg, optimizer, anchors: int, gamma: float, divergence: str, conf_w: float):
  """A jitted (state, frozen, batch, key) -> (state, metrics); params {'block', 'heads'}."""
  loss = functools.partial(
    loss_fn, cfg=cfg, anchors=anchors, gamma=gamma, divergence=divergence, conf_w=conf_w
  )
  return optimizer_step(loss, optimizer)


def make_eval_step(cfg: DFlashConfig):
  """(params, frozen, batch, anchors[B, N]) -> [B, N, T - 1] greedy match (the label), T=1
  acceptance, confidence, counted (batch['target_top'][B, S]: the target's argmax)."""

  @jax.jit
  def step(params, frozen, batch, anchors):
    logits, states, pos, _, label, counted = heads_forward(params, frozen, batch, anchors, cfg)
    q = jax.nn.softmax(logits, -1)
    accept = jnp.sum(jnp.minimum(dflash_block.teacher_at(frozen, batch, pos)[0], q), -1)
    conf = dspark_model.confidence(params['heads'], states)  # heads: never frozen
    return label.astype(jnp.float32), accept, conf, counted

  return step


def expected_calibration_error(conf, label, bins: int = ECE_BINS) -> float:
  """Expected calibration error of confidences conf[n] in [0, 1] against 0/1 labels[n]:
  sum over equal-width bins of (share of samples) * |mean confidence - mean label| (a
  confidence of exactly 1 falls in the last bin); nan without samples."""
  conf, label = np.asarray(conf, np.float64).ravel(), np.asarray(label, np.float64).ravel()
  if conf.size == 0:
    return float('nan')
  which = np.minimum((conf * bins).astype(np.int64), bins - 1)
  gap = np.bincount(which, conf - label, minlength=bins)  # per bin: count * (mean c - mean y)
  return float(np.abs(gap).sum() / conf.size)


def calibration(conf, label, counted) -> dict:
  """The confidence head's metrics (module doc) of conf, label, counted [..., T - 1]."""
  out = {}
  for k in range(conf.shape[-1]):
    m = counted[..., k]
    c, y = conf[..., k][m], label[..., k][m]
    out[f'ece_{k + 1}'] = expected_calibration_error(c, y)
    out[f'conf_{k + 1}'] = float(c.mean()) if m.any() else float('nan')
    out[f'hit_{k + 1}'] = float(y.mean()) if m.any() else float('nan')
    out[f'counted_{k + 1}'] = int(m.sum())
  out['ece'] = expected_calibration_error(conf[counted], label[counted])
  return out


def evaluate(eval_step, params, frozen, dataset, batch_size: int, stride: int, top, block: int):
  """Held-aside metrics (the module doc) at anchors every `stride` positions."""
  anchors = dflash_block.eval_anchors(dataset.tokens.shape[1], stride)
  parts = []
  for rows, batch in eagle_head.eval_batches(dataset, batch_size, top):
    at = jnp.broadcast_to(jnp.asarray(anchors), (len(rows), len(anchors)))
    parts.append([np.asarray(x) for x in eval_step(params, frozen, batch, at)])
  greedy, accept, conf, counted = (np.concatenate(x) for x in zip(*parts))  # [N, A, T - 1]
  mask = dataset.mask[dataset.rows]
  _, valid = dflash_block.label_positions(jnp.asarray(anchors)[None], jnp.asarray(mask), block)
  out = dflash_block.summarize(greedy, accept, np.asarray(valid), dataset.source[dataset.rows])
  return {**out, **calibration(conf, greedy, counted)}


def initial_heads(config, cfg: DFlashConfig) -> dict:
  """The heads to start from: drafter.init_from's when it is a DSpark drafter, else new."""
  from specjax.checkpoints import dspark as dspark_ckpt

  d = config.drafter
  if d.get('init_from') and dspark_ckpt.is_dspark_dir(d.init_from):
    heads = dspark_ckpt.load(d.init_from)[2]
    if heads['w1'].shape[1] != d.rank:
      raise ValueError(f'drafter.init_from {d.init_from}: Markov rank differs from {d.rank}')
    return heads
  key = jax.random.fold_in(jax.random.key(config.seed), 1)
  return dspark_model.init_params(cfg.vocab_size, cfg.draft_vocab, cfg.d_model, d.rank, key)


def task(config, progress=print) -> Task:
  """What specjax.train.trainer.train runs for a config of kind 'dspark'."""
  from specjax.checkpoints import dspark as dspark_ckpt

  if config.drafter.get('freeze_block') and not config.drafter.get('init_from'):
    # (before the setup loads the target and the feature data)
    raise ValueError('drafter.freeze_block needs drafter.init_from (a trained block)')
  s = dflash_block.setup(config, progress)
  heads = jax.tree.map(jnp.asarray, initial_heads(config, s.cfg))
  params = {'block': s.init_params, 'heads': heads}
  frozen = s.frozen
  if config.drafter.get('freeze_block'):  # the heads learn on a trained block that stays
    params, frozen = {'heads': heads}, {**s.frozen, 'block': s.init_params}
  optimizer = make_optimizer(config)
  progress('the target argmax at every training position (the confidence labels)')
  train_top = dflash_block.target_argmax(frozen, s.train_data, config.eval_batch)
  eval_top = dflash_block.target_argmax(frozen, s.eval_data, config.eval_batch)
  eval_step = make_eval_step(s.cfg)

  def batch(step):
    idx = np.sort(data_lib.batch_indices(len(s.train_data), config.batch_size, step, config.seed))
    b = dflash_block.device_batch(s.train_data.batch(idx))
    return {**b, 'target_top': jnp.asarray(train_top[idx])}

  def save(workdir, params, steps, evals):
    p = jax.tree.map(np.asarray, with_block(params, frozen))
    block = {**p['block'], 'vocab_ids': np.asarray(frozen['vocab_ids'])}
    info = dflash_block.train_info(config, s.target, steps, evals, conf_weight=config.conf_weight)
    dspark_ckpt.save(workdir / 'drafter', s.cfg, block, p['heads'], info)

  describe = (
    f'{eagle_head.describe_data(s.train_data, s.eval_data)}; DSpark drafter: a '
    f'{s.cfg.num_params / 1e6:.1f}M-parameter '
    f'block of {s.cfg.block_size} ({s.cfg.n_layers} layers, {s.cfg.draft_vocab}-token '
    f'vocabulary, target layers {list(s.cfg.capture)}), Markov rank {config.drafter.rank}, '
    f'a confidence head; {config.anchors} blocks per sequence'
  )
  return Task(
    describe=describe,
    init_params=params,
    frozen=frozen,
    train_step=make_train_step(
      s.cfg, optimizer, config.anchors, config.loss_decay, config.divergence, config.conf_weight
    ),
    optimizer=optimizer,
    evaluate=lambda params: evaluate(
      eval_step,
      params,
      frozen,
      s.eval_data,
      config.eval_batch,
      config.eval_stride,
      eval_top,
      s.cfg.block_size,
    ),  # fmt: skip
    batch=batch,
    save=save,
    summary=lambda ev: f'{eagle_head.summary(ev)}, confidence ECE {ev["ece"]:.3f}',
  )
