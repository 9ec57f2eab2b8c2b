"""Kernels for segment-packed chunk attention (no dependency on ``chunkformer``).

Public ops, each with ``implementation=`` in {"xla", "pallas_gpu", "pallas_tpu"} and
``interpret=`` to run the Pallas code on CPU:
- ``segment_pool``: gated softmax pooling of variable chunks into packed entries;
- ``chunk_attention``: queries over [sliding window of raw keys] union [visible entries];
- ``decode_attention``: one query over a ring-buffer window plus the first entries.
Layout conventions (chunk rules, padding entries, visibility ranges) in ``kernels.layout``.
"""

from kernels.attention import chunk_attention
from kernels.block_sizes import AttentionBlockSizes, DecodeBlockSizes, PoolBlockSizes
from kernels.decode import decode_attention
from kernels.layout import (
    PAD_END,
    PAD_SEGMENT,
    chunk_starts,
    chunk_structure,
    visible_entry_range,
)
from kernels.pool import segment_pool
from kernels.reference import (
                               chunk_attention_reference,
                               decode_attention_reference,
                               segment_pool_reference,
)

IMPLEMENTATIONS = ("xla", "pallas_gpu", "pallas_tpu")

__all__ = [
    "AttentionBlockSizes",
    "DecodeBlockSizes",
    "IMPLEMENTATIONS",
    "PAD_END",
    "PAD_SEGMENT",
    "PoolBlockSizes",
    "chunk_attention",
    "chunk_attention_reference",
    "chunk_starts",
    "chunk_structure",
    "decode_attention",
    "decode_attention_reference",
    "segment_pool",
    "segment_pool_reference",
    "visible_entry_range",
]
