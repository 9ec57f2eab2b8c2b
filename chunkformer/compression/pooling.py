"""Pooling of slot buffers into entries: the arithmetic of DeepSeek-V4's compressor.

A *slot buffer* lays the tokens of C chunks out as S slots per chunk, per key/value head:
``kv_BxCxSxKxR`` (R = c * D compressor channels, c = 2 with overlap), gate logits of the same
shape and ``valid_BxCxSxK`` (False for padding: slots before the row start or of another
document). Fixed chunking fills it by a reshape (or a gather when chunk boundaries are shifted
by an offset); any other chunking can fill it the same way and reuse everything below.

Overlap (DeepSeek CSA): entry i pools 2S slots, the first half of the R channels of chunk i-1
in slots 0..S-1 and the second half of chunk i in slots S..2S-1, so that every token feeds two
entries through different channels (and slot biases). Chunk -1 is padding.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

Array = jax.Array


def masked_softmax(scores: Array, valid: Array, axis: int) -> Array:
  """Softmax along ``axis`` over the entries where ``valid``; all-invalid groups give zeros.

  Invalid scores become -inf before the exponential, so no NaN can leak into the gradient.
  """
  scores = jnp.where(valid, scores.astype(jnp.float32), -jnp.inf)
  m = jnp.max(scores, axis=axis, keepdims=True)
  m = jax.lax.stop_gradient(jnp.where(jnp.isfinite(m), m, 0.0))
  p = jnp.exp(scores - m)
  denom = jnp.sum(p, axis=axis, keepdims=True)
  return p / jnp.where(denom > 0, denom, 1.0)


def previous_chunk(x_BxCx_: Array, fill) -> Array:
  """x of chunk i-1 at index i (``fill`` at i = 0): the overlap's view of the previous chunk."""
  pad = [(0, 0)] * x_BxCx_.ndim
  pad[1] = (1, 0)
  return jnp.pad(x_BxCx_, pad, constant_values=fill)[:, :-1]


def overlap_slots(cur_BxCxSxKxR: Array, prev_BxCxSxKxR: Array) -> Array:
  """The 2S overlapped slots of width R/2: [first channel half of chunk i-1, second of i]."""
  half = cur_BxCxSxKxR.shape[-1] // 2
  return jnp.concatenate([prev_BxCxSxKxR[..., :half], cur_BxCxSxKxR[..., half:]], axis=2)


def pool_gated(kv_BxCxSxKxD: Array, scores_BxCxSxKxD: Array,
               valid_BxCxSxK: Array) -> tuple[Array, Array]:
  """sum_s softmax_s(scores)[s, c] * kv[s, c], the softmax over slots taken per channel c.

  Returns (pooled_BxCxKxD in kv's dtype, weights_BxCxSxKxD in float32).
  """
  w = masked_softmax(scores_BxCxSxKxD, valid_BxCxSxK[..., None], axis=2)
  pooled = jnp.einsum("bcskd,bcskd->bckd", w, kv_BxCxSxKxD.astype(jnp.float32))
  return pooled.astype(kv_BxCxSxKxD.dtype), w


def pool_mean(kv_BxCxSxKxD: Array, valid_BxCxSxK: Array) -> tuple[Array, Array]:
  """Uniform mean over the valid slots (the study's 'plain average' ablation).

  Returns (pooled_BxCxKxD, weights_BxCxSxK); a chunk without valid slots pools to zero.
  """
  valid = valid_BxCxSxK.astype(jnp.float32)
  w = valid / jnp.maximum(jnp.sum(valid, axis=2, keepdims=True), 1.0)
  pooled = jnp.einsum("bcsk,bcskd->bckd", w, kv_BxCxSxKxD.astype(jnp.float32))
  return pooled.astype(kv_BxCxSxKxD.dtype), w


def fixed_slot_tokens(num_chunks: int, chunk_size: int, offsets_BxK: Array) -> Array:
  """tok_BxCxMxK: the row index held by slot s of chunk j, ``j*M + s - offset``.

  With offset o the chunk boundaries move o tokens to the left: chunk 0 covers [-o, M - o)
  and its first o slots are padding (negative index). Offsets lie in [0, M).
  """
  j = jnp.arange(num_chunks)[:, None, None]
  s = jnp.arange(chunk_size)[None, :, None]
  return (j * chunk_size + s)[None] - offsets_BxK[:, None, None, :]


def gather_slots(x_BxTxKx_: Array, tok_BxCxMxK: Array) -> Array:
  """x at the slot tokens, x_BxCxMxKx_ (indices clipped to the row; callers mask padding)."""
  b, c, m, k = tok_BxCxMxK.shape
  t = x_BxTxKx_.shape[1]
  idx = jnp.clip(tok_BxCxMxK, 0, t - 1).reshape(b, c * m, k)
  idx = idx.reshape(idx.shape + (1,) * (x_BxTxKx_.ndim - 3))
  return jnp.take_along_axis(x_BxTxKx_, idx, axis=1).reshape((b, c, m) + x_BxTxKx_.shape[2:])


def reshape_slots(x_BxTx_: Array, num_chunks: int, chunk_size: int) -> Array:
  """Zero-offset fast path of ``gather_slots``: pad the row to C*M tokens and reshape."""
  t = x_BxTx_.shape[1]
  pad = [(0, 0)] * x_BxTx_.ndim
  pad[1] = (0, num_chunks * chunk_size - t)
  x = jnp.pad(x_BxTx_, pad)
  return x.reshape((x.shape[0], num_chunks, chunk_size) + x.shape[2:])
