"""Phase offsets of fixed chunk boundaries: static per layer or kv head, random per row.

An offset o shifts every boundary of a row o tokens to the left (chunk 0 covers [-o, M - o),
so the first chunk is shorter, padded in front). Offsets keep every tensor's shape fixed.
The paper's window alignment (``compress_window_align = "start"``) is one more such shift:
W mod S to the right, i.e. ``attn.align_offset`` = -W mod S to the left, so that windows start
on multiples of S.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from chunkformer.config import AttentionConfig, ModelConfig

Array = jax.Array


def static_offsets(model: ModelConfig, attn: AttentionConfig, layer: int) -> np.ndarray:
  """offsets_K in [0, M): ``chunk_offset`` plus the window alignment's plus the stagger term.

  stagger="layers": layer l adds round(l*M/L); stagger="heads": kv head k adds round(k*M/K).
  """
  m = attn.chunk_size
  k = np.arange(model.num_kv_heads)
  offsets = np.full_like(k, attn.chunk_offset + attn.align_offset)
  if attn.stagger == "layers":
    offsets = offsets + int(round(layer * m / model.num_layers))
  elif attn.stagger == "heads":
    offsets = offsets + np.round(k * m / model.num_kv_heads).astype(k.dtype)
  return offsets % m


def tail_start(query_index: Array, doc_start: Array, offsets: Array,
               attn: AttentionConfig) -> Array:
  """First raw key of the uncompressed tail for query t (elementwise, broadcasting).

  The tail is t's own chunk, ``t - (t + o) mod S .. t`` (o the chunk grid's offset): the
  tokens no visible entry covers yet, plus at a chunk's last token that chunk. Under "start"
  alignment an entry whose window begins before its document is never visible, so until the
  document's first full window closes the tail reaches back to the document start instead.
  """
  s = attn.chunk_size
  own = query_index - (query_index + offsets) % s
  if attn.compress_window_align != "start":
    return own
  last_end = query_index - (query_index + offsets + 1) % s  # the newest chunk end <= t
  covered = last_end - (attn.window_tokens - 1) >= doc_start  # its window lies in t's document
  return jnp.where(covered, own, doc_start)


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
