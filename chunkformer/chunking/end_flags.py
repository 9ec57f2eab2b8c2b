"""End flags: ``ends_BxT[b, t] = 1`` iff a chunk closes at token t (t is its last token).

Fixed chunking is the special case ``(position + 1 - offset) mod M == 0``; a boundary
predictor proposes closes and ``enforce_lengths`` turns proposals into end flags that respect
the minimum and maximum chunk length. Both are causal: the flag at t depends on tokens <= t.

Documents: lengths are counted from each document's start (a document start always starts a
chunk). The open chunk at a document's (or the row's) end is *not* closed: its entry could only
ever be seen by the document's last query, and during decoding nobody knows that a document is
about to end, so closing it would make the forward pass disagree with incremental decoding. It
simply never becomes an entry. This also bounds the number of entries of a row by
``floor(T / min_chunk)``, because every closed chunk has at least ``min_chunk`` tokens.
"""

from __future__ import annotations

from typing import Protocol

import flax.linen as nn
import jax
import jax.numpy as jnp
from jax.sharding import PartitionSpec

Array = jax.Array


def is_document_start(segment_ids_BxT: Array) -> Array:
  """bool_BxT: token t is the first token of its document within the row."""
  previous = jnp.pad(segment_ids_BxT, ((0, 0), (1, 0)), constant_values=-1)[:, :-1]
  return segment_ids_BxT != previous


def fixed_end_flags(positions_BxT: Array, chunk_size: int, offset: int | Array = 0) -> Array:
  """bool_BxT: fixed chunks of ``chunk_size`` tokens, boundaries shifted left by ``offset``.

  A chunk closes at document position p iff ``(p + 1 + offset) mod M == 0``: the convention of
  the fixed kind (chunkformer/compression/offsets.py), whose chunk j covers
  [jM - o, (j+1)M - 1 - o], so with o > 0 a document's first chunk is the partial
  [0, M - 1 - o]. Positions are measured from the document start, so every document starts
  its own grid. ``offset`` may be an int or per-row offsets_Bx1.
  """
  return (positions_BxT + 1 + offset) % chunk_size == 0


def shortest_chunk(chunk_size: int, offset: int) -> int:
  """Fewest tokens a closed fixed chunk can hold (the partial first chunk under an offset)."""
  return chunk_size - offset % chunk_size


def enforce_lengths(proposals_BxT: Array, segment_ids_BxT: Array, *, min_chunk: int,
                    max_chunk: int, axis: ShardAxis | None = None) -> Array:
  """End flags from proposed closes under chunk length limits (a causal state machine).

  Scanning left to right with L = length of the open chunk including t: the chunk closes at t
  iff (proposed at t and L >= min_chunk) or L == max_chunk; a document start resets L.
  Implemented as a parallel prefix over the state-transition maps (state = open length before
  t, in [0, max_chunk)), so the cost is O(T log T * max_chunk) with no sequential loop. With
  the tokens split over a mesh ``axis`` (context parallelism) each shard scans its own maps
  and the shards exchange one composed map each (``_open_lengths_over_shards``).

  Args:
    proposals_BxT: bool, the predictor's proposed closes.
    segment_ids_BxT: int, document id per token.
    min_chunk, max_chunk: chunk length limits in tokens, 1 <= min_chunk <= max_chunk.
    axis: the mesh axis (``.name``, ``.size``) the token axis is split over, or None.

  Returns:
    ends_BxT: bool end flags.
  """
  if not 1 <= min_chunk <= max_chunk:
    raise ValueError(f"need 1 <= min_chunk <= max_chunk, got {min_chunk}, {max_chunk}")
  proposals_BxT = proposals_BxT.astype(bool)
  num_states = max_chunk
  starts_BxT = is_document_start(segment_ids_BxT)
  if min_chunk == 1 and max_chunk > proposals_BxT.shape[1]:
    return proposals_BxT  # no limit can bind: no chunk of the row reaches max_chunk tokens
  # f_t maps the open length before t to the open length after t.
  state = jnp.arange(num_states, dtype=jnp.int32)
  before_BxTxS = jnp.where(starts_BxT[..., None], 0, state)
  length_BxTxS = before_BxTxS + 1
  close_BxTxS = (proposals_BxT[..., None] & (length_BxTxS >= min_chunk)) | (
      length_BxTxS >= max_chunk)
  maps_BxTxS = jnp.where(close_BxTxS, 0, length_BxTxS)

  if axis is None:
    prefix_BxTxS = jax.lax.associative_scan(_compose, maps_BxTxS, axis=1)
    after_BxT = prefix_BxTxS[..., 0]  # every row starts with an empty open chunk
    open_before_BxT = jnp.pad(after_BxT, ((0, 0), (1, 0)))[:, :-1]
  else:
    open_before_BxT = _open_lengths_over_shards(maps_BxTxS, axis)
  open_before_BxT = jnp.where(starts_BxT, 0, open_before_BxT)
  length_BxT = open_before_BxT + 1
  return (proposals_BxT & (length_BxT >= min_chunk)) | (length_BxT >= max_chunk)


class ShardAxis(Protocol):
  """A mesh axis the tokens are split over (``chunkformer.attention.context_axis.ContextAxis``)."""

  name: str
  size: int


def _compose(earlier: Array, later: Array) -> Array:
  """(later o earlier)[s] = later[earlier[s]] of state maps (last axis: the state)."""
  return jnp.take_along_axis(later, earlier, axis=-1)


def _open_lengths_over_shards(maps_BxTxS: Array, axis: ShardAxis) -> Array:
  """open_before_BxT (the open length before each token) with the tokens split over ``axis``.

  The state machine is causal, so each shard needs only the state entering its first token:
  the composition of every earlier shard's maps applied to the empty state. Each shard scans
  its own maps and all-gathers its composed map (``max_chunk`` integers per row), where the
  partitioned whole-row scan would reshard at every level of the parallel prefix.
  """
  def local(maps_BxLxS):
    n, device = axis.size, jax.lax.axis_index(axis.name)
    prefix_BxLxS = jax.lax.associative_scan(_compose, maps_BxLxS, axis=1)
    totals_NxBxS = jax.lax.all_gather(prefix_BxLxS[:, -1], axis.name)
    entering_B = jnp.zeros(maps_BxLxS.shape[:1], jnp.int32)
    for shard in range(n - 1):  # n is the mesh axis' size: a few steps of B integers
      moved = jnp.take_along_axis(totals_NxBxS[shard], entering_B[:, None], axis=1)[:, 0]
      entering_B = jnp.where(shard < device, moved, entering_B)
    after_BxL = jnp.take_along_axis(prefix_BxLxS, entering_B[:, None, None], axis=2)[..., 0]
    return jnp.concatenate([entering_B[:, None], after_BxL[:, :-1]], axis=1)

  spec = nn.logical_to_mesh_axes(("batch", "length", None))
  return jax.shard_map(local, in_specs=spec, out_specs=PartitionSpec(*spec[:2]))(maps_BxTxS)
