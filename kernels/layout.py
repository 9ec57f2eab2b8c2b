"""The segment-packed layout: chunk structure from end flags, and per-query visibility ranges.

Shape legend: B batch, T tokens, C entry capacity, N channels.

Conventions shared by every kernel in this package:
- A row holds one or more documents, each a contiguous run of equal ``segment_ids``; adjacent
  documents have different ids. Ids need not be sorted, and an id that reappears later in the
  row starts a new document: nothing crosses from one run to another run of the same id
  (``chunk_attention`` maps ids to run indices with ``document_runs`` before any
  implementation sees them, so every tile size gives this result).
- ``ends_BxT[t]`` means "a chunk closes at t". A chunk starts at t == 0, after every end, and at
  every document start. A document start never closes the previous chunk: tokens of a document
  after its last end form an open chunk that produces no entry (the same rule as for the
  row's final open chunk). So callers that want the last piece of a document pooled must set
  its end flag themselves.
- Entries are stored in order of their end position; unused capacity holds padding entries with
  end ``PAD_END`` (never visible), segment id ``PAD_SEGMENT`` and zero values. Closed chunks
  beyond the capacity are dropped (``num_entries`` tells how many were kept).
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp

Array = jax.Array

PAD_END = 2**30  # end position of a padding entry: larger than any query position
PAD_SEGMENT = -1  # segment id of a padding entry


def document_starts(segment_ids_BxT: Array) -> Array:
  """doc_start_BxT: position of the first token of t's document (t's contiguous run)."""
  t = segment_ids_BxT.shape[1]
  pos = jnp.arange(t, dtype=jnp.int32)
  is_start = jnp.concatenate(
      [jnp.ones_like(segment_ids_BxT[:, :1], dtype=bool),
       segment_ids_BxT[:, 1:] != segment_ids_BxT[:, :-1]], axis=1)
  return jax.lax.cummax(jnp.where(is_start, pos, 0), axis=1)


def document_runs(segment_ids_BxT: Array, entry_ends_Bx_: Array,
                  entry_segment_ids_Bx_: Array, run_BxT: Array | None = None
                  ) -> tuple[Array, Array]:
  """Renames documents to run indices: ``(run_BxT, entry_run_Bx_)``.

  ``run_BxT`` counts document starts (a contiguous run of equal ids is one document, so an id
  that reappears later gets a new index; pass it when known, ``RowLayout.run_BxT``). An entry
  (any shape after the batch axis, e.g. BxC or BxCxK) takes the run of the token it ends at
  when its segment id is that token's; any other entry (padding, or an id that disagrees with
  its end position) gets ``PAD_SEGMENT`` and is never visible. On inputs whose ids are
  contiguous this changes no visibility decision.
  """
  b, t = segment_ids_BxT.shape
  if run_BxT is None:
    run_BxT = document_run_index(segment_ids_BxT)
  ends = entry_ends_Bx_.reshape(b, -1)
  inside = (ends >= 0) & (ends < t)
  at = jnp.where(inside, ends, 0).astype(jnp.int32)
  own = inside & (jnp.take_along_axis(segment_ids_BxT, at, axis=1)
                  == entry_segment_ids_Bx_.reshape(b, -1))
  entry_run = jnp.where(own, jnp.take_along_axis(run_BxT, at, axis=1), PAD_SEGMENT)
  return run_BxT, entry_run.astype(jnp.int32).reshape(entry_ends_Bx_.shape)


def document_run_index(segment_ids_BxT: Array) -> Array:
  """run_BxT: 1 + the number of document starts before or at t (documents = contiguous runs)."""
  is_start = jnp.concatenate(
      [jnp.ones_like(segment_ids_BxT[:, :1], dtype=bool),
       segment_ids_BxT[:, 1:] != segment_ids_BxT[:, :-1]], axis=1)
  return jnp.cumsum(is_start, axis=1, dtype=jnp.int32)


class RowLayout(NamedTuple):
  """What the kernels read of a row's documents: computed once per step (``row_layout``; the
  model puts it in its attention context, outside the layer scan and remat) and shared by every
  layer's call instead of being recomputed in each."""

  run_BxT: Array  # document_run_index
  doc_start_BxT: Array  # document_starts
  doc_end_BxT: Array  # document_ends


def row_layout(segment_ids_BxT: Array) -> RowLayout:
  """The ``RowLayout`` of a batch of rows."""
  return RowLayout(document_run_index(segment_ids_BxT), document_starts(segment_ids_BxT),
                   document_ends(segment_ids_BxT))


