"""DSpark drafters on disk: a DFlash checkpoint (specjax/checkpoints/dflash.py) with
DSpark's two heads beside the block, in DeepSpec's names and torch layouts
(deepseek-ai/DeepSpec `deepspec/modeling/dspark/markov_head.py` VanillaMarkov and
`common.py` AcceptRatePredictor):

  markov_head.markov_w1.weight      [V, r]   nn.Embedding(V, r): W1, rows = target ids
  markov_head.markov_w2.weight      [K, r]   nn.Linear(r, K) (out, in): W2 [r, K] transposed
  confidence_head.proj.weight       [1, D]   nn.Linear(D, 1): conf_w
  confidence_head.proj.bias         [1]      conf_b

config.json adds DeepSpec's keys: `markov_rank`, `markov_head_type: "vanilla"`,
`enable_confidence_head: true`, `confidence_head_with_markov: false` (specjax's
confidence head reads the block's states only, models/dspark.py says why). A DeepSpec
checkpoint without a confidence head loads with confidence 1/2 everywhere; gated or RNN
Markov heads and a confidence head that reads the Markov embedding are refused. The
heads are stored in float32 (they are small; the block's weights stay bfloat16).
"""

from __future__ import annotations

import json
import pathlib

import numpy as np

from specjax.checkpoints import dflash as dflash_ckpt
from specjax.models import dspark as dspark_model
from specjax.models.dflash import DFlashConfig

W1, W2 = 'markov_head.markov_w1.weight', 'markov_head.markov_w2.weight'
CONF_W, CONF_B = 'confidence_head.proj.weight', 'confidence_head.proj.bias'


def is_dspark_dir(path) -> bool:
  """A DFlash checkpoint whose config.json carries `markov_rank`."""
  p = pathlib.Path(path)
  if not dflash_ckpt.is_dflash_dir(p):
    return False
  try:
    return 'markov_rank' in json.loads((p / dflash_ckpt.CONFIG_FILE).read_text())
  except (OSError, json.JSONDecodeError):
    return False


def head_tensors(heads) -> dict[str, np.ndarray]:
  """models/dspark params -> DeepSpec's tensors (float32, torch layouts)."""
  f32 = lambda a: np.ascontiguousarray(np.asarray(a, np.float32))  # noqa: E731
  return {
    W1: f32(heads['w1']),
    W2: f32(np.asarray(heads['w2']).T),
    CONF_W: f32(heads['conf_w'])[None],
    CONF_B: f32(heads['conf_b']).reshape(1),
  }


def config_keys(heads) -> dict:
  return {
    'markov_rank': int(np.shape(heads['w1'])[1]),
    'markov_head_type': 'vanilla',
    'enable_confidence_head': True,
    'confidence_head_with_markov': False,
  }


def save(
  directory, cfg: DFlashConfig, block, heads, info: dict | None = None, shard_bytes: int = 0
) -> None:
  """Writes the block (DFlash layout, block['vocab_ids'] included) and the heads (in
  Hugging Face shards of at most shard_bytes when > 0)."""
  dspark_model.check_params(cfg, heads, 'DSpark heads')
  dflash_ckpt.save(
    directory, cfg, block, info, head_tensors(heads), config_keys(heads), shard_bytes
  )


def heads_from(c: dict, tensors, cfg: DFlashConfig, source: str) -> dict:
  """DeepSpec's head tensors of a parsed config.json -> models/dspark params."""
  rank = int(c.get('markov_rank', 0))
  if rank < 1 or str(c.get('markov_head_type', 'vanilla')).lower() != 'vanilla':
    raise ValueError(
      f'{source}: a DSpark drafter needs a vanilla Markov head of rank >= 1 (markov_rank '
      f'{rank}, markov_head_type {c.get("markov_head_type")!r}); without one load it as dflash:'
    )
  conf = bool(c.get('enable_confidence_head', False))
  if conf and c.get('confidence_head_with_markov', False):
    raise ValueError(
      f'{source}: its confidence head reads the Markov embedding of the drawn token, which '
      'would make a verification length chosen from it lossy (specjax/models/dspark.py)'
    )
  missing = [n for n in (W1, W2, *((CONF_W, CONF_B) if conf else ())) if n not in tensors]
  if missing:
    raise ValueError(f'{source}: missing tensors {missing}')
  f32 = lambda name: np.asarray(tensors[name], np.float32)  # noqa: E731
  heads = {'w1': f32(W1), 'w2': np.ascontiguousarray(f32(W2).T)}
  if conf:
    heads['conf_w'] = f32(CONF_W).reshape(-1)
    heads['conf_b'] = f32(CONF_B).reshape(())
  else:  # no confidence head: 1/2 everywhere
    heads['conf_w'] = np.zeros((cfg.d_model,), np.float32)
    heads['conf_b'] = np.zeros((), np.float32)
  dspark_model.check_params(cfg, heads, source)
  return heads


def load(directory) -> tuple[DFlashConfig, dict, dict, dict]:
  """(cfg, float32 block params, float32 heads, the `specjax` info) of a DSpark drafter."""
  d = pathlib.Path(directory)
  c, cfg, tensors = dflash_ckpt.read(d)
  block = dflash_ckpt.from_tensors(tensors, cfg, str(d))
  dflash_ckpt.check_params(cfg, block, str(d / dflash_ckpt.WEIGHTS_FILE))
  heads = heads_from(c, tensors, cfg, str(d / dflash_ckpt.WEIGHTS_FILE))
  info = dict(c.get('specjax') or {})
  info.pop('capture', None)
  return cfg, block, heads, info
