"""Device meshes and partition rules for parameters and caches.

Rules map a regex over a parameter's path ('layers/3/wq') to a PartitionSpec over the
mesh axes ('data', 'model'): Megatron-style tensor parallelism (column-split
wq/wk/wv/w_gate/w_up, row-split wo/w_down, vocabulary-split embeddings) with the
batch split over 'data'. A dimension that the mesh axis does not divide is
replicated instead (SmolLM2 has 9 query and 3 kv heads), so any model runs on any mesh.

The target uses DEFAULT_RULES, a drafter its kind's (`DraftKind.partition_rules`: a draft
model the same, a feature head EAGLE_RULES, a block drafter DFLASH_RULES), and KV caches
CACHE_SPEC over [B, G, S, H].
A run config adds rules in front of those (config.mesh.rules, config.mesh.draft_rules)
as 'REGEX=AXES' strings, parsed by `parse_rules`:

  'lm_head$=None,model'   # split the output head's vocabulary over 'model'
  'layers/\\d+/wo$='       # keep every wo replicated (no axes)
"""

from __future__ import annotations

import re
from collections.abc import Sequence

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from specjax.models.kv_cache import KVCache

AXES = ('data', 'model')

DEFAULT_RULES: tuple[tuple[str, P], ...] = (
  (r'^embed$', P('model', None)),
  (r'^lm_head$', P(None, 'model')),
  (r'^layers/\d+/w[qkv]$', P(None, 'model')),
  (r'^layers/\d+/b[qkv]$', P('model')),  # Qwen2's biases, split like their projections
  (r'^layers/\d+/wo$', P('model', None)),
  (r'^layers/\d+/w_(gate|up)$', P(None, 'model')),
  (r'^layers/\d+/w_down$', P('model', None)),
  (r'norm$', P()),
)

# A feature head (specjax/models/eagle.py): its one layer reads [token; feature] (2D
# rows), its fc fuses the captured layers, its output head is over the draft vocabulary.
EAGLE_RULES: tuple[tuple[str, P], ...] = (
  (r'^embed$', P('model', None)),
  (r'^head/fc$', P(None, 'model')),
  (r'^head/layer/w[qkv]$', P(None, 'model')),
  (r'^head/layer/wo$', P('model', None)),
  (r'^head/layer/w_(gate|up)$', P(None, 'model')),
  (r'^head/layer/w_down$', P('model', None)),
  (r'^head/head$', P(None, 'model')),
)

# A block drafter (specjax/models/dflash.py): Llama-shaped layers over the fused features,
# its fc fuses the captured layers, its output head is over the draft vocabulary.
DFLASH_RULES: tuple[tuple[str, P], ...] = (
  (r'^embed$', P('model', None)),
  (r'^block/fc$', P(None, 'model')),
  (r'^block/layers/\d+/w[qkv]$', P(None, 'model')),
  (r'^block/layers/\d+/wo$', P('model', None)),
  (r'^block/layers/\d+/w_(gate|up)$', P(None, 'model')),
  (r'^block/layers/\d+/w_down$', P('model', None)),
  (r'^block/head$', P(None, 'model')),
  (r'^heads/w2$', P(None, 'model')),  # DSpark's Markov bias over the draft vocabulary
)

CACHE_SPEC = P('data', 'model', None, None)  # KV buffers [B, G, S, H]: rows, kv heads

Rules = tuple[tuple[str, P], ...]


def parse_rules(texts: Sequence[str], field: str = 'rules') -> Rules:
  """('REGEX=AXES', ...) -> ((regex, PartitionSpec), ...); AXES is one entry per
  dimension, comma separated: 'data', 'model' or 'None' (replicated); empty for P()."""
  out = []
  for text in texts:
    if not isinstance(text, str) or '=' not in text:
      raise ValueError(
        f'config.mesh.{field}: rule {text!r} is not REGEX=AXES (e.g. "lm_head$=None,model")'
      )
    pattern, axes = text.rsplit('=', 1)
    try:
      re.compile(pattern)
    except re.error as e:
      raise ValueError(f'config.mesh.{field}: rule {text!r}: bad regex ({e})') from None
    out.append((pattern, parse_axes(axes, f'config.mesh.{field}: rule {text!r}')))
  return tuple(out)


def parse_axes(text: str, where: str) -> P:
  """'None,model' -> P(None, 'model'); '' -> P()."""
  names = [a.strip() for a in text.split(',')] if text.strip() else []
  bad = [a for a in names if a not in AXES + ('None',)]
  if bad:
    raise ValueError(f'{where}: unknown mesh axis {bad[0]!r}; expected data, model or None')
  return P(*(None if a == 'None' else a for a in names))


def make_mesh(data: int = 1, model: int = 1, devices: Sequence[jax.Device] | None = None) -> Mesh:
  """A (data, model) mesh over the first data * model devices."""
  devices = list(jax.devices() if devices is None else devices)
  if data < 1 or model < 1:
    raise ValueError(f'mesh axes must be >= 1, got data={data}, model={model}')
  if data * model > len(devices):
    raise ValueError(
      f'mesh data={data} x model={model} needs {data * model} devices, '
      f'only {len(devices)} available ({devices[0].platform})'
    )
  return Mesh(np.array(devices[: data * model]).reshape(data, model), AXES)


def path_str(path) -> str:
  """'layers/3/wq' for a tree path."""
  parts = []
  for key in path:
    for attr in ('key', 'idx', 'name'):
      if hasattr(key, attr):
        parts.append(str(getattr(key, attr)))
        break
  return '/'.join(parts)


def fit_spec(spec: P, shape: Sequence[int], mesh: Mesh) -> P:
  """Drops the mesh axes that do not divide their dimension (those dims replicate)."""
  fitted = []
  for dim, axis in zip(shape, tuple(spec) + (None,) * (len(shape) - len(spec))):
    size = 1 if axis is None else int(np.prod([mesh.shape[a] for a in np.atleast_1d(axis)]))
    fitted.append(axis if axis is not None and dim % size == 0 else None)
  return P(*fitted)


def param_specs(params, mesh: Mesh, rules=DEFAULT_RULES):
  """A PartitionSpec for every parameter: the first matching rule, fitted to the shape."""

  def spec_for(path, leaf):
    name = path_str(path)
    for pattern, spec in rules:
      if re.search(pattern, name):
        return fit_spec(spec, leaf.shape, mesh)
    return P()

  return jax.tree_util.tree_map_with_path(spec_for, params)


def shard_params(params, mesh: Mesh, rules=DEFAULT_RULES):
  """Places parameters on the mesh according to the rules."""
  specs = param_specs(params, mesh, rules)
  shardings = jax.tree_util.tree_map(lambda s: NamedSharding(mesh, s), specs)
  return jax.device_put(params, shardings)


def batch_sharding(mesh: Mesh, shape: Sequence[int]) -> NamedSharding:
  """Leading (batch) dimension over 'data' when it divides, the rest replicated."""
  return NamedSharding(mesh, fit_spec(P('data'), shape, mesh))


def constrain_cache(cache: KVCache, mesh: Mesh, spec: P = CACHE_SPEC) -> KVCache:
  """Pins cache buffers [B, G, S, H] (default: batch over 'data', kv heads over 'model')."""

  def pin(x):
    fitted = fit_spec(spec, x.shape, mesh)
    return jax.lax.with_sharding_constraint(x, NamedSharding(mesh, fitted))

  return cache.replace(k=[pin(x) for x in cache.k], v=[pin(x) for x in cache.v])
