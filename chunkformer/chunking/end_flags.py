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

import jax
import jax.numpy as jnp

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
                    max_chunk: int) -> Array:
  """End flags from proposed closes under chunk length limits (a causal state machine).

  Scanning left to right with L = length of the open chunk including t: the chunk closes at t
  iff (proposed at t and L >= min_chunk) or L == max_chunk; a document start resets L.
  Implemented as a parallel prefix over the state-transition maps (state = open length before
  t, in [0, max_chunk)), so the cost is O(T log T * max_chunk) with no sequential loop.

  Args:
    proposals_BxT: bool, the predictor's proposed closes.
    segment_ids_BxT: int, document id per token.
    min_chunk, max_chunk: chunk length limits in tokens, 1 <= min_chunk <= max_chunk.

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

  def compose(earlier, later):  # (later o earlier)[s] = later[earlier[s]]
    return jnp.take_along_axis(later, earlier, axis=-1)

  prefix_BxTxS = jax.lax.associative_scan(compose, maps_BxTxS, axis=1)
  after_BxT = prefix_BxTxS[..., 0]  # every row starts with an empty open chunk
  open_before_BxT = jnp.pad(after_BxT, ((0, 0), (1, 0)))[:, :-1]
  open_before_BxT = jnp.where(starts_BxT, 0, open_before_BxT)
  length_BxT = open_before_BxT + 1
  return (proposals_BxT & (length_BxT >= min_chunk)) | (length_BxT >= max_chunk)

