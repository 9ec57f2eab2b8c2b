"""chunk_attention on GPU: Pallas Triton kernels, forward and backward (flash-attention style).

Forward: one program per (query block, row, kv head) serving the kv head's whole group of query
heads as extra rows of its tile, when the group is a power of two (else one per head: ``_config``),
so each K/V block is loaded once per group. Raw keys and entries are one column axis of one
buffer (``layout.key_columns``: raw keys, then entries, each column with the
queries that see it), and the program runs ONE loop of online softmax over its column blocks:
the raw-key blocks inside its window, then the entry blocks inside its visible range (loop
bounds from per-query ranges, so invisible blocks cost nothing), so Triton's software pipeline
runs through both sources without restarting. A block that every query of the tile sees in full
(an interior block) skips its mask: the test is a branch around arithmetic, the loads stay
outside it. The sink logit seeds the running max (value zero, so it only adds to the
denominator).

Backward (``attention_gpu_bwd``): dq with the forward's loop; dk/dv per column block (raw keys and
entries alike), each looping over the query blocks that can see it and over the H/K query heads
of its group, so GQA/MQA gradients are summed in registers rather than in HBM. Shared pieces
(config, key columns, masks, block ranges): ``attention_gpu_common``.

Padding: T and C are padded to the tiles and D to a power of two >= 16 (Triton needs power-of-
two tiles of at least 16 for tl.dot); padded keys and entries are never visible to a real query
(their query ranges start past every real query, or are empty) and padded rows are sliced away.
The buffer of both sources costs one copy of K and V (and entries) per call.

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
  key_steps,
  mask_boundary,
  program_specs,
)
from kernels.block_sizes import AttentionBlockSizes
from kernels.padding import gpu_tile, next_power_of_2, pad_to, round_up

Array = jax.Array


# ----------------------------------------------------------------------------- forward


def _online_update(carry, s, v):
  """One block of the online softmax (invisible scores already at -inf)."""
  acc, m, denom = carry
  m_new = jnp.maximum(m, jnp.max(s, axis=1))
  m_safe = jnp.where(m_new == -jnp.inf, 0.0, m_new)
  alpha = jnp.exp(m - m_safe)
  p = jnp.exp(s - m_safe[:, None])
  denom = alpha * denom + jnp.sum(p, axis=1)
  acc = alpha[:, None] * acc + dot(p.astype(v.dtype), v)
  return acc, m_new, denom


def _fwd_kernel(q_ref, k_ref, v_ref, lo_ref, hi_ref, blo_ref, bhi_ref, steps_ref, sink_ref, o_ref,
                lse_ref, *, cfg: Cfg, entry_block0: int):
  i = pl.program_id(0)
  bq, bk, gf = cfg.bq_fwd, cfg.bk, cfg.fwd_group
  q = q_ref[...]
  first, last = i * bq, i * bq + bq - 1
  t_pos = first + jnp.arange(bq, dtype=jnp.int32)
  if gf > 1:
    # The group's heads as extra rows of one tile (row t * gf + head): every K/V block is loaded
    # once for the whole group, and each row keeps its own token's position.
    q = q.reshape(bq * gf, q.shape[-1])
    t_pos = jnp.broadcast_to(t_pos[:, None], (bq, gf)).reshape(bq * gf)
  m = sink_ref[...]
  denom = jnp.where(m == -jnp.inf, 0.0, 1.0)
  n_steps, block = key_steps(steps_ref, i, entry_block0)

  def step(n, carry):
    j = block(n)
    cols = pl.ds(j * bk, bk)
    s = dot_t(q, k_ref[cols, :]) * cfg.scale
    interior = (blo_ref[j] <= first) & (bhi_ref[j] > last)
    s = mask_boundary(s, interior, t_pos, lo_ref, hi_ref, cols)
    return _online_update(carry, s, v_ref[cols, :])

  acc, m, denom = jax.lax.fori_loop(0, n_steps, step, (jnp.zeros(q.shape, F32), m, denom))
  seen = denom > 0
  o = (acc / jnp.where(seen, denom, 1.0)[:, None]).astype(o_ref.dtype)
  # Rows that saw nothing get lse 0: the backward masks every logit of such a row anyway.
  lse = jnp.where(seen, jnp.where(m == -jnp.inf, 0.0, m) + jnp.log(jnp.where(
      seen, denom, 1.0)), 0.0)
  if gf > 1:
    o, lse = o.reshape(bq, gf, o.shape[-1]), lse.reshape(bq, gf)
  o_ref[...] = o
  lse_ref[...] = lse


def _forward(cfg: Cfg, q, k, v, lo, hi, blo, bhi, steps, sink_hq, kvlo, elo, ehi):
  """(o_BxTpxHxDp, lse_BxHxTp): one program per query block and head, or per query block and
  kv head serving its whole group (``cfg.fwd_group``). kvlo / elo / ehi are the Mosaic
  forward's (its per-row masks); this one reads the blocks' summaries ``steps``."""
  del kvlo, elo, ehi
  b, tp, h, dp = q.shape
  gf, bq = cfg.fwd_group, cfg.bq_fwd
  spec = program_specs(cfg, q.shape, k.shape[1])
  if gf > 1:
    lse_spec = pl.BlockSpec((None, bq, gf), lambda i, b_, kv: (b_, i, kv))
    lse_shape = (b, tp, h)
    # Row r of a program's tile is head r % gf of its kv head's group.
    sink = jnp.tile(sink_hq[:, 0].reshape(h // gf, gf), (1, bq))
  else:
    lse_spec = pl.BlockSpec((None, None, bq), lambda i, b_, h_: (b_, h_, i))
    lse_shape = (b, h, tp)
    sink = sink_hq[:, :1] * jnp.ones((1, bq), F32)
  o, lse = pl.pallas_call(
      functools.partial(_fwd_kernel, cfg=cfg, entry_block0=tp // cfg.bk),
      grid=(tp // bq, b, h // gf),
      in_specs=[spec["tile"], spec["kv"], spec["kv"], spec["cols"], spec["cols"],
                spec["blocks"], spec["blocks"], spec["steps"],
                pl.BlockSpec((None, bq * gf), lambda i, b_, h_: (h_, 0))],
      out_specs=[spec["tile"], lse_spec],
      out_shape=[jax.ShapeDtypeStruct(q.shape, q.dtype), jax.ShapeDtypeStruct(lse_shape, F32)],
      compiler_params=cfg.params,
      interpret=cfg.interpret,
      name="chunk_attention_fwd",
  )(q, k, v, lo, hi, blo, bhi, steps, sink)
  return o, (jnp.swapaxes(lse, 1, 2) if gf > 1 else lse)


def _any_forward(cfg: Cfg, *args):
  """The Triton forward, or the Mosaic GPU one (same inputs, same (o, lse) contract)."""
  if cfg.mosaic_fwd:
    from kernels import attention_mgpu
    return attention_mgpu.forward(cfg, *args)
  return _forward(cfg, *args)


@functools.partial(jax.custom_vjp, nondiff_argnums=(0,))
def _attention(cfg, q, k, v, lo, hi, blo, bhi, steps, sink_hq, kvlo, elo, ehi):
  return _any_forward(cfg, q, k, v, lo, hi, blo, bhi, steps, sink_hq, kvlo, elo, ehi)[0]


def _attention_fwd(cfg, *args):
  o, lse = _any_forward(cfg, *args)
  return o, args + (o, lse)


def _attention_bwd(cfg, res, do):
  dq, dk, dv, dsink = backward_kernels(cfg, res, do)
  return dq, dk, dv, None, None, None, None, None, dsink, None, None, None


_attention.defvjp(_attention_fwd, _attention_bwd)


def _config(block_sizes: AttentionBlockSizes, t: int, window: int, scale: float, group: int,
            interpret: bool):
  """The kernels' static configuration. Raw keys and entries share one column axis, so its
  tiles are block_k (forward, dq) and block_k_bwd (dk/dv); block_c and block_c_bwd are the TPU
  kernels'."""
  bs = block_sizes
  bq = gpu_tile(bs.block_q, t)
  # One forward program per kv head when its group is a power of two that leaves >= 16 tokens
  # of the query tile: the tile keeps block_q rows (bq / G tokens x G heads).
  grouped = group > 1 and not group & (group - 1) and bq // group >= 16
  return Cfg(window=window, scale=scale, group=group, fwd_group=group if grouped else 1,
             bq_fwd=bq // group if grouped else bq, bq=bq, bk=gpu_tile(bs.block_k, t),
             bq_bwd=gpu_tile(bs.block_q_bwd, t), bk_bwd=gpu_tile(bs.block_k_bwd, t),
             num_warps=bs.num_warps, num_stages=bs.num_stages, interpret=bool(interpret),
             fused_bwd=bs.backward == "fused", mosaic_fwd=bs.forward == "mosaic",
             mosaic_interpret=interpret if bs.forward == "mosaic" and interpret else None)


