"""Online index estimation: from one layer's prompt queries and keys to an ``Index``.

Letters: B rows, T prompt tokens, H query heads, K kv heads (head h reads kv head h // (H/K)),
D head dim, W the last queries a pattern reads, N query/key blocks of L tokens. Scores are
float32. Each function reads only what its pattern needs (the last W queries, block means), so
estimation costs O(W x T) or O(N x N) per head, never T x T.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from chunkformer.sparse_prefill.index import (
  Index,
  from_bitmap,
  from_diagonals,
  no_columns,
  num_blocks,
)

Array = jax.Array
_F32 = jnp.float32


def _per_head(k_BxTxKxD: Array, h: int) -> Array:
  """k_BxTxHxD: the kv head of every query head."""
  return k_BxTxKxD[:, :, jnp.arange(h) // (h // k_BxTxKxD.shape[2])]


def keep_all(q_BxTxHxD: Array, block: int) -> Index:
  """Every causal key block of every query block: dense attention as an index."""
  b, t, h, _ = q_BxTxHxD.shape
  n = num_blocks(t, block)
  blocks = jnp.broadcast_to(jnp.arange(n, dtype=jnp.int32), (b, h, n, n))
  counts = jnp.broadcast_to(jnp.arange(1, n + 1, dtype=jnp.int32), (b, h, n))
  return Index(blocks, counts, *no_columns(b, h, n))


def a_shape(q_BxTxHxD: Array, block: int, sink_blocks: int, local_blocks: int) -> Index:
  """Static: the first ``sink_blocks`` key blocks and the last ``local_blocks`` up to the
  diagonal (StreamingLLM's sinks + window at block granularity)."""
  b, t, h, _ = q_BxTxHxD.shape
  n = num_blocks(t, block)
  i, j = jnp.arange(n)[:, None], jnp.arange(n)[None, :]
  bitmap = (j <= i) & ((j < sink_blocks) | (i - j < local_blocks))
  blocks, counts = from_bitmap(jnp.broadcast_to(bitmap, (b, h, n, n)),
                               min(n, sink_blocks + local_blocks))
  return Index(blocks, counts, *no_columns(b, h, n))


def last_query_attention(q_BxTxHxD: Array, k_BxTxKxD: Array, last_q: int) -> Array:
  """probs_BxHxWxT: causal softmax attention of the prompt's last W = min(last_q, T) queries."""
  b, t, h, d = q_BxTxHxD.shape
  w = min(last_q, t)
  q = q_BxTxHxD[:, t - w:].astype(_F32)
  logits = jnp.einsum("bwhd,bthd->bhwt", q, _per_head(k_BxTxKxD, h).astype(_F32)) * d**-0.5
  visible = jnp.arange(t)[None, :] <= (t - w + jnp.arange(w))[:, None]
  return jax.nn.softmax(jnp.where(visible, logits, -jnp.inf), axis=-1)


def diagonal_sums(probs_BxHxWxT: Array) -> Array:
  """sums_BxHxT: for every offset o = query position - key position, the attention the W last
  queries give the key o before them (the "slash" line o)."""
  w, t = probs_BxHxWxT.shape[2:]
  positions = t - w + jnp.arange(w)
  keys = positions[:, None] - jnp.arange(t)[None, :]  # W x T(offsets): the key of line o
  along = jnp.take_along_axis(probs_BxHxWxT, jnp.broadcast_to(
      jnp.maximum(keys, 0), probs_BxHxWxT.shape), axis=-1)
  return jnp.where(keys >= 0, along, 0.0).sum(axis=2)


def vertical_slash(q_BxTxHxD: Array, k_BxTxKxD: Array, block: int, vertical: int, slash: int,
                   last_q: int, forced_vertical: int, forced_slash: int) -> Index:
  """MInference's vertical-slash estimate: the last queries' attention summed down each key
  column (top ``vertical`` columns, the first ``forced_vertical`` always) and along each
  diagonal (top ``slash`` offsets, offsets 0 .. forced_slash - 1 always). Columns are read
  token by token; a slash line o, which crosses query block i in key blocks i - floor(o/L) and
  i - ceil(o/L), is read as those whole blocks."""
  b, t, h, _ = q_BxTxHxD.shape
  n = num_blocks(t, block)
  probs = last_query_attention(q_BxTxHxD, k_BxTxKxD, last_q)
  pos = jnp.arange(t)
  columns_score = jnp.where(pos < forced_vertical, jnp.inf, probs.sum(axis=2))
  columns = jax.lax.top_k(columns_score, min(vertical, t))[1].astype(jnp.int32)
  slash_score = jnp.where(pos < forced_slash, jnp.inf, diagonal_sums(probs))
  offsets = jax.lax.top_k(slash_score, min(slash, t))[1]
  hit = jnp.zeros((b, h, n + 1), bool)
  rows = (jnp.arange(b)[:, None, None], jnp.arange(h)[None, :, None])
  hit = hit.at[rows + (offsets // block,)].set(True)
  hit = hit.at[rows + (-(-offsets // block),)].set(True)[..., :n]
  # Static slots (the XLA path computes every slot): the forced offsets 0 .. F-1 hit the
  # diagonals 0 .. ceil((F-1)/L), every other line at most two more.
  forced = min(forced_slash, slash, t)
  extra = min(slash, t) - forced
  blocks, counts = from_diagonals(hit, min(n, (max(forced, 1) - 1) // block + 2 + 2 * extra))
  return Index(blocks, counts, columns, jnp.ones((b, h, n, columns.shape[-1]), bool))


def pooled_scores(q_BxTxHxD: Array, k_BxTxKxD: Array, block: int) -> Array:
  """scores_BxHxNxN: mean query of each block against mean key of each block (the mean over the
  block's real tokens), causal blocks only (-inf above the diagonal)."""
  b, t, h, d = q_BxTxHxD.shape
  n = num_blocks(t, block)
  pad = n * block - t
  count = jnp.minimum(block, t - jnp.arange(n) * block).astype(_F32)[:, None, None]

  def mean(x):
    x = jnp.pad(x.astype(_F32), ((0, 0), (0, pad), (0, 0), (0, 0)))
    return x.reshape(b, n, block, *x.shape[2:]).sum(2) / count

  scores = jnp.einsum("bihd,bjhd->bhij", mean(q_BxTxHxD), mean(_per_head(k_BxTxKxD, h)))
  return jnp.where(jnp.tril(jnp.ones((n, n), bool)), scores, -jnp.inf)


def block_sparse(q_BxTxHxD: Array, k_BxTxKxD: Array, block: int, top: int) -> Index:
  """MInference's block-sparse estimate: per query block, the ``top`` causal key blocks of
  highest pooled score; the diagonal block always (every query then sees itself)."""
  b, t, h, _ = q_BxTxHxD.shape
  n = num_blocks(t, block)
  scores = pooled_scores(q_BxTxHxD, k_BxTxKxD, block)
  scores = jnp.where(jnp.eye(n, dtype=bool), jnp.inf, scores)
  slots = min(top, n)
  blocks = jax.lax.top_k(scores, slots)[1].astype(jnp.int32)
  counts = jnp.broadcast_to(jnp.minimum(jnp.arange(1, n + 1), slots).astype(jnp.int32),
                            (b, h, n))
  return Index(blocks, counts, *no_columns(b, h, n))
