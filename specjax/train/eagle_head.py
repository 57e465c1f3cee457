"""Training an EAGLE-3-style feature head (specjax/models/eagle.py) on cached target features.

The data (specjax/train/feature_data.py) holds, per position t of a training sequence,
the target's captured features F_t and its exact next-token distribution p_t on the draft
vocabulary. Head position t reads (fc(F_t), embedding of token t + 1) and learns p_{t+1},
the target's distribution of token t + 2.

**Training-time test** (EAGLE-3): at decoding time only the first draft step sees target
features; later steps read the head's own output states. Training unrolls `unroll` steps
over whole sequences at once: step k at position t reads the step k - 1 output at t - 1
(in place of F_t) and the true token t + 1, and attends to step-1 keys at positions
<= t - k + 1 plus, for each step j in 2..k, the step-j key at position t - (k - j): exactly
what the k-th draft step sees after a verification (a diagonal mask over the unrolled
steps). Every step learns the same target p_{t+1}; step k's loss weighs step_decay^(k-1).

Evaluation on held-aside sequences, per unrolled step k: `greedy_k`, the share of
positions where the head's argmax is the target's argmax over the full vocabulary, and
`accept_t1_k`, sum over tokens of min(p, q) (rejection sampling's acceptance). `chain`
is the mean number of tokens a greedy chain of `unroll` draft steps would get accepted
(step k at position t + k - 1; the sum over k of the product of the first k matches), so
1 + chain estimates tokens per target call at gamma = unroll.
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np

from specjax import registry
from specjax.models import eagle as eagle_model
from specjax.models import llama
from specjax.train import data as data_lib
from specjax.train import feature_data
from specjax.train.task import Task, make_optimizer, optimizer_step


def _split_heads(x, n):
  b, t, _ = x.shape
  return x.reshape(b, t, n, -1)


def _shift(x, k: int):
  """x[:, t] -> x[:, t - k] along axis 1 (zeros for t < k)."""
  if k == 0:
    return x
  return jnp.pad(x, ((0, 0), (k, 0)) + ((0, 0),) * (x.ndim - 2))[:, : x.shape[1]]


def unrolled_states(params, embed, features, tokens, cfg: eagle_model.EagleConfig, unroll: int):
  """Output states [unroll, B, T - 1, D] of `unroll` draft steps at every position.

  features [B, T, C*D] and tokens [B, T]; head position t (0 .. T - 2) reads token t + 1.
  """
  b, t1 = tokens.shape[0], tokens.shape[1] - 1
  p = params['layer']
  n, g, h = cfg.n_heads, cfg.n_kv_heads, cfg.head_dim
  positions = jnp.broadcast_to(jnp.arange(t1, dtype=jnp.int32), (b, t1))
  cos, sin = llama.rope_tables(positions, h, cfg.rope_base)
  e = jnp.take(embed, tokens[:, 1:], axis=0).astype(jnp.float32)
  e_normed = llama.rms_norm(e, p['embed_norm'], cfg.norm_eps)
  x = eagle_model.fuse(params, features[:, :-1].astype(jnp.float32))
  keys, values, outs = [], [], []
  scale = h**-0.5
  for k in range(1, unroll + 1):
    if k > 1:
      x = _shift(outs[-1], 1)  # the previous step's output at t - 1
    y = jnp.concatenate([e_normed, llama.rms_norm(x, p['hidden_norm'], cfg.norm_eps)], -1)
    q = llama.apply_rope((y @ p['wq']).reshape(b, t1, n, h), cos, sin)
    kk = llama.apply_rope((y @ p['wk']).reshape(b, t1, g, h), cos, sin)
    vv = (y @ p['wv']).reshape(b, t1, g, h)
    keys.append(kk)
    values.append(vv)
    qg = q.reshape(b, t1, g, n // g, h)
    # Step-1 keys at s <= t - (k - 1).
    s1 = jnp.einsum('BTGRH,BSGH->BGRTS', qg, keys[0]) * scale
    mask1 = jnp.arange(t1)[None, :] <= jnp.arange(t1)[:, None] - (k - 1)  # [T, S]
    s1 = jnp.where(mask1[None, None, None], s1, -1e30)
    parts = [s1]
    vals = []
    for j in range(2, k + 1):  # step-j key at t - (k - j): a diagonal
      kj = _shift(keys[j - 1], k - j)
      parts.append(jnp.einsum('BTGRH,BTGH->BGRT', qg, kj)[..., None] * scale)
      vals.append(_shift(values[j - 1], k - j))
    probs = jax.nn.softmax(jnp.concatenate(parts, -1), -1)
    att = jnp.einsum('BGRTS,BSGH->BTGRH', probs[..., :t1], values[0])
    for i, vj in enumerate(vals):
      att = att + probs[..., t1 + i].transpose(0, 3, 1, 2)[..., None] * vj[:, :, :, None]
    xr = x + att.reshape(b, t1, n * h) @ p['wo']
    yy = llama.rms_norm(xr, p['mlp_norm'], cfg.norm_eps)
    out = xr + (jax.nn.silu(yy @ p['w_gate']) * (yy @ p['w_up'])) @ p['w_down']
    outs.append(out)
  return jnp.stack(outs)


def teacher(frozen, batch, shifted: bool = False):
  """The target's sub-probabilities over the draft vocabulary for head positions:
  p [B, T - 1, K] (of token t + 2) and their renormalised form. `shifted`: batch holds
  hidden and lse of the head positions already (position t + 1's)."""
  hidden, lse = batch['hidden'], batch['lse']
  if not shifted:
    hidden, lse = hidden[:, 1:], lse[:, 1:]
  logp = hidden.astype(jnp.float32) @ frozen['head_w'] - lse[..., None]
  p = jnp.exp(logp)
  return p, p / jnp.maximum(p.sum(-1, keepdims=True), 1e-9)


def loss_fn(params, frozen, batch, key, cfg, unroll, decay, divergence, keep: int):
  """The training-time-test loss; the output head (the K-wide part) runs at `keep` random
  learned positions per sequence (0: all), the decoder layer at every position."""
  states = unrolled_states(
    params, frozen['embed'], batch['features'], batch['tokens'], cfg, unroll
  )  # [U, B, T-1, D]
  mask = batch['mask'][:, 1:].astype(jnp.float32)  # position t + 1's next token is learned
  hidden, lse = batch['hidden'][:, 1:], batch['lse'][:, 1:]
  if keep:
    # Learned positions first, in random order; the step's key makes this reproducible.
    score = mask + jax.random.uniform(key, mask.shape) * 0.5
    _, pos = jax.lax.top_k(score, keep)  # [B, keep]
    pick = lambda a: jnp.take_along_axis(a, pos.reshape(pos.shape + (1,) * (a.ndim - 2)), 1)
    states = jax.vmap(pick)(states)
    mask, hidden, lse = pick(mask), pick(hidden), pick(lse)
    offset = pos
  else:
    offset = jnp.broadcast_to(jnp.arange(mask.shape[1]), mask.shape)
  logits = eagle_model.head_logits(params, states, cfg)  # [U, B, T', K]
  _, p = teacher(frozen, {'hidden': hidden, 'lse': lse}, shifted=True)
  div = registry.DIVERGENCES.get(divergence)
  total, metrics = 0.0, {}
  for k in range(unroll):
    m = mask * (offset >= k)  # step k needs k - 1 earlier positions
    count = jnp.maximum(m.sum(), 1.0)
    d = jnp.sum(div(p, logits[k]) * m) / count
    total = total + decay**k * d
    agree = (jnp.argmax(logits[k], -1) == jnp.argmax(p, -1)).astype(jnp.float32)
    metrics[f'agree_{k + 1}'] = jnp.sum(agree * m) / count
  return total / sum(decay**k for k in range(unroll)), metrics


def make_train_step(cfg, optimizer, unroll: int, decay: float, divergence: str, keep: int = 0):
  """A jitted (state, frozen, batch, key) -> (state, metrics)."""
  loss = functools.partial(
    loss_fn, cfg=cfg, unroll=unroll, decay=decay, divergence=divergence, keep=keep
  )
  return optimizer_step(loss, optimizer)


def make_eval_step(cfg, unroll: int):
  """(params, frozen, batch) -> greedy match and T=1 acceptance [U, B, T - 1]."""

  @jax.jit
  def step(params, frozen, batch):
    states = unrolled_states(
      params, frozen['embed'], batch['features'], batch['tokens'], cfg, unroll
    )
    q = jax.nn.softmax(eagle_model.head_logits(params, states, cfg), -1)
    p_sub, _ = teacher(frozen, batch)
    accept = jnp.sum(jnp.minimum(p_sub[None], q), -1)
    greedy = frozen['vocab_ids'][jnp.argmax(q, -1)] == batch['target_top'][None]
    return greedy.astype(jnp.float32), accept

  return step


def target_argmax(
  frozen, dataset: feature_data.FeatureSet, batch_size: int, first: int = 1
) -> np.ndarray:
  """[N, T - first] the target's greedy token after each position from `first` on (full
  vocabulary; first 1: after each head position)."""
  top = jax.jit(lambda h, w: jnp.argmax(h[:, first:].astype(jnp.float32) @ w, -1))
  out = []
  for start in range(0, len(dataset), batch_size):
    b = dataset.batch(np.arange(start, min(start + batch_size, len(dataset))))
    out.append(np.asarray(top(b['hidden'], frozen['full_w'])))
  return np.concatenate(out)


def evaluate(
  eval_step, params, frozen, dataset: feature_data.FeatureSet, batch_size, unroll, target_top
):
  greedy, accept = [], []
  for _, batch in eval_batches(dataset, batch_size, target_top):
    g, a = eval_step(params, frozen, batch)
    greedy.append(np.asarray(g))
    accept.append(np.asarray(a))
  greedy, accept = np.concatenate(greedy, 1), np.concatenate(accept, 1)  # [U, N, T-1]
  mask = dataset.mask[dataset.rows][:, 1:]
  source = dataset.source[dataset.rows]
  out = {}
  for k in range(unroll):
    m = mask & (np.arange(mask.shape[1]) >= k)[None]
    out[f'greedy_{k + 1}'] = float(greedy[k][m].mean())
    out[f'accept_t1_{k + 1}'] = float(accept[k][m].mean())
  # A chain drafted after position t: step k runs at position t + k - 1.
  n = mask.shape[1] - unroll + 1
  aligned = np.stack([greedy[k][:, k : k + n] for k in range(unroll)])  # [U, N, n]
  m = np.all(np.stack([mask[:, k : k + n] for k in range(unroll)]), 0)
  chain = np.cumprod(aligned, axis=0).sum(0)  # draft tokens a greedy chain keeps
  out['chain'] = float(chain[m].mean())
  return by_source(out, greedy[0], mask, chain, m, source)


def by_source(out: dict, greedy_1, valid_1, chain, full, source) -> dict:
  """out (held-aside metrics with greedy_1 and accept_t1_1) with greedy_1 and chain per
  data source and their aliases `greedy`, `accept_t1`: of greedy_1 where valid_1 [N, ...]
  and chain where full [N, ...], rows by source [N]."""
  for s, name in enumerate(data_lib.SOURCES):
    rows = source == s
    if full[rows].any():
      out[f'greedy_1_{name}'] = float(greedy_1[rows][valid_1[rows]].mean())
      out[f'chain_{name}'] = float(chain[rows][full[rows]].mean())
  out['greedy'] = out['greedy_1']
  out['accept_t1'] = out['accept_t1_1']
  return out


def summary(ev: dict) -> str:
  """The line the trainer logs of held-aside metrics."""
  return f'held-aside greedy match {ev["greedy_1"]:.3f}, chain {ev["chain"]:.2f}'


def device_batch(batch):
  """The arrays of a FeatureSet batch on the device (its `source` left on the host)."""
  return {k: jnp.asarray(v) for k, v in batch.items() if k != 'source'}


def eval_batches(dataset: feature_data.FeatureSet, batch_size: int, target_top):
  """(rows, batch on the device with the rows' target_top) of held-aside data, in order."""
  for start in range(0, len(dataset), batch_size):
    rows = np.arange(start, min(start + batch_size, len(dataset)))
    yield rows, {**device_batch(dataset.batch(rows)), 'target_top': jnp.asarray(target_top[rows])}


def describe_data(train: feature_data.FeatureSet, held: feature_data.FeatureSet) -> str:
  return (
    f'data: {len(train)} train sequences ({train.num_tokens} learned positions), '
    f'{len(held)} held aside'
  )


def vocabulary(target, data: feature_data.FeatureSet, size: int) -> np.ndarray:
  """The `size` tokens that follow learned positions most often in the training data (on
  the target's own answers these are its greedy tokens), EOS always in; sorted ids.
  EAGLE-3 picks its draft vocabulary by token frequency the same way."""
  v = target.cfg.vocab_size
  if size >= v:
    return np.arange(v, dtype=np.int32)
  tokens, mask = data.tokens[data.rows], data.mask[data.rows]
  counts = np.bincount(tokens[:, 1:][mask[:, :-1]], minlength=v).astype(np.float64)
  counts[target.tokenizer.eos_id] = np.inf
  return np.sort(np.argsort(-counts, kind='stable')[:size]).astype(np.int32)


def full_w_of(target):
  p = target.params
  return jnp.asarray(p['embed']).T if target.cfg.tie_embeddings else jnp.asarray(p['lm_head'])


def frozen_arrays(target, vocab_ids) -> dict:
  """What training holds fixed: the target's input embedding and output head (full_w, and
  head_w: its draft vocabulary's columns), the draft vocabulary's target ids."""
  full_w = full_w_of(target)
  frozen = {
    'embed': jnp.asarray(target.params['embed']),
    'vocab_ids': jnp.asarray(vocab_ids),
    'full_w': full_w,
  }
  frozen['head_w'] = full_w[:, frozen['vocab_ids']]
  return frozen


@dataclasses.dataclass
class HeadSetup:
  target: object
  train_data: feature_data.FeatureSet
  eval_data: feature_data.FeatureSet
  cfg: eagle_model.EagleConfig
  init_params: dict
  frozen: dict


def setup(config, progress=print) -> HeadSetup:
  from specjax.checkpoints.loader import load_model

  target = load_model(config.target, config.get('dtype', 'float32'))
  capture = tuple(config.head.capture) or eagle_model.default_capture(target.cfg.n_layers)
  cfg = eagle_model.EagleConfig.for_target(
    target.cfg, config.head.vocab_size, capture, config.head.ffn_dim
  )
  train_data, eval_data = feature_data.build(target, config.data, capture, progress)
  more = config.get('more_data')
  if more is not None and more.get('name'):  # more training sequences (held-aside: the first's)
    extra, _ = feature_data.build(target, more, capture, progress)
    train_data = feature_data.Concat([train_data, extra])
  if config.head.get('init_from'):  # continue from a saved head (its vocabulary too)
    from specjax.checkpoints import eagle3

    start_cfg, params, _ = eagle3.load(config.head.init_from)
    if start_cfg != cfg:
      raise ValueError(
        f'head.init_from {config.head.init_from}: its shape {start_cfg} differs from the '
        f"config's {cfg}"
      )
  else:
    vocab_ids = vocabulary(target, train_data, config.head.vocab_size)
    params = eagle_model.init_params(
      cfg, jax.random.key(config.seed), vocab_ids, target.params, config.head.init_layer
    )
  frozen = frozen_arrays(target, params.pop('vocab_ids'))
  return HeadSetup(target, train_data, eval_data, cfg, jax.tree.map(jnp.asarray, params), frozen)


def task(config, progress=print):
  """What specjax.train.trainer.train runs for a config of kind 'eagle'."""
  from specjax.checkpoints import eagle3

  s = setup(config, progress)
  optimizer = make_optimizer(config)
  unroll = config.unroll
  eval_step = make_eval_step(s.cfg, unroll)
  seq_len = s.train_data.tokens.shape[1]
  eval_top = target_argmax(s.frozen, s.eval_data, config.eval_batch)
  inside = np.zeros(s.cfg.vocab_size, bool)
  inside[np.asarray(s.frozen['vocab_ids'])] = True
  eval_mask = s.eval_data.mask[s.eval_data.rows][:, 1:]
  coverage = float(inside[eval_top][eval_mask].mean())

  def batch(step):
    idx = data_lib.batch_indices(len(s.train_data), config.batch_size, step, config.seed)
    return device_batch(s.train_data.batch(np.sort(idx)))

  def save(workdir, params, steps, evals):
    head = {**jax.tree.map(np.asarray, params), 'vocab_ids': np.asarray(s.frozen['vocab_ids'])}
    info = {
      'target': s.target.source,
      'steps': steps,
      'train_tokens': int(steps * config.batch_size * (seq_len - 1)),
      'unroll': unroll,
      'divergence': config.divergence,
      'final_eval': evals[-1] if evals else {},
      'vocab_coverage': coverage,
    }
    eagle3.save(workdir / 'head', s.cfg, head, info)

  describe = (
    f'{describe_data(s.train_data, s.eval_data)}; head {s.cfg.num_params / 1e6:.1f}M parameters, '
    f"{s.cfg.draft_vocab}-token vocabulary (holds {coverage:.3f} of the target's greedy "
    f'tokens on held-aside data), target layers {list(s.cfg.capture)}'
  )
  return Task(
    describe=describe,
    init_params=s.init_params,
    frozen=s.frozen,
    train_step=make_train_step(
      s.cfg, optimizer, unroll, config.step_decay, config.divergence, config.get('keep', 0)
    ),
    optimizer=optimizer,
    evaluate=lambda params: evaluate(
      eval_step, params, s.frozen, s.eval_data, config.eval_batch, unroll, eval_top
    ),
    batch=batch,
    save=save,
    summary=summary,
  )
