"""H-Net's compression-ratio loss and the measured chunk statistics.

``L = N / (N - 1) * ((N - 1) F G + (1 - F)(1 - G))`` with F the fraction of tokens that close a
chunk (hard, no gradient), G the mean close probability and N the target mean chunk length.
Its gradient in G is ``N / (N - 1) * (N F - 1)``: it lowers the probabilities while chunks are
shorter than N (F > 1/N) and raises them while they are longer, and L = 1 when F = G = 1/N.
F counts the final end flags (after the min/max length rules), i.e. the entries actually
produced, so the loss holds the real budget rather than the router's raw proposals.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

Array = jax.Array


def ratio_loss(ends_BxT: Array, probs_BxT: Array, target_chunk: float,
               mask_BxT: Array | None = None) -> Array:
  """Scalar H-Net ratio loss over the tokens where ``mask`` is 1 (default: all tokens)."""
  if target_chunk <= 1:
    raise ValueError(f"the ratio loss needs a target chunk length > 1, got {target_chunk}")
  n = float(target_chunk)
  mask = jnp.ones(ends_BxT.shape, jnp.float32) if mask_BxT is None else mask_BxT.astype(
      jnp.float32)
  count = jnp.maximum(jnp.sum(mask), 1.0)
  f = jax.lax.stop_gradient(jnp.sum(ends_BxT.astype(jnp.float32) * mask) / count)
  g = jnp.sum(probs_BxT.astype(jnp.float32) * mask) / count
  return n / (n - 1.0) * ((n - 1.0) * f * g + (1.0 - f) * (1.0 - g))


def mean_chunk_length(ends_BxT: Array, mask_BxT: Array | None = None) -> Array:
  """Measured tokens per entry: counted tokens / closed chunks (the achieved budget).

  For fixed chunks of M over a row of T = kM tokens this is exactly M.
  """
  mask = jnp.ones(ends_BxT.shape, jnp.float32) if mask_BxT is None else mask_BxT.astype(
      jnp.float32)
  closes = jnp.sum(ends_BxT.astype(jnp.float32) * mask)
  return jnp.sum(mask) / jnp.maximum(closes, 1.0)
