"""The dense oracle of the window-plus-entries softmax: outputs AND the attention weights.

Shape legend: B batch, T tokens (queries; S the same tokens as raw keys), H query heads,
K key/value heads (H = K * G), D head dim, C entries.

One [T, T + C + 1] softmax per query and head, written as plainly as possible: it is the
definition the faster paths (``kernels.reference``'s banded form, the Pallas kernels and the
model's blockwise path ``chunkformer.attention.compressed_core``) are tested against, and the
attention probe reads its weights. Memory grows as T**2: meant for tests and small analysis
models.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

from kernels import layout

Array = jax.Array


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class AttentionWeights:
  """One softmax per query and head; the three parts sum to 1 (or to 0: nothing visible)."""

  raw_BxTxHxS: Array  # weight of query t on raw key s (zero outside the window)
  entries_BxTxHxC: Array  # weight of query t on entry c of its key/value head
  sink_BxTxH: Array  # weight of the value-zero sink logit (zero without one)


def _per_head(x_BxC_or_BxCxK: Array, kh: int) -> Array:
  if x_BxC_or_BxCxK.ndim == 2:
    return jnp.broadcast_to(x_BxC_or_BxCxK[..., None], x_BxC_or_BxCxK.shape + (kh,))
  return x_BxC_or_BxCxK


def dense_attention(q_BxTxHxD: Array, k_BxTxKxD: Array, v_BxTxKxD: Array | None,
                    segment_ids_BxT: Array, *, window: int,
                    entry_k_BxCxKxD: Array | None = None, entry_v_BxCxKxD: Array | None = None,
                    entry_visible_from_BxC: Array | None = None,
                    entry_segment_ids_BxC: Array | None = None, sink_H: Array | None = None,
                    scale: float | None = None) -> tuple[Array | None, AttentionWeights]:
  """(o_BxTxHxD, weights) of queries over [raw keys in the window] union [visible entries].

  Query t (head h, key/value head h // G) sees raw key s iff ``t - window < s <= t`` in t's
  document, and entry c iff ``kernels.layout.entry_visible`` holds for it: its visible-from
  index <= t, in t's document. A document is a contiguous run of equal ids
  (``kernels.layout.document_runs``). The entry arrays are B x C, or B x C x K when the kv
  heads' entries differ (the fixed kind's per-head stagger); anything visible from >= T is never
  visible. ``v`` None: weights only (o is None); ``entry_v`` None: the entry keys are the values.
  ``scale`` defaults to D**-0.5. Computed in float32; o in q's dtype.
  """
  b, t, h, d = q_BxTxHxD.shape
  kh = k_BxTxKxD.shape[2]
  g = h // kh
  scale = d**-0.5 if scale is None else scale
  q = q_BxTxHxD.astype(jnp.float32).reshape(b, t, kh, g, d) * scale
  c = 0 if entry_k_BxCxKxD is None else entry_k_BxCxKxD.shape[1]
  from_BxCxK = jnp.full((b, c, kh), layout.PAD_END, jnp.int32) if not c else _per_head(
      entry_visible_from_BxC, kh)
  eseg_BxCxK = jnp.full((b, c, kh), layout.PAD_SEGMENT, jnp.int32) if not c else _per_head(
      entry_segment_ids_BxC, kh)
  run_BxT, erun_BxCxK = layout.document_runs(segment_ids_BxT, from_BxCxK, eseg_BxCxK)
  # document_runs reads an entry's document at its visible-from index; an entry that becomes
  # visible only after its document ended is invisible either way.
  pos = jnp.arange(t)
  raw_visible = ((run_BxT[:, :, None] == run_BxT[:, None, :])
                 & ((pos[:, None] - pos[None, :] >= 0) & (pos[:, None] - pos[None, :] < window)))
  raw = jnp.einsum("btkgd,bskd->btkgs", q, k_BxTxKxD.astype(jnp.float32))
  logits = [jnp.where(raw_visible[:, :, None, None], raw, -jnp.inf)]
  if c:
    visible_BxTxKxC = layout.entry_visible(
        jnp.moveaxis(from_BxCxK, 1, 2)[:, None], jnp.moveaxis(erun_BxCxK, 1, 2)[:, None],
        pos[None, :, None, None], run_BxT[:, :, None, None])
    scores = jnp.einsum("btkgd,bckd->btkgc", q, entry_k_BxCxKxD.astype(jnp.float32))
    logits.append(jnp.where(visible_BxTxKxC[:, :, :, None], scores, -jnp.inf))
  if sink_H is not None:
    logits.append(jnp.broadcast_to(sink_H.astype(jnp.float32).reshape(1, 1, kh, g, 1),
                                   (b, t, kh, g, 1)))
  z = jnp.concatenate(logits, axis=-1)
  top = jnp.max(z, axis=-1, keepdims=True, initial=-jnp.inf)
  e = jnp.exp(z - jax.lax.stop_gradient(jnp.where(jnp.isfinite(top), top, 0.0)))
  total = jnp.sum(e, axis=-1, keepdims=True)
  w = e / jnp.where(total > 0, total, 1.0)  # B x T x K x G x (S + C [+ 1])
  weights = AttentionWeights(
      w[..., :t].reshape(b, t, h, t), w[..., t:t + c].reshape(b, t, h, c),
      w[..., t + c].reshape(b, t, h) if sink_H is not None else jnp.zeros((b, t, h), jnp.float32))
  if v_BxTxKxD is None:
    return None, weights
  o = jnp.einsum("btkgs,bskd->btkgd", w[..., :t], v_BxTxKxD.astype(jnp.float32))
  if c:
    ev = entry_k_BxCxKxD if entry_v_BxCxKxD is None else entry_v_BxCxKxD
    o = o + jnp.einsum("btkgc,bckd->btkgd", w[..., t:t + c], ev.astype(jnp.float32))
  return o.reshape(b, t, h, d).astype(q_BxTxHxD.dtype), weights
