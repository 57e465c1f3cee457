"""A static-shape KV cache with a length per row.

Each layer has its own key and value buffers [B, G, S, H] (per-layer buffers updated
by a per-row scatter decode much faster on XLA:CPU than one stacked buffer; head-major,
so attention contracts them without a transpose). Row b
holds `lengths[b]` valid slots; a forward pass writes its T new tokens at slots
lengths[b] .. lengths[b] + T - 1. Slots at or past a row's length are ignored by
attention, so rolling a row back is only lowering its length.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import struct


@struct.dataclass
class KVCache:
  k: list[jax.Array]  # L x [B, G, S, H]
  v: list[jax.Array]  # L x [B, G, S, H]
  lengths: jax.Array  # [B] int32

  @property
  def cache_size(self) -> int:
    """S, the number of slots per row."""
    return self.k[0].shape[2]

  @property
  def batch(self) -> int:
    return self.lengths.shape[0]

  @classmethod
  def init(cls, cfg, batch: int, cache_size: int, dtype=jnp.float32) -> KVCache:
    """An empty cache for `cfg` (a LlamaConfig) with `cache_size` slots per row."""
    if cache_size <= 0 or batch <= 0:
      raise ValueError(
        f'KVCache needs a positive batch and cache_size, got batch={batch}, cache_size={cache_size}'
      )
    shape = (batch, cfg.n_kv_heads, cache_size, cfg.head_dim)
    return cls(
      k=[jnp.zeros(shape, dtype) for _ in range(cfg.n_layers)],
      v=[jnp.zeros(shape, dtype) for _ in range(cfg.n_layers)],
      lengths=jnp.zeros((batch,), jnp.int32),
    )

  def with_lengths(self, lengths: jax.Array) -> KVCache:
    """The same buffers with new per-row lengths (rollback when lower)."""
    return self.replace(lengths=jnp.asarray(lengths, jnp.int32))