def chunk_attention_gpu(q_BxTxHxD, k_BxTxKxD, v_BxTxKxD, segment_ids_BxT, entry_k_BxCxKxD,
                        entry_v_BxCxKxD, entry_ends_BxC, entry_segment_ids_BxC, *, sink_H,
                        window: int, scale: float, interpret, block_sizes: AttentionBlockSizes,
                        row_layout: layout.RowLayout | None = None):
  """Pallas Triton implementation of ``kernels.chunk_attention`` (same semantics).

  ``row_layout`` (of the unpadded rows): the documents' bounds computed once per step by the
  caller; the per-call work left is the entry ranges (a histogram and a running sum) and the
  key columns' query ranges.
  """
  b, t, h, d = q_BxTxHxD.shape
  kh, c = k_BxTxKxD.shape[2], entry_k_BxCxKxD.shape[1]
  cfg = _config(block_sizes, t, window, scale, h // kh, interpret)
  # Column blocks of both tile sizes must not straddle the raw keys' end: Tp and Cp are
  # multiples of both (powers of two: of the larger).
  col_tile = max(cfg.bk, cfg.bk_bwd)
  tp = round_up(t, max(cfg.bq, cfg.bq_bwd, col_tile))
  cp = round_up(max(c, 1), col_tile)  # C = 0: one block of padding entries
  dp = max(16, next_power_of_2(d))
  if cfg.mosaic_fwd:  # its tiles: whole 64-row warpgroups, 64-aligned head dims (swizzle)
    from kernels import attention_mgpu
    attention_mgpu.check_inputs(q_BxTxHxD.dtype, d)
    if not interpret:
      attention_mgpu.check_device()
    tp = round_up(tp, max(attention_mgpu.program_rows(cfg), attention_mgpu.key_block(cfg)))
    cp = round_up(cp, attention_mgpu.key_block(cfg))
    dp = attention_mgpu.padded_head_dim(dp)
  pad_d = lambda x, n: pad_to(pad_to(x, 1, n), 3, dp)
  # One buffer per operand: raw keys in columns [0, Tp), entries in [Tp, Tp + Cp).
  columns = lambda x, e: jnp.concatenate([pad_d(x, tp), pad_d(e, cp)], axis=1)
  seg = pad_to(segment_ids_BxT.astype(jnp.int32), 1, tp, mode="edge")
  eends = pad_to(entry_ends_BxC.astype(jnp.int32), 1, cp, layout.PAD_END)
  eseg = pad_to(entry_segment_ids_BxC.astype(jnp.int32), 1, cp, layout.PAD_SEGMENT)
  # Document bounds of the padded rows: the padding joins the last document (edge padding).
  doc_start, doc_end = layout.padded_document_bounds(
      layout.row_layout(segment_ids_BxT) if row_layout is None else row_layout, tp)
  kvlo = layout.raw_key_start(seg, window, doc_start)
  elo, ehi = layout.visible_entry_range(eends, eseg, seg, doc_start)
  lo, hi = layout.key_columns(seg, eends, eseg, doc_end, window)
  blo, bhi = layout.column_block_bounds(lo, hi, cfg.bk)
  steps = jnp.stack(layout.query_key_blocks(kvlo, elo, ehi, cfg.bq_fwd, cfg.bk, cfg.bk, window),
                    axis=1)
  sink = jnp.full((h,), -jnp.inf, F32) if sink_H is None else sink_H.astype(F32)
  sink_hq = jnp.broadcast_to(sink[:, None], (h, cfg.bq))
  o = _attention(cfg, pad_d(q_BxTxHxD, tp), columns(k_BxTxKxD, entry_k_BxCxKxD),
                 columns(v_BxTxKxD, entry_v_BxCxKxD), lo, hi, blo, bhi, steps, sink_hq, kvlo,
                 elo, ehi)
  return o[:, :t, :, :d]
