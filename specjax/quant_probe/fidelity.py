"""How closely a candidate model follows the reference on the reference's own text.

The reference answers each prompt greedily; both models then read prompt + answer in one
forward each (teacher forcing), and per answer position t, with p the reference's and q
the candidate's next-token distribution:

  kl         KL(p || q), in nats
  top1       argmax q == argmax p (greedy speculative decoding accepts exactly these)
  overlap    sum_x min(p(x), q(x)) = 1 - TV(p, q): the probability that rejection
             sampling at temperature 1 accepts the candidate's token (Leviathan et al.)

From them: greedy acceptance (the mean of top1), acceptance at T = 1 (the mean of overlap),
tokens per target call at a fixed gamma (greedy: the chain walked along the answer; T = 1:
(1 - a^(g+1)) / (1 - a) at the mean overlap a), and the first greedy divergence (the first
answer position where top1 fails).
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np

from specjax.control import cost_model
from specjax.models import llama


@dataclasses.dataclass
class Positions:
  """Per answer position of one prompt: kl, top1 and overlap (numpy arrays [n])."""

  kl: np.ndarray
  top1: np.ndarray
  overlap: np.ndarray


@functools.partial(jax.jit, static_argnames=('cfg', 'cand_cfg'))
def _compare(ref_params, cand_params, tokens, cfg, cand_cfg):
  cache = llama.init_cache(cfg, tokens.shape[0], tokens.shape[1])
  logp = jax.nn.log_softmax(llama.forward(ref_params, tokens, cache, cfg)[0], -1)
  cache = llama.init_cache(cand_cfg, tokens.shape[0], tokens.shape[1])
  logq = jax.nn.log_softmax(llama.forward(cand_params, tokens, cache, cand_cfg)[0], -1)
  p = jnp.exp(logp)
  kl = jnp.sum(p * (logp - logq), -1)
  top1 = jnp.argmax(logp, -1) == jnp.argmax(logq, -1)
  overlap = jnp.sum(jnp.minimum(p, jnp.exp(logq)), -1)
  return kl, top1, overlap


def compare(
  cfg, ref_params, cand_params, prompts, answers, batch: int = 4, cand_cfg=None
) -> list[Positions]:
  """Positions per prompt: `prompts` and `answers` are token id lists (the answer the
  reference's greedy continuation of the prompt). The candidate runs with its own config
  (`cand_cfg`, default `cfg`): settings its file states, such as its RoPE base, count."""
  cand_cfg = cfg if cand_cfg is None else cand_cfg
  out = []
  for start in range(0, len(prompts), batch):
    rows = [p + a for p, a in zip(prompts[start : start + batch], answers[start : start + batch])]
    width = -(-max(len(r) for r in rows) // 64) * 64  # few shapes, few compilations
    tokens = np.zeros((len(rows), width), np.int32)
    for i, r in enumerate(rows):
      tokens[i, : len(r)] = r
    kl, top1, overlap = jax.device_get(
      _compare(ref_params, cand_params, jnp.asarray(tokens), cfg, cand_cfg)
    )
    for i in range(len(rows)):
      p, a = len(prompts[start + i]), len(answers[start + i])
      span = slice(p - 1, p - 1 + a)  # the logits that predict the answer's tokens
      out.append(Positions(kl[i, span], top1[i, span], overlap[i, span]))
  return out


greedy_calls = cost_model.greedy_calls  # target calls of greedy speculation along one answer


def sampled_tokens_per_call(alpha: float, gamma: int) -> float:
  if alpha >= 1.0:
    return float(gamma + 1)
  return (1 - alpha ** (gamma + 1)) / (1 - alpha)


def first_divergence(top1: np.ndarray) -> int | None:
  wrong = np.flatnonzero(~np.asarray(top1, bool))
  return int(wrong[0]) if wrong.size else None


def summarize(positions: list[Positions], gamma: int) -> dict:
  """The figures over prompts (positions pooled; first divergence: the median prompt's)."""
  if not positions:
    return {}
  kl = np.concatenate([p.kl for p in positions])
  top1 = np.concatenate([p.top1 for p in positions])
  overlap = np.concatenate([p.overlap for p in positions])
  calls = sum(greedy_calls(p.top1, gamma) for p in positions)
  firsts = [first_divergence(p.top1) for p in positions]
  firsts = [len(p.top1) if f is None else f for f, p in zip(firsts, positions)]
  alpha = float(overlap.mean())
  return {
    'positions': int(kl.size),
    'kl': float(kl.mean()),
    'kl_p99': float(np.percentile(kl, 99)),
    'top1': float(top1.mean()),
    'acceptance_greedy': float(top1.mean()),
    'acceptance_t1': alpha,
    'gamma': gamma,
    'tokens_per_call_greedy': float(top1.size / max(calls, 1)),
    'tokens_per_call_t1': sampled_tokens_per_call(alpha, gamma),
    'first_divergence_median': float(np.median(firsts)),
  }
