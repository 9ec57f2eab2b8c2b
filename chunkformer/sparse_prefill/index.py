"""Index sets of sparse prefill: which keys each query block reads, as data.

An ``Index`` is the argument tuple of ``kernels.block_sparse_attention`` (semantics there):
per row b, query head h and query block n of ``block`` queries, ``counts`` distinct key blocks
in ``blocks`` read whole (causal inside), plus distinct ``columns`` (single keys) read by the
query blocks whose ``column_keep`` flag is set. Every pattern's online estimation returns one;
heads with different patterns are merged into one by padding (``merge_heads``), so a layer runs
one attention call whatever mixture of patterns its heads carry.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

import jax
import jax.numpy as jnp

from kernels.block_sparse import exclusive_columns

Array = jax.Array


class Index(NamedTuple):
  blocks_BxHxNxS: Array  # int32 key blocks per query block; entries past the count unused
  counts_BxHxN: Array  # int32 listed blocks per query block (>= 1: the diagonal)
  columns_BxHxV: Array  # int32 distinct key positions read as single columns
  column_keep_BxHxNxV: Array  # bool: query block n reads column v


def num_blocks(t: int, block: int) -> int:
  return -(-t // block)


def no_columns(b: int, h: int, n: int) -> tuple[Array, Array]:
  return jnp.zeros((b, h, 0), jnp.int32), jnp.zeros((b, h, n, 0), bool)


def from_bitmap(bitmap_BxHxNxN: Array, slots: int) -> tuple[Array, Array]:
  """(blocks, counts) listing the set key blocks of every query block in ascending order;
  ``slots`` must be at least the largest count."""
  order = jnp.argsort(~bitmap_BxHxNxN, axis=-1, stable=True)[..., :slots]
  return order.astype(jnp.int32), bitmap_BxHxNxN.sum(-1).astype(jnp.int32)


def from_diagonals(hit_BxHxN: Array, slots: int) -> tuple[Array, Array]:
  """(blocks, counts) of a pattern that reads key block i - d from query block i wherever
  ``hit[d]`` (block diagonals: the same for every query block), without an N x N bitmap."""
  n = hit_BxHxN.shape[-1]
  diffs = jnp.argsort(~hit_BxHxN, axis=-1, stable=True)[..., :slots]  # hit diagonals, ascending
  counts = jnp.cumsum(hit_BxHxN, axis=-1).astype(jnp.int32)  # diagonals d <= i
  blocks = jnp.arange(n)[:, None] - diffs[:, :, None, :]  # B x H x N x S
  return jnp.maximum(blocks, 0).astype(jnp.int32), counts


def _pad_last(x: Array, size: int, value) -> Array:
  extra = size - x.shape[-1]
  return x if extra == 0 else jnp.pad(x, [(0, 0)] * (x.ndim - 1) + [(0, extra)],
                                      constant_values=value)


def merge_heads(indices: Sequence[Index], choice_H: Sequence[int]) -> Index:
  """One index whose head h is head h of ``indices[choice_H[h]]`` (padded to the largest
  block list and column count)."""
  if len(indices) == 1:
    return indices[0]
  slots = max(i.blocks_BxHxNxS.shape[-1] for i in indices)
  cols = max(i.columns_BxHxV.shape[-1] for i in indices)
  padded = [Index(_pad_last(i.blocks_BxHxNxS, slots, 0), i.counts_BxHxN,
                  _pad_last(i.columns_BxHxV, cols, 0), _pad_last(i.column_keep_BxHxNxV, cols,
                                                                 False)) for i in indices]
  choice = jnp.asarray(choice_H)
  pick = lambda *xs: jnp.stack(xs)[choice, :, jnp.arange(len(choice_H))].swapaxes(0, 1)
  return Index(*(pick(*fields) for fields in zip(*padded, strict=True)))


def tile_fraction(index: Index, t: int, block: int) -> Array:
  """work_BxH: the key-query pairs the kernels compute (whole listed tiles, every column chunk
  for every query block) over the causal pairs a dense prefill computes. Kernel-aware: a
  listed block costs block**2 even where causality masks half of it."""
  n, v = index.counts_BxHxN.shape[-1], index.columns_BxHxV.shape[-1]
  tiles = index.counts_BxHxN.sum(-1) * block * block
  return (tiles + n * v * block) / (t * (t + 1) / 2)


def kept_fraction(index: Index, t: int, block: int) -> Array:
  """fraction_BxH: the visible (query, key) pairs of the index set over the causal pairs (the
  useful-FLOP fraction a speed-up is measured against), counted per tile without a T x T mask."""
  b, h, n, s = index.blocks_BxHxNxS.shape
  first = jnp.arange(n) * block
  queries = jnp.minimum(block, t - first)  # real queries per query block
  j = index.blocks_BxHxNxS
  listed = jnp.arange(s) < index.counts_BxHxN[..., None]
  i = jnp.arange(n)[:, None]
  pairs = jnp.where(j < i, queries[:, None] * block, jnp.where(
      j == i, queries[:, None] * (queries[:, None] + 1) // 2, 0))
  block_pairs = jnp.where(listed, pairs, 0).sum((-1, -2))
  keep = exclusive_columns(*index, block)
  c = index.columns_BxHxV[:, :, None, :]
  start = jnp.maximum(c, first[:, None])
  seen = jnp.clip(first[:, None] + queries[:, None] - start, 0, queries[:, None])
  column_pairs = jnp.where(keep & (c < t), seen, 0).sum((-1, -2))
  return (block_pairs + column_pairs) / (t * (t + 1) / 2)
