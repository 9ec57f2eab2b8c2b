"""Static-capacity packed entry buffers (docs/design.md section 4), one per row, ordered by end.

The rules (shared with ``kernels.layout``): a chunk closes at every end flag, starts after every
end and at every document start; a chunk that is never closed produces no entry. Entry c of a
row is its c-th closed chunk; slots past the last closed chunk are padding (end ``PAD_END``,
segment ``PAD_SEGMENT``, zeros), which no query can see.

Capacity: every closed chunk holds at least ``min_chunk`` tokens (see ``end_flags``), so a
row of T tokens never closes more than ``floor(T / min_chunk)`` chunks and
``entry_capacity`` (``ceil(T / min_chunk)`` padded to the hardware multiple) never drops one.
"""

from __future__ import annotations

import dataclasses
import math

import jax
import jax.numpy as jnp

import kernels

Array = jax.Array


def entry_capacity(seq_len: int, min_chunk: int, multiple: int = 8) -> int:
  """Entries per row: ``ceil(seq_len / min_chunk)`` rounded up to ``multiple`` (>= multiple)."""
  if seq_len < 1 or min_chunk < 1 or multiple < 1:
    raise ValueError(f"need positive seq_len, min_chunk, multiple; got {seq_len}, {min_chunk}, "
                     f"{multiple}")
  needed = math.ceil(seq_len / min_chunk)
  return max(multiple, math.ceil(needed / multiple) * multiple)


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class PackedLayout:
  """Where every token and entry of a row lives in the packed buffer."""

  entry_of_token_BxT: Array  # entry a token is pooled into; C for tokens of open chunks
  pos_in_chunk_BxT: Array  # offset of a token inside its chunk (0 = chunk start)
  entry_ends_BxC: Array  # row index of each entry's last token; PAD_END for padding
  entry_segment_ids_BxC: Array  # document of each entry; PAD_SEGMENT for padding
  entry_starts_BxC: Array  # row index of each entry's first token; PAD_END for padding
  num_entries_B: Array  # closed chunks kept (all of them when capacity is entry_capacity)
  # First query that sees each entry: its end plus the predictor's delay (the router's 'start'
  # rule closes a chunk with the token after it); PAD_END for padding.
  entry_visible_from_BxC: Array

  @property
  def capacity(self) -> int:
    return self.entry_ends_BxC.shape[1]

  @property
  def valid_BxC(self) -> Array:
    return self.entry_ends_BxC != kernels.PAD_END

  @property
  def structure(self) -> kernels.ChunkStructure:
    """The kernels' view of this layout (``kernels.segment_pool(..., structure=)``)."""
    return kernels.ChunkStructure(self.entry_of_token_BxT, self.pos_in_chunk_BxT,
                                  self.entry_ends_BxC, self.entry_segment_ids_BxC,
                                  self.entry_starts_BxC, self.num_entries_B)

  def visibility_BxTxC(self, segment_ids_BxT: Array) -> Array:
    """visible_BxTxC: query t may read entry c (``kernels.entry_visible``)."""
    return kernels.entry_visibility_BxTxC(self.entry_visible_from_BxC,
                                          self.entry_segment_ids_BxC, segment_ids_BxT)


def packed_layout(ends_BxT: Array, segment_ids_BxT: Array, capacity: int,
                  delay: int = 0) -> PackedLayout:
  """The packed layout of the chunks described by end flags (see module docstring).

  ``delay``: tokens between an entry's last token and the first query that sees it.
  """
  # Field order follows kernels.chunk_structure's return order.
  structure = kernels.chunk_structure(ends_BxT, segment_ids_BxT, capacity)
  entry_ends = structure[2]
  visible_from = jnp.where(entry_ends == kernels.PAD_END, entry_ends, entry_ends + delay)
  return PackedLayout(*structure, visible_from)


def _take_rows(x_BxTx_: Array, index_BxC: Array) -> Array:
  index = index_BxC.reshape(index_BxC.shape + (1,) * (x_BxTx_.ndim - 2))
  return jnp.take_along_axis(x_BxTx_, index, axis=1)


def pack(x_BxTx_: Array, layout: PackedLayout) -> Array:
  """Per-token values at each entry's end token, gathered into the packed buffer (B x C x ...).

  Padding slots hold zeros. ``unpack(pack(x), layout)`` equals x at every end token.
  """
  t = x_BxTx_.shape[1]
  valid = layout.valid_BxC
  gathered = _take_rows(x_BxTx_, jnp.where(valid, layout.entry_ends_BxC, 0).clip(0, t - 1))
  return jnp.where(valid.reshape(valid.shape + (1,) * (x_BxTx_.ndim - 2)), gathered,
                   jnp.zeros((), x_BxTx_.dtype))


def unpack(packed_BxCx_: Array, layout: PackedLayout, seq_len: int) -> Array:
  """Inverse of ``pack``: entry c written back at its end token, zeros at every other token."""
  b = packed_BxCx_.shape[0]
  valid = layout.valid_BxC
  # Padding slots scatter to an extra, discarded row so they can never overwrite a token.
  rows = jnp.where(valid, layout.entry_ends_BxC, seq_len)
  out = jnp.zeros((b, seq_len + 1) + packed_BxCx_.shape[2:], packed_BxCx_.dtype)
  out = jax.vmap(lambda o, r, p: o.at[r].set(p))(out, rows, packed_BxCx_)
  return out[:, :seq_len]
