"""Pure-jnp references: the "xla" implementation of every op and the twin the kernels must match.

Shape legend: B batch, T tokens, H query heads, K key/value heads (H = K * G), D head dim,
C entry capacity, N channels, S slot-bias positions, W decode window.

Numerics: logits, softmax and accumulation in float32; outputs in the input dtype. Masked
logits are -inf and the running max is replaced by 0 where nothing is visible, so a query that
sees nothing gets zeros, never NaN, in the forward and the backward pass.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from kernels import layout

Array = jax.Array


def _safe_softmax(logits, sink):
  """Softmax over the last axis with -inf for masked logits and an optional sink logit.

  ``sink`` broadcasts against ``logits[..., :1]`` and adds a value-zero column. Rows with no
  finite logit and no sink get all-zero weights.
  """
  # initial=-inf: a row with no key at all (window 0 and no entries) is a valid empty max.
  m = jnp.max(logits, axis=-1, keepdims=True, initial=-jnp.inf)
  if sink is not None:
    m = jnp.maximum(m, sink)
  # The softmax does not depend on the shift, so no gradient flows through it (and none through
  # the max of an all -inf row).
  m = jax.lax.stop_gradient(jnp.where(jnp.isfinite(m), m, 0.0))
  p = jnp.exp(logits - m)
  denom = jnp.sum(p, axis=-1, keepdims=True)
  if sink is not None:
    denom = denom + jnp.exp(sink - m)
  return p / jnp.where(denom > 0, denom, 1.0)


def _split_heads(q_BxTxHxD, num_kv_heads):
  b, t, h, d = q_BxTxHxD.shape
  if h % num_kv_heads:
    raise ValueError(f"query heads {h} must be a multiple of key/value heads {num_kv_heads}")
  return q_BxTxHxD.reshape(b, t, num_kv_heads, h // num_kv_heads, d)


def _sink_KxG(sink_H, k, g):
  if sink_H is None:
    return None
  return sink_H.astype(jnp.float32).reshape(k, g)


def chunk_attention_reference(q_BxTxHxD, k_BxTxKxD, v_BxTxKxD, segment_ids_BxT,
                              entry_k_BxCxKxD, entry_v_BxCxKxD, entry_ends_BxC,
                              entry_segment_ids_BxC, *, window: int, sink_H=None,
                              scale=None) -> Array:
  """Queries over [raw keys in the sliding window] union [visible entries], one softmax.

  Query t (head h, key/value head h // (H/K)) sees raw key s iff ``t - window < s <= t`` and
  ``segment_ids[s] == segment_ids[t]`` (window = 0: no raw keys), and entry c iff
  ``entry_ends[c] <= t`` and ``entry_segment_ids[c] == segment_ids[t]``; plus the optional
  sink logit ``sink_H[h]`` with value zero. ``scale`` defaults to D**-0.5. Returns o_BxTxHxD.

  Raw keys are handled in bands of ``window`` queries against two key bands, so memory grows
  as T * window + T * C rather than T**2.
  """
  b, t, h, d = q_BxTxHxD.shape
  kh = k_BxTxKxD.shape[2]
  g = h // kh
  scale = d**-0.5 if scale is None else scale
  q = _split_heads(q_BxTxHxD, kh).astype(jnp.float32) * scale
  seg = segment_ids_BxT
  logits, values = [], []
  if window > 0:
    band = min(window, t)
    nb = -(-t // band)
    tp = nb * band
    pad = ((0, 0), (0, tp - t), (0, 0), (0, 0))
    k_blocks = jnp.pad(k_BxTxKxD, pad).reshape(b, nb, band, kh, d)
    v_blocks = jnp.pad(v_BxTxKxD, pad).reshape(b, nb, band, kh, d)
    prev = lambda x: jnp.pad(x, ((0, 0), (1, 0)) + ((0, 0),) * (x.ndim - 2))[:, :nb]
    k_win = jnp.concatenate([prev(k_blocks), k_blocks], axis=2)  # B x nb x 2band x K x D
    v_win = jnp.concatenate([prev(v_blocks), v_blocks], axis=2)
    seg_blocks = jnp.pad(seg, ((0, 0), (0, tp - t)), mode="edge").reshape(b, nb, band)
    seg_win = jnp.concatenate([prev(seg_blocks), seg_blocks], axis=2)
    q_pos = jnp.arange(tp).reshape(nb, band)
    k_pos = q_pos[:, :1] - band + jnp.arange(2 * band)  # nb x 2band
    s_pos, t_pos = k_pos[:, None, :], q_pos[:, :, None]
    ok = (s_pos <= t_pos) & (s_pos > t_pos - window) & (s_pos >= 0)  # nb x band x 2band
    same = seg_blocks[:, :, :, None] == seg_win[:, :, None, :]  # B x nb x band x 2band
    q_blocks = jnp.pad(q, ((0, 0), (0, tp - t), (0, 0), (0, 0), (0, 0))).reshape(
        b, nb, band, kh, g, d)
    s = jnp.einsum("bnqkgd,bnskd->bkgnqs", q_blocks, k_win.astype(jnp.float32))
    s = jnp.where((ok[None] & same)[:, None, None], s, -jnp.inf)
    logits.append(s.reshape(b, kh, g, tp, 2 * band)[:, :, :, :t])
    values.append(("raw", v_win, band, nb, tp))
  s = jnp.einsum("btkgd,bckd->bkgtc", q, entry_k_BxCxKxD.astype(jnp.float32))
  visible = layout.entry_visibility_BxTxC(entry_ends_BxC, entry_segment_ids_BxC, seg)
  logits.append(jnp.where(visible[:, None, None], s, -jnp.inf))
  sink = _sink_KxG(sink_H, kh, g)
  sink = None if sink is None else sink[None, :, :, None, None]
  w = _safe_softmax(jnp.concatenate(logits, axis=-1), sink)
  out = 0.0
  if window > 0:
    _, v_win, band, nb, tp = values[0]
    w_raw = jnp.pad(w[..., :2 * band], ((0, 0),) * 3 + ((0, tp - t), (0, 0)))
    w_raw = w_raw.reshape(b, kh, g, nb, band, 2 * band)
    o = jnp.einsum("bkgnqs,bnskd->bnqkgd", w_raw, v_win.astype(jnp.float32))
    out = o.reshape(b, tp, kh, g, d)[:, :t]
    w = w[..., 2 * band:]
  out = out + jnp.einsum("bkgtc,bckd->btkgd", w, entry_v_BxCxKxD.astype(jnp.float32))
  return out.reshape(b, t, h, d).astype(q_BxTxHxD.dtype)


def segment_pool_reference(values_BxTxN, logits_BxTxN, ends_BxT, segment_ids_BxT, *,
                           capacity: int, slot_bias_SxN=None):
  """Gated softmax pooling of every closed chunk into one packed entry.

  Entry c (the c-th closed chunk of the row, in order of its end) is
  ``sum_j softmax_j(logits[j] + slot_bias[min(pos_j, S - 1)]) * values[j]`` over the chunk's
  tokens j, the softmax per channel; ``pos_j`` is j's offset inside its chunk (positions past
  the last slot share the last slot's bias). Chunk rules in ``kernels.layout``: chunks start at
  document starts, open chunks produce no entry, chunks beyond ``capacity`` are dropped.

  Returns ``(entries_BxCxN, entry_ends_BxC, entry_segment_ids_BxC)``; padding entries have
  end ``PAD_END``, segment id ``PAD_SEGMENT`` and zero values.
  """
  return pool_structure(values_BxTxN, logits_BxTxN,
                        layout.chunk_structure(ends_BxT, segment_ids_BxT, capacity),
                        slot_bias_SxN=slot_bias_SxN)


def pool_structure(values_BxTxN, logits_BxTxN, structure: layout.ChunkStructure, *,
                   slot_bias_SxN=None):
  """``segment_pool_reference`` on a precomputed ``kernels.chunk_structure``."""
  entry_of_token, pos = structure.entry_of_token_BxT, structure.pos_in_chunk_BxT
  entry_ends, entry_segment_ids = structure.entry_ends_BxC, structure.entry_segment_ids_BxC
  capacity = entry_ends.shape[1]
  z = logits_BxTxN.astype(jnp.float32)
  if slot_bias_SxN is not None:
    slot = jnp.minimum(pos, slot_bias_SxN.shape[0] - 1)
    z = z + slot_bias_SxN.astype(jnp.float32)[slot]

  def pool_row(z_TxN, v_TxN, idx_T):
    n = capacity + 1  # the last segment collects dropped tokens
    m = jax.lax.stop_gradient(jax.ops.segment_max(z_TxN, idx_T, num_segments=n))
    p = jnp.exp(z_TxN - m[idx_T])
    denom = jax.ops.segment_sum(p, idx_T, num_segments=n)[:capacity]
    num = jax.ops.segment_sum(p * v_TxN.astype(jnp.float32), idx_T, num_segments=n)[:capacity]
    return num / jnp.where(denom > 0, denom, 1.0)

  entries = jax.vmap(pool_row)(z, values_BxTxN, entry_of_token)
  return entries.astype(values_BxTxN.dtype), entry_ends, entry_segment_ids


def decode_attention_reference(q_BxHxD, window_k_BxWxKxD, window_v_BxWxKxD, window_valid_BxW,
                               entry_k_BxCxKxD, entry_v_BxCxKxD, num_entries_B, *, sink_H=None,
                               scale=None, entry_visible_BxCxK=None) -> Array:
  """One query per row over [valid window slots] union [entries 0 .. num_entries - 1].

  The window is a ring buffer, so slot order is irrelevant: ``window_valid`` says which slots
  hold a token the query may see. ``entry_visible`` (optional) further restricts entry c of
  key/value head k. Returns o_BxHxD (zeros where nothing is visible).
  """
  b, h, d = q_BxHxD.shape
  kh = window_k_BxWxKxD.shape[2]
  g = h // kh
  scale = d**-0.5 if scale is None else scale
  q = q_BxHxD.reshape(b, kh, g, d).astype(jnp.float32) * scale
  s_win = jnp.einsum("bkgd,bwkd->bkgw", q, window_k_BxWxKxD.astype(jnp.float32))
  s_win = jnp.where(window_valid_BxW[:, None, None, :], s_win, -jnp.inf)
  s_ent = jnp.einsum("bkgd,bckd->bkgc", q, entry_k_BxCxKxD.astype(jnp.float32))
  c = entry_k_BxCxKxD.shape[1]
  live_BxKxC = jnp.broadcast_to((jnp.arange(c)[None, :] < num_entries_B[:, None])[:, None],
                                (b, kh, c))
  if entry_visible_BxCxK is not None:
    live_BxKxC = live_BxKxC & jnp.swapaxes(entry_visible_BxCxK, 1, 2)
  s_ent = jnp.where(live_BxKxC[:, :, None, :], s_ent, -jnp.inf)
  sink = _sink_KxG(sink_H, kh, g)
  sink = None if sink is None else sink[None, :, :, None]
  w = _safe_softmax(jnp.concatenate([s_win, s_ent], axis=-1), sink)
  ww = window_k_BxWxKxD.shape[1]
  o = (jnp.einsum("bkgw,bwkd->bkgd", w[..., :ww], window_v_BxWxKxD.astype(jnp.float32))
       + jnp.einsum("bkgc,bckd->bkgd", w[..., ww:], entry_v_BxCxKxD.astype(jnp.float32)))
  return o.reshape(b, h, d).astype(q_BxHxD.dtype)
