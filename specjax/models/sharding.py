"""Device meshes and partition rules for parameters and caches.

Rules map a regex over a parameter's path ('layers/3/wq') to a PartitionSpec over the
mesh axes ('data', 'model'): Megatron-style tensor parallelism (column-split
wq/wk/wv/w_gate/w_up, row-split wo/w_down, vocabulary-split embeddings) with the
batch split over 'data'. A dimension that the mesh axis does not divide is
replicated instead (SmolLM2 has 9 query and 3 kv heads), so any model runs on any mesh.
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


def constrain_cache(cache: KVCache, mesh: Mesh) -> KVCache:
  """Pins cache buffers [B, G, S, H]: batch over 'data', kv heads over 'model'."""

  def pin(x):
    spec = fit_spec(P('data', 'model', None, None), x.shape, mesh)  # [B, G, S, H]
    return jax.lax.with_sharding_constraint(x, NamedSharding(mesh, spec))

  return cache.replace(k=[pin(x) for x in cache.k], v=[pin(x) for x in cache.v])
