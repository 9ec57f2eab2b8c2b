"""Phase offsets of fixed chunk boundaries: static per layer or kv head, random per row.

An offset o shifts every boundary of a row o tokens to the left (chunk 0 covers [-o, M - o),
so the first chunk is shorter, padded in front). Offsets keep every tensor's shape fixed.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from chunkformer.config import AttentionConfig, ModelConfig

Array = jax.Array


def static_offsets(model: ModelConfig, attn: AttentionConfig, layer: int) -> np.ndarray:
  """offsets_K in [0, M): ``chunk_offset`` plus the stagger term.

  stagger="layers": layer l adds round(l*M/L); stagger="heads": kv head k adds round(k*M/K).
  """
  m = attn.chunk_size
  k = np.arange(model.num_kv_heads)
  offsets = np.full_like(k, attn.chunk_offset)
  if attn.stagger == "layers":
    offsets = offsets + int(round(layer * m / model.num_layers))
  elif attn.stagger == "heads":
    offsets = offsets + np.round(k * m / model.num_kv_heads).astype(k.dtype)
  return offsets % m


def chunk_offsets(model: ModelConfig, attn: AttentionConfig, layer: int, batch: int,
                  rng: Array | None = None) -> Array | None:
  """offsets_BxK of one layer; ``rng`` adds a uniform random phase per row (training).

  Returns None when every offset is statically zero, which selects the reshape fast path.
  """
  static = static_offsets(model, attn, layer)
  if rng is None and not static.any():
    return None
  offsets = jnp.broadcast_to(jnp.asarray(static, jnp.int32), (batch, model.num_kv_heads))
  if rng is not None:
    phase = jax.random.randint(rng, (batch, 1), 0, attn.chunk_size, dtype=jnp.int32)
    offsets = (offsets + phase) % attn.chunk_size
  return offsets
