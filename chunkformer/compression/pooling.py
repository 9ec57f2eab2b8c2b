"""Pooling of slot buffers into entries: the arithmetic of the chunked compressor.

A *slot buffer* lays out the W tokens that each of C entries pools, per key/value head:
``kv_BxCxWxKxR`` (R = G * D: every token projected by each of the G payload maps), gate logits
of the same layout (G * g channels: g = D for vector gates, 1 for scalar ones) and
``valid_BxCxWxK`` (False for padding: slots before the row start or of another document).
Fixed chunking fills it by a reshape (W = S, no offset) or a gather; any other chunking can fill
it the same way and reuse everything below.

Offset i of a window uses map group ``i // (W / G)`` (``select_groups``): G = 1 is one map for
all offsets, G = W the paper's C_i per offset, and G = 2 with W = 2S DeepSeek's CSA overlap
(offsets 0..S-1, the previous chunk, read the first channel half, S..2S-1 the second), so
every token feeds two entries through different channels.
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


def select_groups(x_BxCxWxKxR: Array, groups: int) -> Array:
  """x_BxCxWxKx(R/G): offset i keeps channel group ``i // (W / G)`` of its R = G * g channels."""
  if groups == 1:
    return x_BxCxWxKxR
  w, r = x_BxCxWxKxR.shape[2], x_BxCxWxKxR.shape[-1]
  x = x_BxCxWxKxR.reshape(x_BxCxWxKxR.shape[:-1] + (groups, r // groups))
  group_W = jnp.arange(w) // (w // groups)
  idx = group_W.reshape(1, 1, w, 1, 1, 1)
  return jnp.take_along_axis(x, idx, axis=4)[..., 0, :]


def offset_table(table_RxKxGg: Array, groups: int) -> Array:
  """table_WxKxg: a per-offset table stored as (W/G) rows x K x (G * g) channels.

  Offset i = group * (W/G) + row reads row ``row`` of its group's channels, so the stored
  layout of G = 1 (one row per offset) and of the CSA overlap (S rows, two channel halves)
  is the one DeepSeek-V4 checkpoints use.
  """
  rows, k, gg = table_RxKxGg.shape
  t = table_RxKxGg.reshape(rows, k, groups, gg // groups)
  return jnp.moveaxis(t, 2, 0).reshape(groups * rows, k, gg // groups)


def pool_gated(kv_BxCxSxKxD: Array, scores_BxCxSxKxG: Array,
               valid_BxCxSxK: Array) -> tuple[Array, Array]:
  """sum_s softmax_s(scores)[s, c] * kv[s, c], the softmax over slots taken per channel c.

  Scores have D channels (vector gate) or one (scalar gate: every channel shares the score).
  Returns (pooled_BxCxKxD in kv's dtype, weights_BxCxSxKxG in float32).
  """
  w = masked_softmax(scores_BxCxSxKxG, valid_BxCxSxK[..., None], axis=2)
  w_full = jnp.broadcast_to(w, kv_BxCxSxKxD.shape)
  pooled = jnp.einsum("bcskd,bcskd->bckd", w_full, kv_BxCxSxKxD.astype(jnp.float32))
  return pooled.astype(kv_BxCxSxKxD.dtype), w


def pool_mean(kv_BxCxSxKxD: Array, valid_BxCxSxK: Array) -> tuple[Array, Array]:
  """Uniform mean over the valid slots (the study's 'plain average' ablation).

  Returns (pooled_BxCxKxD, weights_BxCxSxK); a chunk without valid slots pools to zero.
  """
  valid = valid_BxCxSxK.astype(jnp.float32)
  w = valid / jnp.maximum(jnp.sum(valid, axis=2, keepdims=True), 1.0)
  pooled = jnp.einsum("bcsk,bcskd->bckd", w, kv_BxCxSxKxD.astype(jnp.float32))
  return pooled.astype(kv_BxCxSxKxD.dtype), w


def fixed_slot_tokens(num_chunks: int, chunk_size: int, offsets_BxK: Array,
                      window: int = 0) -> Array:
  """tok_BxCxWxK: the row index held by slot s of entry j, ``j*S + S - W + s - offset``.

  Entry j's window is the W tokens ending at its chunk's last token ``(j+1)*S - 1 - offset``
  (W = 0: S, the chunk alone). With offset o the boundaries move o tokens to the left: chunk 0
  covers [-o, S - o); slots before the row start are padding (negative index). Offsets lie in
  [0, S).
  """
  w = window or chunk_size
  j = jnp.arange(num_chunks)[:, None, None]
  s = jnp.arange(w)[None, :, None]
  return (j * chunk_size + chunk_size - w + s)[None] - offsets_BxK[:, None, None, :]


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
