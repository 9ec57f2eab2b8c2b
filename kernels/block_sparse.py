"""Block-sparse causal attention over per-head index sets: the prefill op of sparse patterns.

An index set says, per row b, query head h and query block n (queries [n*L, n*L + L), L =
``block``), which keys the block's queries read:
- ``blocks_BxHxNxS`` / ``counts_BxHxN``: the first ``counts`` entries are distinct key blocks
  (keys [j*L, j*L + L)) read whole (entries past the count are ignored);
- ``columns_BxHxV`` / ``column_keep_BxHxNxV``: distinct single keys ("vertical" columns) read
  by the query blocks whose keep flag is set.
Query t then attends, in one softmax, to the keys s <= t in that union (causality inside every
block and column). A column that falls inside a listed block of the same query block is the same
key: every implementation counts it once (``exclusive_columns``). Every query must see at
least one key, which the patterns guarantee by listing the diagonal block.

Implementations:
- ``xla``: query blocks in groups (``lax.map``); each group gathers its listed key blocks and
  the columns and runs one masked softmax over them, so the live scores are
  group x L x (S*L + V) per head, never T x T; it computes all S slots (a static shape);
- ``pallas_gpu`` (Triton, ``block_sparse_gpu``) and ``pallas_tpu`` (Mosaic,
  ``block_sparse_tpu``): one program per (query block, row, head) loops over its ``counts``
  blocks only, so an unlisted block is neither loaded nor computed, then over the column chunks
  up to the last column the block keeps and can see (columns sorted by position);
  ``interpret=True`` runs them on CPU.
``block_sparse_dense`` is the dense oracle (a T x T mask; tests only).
Forward only: sparse prefill is inference (no custom VJP).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from kernels import implementation as implementations

Array = jax.Array
_F32 = jnp.float32


def _check(q, k, v, blocks, counts, columns, keep, block):
  if q.ndim != 4 or k.ndim != 4 or k.shape != v.shape:
    raise ValueError(f"q_BxTxHxD, k/v_BxTxKxD expected, got {q.shape}, {k.shape}, {v.shape}")
  b, t, h, d = q.shape
  if k.shape[:2] != (b, t) or k.shape[3] != d or h % k.shape[2]:
    raise ValueError(f"k/v {k.shape} do not match q {q.shape} (H a multiple of K)")
  if block < 1:
    raise ValueError(f"block must be >= 1, got {block}")
  n = -(-t // block)
  if blocks.ndim != 4 or blocks.shape[:3] != (b, h, n) or counts.shape != (b, h, n):
    raise ValueError(f"blocks_BxHxNxS / counts_BxHxN must start with {(b, h, n)}, got "
                     f"{blocks.shape}, {counts.shape}")
  if columns.ndim != 3 or columns.shape[:2] != (b, h) or keep.shape != (b, h, n,
                                                                         columns.shape[2]):
    raise ValueError(f"columns_BxHxV / column_keep_BxHxNxV must be {(b, h)} x V and "
                     f"{(b, h, n)} x V, got {columns.shape}, {keep.shape}")


def listed_BxHxNxN(blocks_BxHxNxS: Array, counts_BxHxN: Array) -> Array:
  """Bitmap of the listed key blocks of every query block (N x N per head; N = T / block)."""
  b, h, n, s = blocks_BxHxNxS.shape
  valid = jnp.arange(s) < counts_BxHxN[..., None]
  target = jnp.where(valid, jnp.clip(blocks_BxHxNxS, 0, n - 1), n)  # n: a dropped slot
  out = jnp.zeros((b, h, n, n + 1), bool)
  out = out.at[jnp.arange(b)[:, None, None, None], jnp.arange(h)[None, :, None, None],
               jnp.arange(n)[None, None, :, None], target].set(True)
  return out[..., :n]


def exclusive_columns(blocks_BxHxNxS, counts_BxHxN, columns_BxHxV, column_keep_BxHxNxV,
                      block: int) -> Array:
  """column_keep without the columns that a listed block of the same query block covers."""
  listed = listed_BxHxNxN(blocks_BxHxNxS, counts_BxHxN)
  n = listed.shape[-1]
  col_block = jnp.clip(columns_BxHxV // block, 0, n - 1)  # B x H x V
  covered = jnp.take_along_axis(listed, jnp.broadcast_to(
      col_block[:, :, None, :], column_keep_BxHxNxV.shape), axis=3)
  return column_keep_BxHxNxV & ~covered


def block_sparse_mask(t: int, blocks_BxHxNxS, counts_BxHxN, columns_BxHxV, column_keep_BxHxNxV,
                      block: int) -> Array:
  """mask_BxHxTxT of the index set (dense: tests and small calibration prompts only)."""
  listed = listed_BxHxNxN(blocks_BxHxNxS, counts_BxHxN)
  pos = jnp.arange(t)
  mask = listed[:, :, pos // block][:, :, :, pos // block]
  b, h, v = columns_BxHxV.shape
  col_hit = (columns_BxHxV[:, :, None, :] == pos[None, None, :, None])  # B x H x T(key) x V
  keep_q = column_keep_BxHxNxV[:, :, pos // block]  # B x H x T(query) x V
  cols = jnp.einsum("bhqv,bhkv->bhqk", keep_q.astype(_F32), col_hit.astype(_F32)) > 0
  return (mask | cols) & (pos[None, None, None, :] <= pos[None, None, :, None])


def block_sparse_dense(q_BxTxHxD, k_BxTxKxD, v_BxTxKxD, blocks_BxHxNxS, counts_BxHxN,
                       columns_BxHxV, column_keep_BxHxNxV, *, block: int, scale=None) -> Array:
  """Dense attention masked to the index set (the oracle the implementations are tested
  against); o_BxTxHxD."""
  b, t, h, d = q_BxTxHxD.shape
  g = h // k_BxTxKxD.shape[2]
  mask = block_sparse_mask(t, blocks_BxHxNxS, counts_BxHxN, columns_BxHxV, column_keep_BxHxNxV,
                           block)
  k = jnp.repeat(k_BxTxKxD, g, axis=2).astype(_F32)
  v = jnp.repeat(v_BxTxKxD, g, axis=2).astype(_F32)
  scale = d**-0.5 if scale is None else scale
  s = jnp.einsum("bthd,bshd->bhts", q_BxTxHxD.astype(_F32), k) * scale
  p = jax.nn.softmax(jnp.where(mask, s, -jnp.inf), axis=-1)
  return jnp.einsum("bhts,bshd->bthd", p, v).astype(q_BxTxHxD.dtype)


def _group(n: int, block: int, target: int = 512) -> int:
  """Query blocks per XLA step: the largest divisor of n with at most ``target`` queries."""
  best = 1
  for g in range(1, n + 1):
    if n % g == 0 and g * block <= max(target, block):
      best = g
  return best


def _xla(q, k, v, blocks, counts, columns, keep, block, scale):
  """Padded inputs (T = N * block); see the module docstring."""
  b, t, h, d = q.shape
  kh = k.shape[2]
  n, s = blocks.shape[2:]
  heads = jnp.arange(h) // (h // kh)
  kb = k.reshape(b, n, block, kh, d)[:, :, :, heads].transpose(0, 3, 1, 2, 4)  # B x H x N x L x D
  vb = v.reshape(b, n, block, kh, d)[:, :, :, heads].transpose(0, 3, 1, 2, 4)
  qb = q.reshape(b, n, block, h, d).transpose(1, 0, 3, 2, 4)  # N x B x H x L x D
  col_idx = jnp.clip(columns, 0, t - 1)[..., None]
  kc = jnp.take_along_axis(k[:, :, heads].transpose(0, 2, 1, 3), col_idx, axis=2)  # B x H x V x D
  vc = jnp.take_along_axis(v[:, :, heads].transpose(0, 2, 1, 3), col_idx, axis=2)
  slot_ok = jnp.arange(s) < counts[..., None]  # B x H x N x S
  safe = jnp.clip(blocks, 0, n - 1)
  g = _group(n, block)

  def one_group(i):
    rows = i * g + jnp.arange(g)
    qg = qb[rows].transpose(1, 2, 0, 3, 4).astype(_F32)  # B x H x G x L x D
    idx = safe[:, :, rows].reshape(b, h, g * s)
    kg = jnp.take_along_axis(kb, idx[..., None, None], axis=2).reshape(b, h, g, s * block, d)
    vg = jnp.take_along_axis(vb, idx[..., None, None], axis=2).reshape(b, h, g, s * block, d)
    q_pos = rows[:, None] * block + jnp.arange(block)  # G x L
    k_pos = (safe[:, :, rows, :, None] * block + jnp.arange(block)).reshape(b, h, g, s * block)
    ok = jnp.repeat(slot_ok[:, :, rows], block, axis=-1)  # B x H x G x S*L
    vis_b = ok[:, :, :, None, :] & (k_pos[:, :, :, None, :] <= q_pos[None, None, :, :, None])
    vis_c = keep[:, :, rows, None, :] & (columns[:, :, None, None, :]
                                         <= q_pos[None, None, :, :, None])
    sb = jnp.einsum("bhgld,bhgmd->bhglm", qg, kg.astype(_F32)) * scale
    sc = jnp.einsum("bhgld,bhvd->bhglv", qg, kc.astype(_F32)) * scale
    logits = jnp.concatenate([jnp.where(vis_b, sb, -jnp.inf), jnp.where(vis_c, sc, -jnp.inf)],
                             axis=-1)
    p = jax.nn.softmax(logits, axis=-1)
    o = jnp.einsum("bhglm,bhgmd->bhgld", p[..., :s * block], vg.astype(_F32))
    o = o + jnp.einsum("bhglv,bhvd->bhgld", p[..., s * block:], vc.astype(_F32))
    return o  # B x H x G x L x D

  o = jax.lax.map(one_group, jnp.arange(n // g))  # N/G x B x H x G x L x D
  return o.transpose(1, 0, 3, 4, 2, 5).reshape(b, t, h, d)


def block_sparse_attention(q_BxTxHxD, k_BxTxKxD, v_BxTxKxD, blocks_BxHxNxS, counts_BxHxN,
                           columns_BxHxV, column_keep_BxHxNxV, *, block: int, scale=None,
                           implementation: str = "xla", interpret=False) -> Array:
  """Causal attention of every query over its query block's index set (module docstring).

  GQA: head h reads kv head h // (H/K). ``scale`` defaults to D**-0.5; logits, softmax and
  accumulation are float32. T need not be a multiple of ``block`` (padded internally; padded
  keys lie after every real query). Returns o_BxTxHxD in q's dtype.
  """
  implementations.check(implementation)
  _check(q_BxTxHxD, k_BxTxKxD, v_BxTxKxD, blocks_BxHxNxS, counts_BxHxN, columns_BxHxV,
         column_keep_BxHxNxV, block)
  b, t, h, d = q_BxTxHxD.shape
  scale = d**-0.5 if scale is None else float(scale)
  columns, keep = columns_BxHxV, column_keep_BxHxNxV
  if columns.shape[-1]:  # no columns: no N x N bitmap to build
    # In position order a query block's visible columns are a prefix: the kernels stop there.
    order = jnp.argsort(columns, axis=-1)
    columns = jnp.take_along_axis(columns, order, axis=-1)
    keep = jnp.take_along_axis(keep, order[:, :, None, :], axis=-1)
    keep = exclusive_columns(blocks_BxHxNxS, counts_BxHxN, columns, keep, block)
    keep = keep & (columns < t)[:, :, None, :]
  counts = jnp.minimum(counts_BxHxN, blocks_BxHxNxS.shape[-1]).astype(jnp.int32)
  n = counts.shape[-1]
  pad = n * block - t
  q, k, v = (jnp.pad(x, ((0, 0), (0, pad), (0, 0), (0, 0))) for x in
             (q_BxTxHxD, k_BxTxKxD, v_BxTxKxD))
  args = (q, k, v, blocks_BxHxNxS.astype(jnp.int32), counts, columns.astype(jnp.int32), keep)
  if implementation == "xla":
    o = _xla(*args, block, scale)
  elif implementation == "pallas_gpu":
    from kernels import block_sparse_gpu
    o = block_sparse_gpu.block_sparse_gpu(*args, block=block, scale=scale, interpret=interpret)
  else:
    from kernels import block_sparse_tpu
    o = block_sparse_tpu.block_sparse_tpu(*args, block=block, scale=scale, interpret=interpret)
  return o[:, :t].astype(q_BxTxHxD.dtype)
