"""From scores to kept indices: top-k per (row, kv head), and whole chunks to a budget.

Kept indices come back sorted ascending. Ties go to the earlier token (``lax.top_k`` and a
stable sort both prefer the lower index), so a selection is deterministic.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

Array = jax.Array


def top_k(scores_BxKxT: Array, n: int) -> Array:
  """kept_BxKxN: the n highest scores of each (row, kv head); +inf forces a key in, -inf
  keeps it out (the caller guarantees n finite-or-+inf scores per row)."""
  _, index = jax.lax.top_k(scores_BxKxT, n)
  return jnp.sort(index, axis=-1).astype(jnp.int32)


def from_flags(keep_BxT: Array, n: int) -> Array:
  """kept_BxN: the positions of a row's n flagged tokens, ascending (exactly n flagged)."""
  return top_k(keep_BxT.astype(jnp.float32)[:, None], n)[:, 0]


def chunk_ids(ends_BxT: Array) -> Array:
  """ids_BxT: the chunk of each token, counting chunks closed before it (0 for the first)."""
  ends = ends_BxT.astype(jnp.int32)
  return jnp.cumsum(ends, axis=1) - ends


def whole_chunks(scores_BxT: Array, ends_BxT: Array, budget: int | Array,
                 prefix_B: Array) -> Array:
  """keep_BxT: the best chunks of each row's prefix [0, prefix) to exactly ``budget`` tokens.

  Chunks are the runs closed by ``ends`` (the prefix's last token closes the last one); a
  chunk's score is the mean of its tokens' scores. Chunks are taken in order of score
  (ties: the earlier chunk) while they fit; the first one that does not fit is cut to its
  first tokens, so every kept chunk is whole except at most one, the lowest-ranked kept.
  Rows are independent. The caller keeps ``budget <= prefix``.
  """
  b, t = scores_BxT.shape
  tokens = jnp.arange(t)[None, :]
  valid = tokens < prefix_B[:, None]
  ends = (ends_BxT.astype(bool) | (tokens == prefix_B[:, None] - 1)) & valid
  ids = jnp.where(valid, chunk_ids(ends), t)  # padding: a dummy chunk t, never kept

  def per_row(score_T, id_T, valid_T):
    sums = jax.ops.segment_sum(jnp.where(valid_T, score_T, 0.0), id_T, t + 1)[:t]
    sizes = jax.ops.segment_sum(valid_T.astype(jnp.int32), id_T, t + 1)[:t]
    starts = jax.ops.segment_min(jnp.arange(t), id_T, t + 1)[:t]
    return sums / jnp.maximum(sizes, 1), sizes, starts

  means_BxC, sizes_BxC, starts_BxC = jax.vmap(per_row)(scores_BxT.astype(jnp.float32), ids,
                                                       valid)
  means_BxC = jnp.where(sizes_BxC > 0, means_BxC, -jnp.inf)
  order_BxC = jnp.argsort(-means_BxC, axis=1, stable=True)  # chunk ids, best first
  sorted_sizes = jnp.take_along_axis(sizes_BxC, order_BxC, axis=1)
  before_sorted = jnp.cumsum(sorted_sizes, axis=1) - sorted_sizes
  rank_BxC = jnp.argsort(order_BxC, axis=1)
  before_BxC = jnp.take_along_axis(before_sorted, rank_BxC, axis=1)  # tokens ranked ahead
  safe_ids = jnp.minimum(ids, t - 1)
  offset_BxT = tokens - jnp.take_along_axis(starts_BxC, safe_ids, axis=1)
  ahead_BxT = jnp.take_along_axis(before_BxC, safe_ids, axis=1)
  return valid & (ahead_BxT + offset_BxT < budget)


def grid_ends(t: int, chunk: int) -> Array:
  """ends_T: fixed chunks of ``chunk`` tokens aligned to position 0 (ChunkKV's grid)."""
  return (jnp.arange(t) + 1) % chunk == 0
