"""chunk_attention on GPU, backward: the Pallas Triton dq and dk/dv kernels.

dq runs the forward's programs and loops (one program per kv head serving its group where the
forward does; boundary blocks masked, interior ones not); dk/dv run one program
per key block and per entry block, each looping over the query blocks that can see it (again
boundary blocks masked, interior ones not) with the H/K query heads of its group as extra rows
of each step (a power-of-two group; else a serial loop over them), so GQA/MQA gradients are
summed in registers, not in HBM.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as pltriton

from kernels.attention_gpu_common import (
  F32,
  Cfg,
  cdiv,
  dot,
  dot_t,
  dot_tn,
  entry_blocks,
  entry_mask,
  q_spec,
  raw_blocks,
  raw_mask,
  split_loops,
)


def _dq_kernel(q_ref, k_ref, v_ref, segq_ref, segk_ref, ek_ref, ev_ref, eends_ref, eseg_ref,
               kvlo_ref, elo_ref, ehi_ref, do_ref, lse_ref, delta_ref, dq_ref, *, cfg: Cfg):
  i = pl.program_id(0)
  bk, bc, gf = cfg.bk, cfg.bc, cfg.fwd_group
  bq = cfg.bq_fwd if gf > 1 else cfg.bq
  q, do = q_ref[...], do_ref[...]
  lse, delta = lse_ref[...], delta_ref[...]
  seg_q = segq_ref[...]
  t_pos = i * bq + jnp.arange(bq, dtype=jnp.int32)
  if gf > 1:  # one program per kv head, as the forward: its group's heads as extra rows
    rows = bq * gf
    q, do = q.reshape(rows, q.shape[-1]), do.reshape(rows, do.shape[-1])
    lse, delta = lse.reshape(rows), delta.reshape(rows)
    per_row = lambda x: jnp.broadcast_to(x[:, None], (bq, gf)).reshape(rows)
    seg_q, t_pos = per_row(seg_q), per_row(t_pos)

  def grad_step(dq, s, mask, k, v):
    p = jnp.exp(s - lse[:, None])
    if mask is not None:
      p = jnp.where(mask, p, 0.0)
    ds = p * (dot_t(do, v) - delta[:, None])
    return dq + dot(ds.astype(k.dtype), k)

  dq = jnp.zeros(q.shape, F32)
  if cfg.window > 0:
    def raw_body(j, dq, masked=True):
      k = k_ref[pl.ds(j * bk, bk), :]
      mask = raw_mask(t_pos, j * bk + jnp.arange(bk, dtype=jnp.int32), seg_q,
                       segk_ref[pl.ds(j * bk, bk)], cfg.window) if masked else None
      return grad_step(dq, dot_t(q, k) * cfg.scale, mask, k, v_ref[pl.ds(j * bk, bk), :])

    dq = split_loops(*raw_blocks(i, bq, bk, kvlo_ref[...]), raw_body,
                functools.partial(raw_body, masked=False), dq)

  def entry_body(j, dq, masked=True):
    ek = ek_ref[pl.ds(j * bc, bc), :]
    seg_e = eseg_ref[pl.ds(j * bc, bc)]
    if masked:
      mask = entry_mask(t_pos, eends_ref[pl.ds(j * bc, bc)], seg_q, seg_e)
    else:
      mask = (seg_e == jnp.max(seg_q))[None, :]
    return grad_step(dq, dot_t(q, ek) * cfg.scale, mask, ek, ev_ref[pl.ds(j * bc, bc), :])

  dq = split_loops(*entry_blocks(bc, elo_ref[...], ehi_ref[...]), entry_body,
                   functools.partial(entry_body, masked=False), dq)
  dq = (dq * cfg.scale).astype(dq_ref.dtype)
  dq_ref[...] = dq.reshape(bq, gf, dq.shape[-1]) if gf > 1 else dq


def _dkv_loop(cfg: Cfg, k, v, key_mask, column_mask, q_ref, do_ref, segq_ref, lse_ref,
              delta_ref, bounds, dq_ref=None):
  """dk, dv of one key tile, summed over its query blocks and the group's heads.

  ``bounds`` = (lo, hi, first interior, stop interior) query blocks: the boundary ones are
  masked by ``key_mask(t_pos, seg_q)``, the interior ones (every query sees every key of the
  tile) only by ``column_mask(seg_q)`` (None, or a 1 x keys row). ``cfg.fwd_group > 1``: the G
  heads are G extra rows per token of each query step (lse and delta laid out B x Tp x H), so
  one loop over query blocks serves the whole group; else a serial loop over the heads.
  ``dq_ref`` (the fused backward): each step also adds ds @ k to the query rows' dq (float32,
  atomically: other key tiles add to the same rows).
  """
  bqb, g = cfg.bq_bwd, cfg.group

  def step(carry, q, do, lse, delta, mask, add_dq):
    dk, dv = carry
    s = dot_t(q, k) * cfg.scale
    p = jnp.exp(s - lse[:, None])
    if mask is not None:
      p = jnp.where(mask, p, 0.0)
    dv = dv + dot_tn(p.astype(do.dtype), do)
    ds = p * (dot_t(do, v) - delta[:, None])
    if dq_ref is not None:
      add_dq(dot(ds.astype(k.dtype), k) * cfg.scale)
    return dk + dot_tn(ds.astype(q.dtype), q), dv

  def mask_of(t_pos, seg_q, masked):
    return key_mask(t_pos, seg_q) if masked else column_mask(seg_q)

  def grouped_body(ii, carry, masked=True):
    rows = pl.ds(ii * bqb, bqb)
    flat = lambda x: x.reshape((bqb * g,) + x.shape[2:])  # row t * G + head
    per_row = lambda x: jnp.broadcast_to(x[:, None], (bqb, g)).reshape(bqb * g)
    t_pos = per_row(ii * bqb + jnp.arange(bqb, dtype=jnp.int32))
    add_dq = lambda x: pltriton.atomic_add(dq_ref, (rows, slice(None), slice(None)),
                                           x.reshape(bqb, g, x.shape[-1]))
    return step(carry, flat(q_ref[rows, :, :]), flat(do_ref[rows, :, :]),
                flat(lse_ref[rows, :]), flat(delta_ref[rows, :]),
                mask_of(t_pos, per_row(segq_ref[rows]), masked), add_dq)

  def head_body(h, carry):
    def q_body(ii, carry, masked=True):
      rows = pl.ds(ii * bqb, bqb)
      t_pos = ii * bqb + jnp.arange(bqb, dtype=jnp.int32)
      add_dq = lambda x: pltriton.atomic_add(dq_ref, (rows, h, slice(None)), x)
      return step(carry, q_ref[rows, h, :], do_ref[rows, h, :], lse_ref[h, rows],
                  delta_ref[h, rows], mask_of(t_pos, segq_ref[rows], masked), add_dq)
    return split_loops(*bounds, q_body, functools.partial(q_body, masked=False), carry)

  zeros = jnp.zeros(k.shape, F32)
  if cfg.fwd_group > 1:
    return split_loops(*bounds, grouped_body, functools.partial(grouped_body, masked=False),
                       (zeros, zeros))
  return jax.lax.fori_loop(0, g, head_body, (zeros, zeros))


def _dkv_raw_kernel(k_ref, v_ref, segk_ref, qhi_ref, q_ref, do_ref, segq_ref, lse_ref,
                    delta_ref, *refs, cfg: Cfg):
  # refs: [dq_in (aliased),] dk, dv[, dq_out] -- the fused backward adds dq into dq_out.
  dq_ref, (dk_ref, dv_ref) = (refs[3], refs[1:3]) if cfg.fused_bwd else (None, refs)
  j = pl.program_id(0)
  bkb, bqb = cfg.bk_bwd, cfg.bq_bwd
  s_pos = j * bkb + jnp.arange(bkb, dtype=jnp.int32)
  seg_k = segk_ref[...]

  def key_mask(t_pos, seg_q):
    return raw_mask(t_pos, s_pos, seg_q, seg_k, cfg.window)

  # Key s is seen by queries [s, kqhi[s]) (kqhi non-decreasing): query block ii sees the whole
  # tile when it starts at or after the tile's last key and ends before the first key's kqhi.
  qhi = qhi_ref[...]
  bounds = (jax.lax.div(j * bkb, bqb), cdiv(jnp.max(qhi), bqb), cdiv(j * bkb + bkb - 1, bqb),
            jax.lax.div(jnp.min(qhi), bqb))
  dk, dv = _dkv_loop(cfg, k_ref[...], v_ref[...], key_mask, lambda seg_q: None, q_ref, do_ref,
                     segq_ref, lse_ref, delta_ref, bounds, dq_ref)
  dk_ref[...] = (dk * cfg.scale).astype(dk_ref.dtype)
  dv_ref[...] = dv.astype(dv_ref.dtype)


def _dkv_entry_kernel(ek_ref, ev_ref, eends_ref, eseg_ref, eqlo_ref, eqhi_ref, q_ref, do_ref,
                      segq_ref, lse_ref, delta_ref, *refs, cfg: Cfg):
  dq_ref, (dk_ref, dv_ref) = (refs[3], refs[1:3]) if cfg.fused_bwd else (None, refs)
  ends, seg_e = eends_ref[...], eseg_ref[...]
  bqb = cfg.bq_bwd

  def key_mask(t_pos, seg_q):
    return entry_mask(t_pos, ends, seg_q, seg_e)

  def column_mask(seg_q):  # interior queries share one document: the entries' own ids only
    return (seg_e == jnp.max(seg_q))[None, :]

  eqlo, eqhi = eqlo_ref[...], eqhi_ref[...]
  bounds = (jax.lax.div(jnp.min(eqlo), bqb), cdiv(jnp.max(eqhi), bqb),
            cdiv(jnp.max(eqlo), bqb), jax.lax.div(jnp.min(eqhi), bqb))
  dk, dv = _dkv_loop(cfg, ek_ref[...], ev_ref[...], key_mask, column_mask, q_ref, do_ref,
                     segq_ref, lse_ref, delta_ref, bounds, dq_ref)
  dk_ref[...] = (dk * cfg.scale).astype(dk_ref.dtype)
  dv_ref[...] = dv.astype(dv_ref.dtype)


def backward_kernels(cfg: Cfg, res, do):
  q, k, v, seg, ek, ev, eends, eseg, sink_hq, kvlo, elo, ehi, kqhi, eqlo, eqhi, o, lse = res
  b, tp, h, dp = q.shape
  kh, cp, g = k.shape[2], ek.shape[1], cfg.group
  delta = jnp.einsum("bthd,bthd->bht", o.astype(F32), do.astype(F32))
  gf = cfg.fwd_group
  bq = cfg.bq_fwd if gf > 1 else cfg.bq
  kv_head = (lambda h_: h_) if gf > 1 else (lambda h_: h_ // g)  # grid axis 2 -> kv head
  full_kv = pl.BlockSpec((None, tp, None, dp), lambda i, b_, h_: (b_, 0, kv_head(h_), 0))
  full_e = pl.BlockSpec((None, cp, None, dp), lambda i, b_, h_: (b_, 0, kv_head(h_), 0))
  q_vec = pl.BlockSpec((None, bq), lambda i, b_, h_: (b_, i))
  row_t = pl.BlockSpec((None, tp), lambda i, b_, h_: (b_, 0))
  row_c = pl.BlockSpec((None, cp), lambda i, b_, h_: (b_, 0))
  if gf > 1:  # one program per kv head: tiles of bq tokens x its G heads, lse/delta B x Tp x H
    tile = pl.BlockSpec((None, bq, gf, dp), lambda i, b_, kv: (b_, i, kv, 0))
    head_t = pl.BlockSpec((None, bq, gf), lambda i, b_, kv: (b_, i, kv))
    lse_q, delta_q = jnp.swapaxes(lse, 1, 2), jnp.swapaxes(delta, 1, 2)
  else:
    tile = q_spec(cfg, dp)
    head_t = pl.BlockSpec((None, None, bq), lambda i, b_, h_: (b_, h_, i))
    lse_q, delta_q = lse, delta
  dq = None if cfg.fused_bwd else pl.pallas_call(
      functools.partial(_dq_kernel, cfg=cfg),
      grid=(tp // bq, b, h // gf),
      in_specs=[tile, full_kv, full_kv, q_vec, row_t, full_e, full_e, row_c, row_c,
                q_vec, q_vec, q_vec, tile, head_t, head_t],
      out_specs=tile,
      out_shape=jax.ShapeDtypeStruct(q.shape, q.dtype),
      compiler_params=cfg.params,
      interpret=cfg.interpret,
      name="chunk_attention_dq",
  )(q, k, v, seg, seg, ek, ev, eends, eseg, kvlo, elo, ehi, do, lse_q, delta_q)

  # dk/dv programs see every query head of their group: G heads of q, do, lse and delta.
  group_q = pl.BlockSpec((None, tp, g, dp), lambda j, b_, kv: (b_, 0, kv, 0))
  seg_all = pl.BlockSpec((None, tp), lambda j, b_, kv: (b_, 0))
  if cfg.fwd_group > 1:  # the heads as rows: per-token lse and delta, B x Tp x H
    group_t = pl.BlockSpec((None, tp, g), lambda j, b_, kv: (b_, 0, kv))
    lse_g, delta_g = jnp.swapaxes(lse, 1, 2), jnp.swapaxes(delta, 1, 2)
  else:
    group_t = pl.BlockSpec((None, g, tp), lambda j, b_, kv: (b_, kv, 0))
    lse_g, delta_g = lse, delta
  common = [group_q, group_q, seg_all, group_t, group_t]
  # Fused: dq accumulates in float32 through both dk/dv kernels (input aliased to output).
  dq_acc = jnp.zeros(q.shape, F32) if cfg.fused_bwd else None
  fused = lambda n_in, tile: dict(
      extra_in=[group_q] * cfg.fused_bwd, extra_out=[group_q] * cfg.fused_bwd,
      shapes=[jax.ShapeDtypeStruct(tile.shape, tile.dtype)] * 2
      + [jax.ShapeDtypeStruct(q.shape, F32)] * cfg.fused_bwd,
      aliases={n_in: 2} if cfg.fused_bwd else {}, args=[dq_acc] * cfg.fused_bwd)
  dk = dv = jnp.zeros(k.shape, k.dtype)
  if cfg.window > 0:
    key_tile = pl.BlockSpec((None, cfg.bk_bwd, None, dp), lambda j, b_, kv: (b_, j, kv, 0))
    key_vec = pl.BlockSpec((None, cfg.bk_bwd), lambda j, b_, kv: (b_, j))
    f = fused(9, k)
    dk, dv, *dq_out = pl.pallas_call(
        functools.partial(_dkv_raw_kernel, cfg=cfg),
        grid=(tp // cfg.bk_bwd, b, kh),
        in_specs=[key_tile, key_tile, key_vec, key_vec] + common + f["extra_in"],
        out_specs=[key_tile, key_tile] + f["extra_out"],
        out_shape=f["shapes"],
        input_output_aliases=f["aliases"],
        compiler_params=cfg.params,
        interpret=cfg.interpret,
        name="chunk_attention_dkv_raw",
    )(k, v, seg, kqhi, q, do, seg, lse_g, delta_g, *f["args"])
    dq_acc = dq_out[0] if dq_out else dq_acc
  entry_tile = pl.BlockSpec((None, cfg.bc_bwd, None, dp), lambda j, b_, kv: (b_, j, kv, 0))
  entry_vec = pl.BlockSpec((None, cfg.bc_bwd), lambda j, b_, kv: (b_, j))
  f = fused(11, ek)
  dek, dev, *dq_out = pl.pallas_call(
      functools.partial(_dkv_entry_kernel, cfg=cfg),
      grid=(cp // cfg.bc_bwd, b, kh),
      in_specs=[entry_tile, entry_tile, entry_vec, entry_vec, entry_vec, entry_vec] + common
      + f["extra_in"],
      out_specs=[entry_tile, entry_tile] + f["extra_out"],
      out_shape=f["shapes"],
      input_output_aliases=f["aliases"],
      compiler_params=cfg.params,
      interpret=cfg.interpret,
      name="chunk_attention_dkv_entries",
  )(ek, ev, eends, eseg, eqlo, eqhi, q, do, seg, lse_g, delta_g, *f["args"])
  if cfg.fused_bwd:
    dq = dq_out[0].astype(q.dtype)
  # The sink has value zero: d sink_h = -sum_t p_sink(t) * delta(t).
  dsink = -jnp.sum(jnp.exp(sink_hq[:, :1].T[:, :, None] - lse) * delta, axis=(0, 2))
  dsink_hq = jnp.zeros_like(sink_hq).at[:, 0].set(dsink)
  return dq, dk, dv, dek, dev, dsink_hq
