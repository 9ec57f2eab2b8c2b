"""Chunked KV compression: the DeepSeek-V4 compressor family (pooling math, module, offsets)."""

from chunkformer.compression.compressor import (
  Compressor,
  FixedChunks,
  fixed_chunks,
  num_fixed_chunks,
)
from chunkformer.compression.offsets import chunk_offsets, static_offsets, tail_start
from chunkformer.compression.probes import pool_weights, slot_biases

__all__ = ["Compressor", "FixedChunks", "chunk_offsets", "fixed_chunks", "num_fixed_chunks",
           "pool_weights", "slot_biases", "static_offsets", "tail_start"]
