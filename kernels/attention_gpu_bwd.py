"""chunk_attention on GPU, backward: the Pallas Triton dq and dk/dv kernels.

dq runs the forward's programs and its one loop over window and entry blocks (one program per kv
head serving its group where the forward does; interior blocks unmasked). dk/dv is one kernel
over every column block of the key buffer (raw keys and entries alike,
``layout.key_columns``): a program loops over the query blocks that see one of its
columns (interior ones unmasked), with the H/K query heads of its group as extra rows of each
step (a power-of-two group; else a serial loop over them), so GQA/MQA gradients are summed in
registers, not in HBM.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as pltriton

from kernels import layout
from kernels.attention_gpu_common import (
  F32,
  Cfg,
  dot,
  dot_t,
  dot_tn,
  key_steps,
  mask_boundary,
  program_specs,
)


def _dq_kernel(q_ref, k_ref, v_ref, lo_ref, hi_ref, blo_ref, bhi_ref, steps_ref, do_ref, lse_ref,
               delta_ref, dq_ref, *, cfg: Cfg, entry_block0: int):
  i = pl.program_id(0)
  bq, bk, gf = cfg.bq_fwd, cfg.bk, cfg.fwd_group
  q, do = q_ref[...], do_ref[...]
  lse, delta = lse_ref[...], delta_ref[...]
  first, last = i * bq, i * bq + bq - 1
  t_pos = first + jnp.arange(bq, dtype=jnp.int32)
  if gf > 1:  # one program per kv head, as the forward: its group's heads as extra rows
    rows = bq * gf
    q, do = q.reshape(rows, q.shape[-1]), do.reshape(rows, do.shape[-1])
    lse, delta = lse.reshape(rows), delta.reshape(rows)
    t_pos = jnp.broadcast_to(t_pos[:, None], (bq, gf)).reshape(rows)
  n_steps, block = key_steps(steps_ref, i, entry_block0)

  def step(n, dq):
    j = block(n)
    cols = pl.ds(j * bk, bk)
    k = k_ref[cols, :]
    s = dot_t(q, k) * cfg.scale
    interior = (blo_ref[j] <= first) & (bhi_ref[j] > last)
    s = mask_boundary(s, interior, t_pos, lo_ref, hi_ref, cols)
    ds = jnp.exp(s - lse[:, None]) * (dot_t(do, v_ref[cols, :]) - delta[:, None])
    return dq + dot(ds.astype(k.dtype), k)

  dq = jax.lax.fori_loop(0, n_steps, step, jnp.zeros(q.shape, F32))
  dq = (dq * cfg.scale).astype(dq_ref.dtype)
  dq_ref[...] = dq.reshape(bq, gf, dq.shape[-1]) if gf > 1 else dq


def _dkv_kernel(k_ref, v_ref, lo_ref, hi_ref, first_ref, stop_ref, lo_max_ref, hi_min_ref, q_ref,
                do_ref, lse_ref, delta_ref, *refs, cfg: Cfg):
  """dk, dv of one column block, summed over its query blocks and the group's heads.

  Column c is seen by queries [lo[c], hi[c]): the loop walks the query blocks [first, stop) that
  hold a query seeing one of the block's columns (``layout.column_query_blocks``), and a query
  block whose every query sees every column (``layout.column_block_bounds``) runs unmasked.
  ``cfg.fwd_group > 1``: the G heads are G extra rows per token of each query step (lse and
  delta laid out B x Tp x H), so one loop over query blocks serves the whole group; else a
  serial loop over the heads. The fused backward (refs: dq_in aliased, dk, dv, dq_out) also
  adds ds @ k to the query rows' dq (float32, atomically: other column blocks add to the same
  rows).
  """
  dq_ref, (dk_ref, dv_ref) = (refs[3], refs[1:3]) if cfg.fused_bwd else (None, refs)
  bqb, g, j = cfg.bq_bwd, cfg.group, pl.program_id(0)
  k, v = k_ref[...], v_ref[...]
  q_first, q_stop, lo_max, hi_min = first_ref[j], stop_ref[j], lo_max_ref[j], hi_min_ref[j]

  def step(carry, ii, q, do, lse, delta, t_pos, add_dq):
    dk, dv = carry
    s = dot_t(q, k) * cfg.scale
    interior = (lo_max <= ii * bqb) & (hi_min > ii * bqb + bqb - 1)
    s = mask_boundary(s, interior, t_pos, lo_ref, hi_ref, slice(None))
    p = jnp.exp(s - lse[:, None])
    dv = dv + dot_tn(p.astype(do.dtype), do)
    ds = p * (dot_t(do, v) - delta[:, None])
    if dq_ref is not None:
      add_dq(dot(ds.astype(k.dtype), k) * cfg.scale)
    return dk + dot_tn(ds.astype(q.dtype), q), dv

  def grouped_step(ii, carry):
    rows = pl.ds(ii * bqb, bqb)
    flat = lambda x: x.reshape((bqb * g,) + x.shape[2:])  # row t * G + head
    t_pos = jnp.broadcast_to((ii * bqb + jnp.arange(bqb, dtype=jnp.int32))[:, None],
                             (bqb, g)).reshape(bqb * g)
    add_dq = lambda x: pltriton.atomic_add(dq_ref, (rows, slice(None), slice(None)),
                                           x.reshape(bqb, g, x.shape[-1]))
    return step(carry, ii, flat(q_ref[rows, :, :]), flat(do_ref[rows, :, :]),
                flat(lse_ref[rows, :]), flat(delta_ref[rows, :]), t_pos, add_dq)

  def head_loop(h, carry):
    def head_step(ii, carry):
      rows = pl.ds(ii * bqb, bqb)
      add_dq = lambda x: pltriton.atomic_add(dq_ref, (rows, h, slice(None)), x)
      return step(carry, ii, q_ref[rows, h, :], do_ref[rows, h, :], lse_ref[h, rows],
                  delta_ref[h, rows], ii * bqb + jnp.arange(bqb, dtype=jnp.int32), add_dq)
    return jax.lax.fori_loop(q_first, q_stop, head_step, carry)

  zeros = jnp.zeros(k.shape, F32)
  if cfg.fwd_group > 1:
    dk, dv = jax.lax.fori_loop(q_first, q_stop, grouped_step, (zeros, zeros))
  else:
    dk, dv = jax.lax.fori_loop(0, g, head_loop, (zeros, zeros))
  dk_ref[...] = (dk * cfg.scale).astype(dk_ref.dtype)
  dv_ref[...] = dv.astype(dv_ref.dtype)


def backward_kernels(cfg: Cfg, res, do):
  """(dq, dk, dv, dsink_hq): dk and dv over the whole column buffer (raw keys, then entries)."""
  q, k, v, lo, hi, blo, bhi, steps, sink_hq, _, _, _, o, lse = res
  b, tp, h, dp = q.shape
  kh, n_cols, g, gf = k.shape[2], k.shape[1], cfg.group, cfg.fwd_group
  delta = jnp.einsum("bthd,bthd->bht", o.astype(F32), do.astype(F32))
  spec = program_specs(cfg, q.shape, n_cols)
  if gf > 1:  # one program per kv head: tiles of bq tokens x its G heads, lse/delta B x Tp x H
    head_t = pl.BlockSpec((None, cfg.bq_fwd, gf), lambda i, b_, kv: (b_, i, kv))
    lse_q, delta_q = jnp.swapaxes(lse, 1, 2), jnp.swapaxes(delta, 1, 2)
  else:
    head_t = pl.BlockSpec((None, None, cfg.bq_fwd), lambda i, b_, h_: (b_, h_, i))
    lse_q, delta_q = lse, delta
  dq = None if cfg.fused_bwd else pl.pallas_call(
      functools.partial(_dq_kernel, cfg=cfg, entry_block0=tp // cfg.bk),
      grid=(tp // cfg.bq_fwd, b, h // gf),
      in_specs=[spec["tile"], spec["kv"], spec["kv"], spec["cols"], spec["cols"],
                spec["blocks"], spec["blocks"], spec["steps"], spec["tile"], head_t, head_t],
      out_specs=spec["tile"],
      out_shape=jax.ShapeDtypeStruct(q.shape, q.dtype),
      compiler_params=cfg.params,
      interpret=cfg.interpret,
      name="chunk_attention_dq",
  )(q, k, v, lo, hi, blo, bhi, steps, do, lse_q, delta_q)

  # dk/dv programs see every query head of their group: G heads of q, do, lse and delta.
  group_q = pl.BlockSpec((None, tp, g, dp), lambda j, b_, kv: (b_, 0, kv, 0))
  if gf > 1:  # the heads as rows: per-token lse and delta, B x Tp x H
    group_t = pl.BlockSpec((None, tp, g), lambda j, b_, kv: (b_, 0, kv))
    lse_g, delta_g = jnp.swapaxes(lse, 1, 2), jnp.swapaxes(delta, 1, 2)
  else:
    group_t = pl.BlockSpec((None, g, tp), lambda j, b_, kv: (b_, kv, 0))
    lse_g, delta_g = lse, delta
  col_tile = pl.BlockSpec((None, cfg.bk_bwd, None, dp), lambda j, b_, kv: (b_, j, kv, 0))
  col_vec = pl.BlockSpec((None, cfg.bk_bwd), lambda j, b_, kv: (b_, j))
  block_vec = pl.BlockSpec((None, n_cols // cfg.bk_bwd), lambda j, b_, kv: (b_, 0))
  block_ranges = (layout.column_query_blocks(lo, hi, cfg.bk_bwd, cfg.bq_bwd)
                  + layout.column_block_bounds(lo, hi, cfg.bk_bwd))
  # Fused: dq accumulates in float32 in the dk/dv kernel (input 12 aliased to output 2).
  fused = [group_q] * cfg.fused_bwd
  dk, dv, *dq_out = pl.pallas_call(
      functools.partial(_dkv_kernel, cfg=cfg),
      grid=(n_cols // cfg.bk_bwd, b, kh),
      in_specs=[col_tile, col_tile, col_vec, col_vec] + [block_vec] * 4
      + [group_q, group_q, group_t, group_t] + fused,
      out_specs=[col_tile, col_tile] + fused,
      out_shape=[jax.ShapeDtypeStruct(k.shape, k.dtype)] * 2
      + [jax.ShapeDtypeStruct(q.shape, F32)] * cfg.fused_bwd,
      input_output_aliases={12: 2} if cfg.fused_bwd else {},
      compiler_params=cfg.params,
      interpret=cfg.interpret,
      name="chunk_attention_dkv",
  )(k, v, lo, hi, *block_ranges, q, do, lse_g, delta_g,
    *[jnp.zeros(q.shape, F32)] * cfg.fused_bwd)
  if cfg.fused_bwd:
    dq = dq_out[0].astype(q.dtype)
  # The sink has value zero: d sink_h = -sum_t p_sink(t) * delta(t).
  dsink = -jnp.sum(jnp.exp(sink_hq[:, :1].T[:, :, None] - lse) * delta, axis=(0, 2))
  return dq, dk, dv, jnp.zeros_like(sink_hq).at[:, 0].set(dsink)
