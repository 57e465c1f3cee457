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

      c_i = sigmoid([h_i, e_i] . w + b)

  and prod_{j <= i} c_j the probability that the first i drafted tokens all survive:
  what confidence-scheduled verification reads to choose how many to verify.

Parameters: {'w1': [V, r], 'w2': [r, K], 'conf_w': [D + r], 'conf_b': []}. Untrained,
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
    'conf_w': np.zeros((d_model + rank,), np.float32),
    'conf_b': np.zeros((), np.float32),
  }


def shapes(vocab_size: int, draft_vocab: int, d_model: int, rank: int) -> dict:
  return {
    'w1': (vocab_size, rank),
    'w2': (rank, draft_vocab),
    'conf_w': (d_model + rank,),
    'conf_b': (),
  }


def step(params, base: jax.Array, state: jax.Array, prev: jax.Array):
  """One position: base logits [B, K], final state [B, D] and the previous token's target
  id prev[B] -> (float32 logits [B, K], confidence logit [B])."""
  e = jnp.take(params['w1'], prev, axis=0).astype(jnp.float32)  # [B, r]
  logits = base + e @ params['w2'].astype(jnp.float32)
  feats = jnp.concatenate([state.astype(jnp.float32), e], axis=-1)
  return logits, feats @ params['conf_w'].astype(jnp.float32) + params['conf_b']


def chain(params, base, states, anchor, vocab_ids, key, sampling: sampling_lib.SamplingConfig):
  """Draws the block's positions in order: base logits [B, G, K] and states [B, G, D] of
  its first G positions, anchor [B] (target ids), vocab_ids [K] -> (draft-vocabulary
  indices [B, G], each position's distribution q [B, G, K] (as the sampler drew from it:
  one-hot when greedy), confidences [B, G] in (0, 1))."""
  keys = jax.random.split(key, base.shape[1])

  def body(prev, xs):
    b, h, k = xs
    logits, conf = step(params, b, h, prev)
    token = sampling_lib.sample(logits, k, sampling)
    q = sampling_lib.probabilities(logits, sampling)
    return vocab_ids[token], (token, q, jax.nn.sigmoid(conf))

  xs = (jnp.moveaxis(base, 1, 0), jnp.moveaxis(states, 1, 0), keys)
  _, (tokens, q, conf) = jax.lax.scan(body, anchor, xs)
  return jnp.moveaxis(tokens, 0, 1), jnp.moveaxis(q, 0, 1), jnp.moveaxis(conf, 0, 1)


def teacher_forced(params, base, states, previous):
  """Training and checking: every position at once given the tokens before it
  (previous [B, G] target ids: the anchor, then the drafted or true tokens) ->
  (logits [B, G, K], confidence logits [B, G])."""
  return step(params, base, states, previous)
