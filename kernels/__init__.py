"""Kernels for segment-packed chunk attention (no dependency on ``chunkformer``).

Public ops, each with ``implementation=`` in {"xla", "pallas_gpu", "pallas_tpu"} and
``interpret=`` to run the Pallas code on CPU:
- ``segment_pool``: gated softmax pooling of variable chunks into packed entries;
- ``chunk_attention``: queries over [sliding window of raw keys] union [visible entries];
- ``decode_attention``: one query over a ring-buffer window plus the first entries (optionally
  masked per kv head: staggered chunk ends, an indexer's top-k);
- ``dense_attention``: the dense oracle of ``chunk_attention`` that also returns its weights;
- ``block_sparse_attention``: causal attention over per-head key blocks and columns (sparse
  prefill), with its dense oracle ``block_sparse_dense``.
The visibility rule is ``layout.entry_visible`` (one place; ``visible_entry_range`` is its range
form) and ``IMPLEMENTATIONS`` the one list of implementations.
Layout conventions (chunk rules, padding entries, visibility ranges) in ``kernels.layout``.
"""

from kernels.attention import chunk_attention
from kernels.block_sizes import AttentionBlockSizes, DecodeBlockSizes, PoolBlockSizes
from kernels.block_sparse import block_sparse_attention, block_sparse_dense, block_sparse_mask
from kernels.decode import decode_attention
from kernels.dense import AttentionWeights, dense_attention
from kernels.implementation import IMPLEMENTATIONS
from kernels.layout import (
    PAD_END,
    PAD_SEGMENT,
    ChunkStructure,
    RowLayout,
    chunk_starts,
    chunk_structure,
    document_runs,
    entry_visibility_BxTxC,
    entry_visible,
    row_layout,
    visible_entry_range,
)
from kernels.pool import segment_pool
from kernels.reference import (
    chunk_attention_reference,
    decode_attention_reference,
    segment_pool_reference,
)

__all__ = [
    "AttentionBlockSizes",
    "AttentionWeights",
    "ChunkStructure",
    "DecodeBlockSizes",
    "IMPLEMENTATIONS",
    "PAD_END",
    "PAD_SEGMENT",
    "PoolBlockSizes",
    "RowLayout",
    "block_sparse_attention",
    "block_sparse_dense",
    "block_sparse_mask",
    "chunk_attention",
    "chunk_attention_reference",
    "chunk_starts",
    "chunk_structure",
    "decode_attention",
    "document_runs",
    "entry_visibility_BxTxC",
    "entry_visible",
    "decode_attention_reference",
    "dense_attention",
    "row_layout",
    "segment_pool",
    "segment_pool_reference",
    "visible_entry_range",
]
