"""The pairs' real shapes: parameters and bytes per device on a mesh, nothing allocated."""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np

from specjax.models import llama
from specjax.models import sharding as sharding_lib
from specjax.pairs.models import DRY, lookup


def real_shapes(cfg: llama.LlamaConfig, dtype=jnp.bfloat16):
  """The parameter tree's ShapeDtypeStructs, by `jax.eval_shape` on llama.init_params."""
  return jax.eval_shape(lambda k: llama.init_params(cfg, k, dtype), jax.random.key(0))


def per_device(cfg: llama.LlamaConfig, data: int, model: int, dtype=jnp.bfloat16) -> dict:
  """Parameters of `cfg` in total and per device on a (data, model) mesh with the default
  partition rules, their bytes in `dtype`, and the KV cache's bytes per token per device."""
  shapes = real_shapes(cfg, dtype)
  mesh = jax.sharding.AbstractMesh((data, model), sharding_lib.AXES)
  specs = sharding_lib.param_specs(shapes, mesh)
  total = local = 0
  for leaf, spec in zip(jax.tree_util.tree_leaves(shapes), jax.tree_util.tree_leaves(specs)):
    n = math.prod(leaf.shape)
    axes = [a for entry in tuple(spec) if entry is not None for a in np.atleast_1d(entry)]
    split = math.prod(mesh.shape[a] for a in axes)
    total += n
    local += n // split
  item = jnp.dtype(dtype).itemsize
  kv_split = model if cfg.n_kv_heads % model == 0 else 1  # constrain_cache's kv-head split
  kv = 2 * cfg.n_layers * cfg.n_kv_heads * cfg.head_dim * item // kv_split
  return {
    'params': total,
    'params_per_device': local,
    'bytes_per_device': local * item,
    'kv_bytes_per_token_per_device': kv,
  }


def _gib(n: float) -> str:
  return f'{n / 2**30:.2f} GiB'


def report_shapes(config, say=print) -> dict:
  """For `dry:` specs in the config: the real models' parameters and bfloat16 bytes per
  device on config.mesh, printed and returned ({} without dry specs)."""
  names = [s[len(DRY) :] for s in (config.model, *config.drafts) if s.startswith(DRY)]
  data, model = config.mesh.data, config.mesh.model
  out = {}
  for name in names:
    shape = lookup(name, 'dry model')
    r = per_device(shape.cfg, data, model)
    out[name] = dict(r, hf_id=shape.hf_id, published_params=shape.published_params)
    say(
      f'{shape.hf_id} real shapes on a (data {data}, model {model}) mesh: '
      f'{r["params"] / 1e9:.3f} B parameters (published {shape.published_params / 1e9:.3g} B), '
      f'{r["params_per_device"] / 1e6:.1f} M per device = {_gib(r["bytes_per_device"])} '
      f'in bfloat16; KV cache {r["kv_bytes_per_token_per_device"] / 1024:.0f} KiB per token '
      'per device'
    )
  return out
