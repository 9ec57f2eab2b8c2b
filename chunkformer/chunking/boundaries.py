"""Where a dynamic layer's chunks close and when their entries become visible: one owner.

``compute`` is the one call: from the configured predictor (``router``, ``delimiter`` or
``fixed``) it returns a ``Boundaries`` value holding the end flags, the router's probabilities
and the packed layout whose ``entry_visible_from_BxC`` already includes the router's one-token
delay. The attention kind pools and attends with it, the ratio loss and the straight-through
entry scale read it, decoding uses the same delay and capacity, and evaluation reads its sown
copy (``SOWN``). The config-level rules (which layer owns a group's boundaries, the buffer
capacity, the slot-bias rows) live here too.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

from chunkformer.chunking.delimiter import delimiter_proposals
from chunkformer.chunking.end_flags import ShardAxis, enforce_lengths, fixed_end_flags
from chunkformer.chunking.packing import PackedLayout, entry_capacity, packed_layout
from chunkformer.chunking.ratio_loss import decided_probs, mean_chunk_length, ratio_loss
from chunkformer.chunking.router import hard_proposals, straight_through
from chunkformer.config import AttentionConfig, ModelConfig

Array = jax.Array

# Names the owner sows into "intermediates" (evaluation reads these, never recomputes).
SOWN_END_FLAGS = "end_flags"
SOWN_VISIBLE_FROM = "entry_visible_from"


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class Boundaries:
  """One group's chunking of a batch of rows."""

  ends_BxT: Array  # bool: t is the last token of a closed chunk
  probs_BxT: Array | None  # the router's close probabilities (None for delimiter / fixed)
  layout: PackedLayout  # packed entries; entry_visible_from = end + the predictor's delay

  def entry_scale_BxC(self) -> Array | None:
    """straight_through(p) of the decision that closed each entry (exactly 1 forward), or None.

    The deciding token is the entry's first visible query (its end, plus one under the
    router's 'start' rule); a chunk the maximum length closed at the row's end has none.
    """
    if self.probs_BxT is None:
      return None
    t = self.ends_BxT.shape[1]
    decided_BxC = jnp.where(self.layout.valid_BxC, self.layout.entry_visible_from_BxC, t)
    p_BxC = jnp.take_along_axis(self.probs_BxT, jnp.minimum(decided_BxC, t - 1), axis=1)
    return jnp.where(decided_BxC < t, straight_through(p_BxC), 1.0)


def boundary_key(attn: AttentionConfig, layer: int) -> str:
  """Name under which a layer's boundaries live in ``shared``: same key, same boundaries."""
  group = 0 if attn.boundary_group == 0 else layer // attn.boundary_group
  return (f"dynamic_boundaries/group{group}/{attn.boundary}-{attn.router_rule}/M{attn.chunk_size}"
          f"+{attn.chunk_offset}/len{attn.min_chunk}-{attn.max_chunk}/{attn.delimiters}")


def owns_boundaries(model: ModelConfig, layer: int) -> bool:
  """Whether ``layer`` computes its group's boundaries (no earlier layer shares its key)."""
  key = boundary_key(model.layers[layer], layer)
  return not any(a.kind == "dynamic" and boundary_key(a, i) == key
                 for i, a in enumerate(model.layers[:layer]))


def num_slots(attn: AttentionConfig) -> int:
  """Rows of the slot-bias table: the longest chunk the predictor can close."""
  return attn.chunk_size if attn.boundary == "fixed" else attn.max_chunk


def capacity(attn: AttentionConfig, seq_len: int) -> int:
  """Packed entries per row of ``seq_len`` tokens (no closed chunk is ever dropped)."""
  needed = entry_capacity(seq_len, attn.shortest_chunk, attn.capacity_multiple)
  if not attn.entry_capacity:
    return needed
  if attn.entry_capacity < -(-seq_len // attn.shortest_chunk):
    raise ValueError(f"entry_capacity {attn.entry_capacity} cannot hold the chunks of a row of "
                     f"{seq_len} tokens (chunks of >= {attn.shortest_chunk} tokens)")
  return attn.entry_capacity


def visibility_delay(attn: AttentionConfig) -> int:
  """Tokens between a chunk's last token and the first query that sees its entry.

  1 for the router's ``start`` rule (the chunk ending at t - 1 is closed by x_t), else 0.
  """
  return int(attn.boundary == "router" and attn.router_rule == "start")


def predict_end_flags(attn: AttentionConfig, tokens_BxT: Array, positions_BxT: Array,
                      segment_ids_BxT: Array, probs_BxT: Array | None,
                      axis: ShardAxis | None = None) -> Array:
  """ends_BxT (a chunk's last token) of the configured predictor.

  ``probs`` is the router's output for 'router'. The flag at t depends on tokens
  <= t + ``visibility_delay(attn)``; entries become visible that many tokens after their end.
  ``axis``: the mesh axis the tokens are split over (context parallelism), or None; the
  length rules then run per shard (``end_flags.enforce_lengths``).
  """
  if attn.boundary == "fixed":
    return fixed_end_flags(positions_BxT, attn.chunk_size, attn.chunk_offset)
  if attn.boundary == "delimiter":
    proposals = delimiter_proposals(tokens_BxT, attn.delimiter_ids)
  else:
    proposals = hard_proposals(probs_BxT)
    if visibility_delay(attn):  # p_t starts a chunk at t: the chunk before it ends at t - 1
      proposals = jnp.pad(proposals[:, 1:], ((0, 0), (0, 1)))
  return enforce_lengths(proposals, segment_ids_BxT, min_chunk=attn.min_chunk,
                         max_chunk=attn.max_chunk, axis=axis)


def compute(attn: AttentionConfig, tokens_BxT: Array, positions_BxT: Array,
            segment_ids_BxT: Array, probs_BxT: Array | None,
            axis: ShardAxis | None = None) -> Boundaries:
  """The ``Boundaries`` of a row batch: end flags, probabilities and the packed layout."""
  ends = predict_end_flags(attn, tokens_BxT, positions_BxT, segment_ids_BxT, probs_BxT, axis)
  layout = packed_layout(ends, segment_ids_BxT, capacity(attn, ends.shape[1]),
                         delay=visibility_delay(attn))
  return Boundaries(ends, probs_BxT, layout)


def repacked(attn: AttentionConfig, boundaries: Boundaries, segment_ids_BxT: Array,
             cap: int) -> Boundaries:
  """The same boundaries packed into ``cap`` entries (a group member with its own capacity)."""
  if boundaries.layout.capacity == cap:
    return boundaries
  layout = packed_layout(boundaries.ends_BxT, segment_ids_BxT, cap,
                         delay=visibility_delay(attn))
  return dataclasses.replace(boundaries, layout=layout)


def weighted_ratio_loss(attn: AttentionConfig, boundaries: Boundaries,
                        segment_ids_BxT: Array) -> Array | None:
  """``ratio_loss_weight`` times H-Net's ratio loss on the decided probabilities (or None)."""
  if boundaries.probs_BxT is None or not attn.ratio_loss_weight:
    return None
  decided = decided_probs(boundaries.probs_BxT, boundaries.ends_BxT, segment_ids_BxT,
                          min_chunk=attn.min_chunk, max_chunk=attn.max_chunk,
                          delay=visibility_delay(attn))
  return attn.ratio_loss_weight * ratio_loss(boundaries.ends_BxT, decided, attn.chunk_size)


def tokens_per_entry(boundaries: Boundaries) -> Array:
  """Measured mean chunk length of the batch (the achieved budget)."""
  return mean_chunk_length(boundaries.ends_BxT)