def padded_document_bounds(rows: RowLayout, padded_len: int) -> tuple[Array, Array]:
  """(doc_start, doc_end) of rows padded at the end to ``padded_len`` with their last segment
  id (the kernels' edge padding): the padding joins the last document."""
  b, t = rows.doc_start_BxT.shape
  extra = padded_len - t
  start = jnp.pad(rows.doc_start_BxT.astype(jnp.int32), ((0, 0), (0, extra)), mode="edge")
  end = jnp.where(rows.doc_end_BxT == t, padded_len, rows.doc_end_BxT).astype(jnp.int32)
  return start, jnp.pad(end, ((0, 0), (0, extra)), constant_values=padded_len)


def document_ends(segment_ids_BxT: Array) -> Array:
  """doc_end_BxT: one past the last token of t's document."""
  t = segment_ids_BxT.shape[1]
  pos = jnp.arange(t, dtype=jnp.int32)
  is_last = jnp.concatenate(
      [segment_ids_BxT[:, 1:] != segment_ids_BxT[:, :-1],
       jnp.ones_like(segment_ids_BxT[:, :1], dtype=bool)], axis=1)
  return jax.lax.cummin(jnp.where(is_last, pos + 1, t), axis=1, reverse=True)


def entry_visible(entry_visible_from: Array, entry_segment_ids: Array, query_positions: Array,
                  query_segment_ids: Array) -> Array:
  """THE entry-visibility rule, elementwise (broadcasting): a query at row index t in document
  s sees an entry iff the entry's visible-from index is <= t and the entry belongs to s.

  The visible-from index is the entry's end (its chunk's last token) plus the boundary
  predictor's delay (the router's ``start`` rule: one token; see ``chunkformer.chunking``).
  Callers arrange the axes (e.g. B x T x 1 queries against B x 1 x C entries);
  ``visible_entry_range`` is the same rule as a per-query range.
  """
  return (entry_visible_from <= query_positions) & (entry_segment_ids == query_segment_ids)


def entry_visibility_BxTxC(entry_visible_from_BxC: Array, entry_segment_ids_BxC: Array,
                           segment_ids_BxT: Array) -> Array:
  """visible_BxTxC: ``entry_visible`` for every query of the row against every entry."""
  t = segment_ids_BxT.shape[1]
  return entry_visible(entry_visible_from_BxC[:, None, :], entry_segment_ids_BxC[:, None, :],
                       jnp.arange(t)[None, :, None], segment_ids_BxT[:, :, None])


def visible_entry_range(entry_ends_BxC: Array, entry_segment_ids_BxC: Array,
                        segment_ids_BxT: Array, doc_start_BxT: Array | None = None
                        ) -> tuple[Array, Array]:
  """Per-query visible entry range [start_BxT, stop_BxT).

  Query t sees entry c iff ``entry_ends[c] <= t`` and ``entry_segment_ids[c] ==
  segment_ids[t]``. Entries are ordered by end and documents are contiguous runs, so the entries
  visible to t are exactly those whose end lies in [doc_start(t), t]: a contiguous range.
  Both bounds are non-decreasing in t over the whole row (start jumps at document starts), so a
  block of queries [t0, t1] is covered by [start[t0], stop[t1]). An entry whose segment id
  disagrees with the document its end lies in would fall inside the range without being
  visible; kernels therefore still apply the exact per-entry mask inside the range.
  """
  del entry_segment_ids_BxC  # implied by the end position under the layout conventions
  t = segment_ids_BxT.shape[1]
  # No search: visible_up_to[t] = entries with end <= t, a histogram of the ends and its running
  # sum (O(T + C) integer work; the ends are sorted, so counts are indices). Ends outside
  # [0, T) (padding) are counted in an extra bin that no query reads.
  ends = entry_ends_BxC.astype(jnp.int32)
  bins = jnp.where((ends >= 0) & (ends < t), ends, t)
  hist = jax.vmap(lambda i: jnp.zeros((t + 1,), jnp.int32).at[i].add(1))(bins)
  below = jnp.sum(ends < 0, axis=1, dtype=jnp.int32)[:, None]  # visible from before the row
  visible_up_to = below + jnp.cumsum(hist[:, :t], axis=1, dtype=jnp.int32)
  if doc_start_BxT is None:
    doc_start_BxT = document_starts(segment_ids_BxT)
  before_doc = jnp.where(doc_start_BxT > 0,
                         jnp.take_along_axis(visible_up_to, jnp.maximum(doc_start_BxT - 1, 0),
                                             axis=1), below)
  return before_doc, jnp.maximum(visible_up_to, before_doc)


