"""The eviction policies as pure functions of one layer's prompt cache.

Every policy maps (keys_BxTxKxD, values_BxTxKxD, queries_BxWxHxD of the prompt's last W tokens,
budget n, lengths_B) to kept_BxKxN: for each row and kv head the n positions whose keys and
values stay in the cache, ascending. Policies that choose per row only (StreamingLLM, ChunkKV)
give every kv head the same positions. Keys carry RoPE at their positions (the cache's
layout). ``lengths_B`` are the valid prompt tokens of each row (padding never stays); the
caller keeps ``n <= min(lengths)`` and any always-kept window inside ``n``. Values are in the
signature because some published policies score them; none of these does.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from chunkformer.eviction import scores as scores_lib
from chunkformer.eviction import select

Array = jax.Array


def _positions(keys_BxTxKxD: Array) -> Array:
  return jnp.arange(keys_BxTxKxD.shape[1])[None, :]


def _heads(kept_BxN: Array, keys_BxTxKxD: Array) -> Array:
  b, n = kept_BxN.shape
  return jnp.broadcast_to(kept_BxN[:, None], (b, keys_BxTxKxD.shape[2], n))


def _with_window(scores_BxKxT: Array, lengths_B: Array, window: int) -> Array:
  """Scores with the last ``window`` valid tokens forced in (+inf) and padding out (-inf)."""
  t = _positions(scores_BxKxT[:, 0, :, None])
  recent = (t >= (lengths_B - window)[:, None]) & (t < lengths_B[:, None])
  scores = jnp.where(recent[:, None], jnp.inf, scores_BxKxT)
  return jnp.where((t < lengths_B[:, None])[:, None], scores, -jnp.inf)


def streaming_llm(keys_BxTxKxD, values_BxTxKxD, queries_BxWxHxD, budget: int, lengths_B, *,
                  sinks: int) -> Array:
  """The first ``sinks`` tokens (attention sinks) and the most recent ``budget - sinks``."""
  del values_BxTxKxD, queries_BxWxHxD
  t = _positions(keys_BxTxKxD)
  recency_BxT = jnp.where(t < sinks, jnp.inf, t.astype(jnp.float32))
  scores = jnp.where(t < lengths_B[:, None], recency_BxT, -jnp.inf)
  return _heads(select.top_k(scores[:, None], budget)[:, 0], keys_BxTxKxD)


def snapkv(keys_BxTxKxD, values_BxTxKxD, queries_BxWxHxD, budget: int, lengths_B, *,
           kernel: int, pooling: str) -> Array:
  """SnapKV: the W observation queries' attention (GQA-averaged), pooled along the prefix
  with ``kernel``; the window's W tokens always stay, the best prefix keys fill the rest."""
  del values_BxTxKxD
  w = queries_BxWxHxD.shape[1]
  pooled = scores_lib.snapkv_scores(keys_BxTxKxD, queries_BxWxHxD, lengths_B, kernel, pooling)
  return select.top_k(_with_window(pooled, lengths_B, w), budget)


def h2o(keys_BxTxKxD, values_BxTxKxD, queries_BxWxHxD, budget: int, lengths_B, *,
        recent: int) -> Array:
  """H2O-style heavy hitters: attention accumulated over the given queries (every prompt
  query for H2O) per key, GQA-averaged; the ``recent`` last tokens always stay."""
  del values_BxTxKxD
  accumulated = scores_lib.query_attention(keys_BxTxKxD, queries_BxWxHxD, lengths_B)
  return select.top_k(_with_window(accumulated, lengths_B, recent), budget)


def knorm(keys_BxTxKxD, values_BxTxKxD, queries_BxWxHxD, budget: int, lengths_B) -> Array:
  """The keys of smallest L2 norm (large-norm keys draw little attention: KNorm)."""
  del values_BxTxKxD, queries_BxWxHxD
  return select.top_k(_with_window(-scores_lib.key_norms(keys_BxTxKxD), lengths_B, 0), budget)


def chunkkv(keys_BxTxKxD, values_BxTxKxD, queries_BxWxHxD, budget: int, lengths_B, *,
            chunk: int, kernel: int, pooling: str) -> Array:
  """ChunkKV as published (ChunkKV's paper; kvpress's ChunkKVPress over SnapKV): a grid of
  ``chunk`` tokens from position 0 over the whole prompt, its last, shorter chunk a chunk of
  its own; each chunk scored by the mean over its tokens of SnapKV's pooled scores summed
  over kv heads, the W observation tokens scoring above every prefix token (SnapKV keeps its
  window: the chunks holding it rank first); the best chunks kept whole, never cut.
  ``budget`` must be the last chunk plus whole chunks (``specs.ChunkKV.tokens`` rounds
  a budget down to that). Per row; every kv head keeps the same positions."""
  del values_BxTxKxD
  w = queries_BxWxHxD.shape[1]
  pooled = scores_lib.snapkv_scores(keys_BxTxKxD, queries_BxWxHxD, lengths_B, kernel, pooling)
  t = _positions(keys_BxTxKxD)
  scores_BxT = jnp.where(t < (lengths_B - w)[:, None], pooled.sum(axis=1), jnp.inf)
  ends_BxT = jnp.broadcast_to(select.grid_ends(t.shape[1], chunk), scores_BxT.shape)
  keep = select.whole_chunks(scores_BxT, ends_BxT, budget, lengths_B)
  return _heads(select.from_flags(keep, budget), keys_BxTxKxD)


def chunkkv_cut(keys_BxTxKxD, values_BxTxKxD, queries_BxWxHxD, budget: int, lengths_B, *,
                ends_BxT: Array, kernel: int, pooling: str) -> Array:
  """ChunkKV filling its budget exactly (``chunkkv_cut``, and content chunks): SnapKV's pooled
  scores summed over kv heads, averaged within chunks (closed by ``ends_BxT``: a fixed grid
  or content boundaries) of the prefix before the observation window, the best chunks to
  ``budget - W`` tokens, the first that does not fit cut to its first tokens, plus the W-token
  window. Per row; every kv head keeps the same positions."""
  del values_BxTxKxD
  w = queries_BxWxHxD.shape[1]
  pooled = scores_lib.snapkv_scores(keys_BxTxKxD, queries_BxWxHxD, lengths_B, kernel, pooling)
  prefix_B = lengths_B - w
  t = _positions(keys_BxTxKxD)
  scores_BxT = jnp.where(t < prefix_B[:, None], pooled.sum(axis=1), 0.0)
  keep = select.whole_chunks(scores_BxT, ends_BxT, budget - w, prefix_B)
  keep = keep | ((t >= prefix_B[:, None]) & (t < lengths_B[:, None]))
  return _heads(select.from_flags(keep, budget), keys_BxTxKxD)
