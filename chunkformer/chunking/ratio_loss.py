"""H-Net's compression-ratio loss and the measured chunk statistics.

``L = N / (N - 1) * ((N - 1) F G + (1 - F)(1 - G))`` with F the fraction of tokens that close a
chunk (hard, no gradient), G the mean close probability and N the target mean chunk length.
Its gradient in G is ``N / (N - 1) * (N F - 1)``: it lowers the probabilities while chunks are
shorter than N (F > 1/N) and raises them while they are longer, and L = 1 when F = G = 1/N.
F counts the final end flags (after the min/max length rules), i.e. the entries actually
produced, so the loss holds the real budget rather than the router's raw proposals.

G must then average the probabilities of the same decisions (``decided_probs``): where the
length rules decide (the open chunk is shorter than ``min_chunk``, or ``max_chunk`` forces the
close) the router's p has no effect on the ends, so it counts as the constant 0 or 1. Without
this the loss has a cheap minimum off the target: L is bilinear, so while F < 1/N it falls as
G rises, and the router can raise G on tokens whose proposals the minimum length suppresses,
never adding an entry (measured on configs/kv_dynamic.py, T = 256, step 1000: G = 0.50 with
F = 0.19, 5.1 tokens per entry against the target 4, and 42% of the proposals suppressed).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

import kernels

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


def decided_probs(probs_BxT: Array, ends_BxT: Array, segment_ids_BxT: Array, *, min_chunk: int,
                  max_chunk: int, delay: int = 0) -> Array:
  """The router's probabilities where they decide an end flag; 0 or 1 where the rules decide.

  The flag at t is the router's call iff the open chunk including t holds ``min_chunk <= L <
  max_chunk`` tokens (L counted from the final ``ends`` and document starts); below that the
  flag is 0 whatever p says, at ``max_chunk`` it is 1. ``delay`` 1 (the router's 'start' rule)
  means ``p[t]`` decides the flag at t - 1 (``p[0]`` decides nothing).
  """
  _, chunk_start = kernels.chunk_starts(ends_BxT, segment_ids_BxT)
  length = jnp.arange(ends_BxT.shape[1], dtype=jnp.int32) - chunk_start + 1
  free = (length >= min_chunk) & (length < max_chunk)
  forced = length >= max_chunk
  if delay:  # p[t] decides the flag at t - 1
    free, forced = (jnp.pad(x[:, :-1], ((0, 0), (1, 0))) for x in (free, forced))
  return jnp.where(free, probs_BxT.astype(jnp.float32), forced.astype(jnp.float32))


def mean_chunk_length(ends_BxT: Array, mask_BxT: Array | None = None) -> Array:
  """Measured tokens per entry: counted tokens / closed chunks (the achieved budget).

  For fixed chunks of M over a row of T = kM tokens this is exactly M.
  """
  mask = jnp.ones(ends_BxT.shape, jnp.float32) if mask_BxT is None else mask_BxT.astype(
      jnp.float32)
  closes = jnp.sum(ends_BxT.astype(jnp.float32) * mask)
  return jnp.sum(mask) / jnp.maximum(closes, 1.0)
