"""A distilled draft with a reduced output vocabulary, sharing the target's input embeddings.

A draft's step cost is dominated by its V-way output head (49152 x 576 for SmolLM2, ~113 MB
in float32: more than a fifth of the target's weights). This draft keeps the target's
embedding table for its input (a row lookup, free), runs a few decoder layers of the
target's width, and scores only K frequent tokens with its own head [D, K]:

    params = {'embed': [V, D] (the target's, shared, not trained),
              'layers': [...], 'final_norm': [D],
              'head': [D, K], 'vocab_ids': [K] int32 (full-vocabulary id of each column)}

Its distribution over the full vocabulary is the subset's softmax with q = 0 everywhere
else. Verification only needs q over the full vocabulary, so speculative decoding stays
lossless: tokens the draft cannot propose are simply never proposed.

On disk a draft is a folder (specjax/checkpoints/draft_dir.py); the draft spec
`distilled` is the one that ships with specjax, `distilled:DIR` (or DIR) one saved by
`python -m specjax.train_draft`.
"""

from __future__ import annotations

import dataclasses
import os

import jax
import jax.numpy as jnp
import numpy as np

from specjax.checkpoints import draft_dir
from specjax.core import contract
from specjax.core import sampling as sampling_lib
from specjax.core.contract import DraftKind
from specjax.drafters import model as model_drafters
from specjax.drafters.model import ModelDrafter
from specjax.models import llama
from specjax.models.kv_cache import KVCache


def init_from_target(
  target_cfg: llama.LlamaConfig,
  target_params,
  layers: tuple[int, ...],
  vocab_ids: np.ndarray,
  ffn_dim: int | None = None,
):
  """(cfg, params) of a draft initialised from the target.

  The draft's layers are copies of the target's `layers` (in order; the first `ffn_dim`
  hidden units when narrower), its final norm the target's, and its head the target's
  (tied) output rows of `vocab_ids`.
  """
  ffn = ffn_dim or target_cfg.ffn_dim
  cfg = dataclasses.replace(
    target_cfg,
    n_layers=len(layers),
    ffn_dim=ffn,
    tie_embeddings=True,
    name=f'distilled[{len(layers)}L, {len(vocab_ids)} tokens]',
    layer_types=tuple(target_cfg.layer_types[i] for i in layers) if target_cfg.layer_types else (),
  )
  embed = np.asarray(target_params['embed'])
  new_layers = []
  for i in layers:
    p = {k: np.array(v) for k, v in target_params['layers'][i].items()}
    p['w_gate'], p['w_up'] = p['w_gate'][:, :ffn], p['w_up'][:, :ffn]
    p['w_down'] = p['w_down'][:ffn]
    new_layers.append(p)
  params = {
    'embed': embed,
    'layers': new_layers,
    'final_norm': np.array(target_params['final_norm']),
    'head': np.ascontiguousarray(embed[np.asarray(vocab_ids)].T),
    'vocab_ids': np.asarray(vocab_ids, np.int32),
  }
  return cfg, params


def subset_logits(params, tokens: jax.Array, cache: KVCache, cfg: llama.LlamaConfig):
  """tokens[B, T] -> (float32 logits [B, T, K] over the draft vocabulary, cache)."""
  out = cfg.family.forward(params, tokens, cache, cfg, head=False)
  return (out.hidden @ params['head']).astype(jnp.float32), out.cache


def to_full_vocab(
  values: jax.Array, vocab_ids: jax.Array, vocab_size: int, fill: float = 0.0
) -> jax.Array:
  """[..., K] values over the draft vocabulary -> [..., V], `fill` outside it."""
  out = jnp.full(values.shape[:-1] + (vocab_size,), fill, values.dtype)
  return out.at[..., vocab_ids].set(values)


@dataclasses.dataclass(frozen=True)
class DistilledDrafter(ModelDrafter):
  """ModelDrafter over a reduced output vocabulary (params as in the module docstring).

  `cfg.vocab_size` is the full (target) vocabulary: the input embedding's rows and the
  size of the distributions handed to the verifier.
  """

  name: str = dataclasses.field(default='distilled draft', compare=False)

  def forward(self, params, tokens, cache):
    return subset_logits(params, tokens, cache, self.cfg)  # [B, T, K]: the draft vocabulary

  def _vocab_ids(self, params):
    return params['vocab_ids']

  def _forward_masked(self, params, tokens, cache, positions, slots, mask):
    at = contract.At(positions, slots, mask)
    out = self.cfg.family.forward(params, tokens, cache, self.cfg, at=at, head=False)
    return (out.hidden @ params['head']).astype(jnp.float32), out.cache

  def propose(self, params, draft_state, state, key, gamma, sampling):
    ids = params['vocab_ids']
    logits, cache = self.first_logits(params, draft_state, state)  # catches up when behind
    tokens, dists = [], []
    for i, k in enumerate(jax.random.split(key, gamma)):
      probs = sampling_lib.probabilities(logits, sampling)  # [B, K]
      token = ids[sampling_lib.sample(logits, k, sampling)]  # [B], full-vocabulary ids
      dists.append(to_full_vocab(probs, ids, self.cfg.vocab_size))
      tokens.append(token)
      if i + 1 < gamma:
        logits, cache = subset_logits(params, token[:, None], cache, self.cfg)
        logits = logits[:, 0]
    return jnp.stack(tokens, 1), jnp.stack(dists, 1), draft_state.replace(cache=cache)


SHIPPED = os.path.join(
  os.path.dirname(os.path.dirname(__file__)), 'drafts', 'smollm2-135m-instruct'
)
DISTILLED_USAGE = 'distilled (the draft shipped for SmolLM2-135M-Instruct) or distilled:<directory>'


def _parse(spec) -> str:
  """The draft directory of 'distilled', 'distilled:DIR' or a bare DIR with a draft.json."""
  if spec.options or len(spec.args) > 1:
    raise spec.error(DISTILLED_USAGE)
  path = SHIPPED if spec.kind == 'distilled' and not spec.args else (spec.args or [spec.text])[0]
  if not draft_dir.is_draft_dir(path):
    raise ValueError(
      f'draft {spec.text!r}: no distilled draft at {path} (no {draft_dir.CONFIG_FILE}; '
      f'train one with python -m specjax.train_draft)'
    )
  return path


def _build(path, target, dtype):
  """A reduced-vocabulary distilled draft, sharing the target's input embeddings."""
  cfg, params, _ = draft_dir.load_draft_dir(
    path, target.params['embed'], np.asarray(target.params['embed']).dtype
  )
  name = f'distilled draft ({cfg.n_layers} layers, {len(params["vocab_ids"])}-token head)'
  return DistilledDrafter(cfg, name=name), params


DISTILLED = DraftKind(
  usage=DISTILLED_USAGE, parse=_parse, build=_build, resync=model_drafters.resyncing
)
