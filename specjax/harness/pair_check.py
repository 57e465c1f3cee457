"""Checks a run's target and model drafts from their headers, before any weight is read:
the vocabularies agree, and the weights and caches fit the devices of the mesh.

What the headers cannot say (that the tokenizers agree, that a feature head matches its
target) is checked when the drafts are built; this catches what would otherwise fail
minutes into loading: a draft of another model family, or a 7B target in float32 on a
machine with 24 GiB.
"""

from __future__ import annotations

import dataclasses

import jax

from specjax import pairs, registry
from specjax.checkpoints import loader


@dataclasses.dataclass(frozen=True)
class Peeked:
  spec: str
  cfg: object  # a LlamaConfig read from the header


def model_drafts(drafts) -> list[str]:
  """The draft specs (of `drafts`) that are independent models (registry kind 'model')."""
  model_kind = registry.DRAFTS.get('model')
  out = []
  for spec in drafts:
    kind, settings = registry.parse_draft(spec)
    if kind is model_kind:
      out.append(settings)
  return out


def check_vocabularies(target: Peeked, drafts: list[Peeked]) -> None:
  """Raises ValueError for a draft whose vocabulary cannot be the target's: more rows than
  the target's, or far fewer (another tokenizer). A few rows fewer is a padded copy of one
  vocabulary (Qwen2.5 0.5B against 7B); the tokenizers are compared when it is built."""
  have = target.cfg.vocab_size
  for d in drafts:
    rows = d.cfg.vocab_size
    if rows > have or rows < 0.9 * have:
      raise ValueError(
        f'draft {d.spec!r} has a vocabulary of {rows} tokens but the target {target.spec!r} '
        f"has {have}: a draft model must share the target's tokenizer (for a draft of "
        'another vocabulary, distil one: python -m specjax.train_draft)'
      )


def device_bytes() -> tuple[int | None, str]:
  """(bytes one device can hold or None where unknown, what the figure is)."""
  device = jax.local_devices()[0]
  stats = device.memory_stats() if device.platform != 'cpu' else None
  if stats and stats.get('bytes_limit'):
    return int(stats['bytes_limit']), f'{device.device_kind} memory'
  try:
    with open('/proc/meminfo') as f:
      info = dict(line.split(':', 1) for line in f)
    free = int(info['MemAvailable'].split()[0]) * 1024
  except (OSError, KeyError, ValueError):
    return None, ''
  return free // max(1, jax.local_device_count()), "the host's available memory"


def needed_bytes(config, models: list[Peeked]) -> int:
  """Weights of `models` per device in config.dtype on config.mesh, and their KV caches at
  config.batch_size rows of config.cache_size slots."""
  dtype = loader.parse_dtype(config.dtype)
  total = 0
  for m in models:
    r = pairs.per_device(m.cfg, config.mesh.data, config.mesh.model, dtype)
    rows = -(-config.batch_size // config.mesh.data)
    total += r['bytes_per_device'] + r['kv_bytes_per_token_per_device'] * rows * config.cache_size
  return total


def _gib(n: int) -> str:
  return f'{n / 2**30:.1f} GiB'


def check_pair(config, say=print) -> None:
  """Raises ValueError (one line) when the headers show the run cannot work; prints the
  weights' bytes per device otherwise. A no-op for models without a local header."""
  try:
    target_cfg = loader.peek_config(config.model)
  except (OSError, ValueError):
    return  # loading reports it, with its own message
  if target_cfg is None:
    return
  target = Peeked(config.model, target_cfg)
  drafts = []
  for spec in model_drafts(config.drafts):
    cfg = loader.peek_config(spec)
    if cfg is not None:
      drafts.append(Peeked(spec, cfg))
  check_vocabularies(target, drafts)
  need = needed_bytes(config, [target, *drafts])
  have, what = device_bytes()
  where = f'(data {config.mesh.data}, model {config.mesh.model})'
  if have is not None and need > have:
    names = ' and '.join(repr(m.spec) for m in [target, *drafts])
    raise ValueError(
      f'{names} need {_gib(need)} per device in {config.dtype} (weights and KV caches '
      f'on a {where} mesh) but {what} is {_gib(have)}: use --config.dtype=bfloat16, a mesh '
      'over more devices (--config.mesh.model), or fewer cache slots or rows'
    )
  say(f'weights and KV caches: {_gib(need)} per device in {config.dtype} on a {where} mesh')
