"""``compressed_core.attend`` over blocks of queries: score memory L x C instead of T x C.

The blockwise XLA path (``compressed_core.compressed_attention``) holds one score per (query,
entry) pair: B x H x T x C floats, several times over in the backward pass. For the
``dynamic`` kind the capacity is C = ceil(T / min_chunk) (no closed chunk is ever dropped), so
with min_chunk 2 and a target of 4 tokens per entry it holds twice the fixed kind's T / M
entries; at T = 32K this dominated the compiled training step (bench/results/scale_plan.md).

Here the queries are cut into blocks of L rows (L a multiple of the window block P), each block
attending through the same function with its own window keys, and the blocks run one after the
other under ``jax.checkpoint`` (``lax.map``), so forward and backward hold the scores of one
block. Each block is given the P rows before it as extra (discarded) queries: its raw keys then
sit in the same window blocks as in the unblocked call, and every query sees the same keys and
entries in the same layout, so the outputs equal the unblocked ones (tested). The price: the
attention forward is recomputed once more in the backward pass, and P extra queries per block.

Everything per query is cut into the same blocks:
- the uncompressed tail (``compressed_core.Tail``): its per-query first key, shifted to the
  block's rows; P is then the tail's span, as in the unblocked call;
- an entry selection (``EntrySelector``: an indexer's top-k, its straight-through logit bias and
  any additive statistics such as the lightning indexer's KL sums): the selector is a pure
  function of the block's rows of its per-query arrays, so the B x T x K x C selection, bias
  and indexer scores are never held for the whole row either. A query's selection depends on
  its own row only, so it equals the whole-row selection; the statistics are summed over each
  block's own rows (not the discarded ones), so their sums equal the whole row's.

This is the ``xla`` implementation of the compressed kinds (blocks only when the scores of the
whole row exceed ``max_scores`` query x entry pairs); ``attention.dispatch`` calls it or the
Pallas kernels, which never hold the scores.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

import jax
import jax.numpy as jnp

import kernels
from chunkformer.attention import compressed_core

Array = jax.Array

# Query x entry pairs one block may hold: 2**24 is 1 GiB of float32 scores for 16 heads; rows
# of T <= 4096 with entries ceil(T / 2) stay in one block (T = 32768: blocks of 1024 queries).
MAX_SCORES = 2**24
_PAD_RUN = -2  # run id of padding rows: no real query or entry has it (runs >= 1, PAD_SEGMENT -1)


class Selection(NamedTuple):
  """What a selector returns for L query rows: ``select_BxLxKxC`` (entries each query may
  see), ``bias_BxLxKxC`` added to the entry logits (or None) and ``stats``, scalars that add up
  over rows (e.g. a loss's sum and its count)."""

  select_BxLxKxC: Array
  bias_BxLxKxC: Array | None
  stats: dict[str, Array]


class EntrySelector(NamedTuple):
  """An entry selection computed per block of query rows.

  ``per_query``: arrays with the query axis at axis 1 (B x T x ...), cut to the block's rows.
  ``select(rows, query_index_BxL, own_BxL)``: ``rows`` is ``per_query`` at the block's rows,
  ``query_index_BxL`` their row indices in the whole row (negative or >= T on padding rows),
  ``own_BxL`` which rows are real queries the block answers (padding rows and the previous
  block's rows are not: a selector must select nothing there and count no statistics there).
  """

  per_query: dict[str, Array]
  select: Callable[[dict[str, Array], Array, Array], Selection]


def block_rows(seq_len: int, window: int, capacity: int, max_scores: int) -> int:
  """Queries per block (a multiple of the window block P); ``seq_len``: no blocking."""
  p = max(min(window, seq_len), 1)
  if seq_len * capacity <= max_scores:
    return seq_len
  rows = max(max_scores // max(capacity, 1) // p, 1) * p
  return seq_len if rows >= seq_len else rows


def attend(q_BxTxHxD: Array, k_BxTxKxD: Array, v_BxTxKxD: Array, segment_ids_BxT: Array, *,
           window: int, entry_k_BxCxKxD: Array, entry_v_BxCxKxD: Array | None,
           entry_ends_BxCxK: Array, entry_segment_ids_BxCxK: Array, sink_H: Array | None,
           tail: compressed_core.Tail | None = None, max_scores: int | None = None) -> Array:
  """``compressed_core.attend`` (same arguments and result), in query blocks when large.

  ``max_scores``: query x entry pairs per block (default ``MAX_SCORES``, read at the call).
  """
  return attend_selected(
      q_BxTxHxD, k_BxTxKxD, v_BxTxKxD, segment_ids_BxT, window=window,
      entry_k_BxCxKxD=entry_k_BxCxKxD, entry_v_BxCxKxD=entry_v_BxCxKxD,
      entry_ends_BxCxK=entry_ends_BxCxK, entry_segment_ids_BxCxK=entry_segment_ids_BxCxK,
      sink_H=sink_H, tail=tail, max_scores=max_scores)[0]


def attend_selected(q_BxTxHxD: Array, k_BxTxKxD: Array, v_BxTxKxD: Array,
                    segment_ids_BxT: Array, *, window: int, entry_k_BxCxKxD: Array,
                    entry_v_BxCxKxD: Array | None, entry_ends_BxCxK: Array,
                    entry_segment_ids_BxCxK: Array, sink_H: Array | None,
                    tail: compressed_core.Tail | None = None,
                    selector: EntrySelector | None = None,
                    max_scores: int | None = None) -> tuple[Array, dict[str, Array]]:
  """(o_BxTxHxD, the selector's statistics summed over the row): ``attend`` with an entry
  selection computed per block (``selector``; None: every visible entry, no statistics)."""
  b, t = segment_ids_BxT.shape
  cap = entry_k_BxCxKxD.shape[1]
  span = window if tail is None else tail.span  # the raw-key block, as compressed_attention's
  rows = block_rows(t, span, cap, MAX_SCORES if max_scores is None else max_scores)
  shared = dict(entry_k_BxCxKxD=entry_k_BxCxKxD, entry_v_BxCxKxD=entry_v_BxCxKxD,
                sink_H=sink_H)
  if rows >= t:
    selection = None
    if selector is not None:
      index = jnp.broadcast_to(jnp.arange(t), (b, t))
      selection = selector.select(selector.per_query, index, jnp.ones((b, t), bool))
    o = compressed_core.attend(
        q_BxTxHxD, k_BxTxKxD, v_BxTxKxD, segment_ids_BxT, window=window, tail=tail,
        entry_ends_BxCxK=entry_ends_BxCxK, entry_segment_ids_BxCxK=entry_segment_ids_BxCxK,
        entry_select_BxTxKxC=None if selection is None else selection.select_BxLxKxC,
        entry_bias_BxTxKxC=None if selection is None else selection.bias_BxLxKxC, **shared)
    return o, {} if selection is None else selection.stats
  # Documents as contiguous runs over the whole row, exactly as compressed_core.attend does.
  run_BxT, entry_run_BxCxK = kernels.document_runs(segment_ids_BxT, entry_ends_BxCxK,
                                                  entry_segment_ids_BxCxK)
  p = max(min(span, t), 1)
  num_blocks = -(-t // rows)
  # p leading rows (the first block's "previous" queries and keys) and trailing rows up to a
  # whole number of blocks, all in a run no real query or entry belongs to.
  total = p + num_blocks * rows

  def pad(x, fill=0, axis=1):
    widths = [(0, 0)] * x.ndim
    widths[axis] = (p, total - p - t)
    return jnp.pad(x, widths, constant_values=fill)

  q, k, v, run = pad(q_BxTxHxD), pad(k_BxTxKxD), pad(v_BxTxKxD), pad(run_BxT, _PAD_RUN)
  tail_start = None if tail is None else pad(tail.start_BxKxT, axis=2)
  per_query = {} if selector is None else {n: pad(x) for n, x in selector.per_query.items()}
  is_pad = entry_ends_BxCxK == kernels.PAD_END

  def block(i):
    first = i * rows  # padded row of the block's first "previous" query: global row i*rows - p
    offset = first - p  # global row of the block's first row
    take = lambda x, axis=1: jax.lax.dynamic_slice_in_dim(x, first, rows + p, axis=axis)
    # Entry ends and tail starts relative to the block's first row (padding entries keep
    # PAD_END).
    ends = jnp.where(is_pad, kernels.PAD_END, entry_ends_BxCxK - offset)
    block_tail = None
    if tail is not None:
      block_tail = compressed_core.Tail(tail.span, take(tail_start, axis=2) - offset)
    select = bias = None
    stats = {}
    if selector is not None:
      index = jnp.broadcast_to(offset + jnp.arange(rows + p), (b, rows + p))
      own = (index >= offset + p) & (index < t)
      select, bias, stats = selector.select({n: take(x) for n, x in per_query.items()}, index,
                                            own)
    o = compressed_core.compressed_attention(
        take(q), take(k), take(v), take(run), window=window, tail=block_tail,
        entry_ends_BxCxK=ends, entry_segment_ids_BxCxK=entry_run_BxCxK,
        entry_select_BxTxKxC=select, entry_bias_BxTxKxC=bias, **shared)
    return o[:, p:], stats

  o_NxBxLxHxD, stats_N = jax.lax.map(jax.checkpoint(block), jnp.arange(num_blocks))
  o = jnp.moveaxis(o_NxBxLxHxD, 0, 1).reshape((b, num_blocks * rows) + q_BxTxHxD.shape[2:])
  return o[:, :t], {n: jnp.sum(s, axis=0) for n, s in stats_N.items()}
