"""Pooling of slot buffers into entries: the arithmetic of the chunked compressor.

A *slot buffer* lays out the W tokens that each of C entries pools, per key/value head:
``kv_BxCxWxKxR`` (R = G * D: every token projected by each of the G payload maps), gate logits
of the same layout (G * g channels: g = D for vector gates, 1 for scalar ones) and
``valid_BxCxWxK`` (False for padding: slots before the row start or of another document).
Fixed chunking fills it from whole chunks (``window_slots``); any other chunking can fill it its
own way and reuse everything below.

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


def window_slots(x_BxTxKx_: Array, num_chunks: int, chunk_size: int, window: int,
                 offsets_BxK: Array | None) -> Array:
  """x_BxCxWxKx_: x at ``fixed_slot_tokens`` (slot s of entry j holds token
  ``j*S + S - W + s - offset``), built from whole chunks instead of gathered token by token.

  The row is cut into C chunks of S tokens; entry j's window lies in chunks j-n+1 .. j, which
  are laid side by side along the slot axis by shifting the chunk axis (``previous_chunk``),
  and W consecutive slots of them are kept (which ones: the offset, per row and head). When
  a mesh splits the row's tokens, a shift of the chunk axis is a collective-permute of the
  n-1 chunks before each shard (the windows' halo) and the choice of slots stays on the
  device; an index gather over the row would be an all-reduce of every window.

  Slots before the row start hold zeros, slots past its end the row's last token (as the
  index ``clip`` of the last chunk's end); callers mask both.
  """
  s, w = chunk_size, window
  # Chunks one window may touch: W tokens, shifted back by up to S - 1 by the offset.
  n = -(-(w if offsets_BxK is None else w + s - 1) // s)
  x, t = x_BxTxKx_, x_BxTxKx_.shape[1]
  if num_chunks * s > t:  # the last chunk is unfinished
    pad = [(0, 0)] * x.ndim
    pad[1] = (0, num_chunks * s - t)
    x = jnp.pad(x, pad, mode="edge")
  chunks = [x.reshape((x.shape[0], num_chunks, s) + x.shape[2:])]
  for _ in range(n - 1):
    chunks.insert(0, previous_chunk(chunks[0], 0))
  stack = jnp.concatenate(chunks, axis=2)  # slot r of entry j: token (j - n + 1) * S + r
  first = n * s - w
  if offsets_BxK is None:
    return stack[:, :, first:]
  slot_Bx1xWxK = (first + jnp.arange(w)[:, None] - offsets_BxK[:, None, :])[:, None]
  idx = slot_Bx1xWxK.reshape(slot_Bx1xWxK.shape + (1,) * (x.ndim - 3))
  return jnp.take_along_axis(stack, idx, axis=2)
