"""Document-causal full attention without a T x T matrix: online softmax over key blocks in XLA.

The forward pass maps over query blocks and, inside each, loops over the key blocks at or before
it (causality: later blocks are never visited), keeping the running max, denominator and output
of the flash-attention recurrence. A custom VJP stores only the output and the per-query log-sum-
exp; the backward pass recomputes each block's probabilities twice, once for dq (query blocks
outer) and once for dk/dv (key blocks outer, summing the H/K query heads of a GQA group), so the
live memory of either pass is a few block x block tiles per head, never T x T.

Visibility is today's dense rule (``common.document_causal_mask``): key s is visible to query t
iff s <= t and ``segment_ids[s] == segment_ids[t]``. Every query sees at least itself, so no row
is empty. Logits, softmax and accumulation are float32; the output has q's dtype.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

Array = jax.Array
_F32 = jnp.float32
_MAX_FLOOR = -1e30
DEFAULT_BLOCK = 512  # tokens per query/key block: 512 x 512 x H float32 scores per step


def _blocks(x_BxTx_, n: int, block: int) -> Array:
  """[B, n*block, ...] -> [n, B, block, ...] (the loop axis first)."""
  b = x_BxTx_.shape[0]
  return jnp.moveaxis(x_BxTx_.reshape(b, n, block, *x_BxTx_.shape[2:]), 1, 0)


def _unblocks(x_NxBxLx_: Array) -> Array:
  n, b, block = x_NxBxLx_.shape[:3]
  return jnp.moveaxis(x_NxBxLx_, 0, 1).reshape(b, n * block, *x_NxBxLx_.shape[3:])


def _logits(q_BxLxKxGxD, k_BxMxKxD, seg_q_BxL, seg_k_BxM, pos_q, pos_k, scale):
  """Masked float32 logits of one (query block, key block) pair: BxKxGxLxM."""
  s = jnp.einsum("blkgd,bmkd->bkglm", q_BxLxKxGxD, k_BxMxKxD, preferred_element_type=_F32)
  visible = (pos_k[None, :] <= pos_q[:, None])[None] & (
      seg_q_BxL[:, :, None] == seg_k_BxM[:, None, :])
  return jnp.where(visible[:, None, None], s * scale, -jnp.inf)


def _forward(q, k, v, seg, scale, block):
  """Returns o_BxTxKxGxD (float32) and lse_BxKxGxT (float32), inputs already padded to blocks."""
  b, t, kh, g, d = q.shape
  n = t // block
  qb, kb, vb, sb = (_blocks(x, n, block) for x in (q, k, v, seg))
  pos = jnp.arange(t).reshape(n, block)

  def one_query_block(i):
    def step(j, carry):
      m, denom, acc = carry
      s = _logits(qb[i], kb[j], sb[i], sb[j], pos[i], pos[j], scale)
      m_new = jnp.maximum(m, jnp.max(s, axis=-1))
      p = jnp.exp(s - m_new[..., None])
      alpha = jnp.exp(m - m_new)
      acc = acc * alpha[..., None] + jnp.einsum("bkglm,bmkd->bkgld", p, vb[j].astype(_F32))
      return m_new, denom * alpha + jnp.sum(p, axis=-1), acc

    # A finite floor for the running max: a row that sees nothing in a key block then gets
    # exp(-inf - floor) = 0 there instead of exp(-inf + inf) = NaN.
    init = (jnp.full((b, kh, g, block), _MAX_FLOOR, _F32), jnp.zeros((b, kh, g, block), _F32),
            jnp.zeros((b, kh, g, block, d), _F32))
    m, denom, acc = jax.lax.fori_loop(0, i + 1, step, init)  # key blocks 0..i: causal
    # The diagonal block holds key t for query t, so denom >= exp(0) and m is finite.
    return acc / denom[..., None], m + jnp.log(denom)

  o, lse = jax.lax.map(one_query_block, jnp.arange(n))  # [n, B, K, G, L, (D)]
  o = jnp.moveaxis(o, 0, 3).reshape(b, kh, g, t, d)
  return jnp.moveaxis(o, 3, 1), jnp.moveaxis(lse, 0, 3).reshape(b, kh, g, t)


def _backward(q, k, v, seg, o, lse, do, scale, block):
  b, t, kh, g, d = q.shape
  n = t // block
  qb, kb, vb, sb, dob = (_blocks(x, n, block) for x in (q, k, v, seg, do))
  lseb = jnp.moveaxis(lse.reshape(b, kh, g, n, block), 3, 0)  # [n, B, K, G, L]
  # delta_t = sum_d do * o: the softmax Jacobian's row term, one float per query and head.
  delta = jnp.einsum("btkgd,btkgd->bkgt", do.astype(_F32), o)
  deltab = jnp.moveaxis(delta.reshape(b, kh, g, n, block), 3, 0)
  pos = jnp.arange(t).reshape(n, block)

  def probs_and_ds(i, j):
    s = _logits(qb[i], kb[j], sb[i], sb[j], pos[i], pos[j], scale)
    p = jnp.exp(s - lseb[i][..., None])  # masked logits are -inf: p = 0 there
    dp = jnp.einsum("blkgd,bmkd->bkglm", dob[i].astype(_F32), vb[j].astype(_F32))
    return p, p * (dp - deltab[i][..., None]) * scale

  def dq_block(i):
    def step(j, dq):
      _, ds = probs_and_ds(i, j)
      return dq + jnp.einsum("bkglm,bmkd->blkgd", ds, kb[j].astype(_F32))
    return jax.lax.fori_loop(0, i + 1, step, jnp.zeros((b, block, kh, g, d), _F32))

  def dkv_block(j):
    def step(i, carry):
      dk, dv = carry
      p, ds = probs_and_ds(i, j)
      dv = dv + jnp.einsum("bkglm,blkgd->bmkd", p, dob[i].astype(_F32))
      dk = dk + jnp.einsum("bkglm,blkgd->bmkd", ds, qb[i].astype(_F32))
      return dk, dv
    zeros = jnp.zeros((b, block, kh, d), _F32)
    return jax.lax.fori_loop(j, n, step, (zeros, zeros))  # query blocks j..n-1: causal

  dq = _unblocks(jax.lax.map(dq_block, jnp.arange(n)))
  dk, dv = jax.lax.map(dkv_block, jnp.arange(n))
  return dq, _unblocks(dk), _unblocks(dv)


@functools.partial(jax.custom_vjp, nondiff_argnums=(4, 5))
def _attention(q, k, v, seg, scale, block):
  return _forward(q, k, v, seg, scale, block)[0]


def _attention_fwd(q, k, v, seg, scale, block):
  o, lse = _forward(q, k, v, seg, scale, block)
  return o, (q, k, v, seg, o, lse)


def _attention_bwd(scale, block, residuals, do):
  q, k, v, seg, o, lse = residuals
  dq, dk, dv = _backward(q, k, v, seg, o, lse, do, scale, block)
  return dq.astype(q.dtype), dk.astype(k.dtype), dv.astype(v.dtype), None


_attention.defvjp(_attention_fwd, _attention_bwd)


def blockwise_attention(q_BxTxHxD: Array, k_BxTxKxD: Array, v_BxTxKxD: Array,
                        segment_ids_BxT: Array, *, block: int = DEFAULT_BLOCK,
                        scale: float | None = None) -> Array:
  """Causal attention within documents (GQA: head h reads kv head h // (H/K)); o_BxTxHxD.

  ``block`` bounds the tiles (query and key blocks are equal, at most the padded length); T is
  padded to a multiple of it with a segment id no real token has, and the padding sliced away.
  """
  b, t, h, d = q_BxTxHxD.shape
  kh = k_BxTxKxD.shape[2]
  if h % kh:
    raise ValueError(f"query heads {h} must be a multiple of key/value heads {kh}")
  if block < 1:
    raise ValueError(f"block must be >= 1, got {block}")
  block = min(block, t)
  tp = -(-t // block) * block
  pad = tp - t
  q = q_BxTxHxD.reshape(b, t, kh, h // kh, d)
  k, v, seg = k_BxTxKxD, v_BxTxKxD, segment_ids_BxT
  if pad:
    widths = ((0, 0), (0, pad))
    q = jnp.pad(q, widths + ((0, 0),) * 3)
    k, v = (jnp.pad(x, widths + ((0, 0),) * 2) for x in (k, v))
    # Padded keys sit after every real query (causality hides them); their own id keeps the
    # padded queries' rows non-empty.
    seg = jnp.pad(seg, widths, constant_values=jnp.min(seg) - 1)
  scale = d**-0.5 if scale is None else float(scale)
  o = _attention(q, k, v, seg, scale, block)
  return o[:, :t].reshape(b, t, h, d).astype(q_BxTxHxD.dtype)
