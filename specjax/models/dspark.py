"""DSpark's two heads on a DFlash block drafter, as pure functions (DeepSeek 2026;
reference code deepseek-ai/DeepSpec, `deepspec/modeling/dspark/`).

A DFlash block (models/dflash.py) scores its positions independently: one forward gives
every position's base logits b_i from its final state h_i. DSpark adds:

* **A low-rank Markov head** that ties each position to the token drafted before it.
  With the previous token x_{i-1} (the anchor for the first position),

      e_i = W1[x_{i-1}]                    (W1 [V, r]: a rank-r embedding of the target's ids)
      logits_i = b_i + e_i @ W2            (W2 [r, K]: a bias over the draft vocabulary)

  so the block is drawn position by position (semi-autoregressive: a scan over at most
  block_size - 1 cheap steps after the one forward). Each position's distribution
  q_i = softmax(logits_i) is fixed before its token is drawn, given the tokens drawn
  before it: the chain's q that the verifier needs, so verification stays lossless.

* **A confidence head**: per position, the probability that the target accepts the
  drafted token given that it accepted the ones before,

      c_i = sigmoid(h_i . w + b)

  and prod_{j <= i} c_j the probability that the first i drafted tokens all survive:
  what confidence-scheduled verification reads to choose how many to verify. It reads
  the block's states only, not the tokens drawn (DeepSpec can add the previous token's
  Markov embedding): the states come from the one forward before anything is drawn, so a
  length chosen from them is independent of the draws, and verifying a chain whose length
  was fixed before its tokens were drawn is lossless. A length chosen from confidences
  that read the drawn tokens would favour some draws over others: the verified tokens
  would no longer be distributed as their q, and rejection sampling would no longer
  return the target's distribution.

Parameters: {'w1': [V, r], 'w2': [r, K], 'conf_w': [D], 'conf_b': []}. Untrained,
W2 = 0 (the Markov bias vanishes: the plain DFlash block) and the confidence is 1/2.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from specjax.core import sampling as sampling_lib


def init_params(vocab_size: int, draft_vocab: int, d_model: int, rank: int, key) -> dict:
  return {
    'w1': 0.02 * np.asarray(jax.random.normal(key, (vocab_size, rank)), np.float32),
    'w2': np.zeros((rank, draft_vocab), np.float32),
    'conf_w': np.zeros((d_model,), np.float32),
    'conf_b': np.zeros((), np.float32),
  }


def shapes(vocab_size: int, draft_vocab: int, d_model: int, rank: int) -> dict:
  return {
    'w1': (vocab_size, rank),
    'w2': (rank, draft_vocab),
    'conf_w': (d_model,),
    'conf_b': (),
  }


def check_params(cfg, params, source: str) -> None:
  """Raises ValueError naming the first head tensor whose shape disagrees with the block
  drafter's `cfg` (models/dflash.DFlashConfig; the rank is W1's)."""
  if 'w1' not in params or len(params['w1'].shape) != 2:
    raise ValueError(f'{source}: missing or malformed Markov tensor w1')
  want = shapes(cfg.vocab_size, cfg.draft_vocab, cfg.d_model, params['w1'].shape[1])
  for name, shape in want.items():
    if name not in params:
      raise ValueError(f'{source}: missing tensor {name}')
    if tuple(params[name].shape) != shape:
      raise ValueError(
        f'{source}: tensor {name} has shape {tuple(params[name].shape)}, expected {shape}'
      )


def step(params, base: jax.Array, prev: jax.Array) -> jax.Array:
  """Base logits [..., K] and the previous token's target id prev[...] -> the Markov
  head's float32 logits [..., K]."""
  e = jnp.take(params['w1'], prev, axis=0).astype(jnp.float32)  # [..., r]
  return base + e @ params['w2'].astype(jnp.float32)


def confidence(params, states: jax.Array) -> jax.Array:
  """Each position's survival probability [...] from its final state [..., D]."""
  return jax.nn.sigmoid(confidence_logit(params, states))


def confidence_logit(params, states: jax.Array) -> jax.Array:
  """The confidence's logit [...] (what a cross-entropy reads)."""
  return states.astype(jnp.float32) @ params['conf_w'].astype(jnp.float32) + params['conf_b']


def chain(params, base, anchor, vocab_ids, key, sampling: sampling_lib.SamplingConfig):
  """Draws the block's positions in order: base logits [B, G, K] of its first G
  positions, anchor [B] (target ids), vocab_ids [K] -> (draft-vocabulary indices [B, G],
  each position's distribution q [B, G, K] as the sampler drew from it: one-hot when
  greedy)."""
  # a key per position, folded in: a block's first g draws are the same for any length
  keys = jax.vmap(lambda i: jax.random.fold_in(key, i))(jnp.arange(base.shape[1]))

  def body(prev, xs):
    b, k = xs
    logits = step(params, b, prev)
    token = sampling_lib.sample(logits, k, sampling)
    return vocab_ids[token], (token, sampling_lib.probabilities(logits, sampling))

  _, (tokens, q) = jax.lax.scan(body, anchor, (jnp.moveaxis(base, 1, 0), keys))
  return jnp.moveaxis(tokens, 0, 1), jnp.moveaxis(q, 0, 1)
