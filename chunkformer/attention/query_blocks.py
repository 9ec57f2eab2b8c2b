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

Applies to the "xla" implementation when the scores of the whole row exceed ``max_scores``
query x entry pairs; the Pallas kernels never hold the scores and are called as they are. Used
by the dynamic kind and by the fixed kind (without an uncompressed tail or a top-k selection,
which take ``compressed_core.attend`` whole: T/S entries, a quarter of the dynamic buffer).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

import kernels
from chunkformer.attention import compressed_core

Array = jax.Array

# Query x entry pairs one block may hold: 2**24 is 1 GiB of float32 scores for 16 heads; rows
# of T <= 4096 with entries ceil(T / 2) stay in one block (T = 32768: blocks of 1024 queries).
MAX_SCORES = 2**24
_PAD_RUN = -2  # run id of padding rows: no real query or entry has it (runs >= 1, PAD_SEGMENT -1)


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
           implementation: str, interpret: bool, max_scores: int | None = None) -> Array:
  """``compressed_core.attend`` (same arguments and result), in query blocks when large.

  ``max_scores``: query x entry pairs per block (default ``MAX_SCORES``, read at the call).
  """
  b, t = segment_ids_BxT.shape
  cap = entry_k_BxCxKxD.shape[1]
  rows = block_rows(t, window, cap, MAX_SCORES if max_scores is None else max_scores)
  if implementation != "xla" or rows >= t:
    return compressed_core.attend(
        q_BxTxHxD, k_BxTxKxD, v_BxTxKxD, segment_ids_BxT, window=window,
        entry_k_BxCxKxD=entry_k_BxCxKxD, entry_v_BxCxKxD=entry_v_BxCxKxD,
        entry_ends_BxCxK=entry_ends_BxCxK, entry_segment_ids_BxCxK=entry_segment_ids_BxCxK,
        sink_H=sink_H, implementation=implementation, interpret=interpret)
  # Documents as contiguous runs over the whole row, exactly as compressed_core.attend does.
  run_BxT, entry_run_BxCxK = kernels.document_runs(segment_ids_BxT, entry_ends_BxCxK,
                                                  entry_segment_ids_BxCxK)
  p = max(min(window, t), 1)
  num_blocks = -(-t // rows)
  # p leading rows (the first block's "previous" queries and keys) and trailing rows up to a
  # whole number of blocks, all in a run no real query or entry belongs to.
  total = p + num_blocks * rows

  def pad(x, fill=0):
    widths = [(0, 0)] * x.ndim
    widths[1] = (p, total - p - t)
    return jnp.pad(x, widths, constant_values=fill)

  q, k, v, run = pad(q_BxTxHxD), pad(k_BxTxKxD), pad(v_BxTxKxD), pad(run_BxT, _PAD_RUN)
  is_pad = entry_ends_BxCxK == kernels.PAD_END

  def block(i):
    first = i * rows  # padded row of the block's first "previous" query: global row i*rows - p
    take = lambda x: jax.lax.dynamic_slice_in_dim(x, first, rows + p, axis=1)
    # Entry ends relative to the block's first row (padding entries keep PAD_END).
    ends = jnp.where(is_pad, kernels.PAD_END, entry_ends_BxCxK - (first - p))
    o = compressed_core.compressed_attention(
        take(q), take(k), take(v), take(run), window=window, entry_k_BxCxKxD=entry_k_BxCxKxD,
        entry_v_BxCxKxD=entry_v_BxCxKxD, entry_ends_BxCxK=ends,
        entry_segment_ids_BxCxK=entry_run_BxCxK, sink_H=sink_H)
    return o[:, p:]

  o_NxBxLxHxD = jax.lax.map(jax.checkpoint(block), jnp.arange(num_blocks))
  o = jnp.moveaxis(o_NxBxLxHxD, 0, 1).reshape((b, num_blocks * rows) + q_BxTxHxD.shape[2:])
  return o[:, :t]