def chunk_starts(ends_BxT: Array, segment_ids_BxT: Array) -> tuple[Array, Array]:
  """(is_start_BxT, chunk_start_BxT): t starts a chunk (document start, or an end flag at t - 1),
  and the first token of t's chunk."""
  t = ends_BxT.shape[1]
  pos = jnp.arange(t, dtype=jnp.int32)
  seg = segment_ids_BxT
  first = jnp.ones_like(seg[:, :1], dtype=bool)
  is_start = jnp.concatenate([first, seg[:, 1:] != seg[:, :-1]], axis=1) | jnp.concatenate(
      [first, ends_BxT[:, :-1].astype(bool)], axis=1)
  return is_start, jax.lax.cummax(jnp.where(is_start, pos, 0), axis=1)


class ChunkStructure(NamedTuple):
  """Token-to-entry map of the packed layout (``chunk_structure``; ``segment_pool`` takes it)."""

  entry_of_token_BxT: Array  # entry a token is pooled into; C for open or dropped chunks
  pos_in_chunk_BxT: Array  # offset of a token inside its chunk (0 = chunk start)
  entry_ends_BxC: Array  # row index of each entry's last token; PAD_END for padding
  entry_segment_ids_BxC: Array  # document of each entry; PAD_SEGMENT for padding
  entry_starts_BxC: Array  # row index of each entry's first token; PAD_END for padding
  num_entries_B: Array  # closed chunks kept


def chunk_structure(ends_BxT: Array, segment_ids_BxT: Array, capacity: int) -> ChunkStructure:
  """Token-to-entry map of the packed layout (``ChunkStructure``).

  ``entry_of_token`` is the entry a token is pooled into, or ``capacity`` for tokens of open
  (never closed) chunks and of chunks beyond the capacity. ``entry_starts`` is the first token
  of each entry's chunk (``PAD_END`` for padding).
  """
  b, t = ends_BxT.shape
  pos = jnp.arange(t, dtype=jnp.int32)
  ends = ends_BxT.astype(bool)
  seg = segment_ids_BxT
  is_start, chunk_start = chunk_starts(ends, seg)
  big = jnp.int32(t + 1)
  next_end = jax.lax.cummin(jnp.where(ends, pos, big), axis=1, reverse=True)
  next_start = jax.lax.cummin(jnp.where(is_start, pos, big), axis=1, reverse=True)
  next_start_after = jnp.concatenate([next_start[:, 1:], jnp.full((b, 1), big)], axis=1)
  closed = next_end < next_start_after
  closes_before = jnp.cumsum(ends, axis=1, dtype=jnp.int32) - ends.astype(jnp.int32)
  entry_of_token = jnp.where(closed & (closes_before < capacity), closes_before, capacity)

  def scatter(values_T, fill):
    # Only end tokens write, each to its own entry; the rest go to the dropped slot.
    index = jnp.where(ends, entry_of_token, capacity)
    return jax.vmap(
        lambda i, x: jnp.full((capacity + 1,), fill, jnp.int32).at[i].set(x)[:capacity])(
            index, values_T.astype(jnp.int32))

  entry_ends = scatter(jnp.broadcast_to(pos, (b, t)), PAD_END)
  entry_segment_ids = scatter(seg, PAD_SEGMENT)
  entry_starts = scatter(chunk_start, PAD_END)
  num_entries = jnp.minimum(jnp.sum(ends, axis=1, dtype=jnp.int32), capacity)
  return ChunkStructure(entry_of_token, pos - chunk_start, entry_ends, entry_segment_ids,
                        entry_starts, num_entries)


def raw_key_start(segment_ids_BxT: Array, window: int, doc_start_BxT: Array | None = None
                  ) -> Array:
  """First raw key position query t may see: max(t - window + 1, doc_start(t))."""
  t = segment_ids_BxT.shape[1]
  pos = jnp.arange(t, dtype=jnp.int32)
  if doc_start_BxT is None:
    doc_start_BxT = document_starts(segment_ids_BxT)
  return jnp.maximum(pos - window + 1, doc_start_BxT)


def entry_query_range(entry_ends_BxC: Array, segment_ids_BxT: Array,
                      doc_end_BxT: Array | None = None) -> tuple[Array, Array]:
  """Queries that may see each entry: [lo_BxC, hi_BxC) = [end, end of the end's document).

  Padding entries (end beyond the row) get the empty range [T, T). Backward kernels loop over
  these queries only.
  """
  t = segment_ids_BxT.shape[1]
  inside = entry_ends_BxC < t
  end = jnp.where(inside, entry_ends_BxC, 0).astype(jnp.int32)
  if doc_end_BxT is None:
    doc_end_BxT = document_ends(segment_ids_BxT)
  doc_end = jnp.take_along_axis(doc_end_BxT, end, axis=1)
  return (jnp.where(inside, end, t).astype(jnp.int32),
          jnp.where(inside, doc_end, t).astype(jnp.int32))


