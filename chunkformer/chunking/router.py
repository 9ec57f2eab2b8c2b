"""Learned boundary router (H-Net style) and its two causal readings.

H-Net scores ``p_t = (1 - cos(W_q x_t, W_k x_{t-1})) / 2`` from the pair (x_{t-1}, x_t) and
*starts* a chunk at t when ``p_t >= 1/2``. Read as an end flag, that rule says "t - 1 closes",
decided from x_t, one token in the future: a compressor that must show the query at t - 1 the
entry of a chunk closing at t - 1 cannot do that. Two causal readings (``router_rule``):

- ``start`` (H-Net's semantics, the default): p_t >= 1/2 means t starts a chunk, so the chunk
  ending at t - 1 is closed when x_t arrives, and its entry becomes visible from query t on:
  one token later than its last token (the window still shows that token raw). In end-flag
  terms the flags are the proposals shifted one token left, ``ends[t - 1] = p_t >= 1/2``, with a
  visibility delay of one token (``chunking.boundaries.visibility_delay``).
- ``end``: p_t >= 1/2 means t is the last token of its chunk; the entry is visible at t.
The score is identical; what differs is which token the dissimilarity prior (identity
projections: a boundary where adjacent states differ) puts at the chunk's edge. Under ``end`` a
boundary at a change of content makes the *first* token of the new content the last token of the
old chunk (on the kv task: the needle's key is cut from its value), under ``start`` it begins
the new chunk, as in H-Net.

At a document's first token there is no predecessor inside the document; ``p = 0`` there (a
document start starts a chunk anyway). Hard proposals are ``p_t >= 1/2``; the straight-through
gradient is applied by the consumer of the boundaries (``straight_through``), and the ratio
loss holds the mean chunk length.
"""

from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp

from chunkformer.chunking.end_flags import is_document_start
from chunkformer.layers import shift_right

Array = jax.Array


def _identity_init(key, shape, dtype=jnp.float32):
  del key
  return jnp.eye(*shape, dtype=dtype)


class BoundaryRouter(nn.Module):
  """x_BxTxE -> probs_BxT (float32), ``probs[t]`` = P(a chunk closes at t); causal.

  ``W_q``, ``W_k`` are E x E and start as the identity, so at initialisation ``p_t`` is the
  cosine dissimilarity of adjacent hidden states, as in H-Net.
  """

  eps: float = 1e-6

  @nn.compact
  def __call__(self, x_BxTxE: Array, segment_ids_BxT: Array) -> Array:
    e = x_BxTxE.shape[-1]
    names = ("embed", "act_embed")  # square map: the input axis shards like every embed axis
    w_q = self.param("w_q", nn.with_logical_partitioning(_identity_init, names), (e, e))
    w_k = self.param("w_k", nn.with_logical_partitioning(_identity_init, names), (e, e))
    x32 = x_BxTxE.astype(jnp.float32)
    q_BxTxE = x32 @ w_q.astype(jnp.float32)
    k_BxTxE = shift_right(x32, 1) @ w_k.astype(jnp.float32)

    def unit(v):
      return v * jax.lax.rsqrt(jnp.sum(v * v, axis=-1, keepdims=True) + self.eps)

    cos_BxT = jnp.sum(unit(q_BxTxE) * unit(k_BxTxE), axis=-1)
    probs_BxT = jnp.clip((1.0 - cos_BxT) / 2.0, 0.0, 1.0)
    return jnp.where(is_document_start(segment_ids_BxT), 0.0, probs_BxT)


def hard_proposals(probs_BxT: Array) -> Array:
  """bool_BxT: the router proposes to close a chunk where ``p >= 1/2`` (H-Net's rule)."""
  return probs_BxT >= 0.5


def straight_through(probs_BxT: Array) -> Array:
  """Exactly 1.0 in the forward pass, gradient d/dp = 1 in the backward pass.

  Multiplying an entry by ``straight_through(p_end)`` leaves every forward value unchanged
  (``p - stop_gradient(p)`` is exactly zero) while the language-model loss tells the router
  whether the entry closed at that token should have been stronger or weaker.
  """
  return 1.0 + (probs_BxT - jax.lax.stop_gradient(probs_BxT))
