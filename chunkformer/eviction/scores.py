"""How much the prompt's last queries (or all of them) attend to each cached key.

Letters: B rows, T prompt tokens (the cache), K kv heads, H query heads (H = K * G, GQA groups
of G), W observation queries, D head dim. ``lengths_B`` are the rows' valid prompt tokens: a
row's W queries are its last W valid tokens (positions length - W .. length - 1), keys at or
past its length are padding. Scores are float32.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

Array = jax.Array
POOLINGS = ("max", "avg")


def query_attention(keys_BxTxKxD: Array, queries_BxWxHxD: Array, lengths_B: Array) -> Array:
  """scores_BxKxT: causal softmax attention of the W queries, summed over the queries and
  averaged over each kv head's query group (GQA)."""
  b, t, k, d = keys_BxTxKxD.shape
  w, h = queries_BxWxHxD.shape[1:3]
  q = queries_BxWxHxD.reshape(b, w, k, h // k, d).astype(jnp.float32)
  logits = jnp.einsum("bwkgd,btkd->bkgwt", q, keys_BxTxKxD.astype(jnp.float32)) / jnp.sqrt(d)
  positions_BxW = lengths_B[:, None] - w + jnp.arange(w)
  visible_BxWxT = jnp.arange(t)[None, None, :] <= positions_BxW[:, :, None]
  real_BxW = positions_BxW >= 0  # a row shorter than W has fewer real queries
  logits = jnp.where(visible_BxWxT[:, None, None], logits, -jnp.inf)
  logits = jnp.where(real_BxW[:, None, None, :, None], logits, 0.0)
  probs = jnp.where(real_BxW[:, None, None, :, None], jax.nn.softmax(logits, axis=-1), 0.0)
  return probs.sum(axis=3).mean(axis=2)


def pool(scores_BxKxT: Array, kernel: int, mode: str) -> Array:
  """1-D pooling along T with stride 1 and ``kernel // 2`` padding on each side ('same').

  ``max`` pads with -inf; ``avg`` pads with zeros and divides by ``kernel`` (PyTorch's
  avg_pool1d with count_include_pad, as SnapKV's reference code uses).
  """
  if kernel % 2 != 1:
    raise ValueError(f"pooling kernel must be odd, got {kernel}")
  pad = ((0, 0), (0, 0), (kernel // 2, kernel // 2))
  dims, strides = (1, 1, kernel), (1, 1, 1)
  if mode == "max":
    return jax.lax.reduce_window(scores_BxKxT, -jnp.inf, jax.lax.max, dims, strides, pad)
  if mode == "avg":
    return jax.lax.reduce_window(scores_BxKxT, 0.0, jax.lax.add, dims, strides, pad) / kernel
  raise ValueError(f"pooling must be one of {POOLINGS}, got {mode!r}")


def snapkv_scores(keys_BxTxKxD: Array, queries_BxWxHxD: Array, lengths_B: Array, kernel: int,
                  pooling: str) -> Array:
  """SnapKV's scores of the prefix keys (before the W-token observation window): the window's
  attention, pooled over the prefix alone (the window's own keys never leak into a prefix
  key's pooled score). scores_BxKxT; entries at or past ``length - W`` are not defined."""
  w = queries_BxWxHxD.shape[1]
  raw = query_attention(keys_BxTxKxD, queries_BxWxHxD, lengths_B)
  prefix_BxT = jnp.arange(raw.shape[-1])[None, :] < (lengths_B - w)[:, None]
  outside = -jnp.inf if pooling == "max" else 0.0
  return pool(jnp.where(prefix_BxT[:, None], raw, outside), kernel, pooling)


def key_norms(keys_BxTxKxD: Array) -> Array:
  """norms_BxKxT: the L2 norm of every key (RoPE rotates pairs of channels: norms unchanged)."""
  return jnp.linalg.norm(keys_BxTxKxD.astype(jnp.float32), axis=-1).transpose(0, 2, 1)