def query_key_blocks(raw_start_BxT: Array, entry_start_BxT: Array, entry_stop_BxT: Array,
                     block_q: int, block_k: int, block_c: int, window: int
                     ) -> tuple[Array, Array, Array, Array]:
  """(raw_lo, raw_n, entry_lo, entry_n), B x (T / block_q) int32: per block of ``block_q``
  queries the raw-key blocks [raw_lo, raw_lo + raw_n) (of ``block_k`` keys) and the entry blocks
  [entry_lo, entry_lo + entry_n) (of ``block_c`` entries) that hold a key or entry one of its
  queries may see. Query t sees keys [raw_start[t], t] (``raw_key_start``) and entries
  [entry_start[t], entry_stop[t]) (``visible_entry_range``), all non-decreasing in t, so the
  block needs keys from its first query's start through its last query and entries from its
  first query's start to its last query's stop. No window: no raw-key block. The forward and dq
  kernels loop over these blocks."""
  b, t = raw_start_BxT.shape
  per = lambda x: x.reshape(b, -1, block_q)
  cdiv = lambda x, n: -(-x // n)
  if window > 0:
    raw_lo = jnp.min(per(raw_start_BxT), axis=2) // block_k
    past_last = jnp.arange(1, t // block_q + 1, dtype=jnp.int32)[None] * block_q
    raw_n = jnp.maximum(cdiv(past_last, block_k) - raw_lo, 0)
  else:
    raw_lo = raw_n = jnp.zeros((b, t // block_q), jnp.int32)
  ent_lo = jnp.min(per(entry_start_BxT), axis=2) // block_c
  ent_n = jnp.maximum(cdiv(jnp.max(per(entry_stop_BxT), axis=2), block_c) - ent_lo, 0)
  return tuple(x.astype(jnp.int32) for x in (raw_lo, raw_n, ent_lo, ent_n))


def key_columns(seg_BxTp: Array, entry_ends_BxCp: Array, entry_segment_ids_BxCp: Array,
                doc_end_BxTp: Array, window: int) -> tuple[Array, Array]:
  """(lo, hi), both B x (Tp + Cp) int32: the queries [lo, hi) that see each key column, raw
  keys in columns [0, Tp) and entries in [Tp, Tp + Cp) (one column axis for both sources).

  Raw key s: [s, min(s + W, end of its document)) (empty when W = 0). Entry c: [its end, end of
  its end's document), empty for padding and for an entry whose id is not its end's document
  (``document_runs`` gave it ``PAD_SEGMENT``). Under the layout conventions this is
  exactly ``kernels.reference``'s visibility, and both bounds are non-decreasing within each
  source (``entry_query_range``).
  """
  tp = seg_BxTp.shape[1]
  pos = jnp.arange(tp, dtype=jnp.int32)
  raw_hi = jnp.minimum(pos + window, doc_end_BxTp)
  raw_lo = jnp.broadcast_to(pos, raw_hi.shape)
  ent_lo, ent_hi = entry_query_range(entry_ends_BxCp, seg_BxTp, doc_end_BxTp)
  ent_hi = jnp.where(entry_segment_ids_BxCp == PAD_SEGMENT, ent_lo, ent_hi)
  return (jnp.concatenate([raw_lo, ent_lo], axis=1).astype(jnp.int32),
          jnp.concatenate([raw_hi, ent_hi], axis=1).astype(jnp.int32))


def column_query_blocks(lo_BxN: Array, hi_BxN: Array, block: int, block_q: int
                        ) -> tuple[Array, Array]:
  """(first, stop), B x (N / block): per block of ``block`` columns the query blocks (of
  ``block_q`` queries) [first, stop) that hold a query seeing one of its columns, from the
  columns' ranges [lo, hi). A column no query sees (lo == hi) adds none; a block of only such
  columns gets first >= stop. The dk/dv kernels loop over these query blocks."""
  b = lo_BxN.shape[0]
  seen = hi_BxN > lo_BxN
  first = jnp.where(seen, lo_BxN, jnp.iinfo(jnp.int32).max).reshape(b, -1, block)
  last = jnp.where(seen, hi_BxN, 0).reshape(b, -1, block)
  return jnp.min(first, axis=2) // block_q, -(-jnp.max(last, axis=2) // block_q)


def column_block_bounds(lo_BxN: Array, hi_BxN: Array, block: int) -> tuple[Array, Array]:
  """(lo_max, hi_min), B x (N / block): per block of ``block`` columns the latest first query
  and the earliest stop of its columns' ranges [lo, hi). Queries [first, last] see every column
  of a block iff lo_max <= first and hi_min > last (a block holding a column that no query sees
  never qualifies); the kernels run such an interior tile without a mask."""
  b = lo_BxN.shape[0]
  return (jnp.max(lo_BxN.reshape(b, -1, block), axis=2),
          jnp.min(hi_BxN.reshape(b, -1, block), axis=2))
