"""chunk_attention on GPU: Pallas Triton kernels, forward and backward (flash-attention style).

Forward: one program per (query block, row, kv head) serving the kv head's whole group of query
heads as extra rows of its tile, when the group is a power of two (else one per head: ``_config``),
so each K/V block is loaded once per group. It runs one online softmax over two key
sources, looping only over the raw-key blocks inside the window and the entry blocks inside the
block's visible range (loop bounds from per-query ranges, so invisible blocks cost nothing).
The sink logit seeds the running max (value zero, so it only adds to the denominator).
Each loop runs its boundary blocks masked and its interior blocks (seen in full by every query
of the tile, ``raw_blocks`` / ``entry_blocks``) without building a mask; dq does the same.

Backward (``attention_gpu_bwd``): dq with the forward's loops; dk/dv per key block and per entry
block, each looping over the query blocks that can see it and over the H/K query heads of its
group, so GQA/MQA gradients are summed in registers rather than in HBM. Shared pieces (config,
masks, block ranges): ``attention_gpu_common``.

Padding: T and C are padded to the tiles and D to a power of two >= 16 (Triton needs power-of-
two tiles of at least 16 for tl.dot); padded keys are never visible (position > every real
query, end PAD_END for entries) and padded rows are sliced away.

Precision: float32 inputs use Triton's default dot precision (TF32 tensor cores on GPU, as
XLA's default does); interpret mode on CPU computes in full float32.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl

from kernels import layout
from kernels.attention_gpu_bwd import backward_kernels
from kernels.attention_gpu_common import (
  F32,
  Cfg,
  dot,
  dot_t,
  entry_blocks,
  entry_mask,
  raw_blocks,
  raw_mask,
  split_loops,
)
from kernels.block_sizes import AttentionBlockSizes
from kernels.padding import gpu_tile, next_power_of_2, pad_to, round_up

Array = jax.Array


# ----------------------------------------------------------------------------- forward


def _online_update(carry, s, mask, v):
  """One block of the online softmax; ``mask`` None: every score of the tile is visible."""
  acc, m, denom = carry
  if mask is not None:
    s = jnp.where(mask, s, -jnp.inf)
  m_new = jnp.maximum(m, jnp.max(s, axis=1))
  m_safe = jnp.where(m_new == -jnp.inf, 0.0, m_new)
  alpha = jnp.exp(m - m_safe)
  p = jnp.exp(s - m_safe[:, None])
  denom = alpha * denom + jnp.sum(p, axis=1)
  acc = alpha[:, None] * acc + dot(p.astype(v.dtype), v)
  return acc, m_new, denom


def _fwd_kernel(q_ref, k_ref, v_ref, segq_ref, segk_ref, ek_ref, ev_ref, eends_ref, eseg_ref,
                sink_ref, kvlo_ref, elo_ref, ehi_ref, o_ref, lse_ref, *, cfg: Cfg):
  i = pl.program_id(0)
  bq, bk, bc, gf = cfg.bq_fwd, cfg.bk, cfg.bc, cfg.fwd_group
  q = q_ref[...]
  seg_q = segq_ref[...]
  t_pos = i * bq + jnp.arange(bq, dtype=jnp.int32)
  if gf > 1:
    # The group's heads as extra rows of one tile (row t * gf + head): every K/V block is loaded
    # once for the whole group, and each row keeps its own token's position and document.
    q = q.reshape(bq * gf, q.shape[-1])
    per_row = lambda x: jnp.broadcast_to(x[:, None], (bq, gf)).reshape(bq * gf)
    seg_q, t_pos = per_row(seg_q), per_row(t_pos)
  m = sink_ref[...]
  denom = jnp.where(m == -jnp.inf, 0.0, 1.0)
  carry = (jnp.zeros(q.shape, F32), m, denom)

  if cfg.window > 0:
    def raw_body(j, carry, masked=True):
      k = k_ref[pl.ds(j * bk, bk), :]
      s = dot_t(q, k) * cfg.scale
      mask = raw_mask(t_pos, j * bk + jnp.arange(bk, dtype=jnp.int32), seg_q,
                       segk_ref[pl.ds(j * bk, bk)], cfg.window) if masked else None
      return _online_update(carry, s, mask, v_ref[pl.ds(j * bk, bk), :])

    carry = split_loops(*raw_blocks(i, bq, bk, kvlo_ref[...]), raw_body,
                   functools.partial(raw_body, masked=False), carry)

  def entry_body(j, carry, masked=True):
    ek = ek_ref[pl.ds(j * bc, bc), :]
    s = dot_t(q, ek) * cfg.scale
    seg_e = eseg_ref[pl.ds(j * bc, bc)]
    if masked:
      mask = entry_mask(t_pos, eends_ref[pl.ds(j * bc, bc)], seg_q, seg_e)
    else:  # one document for the whole tile: the entry's own id only (a 1 x bc row)
      mask = (seg_e == jnp.max(seg_q))[None, :]
    return _online_update(carry, s, mask, ev_ref[pl.ds(j * bc, bc), :])

  acc, m, denom = split_loops(*entry_blocks(bc, elo_ref[...], ehi_ref[...]), entry_body,
                         functools.partial(entry_body, masked=False), carry)
  seen = denom > 0
  o = (acc / jnp.where(seen, denom, 1.0)[:, None]).astype(o_ref.dtype)
  # Rows that saw nothing get lse 0: the backward masks every logit of such a row anyway.
  lse = jnp.where(seen, jnp.where(m == -jnp.inf, 0.0, m) + jnp.log(jnp.where(
      seen, denom, 1.0)), 0.0)
  if gf > 1:
    o, lse = o.reshape(bq, gf, o.shape[-1]), lse.reshape(bq, gf)
  o_ref[...] = o
  lse_ref[...] = lse


def _forward(cfg: Cfg, q, k, v, seg, ek, ev, eends, eseg, sink_hq, kvlo, elo, ehi):
  """(o_BxTpxHxDp, lse_BxHxTp): one program per query block and head, or per query block and
  kv head serving its whole group (``cfg.fwd_group``)."""
  b, tp, h, dp = q.shape
  cp = ek.shape[1]
  g, gf, bq = cfg.group, cfg.fwd_group, cfg.bq_fwd
  kv_head = (lambda h_: h_) if gf > 1 else (lambda h_: h_ // g)  # grid axis 2 -> kv head
  full_kv = pl.BlockSpec((None, tp, None, dp), lambda i, b_, h_: (b_, 0, kv_head(h_), 0))
  full_e = pl.BlockSpec((None, cp, None, dp), lambda i, b_, h_: (b_, 0, kv_head(h_), 0))
  q_vec = pl.BlockSpec((None, bq), lambda i, b_, h_: (b_, i))
  row_t = pl.BlockSpec((None, tp), lambda i, b_, h_: (b_, 0))
  row_c = pl.BlockSpec((None, cp), lambda i, b_, h_: (b_, 0))
  if gf > 1:
    tile = pl.BlockSpec((None, bq, gf, dp), lambda i, b_, kv: (b_, i, kv, 0))
    lse_spec = pl.BlockSpec((None, bq, gf), lambda i, b_, kv: (b_, i, kv))
    lse_shape = (b, tp, h)
    # Row r of a program's tile is head r % gf of its kv head's group.
    sink = jnp.tile(sink_hq[:, 0].reshape(h // gf, gf), (1, bq))
  else:
    tile = pl.BlockSpec((None, bq, None, dp), lambda i, b_, h_: (b_, i, h_, 0))
    lse_spec = pl.BlockSpec((None, None, bq), lambda i, b_, h_: (b_, h_, i))
    lse_shape = (b, h, tp)
    sink = sink_hq[:, :1] * jnp.ones((1, bq), F32)
  o, lse = pl.pallas_call(
      functools.partial(_fwd_kernel, cfg=cfg),
      grid=(tp // bq, b, h // gf),
      in_specs=[tile, full_kv, full_kv, q_vec, row_t, full_e, full_e, row_c, row_c,
                pl.BlockSpec((None, bq * gf), lambda i, b_, h_: (h_, 0)), q_vec, q_vec, q_vec],
      out_specs=[tile, lse_spec],
      out_shape=[jax.ShapeDtypeStruct(q.shape, q.dtype), jax.ShapeDtypeStruct(lse_shape, F32)],
      compiler_params=cfg.params,
      interpret=cfg.interpret,
      name="chunk_attention_fwd",
  )(q, k, v, seg, seg, ek, ev, eends, eseg, sink, kvlo, elo, ehi)
  return o, (jnp.swapaxes(lse, 1, 2) if gf > 1 else lse)


def _any_forward(cfg: Cfg, *args):
  """The Triton forward, or the Mosaic GPU one (same inputs, same (o, lse) contract)."""
  if cfg.mosaic_fwd:
    from kernels import attention_mgpu
    return attention_mgpu.forward(cfg, *args)
  return _forward(cfg, *args)


@functools.partial(jax.custom_vjp, nondiff_argnums=(0,))
def _attention(cfg, q, k, v, seg, ek, ev, eends, eseg, sink_hq, kvlo, elo, ehi, kqhi, eqlo,
               eqhi):
  del kqhi, eqlo, eqhi
  return _any_forward(cfg, q, k, v, seg, ek, ev, eends, eseg, sink_hq, kvlo, elo, ehi)[0]


def _attention_fwd(cfg, *args):
  o, lse = _any_forward(cfg, *args[:12])
  return o, args + (o, lse)


def _attention_bwd(cfg, res, do):
  dq, dk, dv, dek, dev, dsink = backward_kernels(cfg, res, do)
  return (dq, dk, dv, None, dek, dev, None, None, dsink) + (None,) * 6


_attention.defvjp(_attention_fwd, _attention_bwd)


def _config(block_sizes: AttentionBlockSizes, t: int, c: int, window: int, scale: float,
            group: int, interpret: bool):
  bs = block_sizes
  bq = gpu_tile(bs.block_q, t)
  # One forward program per kv head when its group is a power of two that leaves >= 16 tokens
  # of the query tile: the tile keeps block_q rows (bq / G tokens x G heads).
  grouped = group > 1 and not group & (group - 1) and bq // group >= 16
  return Cfg(window=window, scale=scale, group=group, fwd_group=group if grouped else 1,
             bq_fwd=bq // group if grouped else bq, bq=bq, bk=gpu_tile(bs.block_k, t),
             bc=gpu_tile(bs.block_c, c), bq_bwd=gpu_tile(bs.block_q_bwd, t),
             bk_bwd=gpu_tile(bs.block_k_bwd, t), bc_bwd=gpu_tile(bs.block_c_bwd, c),
             num_warps=bs.num_warps, num_stages=bs.num_stages, interpret=bool(interpret),
             fused_bwd=bs.backward == "fused", mosaic_fwd=bs.forward == "mosaic",
             mosaic_interpret=interpret if bs.forward == "mosaic" and interpret else None)


def chunk_attention_gpu(q_BxTxHxD, k_BxTxKxD, v_BxTxKxD, segment_ids_BxT, entry_k_BxCxKxD,
                        entry_v_BxCxKxD, entry_ends_BxC, entry_segment_ids_BxC, *, sink_H,
                        window: int, scale: float, interpret, block_sizes: AttentionBlockSizes,
                        row_layout: layout.RowLayout | None = None):
  """Pallas Triton implementation of ``kernels.chunk_attention`` (same semantics).

  ``row_layout`` (of the unpadded rows): the documents' bounds computed once per step by the
  caller; the per-call work left is the entry ranges (a histogram and a running sum).
  """
  b, t, h, d = q_BxTxHxD.shape
  kh, c = k_BxTxKxD.shape[2], entry_k_BxCxKxD.shape[1]
  cfg = _config(block_sizes, t, c, window, scale, h // kh, interpret)
  tp = round_up(t, max(cfg.bq, cfg.bk, cfg.bq_bwd, cfg.bk_bwd))
  cp = round_up(max(c, 1), max(cfg.bc, cfg.bc_bwd))  # C = 0: one block of padding entries
  dp = max(16, next_power_of_2(d))
  if cfg.mosaic_fwd:  # its tiles: whole 64-row warpgroups, 64-aligned head dims (swizzle)
    from kernels import attention_mgpu
    attention_mgpu.check_inputs(q_BxTxHxD.dtype, d)
    if not interpret:
      attention_mgpu.check_device()
    tp = round_up(tp, max(attention_mgpu.program_rows(cfg), attention_mgpu.key_block(cfg)))
    cp = round_up(cp, attention_mgpu.key_block(cfg))
    dp = attention_mgpu.padded_head_dim(dp)
  pad_td = lambda x: pad_to(pad_to(x, 1, tp), 3, dp)
  pad_cd = lambda x: pad_to(pad_to(x, 1, cp), 3, dp)
  seg = pad_to(segment_ids_BxT.astype(jnp.int32), 1, tp, mode="edge")
  eends = pad_to(entry_ends_BxC.astype(jnp.int32), 1, cp, layout.PAD_END)
  eseg = pad_to(entry_segment_ids_BxC.astype(jnp.int32), 1, cp, layout.PAD_SEGMENT)
  # Document bounds of the padded rows: the padding joins the last document (edge padding).
  doc_start, doc_end = layout.padded_document_bounds(
      layout.row_layout(segment_ids_BxT) if row_layout is None else row_layout, tp)
  kvlo = layout.raw_key_start(seg, window, doc_start)
  elo, ehi = layout.visible_entry_range(eends, eseg, seg, doc_start)
  kqhi = jnp.minimum(jnp.arange(tp, dtype=jnp.int32) + window, doc_end)
  eqlo, eqhi = layout.entry_query_range(eends, seg, doc_end)
  sink = jnp.full((h,), -jnp.inf, F32) if sink_H is None else sink_H.astype(F32)
  sink_hq = jnp.broadcast_to(sink[:, None], (h, cfg.bq))
  o = _attention(cfg, pad_td(q_BxTxHxD), pad_td(k_BxTxKxD), pad_td(v_BxTxKxD), seg,
                 pad_cd(entry_k_BxCxKxD), pad_cd(entry_v_BxCxKxD), eends, eseg, sink_hq, kvlo,
                 elo, ehi, kqhi, eqlo, eqhi)
  return o[:, :t, :, :d]
