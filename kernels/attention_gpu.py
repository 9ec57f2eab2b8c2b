"""chunk_attention on GPU: Pallas Triton kernels, forward and backward (flash-attention style).

Forward: one program per (query block, row, head). It runs one online softmax over two key
sources, looping only over the raw-key blocks inside the window and the entry blocks inside the
block's visible range (loop bounds from per-query ranges, so invisible blocks cost nothing).
The sink logit seeds the running max (value zero, so it only adds to the denominator).
Each loop runs its boundary blocks masked and its interior blocks (seen in full by every query
of the tile, ``_raw_blocks`` / ``_entry_blocks``) without building a mask; dq does the same.

Backward: dq with the forward's loops; dk/dv per key block and per entry block, each looping
over the query blocks that can see it and over the H/K query heads of its group, so GQA/MQA
gradients are summed in registers rather than in HBM.

Padding: T and C are padded to the tiles and D to a power of two >= 16 (Triton needs power-of-
two tiles of at least 16 for tl.dot); padded keys are never visible (position > every real
query, end PAD_END for entries) and padded rows are sliced away.

Precision: float32 inputs use Triton's default dot precision (TF32 tensor cores on GPU, as
XLA's default does); interpret mode on CPU computes in full float32.
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as pltriton

from kernels import layout
from kernels.block_sizes import AttentionBlockSizes
from kernels.padding import gpu_tile, next_power_of_2, pad_to, round_up

Array = jax.Array
_F32 = jnp.float32


@dataclasses.dataclass(frozen=True)
class _Cfg:
  window: int
  scale: float
  group: int  # query heads per key/value head
  bq: int
  bk: int
  bc: int
  bq_bwd: int
  bk_bwd: int
  bc_bwd: int
  num_warps: int
  num_stages: int
  interpret: bool

  @property
  def params(self):
    return pltriton.CompilerParams(num_warps=self.num_warps, num_stages=self.num_stages)


def _dot_t(a, b):
  """a @ b.T with float32 accumulation."""
  return jax.lax.dot_general(a, b, (((1,), (1,)), ((), ())), preferred_element_type=_F32)


def _dot(a, b):
  return jax.lax.dot_general(a, b, (((1,), (0,)), ((), ())), preferred_element_type=_F32)


def _dot_tn(a, b):
  """a.T @ b with float32 accumulation."""
  return jax.lax.dot_general(a, b, (((0,), (0,)), ((), ())), preferred_element_type=_F32)


def _raw_mask(t_pos, s_pos, seg_q, seg_k, window):
  return ((s_pos[None, :] <= t_pos[:, None]) & (s_pos[None, :] > t_pos[:, None] - window)
          & (seg_k[None, :] == seg_q[:, None]))


def _entry_mask(t_pos, ends, seg_q, seg_e):
  return (ends[None, :] <= t_pos[:, None]) & (seg_e[None, :] == seg_q[:, None])


def _cdiv(a, b):
  return jax.lax.div(a + b - 1, b)


def _interior(lo, hi, first_full, stop_full):
  """[lo, hi) split at the interior blocks [a, b): a = first_full, b = stop_full clamped."""
  a = jnp.clip(first_full, lo, hi)
  return a, jnp.clip(stop_full, a, hi)


def _loops(lo, hi, first_full, stop_full, masked, unmasked, carry):
  """``masked`` over the boundary blocks of [lo, hi), ``unmasked`` over its interior ones.

  Interior blocks are those every query of the tile sees in full (no mask to build or apply);
  they form one contiguous run because the per-query bounds are non-decreasing.
  """
  a, b = _interior(lo, hi, first_full, stop_full)
  carry = jax.lax.fori_loop(lo, a, masked, carry)
  carry = jax.lax.fori_loop(a, b, unmasked, carry)
  return jax.lax.fori_loop(b, hi, masked, carry)


def _raw_blocks(i, bq, bk, kvlo):
  """(lo, hi, first interior, stop interior) raw-key blocks of query block i.

  Query t sees keys [kvlo[t], t] (kvlo = max(t - W + 1, its document's start), non-decreasing):
  block j is needed from the first query's kvlo on, and seen in full by every query of the
  block when it starts at or after the last query's kvlo and ends at or before the first query.
  """
  lo = jax.lax.div(jnp.min(kvlo), bk)
  return lo, _cdiv(i * bq + bq, bk), _cdiv(jnp.max(kvlo), bk), jax.lax.div(i * bq + 1, bk)


def _entry_blocks(bc, elo, ehi):
  """(lo, hi, first interior, stop interior) entry blocks of a query block with per-query
  visible ranges [elo, ehi) (both non-decreasing): interior = seen by every query (they then
  all lie in one document; only an entry's own document id is still checked)."""
  return (jax.lax.div(jnp.min(elo), bc), _cdiv(jnp.max(ehi), bc), _cdiv(jnp.max(elo), bc),
          jax.lax.div(jnp.min(ehi), bc))


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
  acc = alpha[:, None] * acc + _dot(p.astype(v.dtype), v)
  return acc, m_new, denom


def _fwd_kernel(q_ref, k_ref, v_ref, segq_ref, segk_ref, ek_ref, ev_ref, eends_ref, eseg_ref,
                sink_ref, kvlo_ref, elo_ref, ehi_ref, o_ref, lse_ref, *, cfg: _Cfg):
  i = pl.program_id(0)
  bq, bk, bc = cfg.bq, cfg.bk, cfg.bc
  q = q_ref[...]
  seg_q = segq_ref[...]
  t_pos = i * bq + jnp.arange(bq, dtype=jnp.int32)
  m = sink_ref[...]
  denom = jnp.where(m == -jnp.inf, 0.0, 1.0)
  carry = (jnp.zeros(q.shape, _F32), m, denom)

  if cfg.window > 0:
    def raw_body(j, carry, masked=True):
      k = k_ref[pl.ds(j * bk, bk), :]
      s = _dot_t(q, k) * cfg.scale
      mask = _raw_mask(t_pos, j * bk + jnp.arange(bk, dtype=jnp.int32), seg_q,
                       segk_ref[pl.ds(j * bk, bk)], cfg.window) if masked else None
      return _online_update(carry, s, mask, v_ref[pl.ds(j * bk, bk), :])

    carry = _loops(*_raw_blocks(i, bq, bk, kvlo_ref[...]), raw_body,
                   functools.partial(raw_body, masked=False), carry)

  def entry_body(j, carry, masked=True):
    ek = ek_ref[pl.ds(j * bc, bc), :]
    s = _dot_t(q, ek) * cfg.scale
    seg_e = eseg_ref[pl.ds(j * bc, bc)]
    if masked:
      mask = _entry_mask(t_pos, eends_ref[pl.ds(j * bc, bc)], seg_q, seg_e)
    else:  # one document for the whole tile: the entry's own id only (a 1 x bc row)
      mask = (seg_e == jnp.max(seg_q))[None, :]
    return _online_update(carry, s, mask, ev_ref[pl.ds(j * bc, bc), :])

  acc, m, denom = _loops(*_entry_blocks(bc, elo_ref[...], ehi_ref[...]), entry_body,
                         functools.partial(entry_body, masked=False), carry)
  seen = denom > 0
  o_ref[...] = (acc / jnp.where(seen, denom, 1.0)[:, None]).astype(o_ref.dtype)
  # Rows that saw nothing get lse 0: the backward masks every logit of such a row anyway.
  lse_ref[...] = jnp.where(seen, jnp.where(m == -jnp.inf, 0.0, m) + jnp.log(jnp.where(
      seen, denom, 1.0)), 0.0)


def _q_spec(cfg, dp):
  return pl.BlockSpec((None, cfg.bq, None, dp), lambda i, b, h: (b, i, h, 0))


def _forward(cfg: _Cfg, q, k, v, seg, ek, ev, eends, eseg, sink_hq, kvlo, elo, ehi):
  b, tp, h, dp = q.shape
  cp = ek.shape[1]
  g = cfg.group
  full_kv = pl.BlockSpec((None, tp, None, dp), lambda i, b_, h_: (b_, 0, h_ // g, 0))
  full_e = pl.BlockSpec((None, cp, None, dp), lambda i, b_, h_: (b_, 0, h_ // g, 0))
  q_vec = pl.BlockSpec((None, cfg.bq), lambda i, b_, h_: (b_, i))
  row_t = pl.BlockSpec((None, tp), lambda i, b_, h_: (b_, 0))
  row_c = pl.BlockSpec((None, cp), lambda i, b_, h_: (b_, 0))
  return pl.pallas_call(
      functools.partial(_fwd_kernel, cfg=cfg),
      grid=(tp // cfg.bq, b, h),
      in_specs=[_q_spec(cfg, dp), full_kv, full_kv, q_vec, row_t, full_e, full_e, row_c, row_c,
                pl.BlockSpec((None, cfg.bq), lambda i, b_, h_: (h_, 0)), q_vec, q_vec, q_vec],
      out_specs=[_q_spec(cfg, dp),
                 pl.BlockSpec((None, None, cfg.bq), lambda i, b_, h_: (b_, h_, i))],
      out_shape=[jax.ShapeDtypeStruct(q.shape, q.dtype), jax.ShapeDtypeStruct((b, h, tp), _F32)],
      compiler_params=cfg.params,
      interpret=cfg.interpret,
      name="chunk_attention_fwd",
  )(q, k, v, seg, seg, ek, ev, eends, eseg, sink_hq, kvlo, elo, ehi)


# ----------------------------------------------------------------------------- backward


def _dq_kernel(q_ref, k_ref, v_ref, segq_ref, segk_ref, ek_ref, ev_ref, eends_ref, eseg_ref,
               kvlo_ref, elo_ref, ehi_ref, do_ref, lse_ref, delta_ref, dq_ref, *, cfg: _Cfg):
  i = pl.program_id(0)
  bq, bk, bc = cfg.bq, cfg.bk, cfg.bc
  q, do = q_ref[...], do_ref[...]
  lse, delta = lse_ref[...], delta_ref[...]
  seg_q = segq_ref[...]
  t_pos = i * bq + jnp.arange(bq, dtype=jnp.int32)

  def grad_step(dq, s, mask, k, v):
    p = jnp.exp(s - lse[:, None])
    if mask is not None:
      p = jnp.where(mask, p, 0.0)
    ds = p * (_dot_t(do, v) - delta[:, None])
    return dq + _dot(ds.astype(k.dtype), k)

  dq = jnp.zeros(q.shape, _F32)
  if cfg.window > 0:
    def raw_body(j, dq, masked=True):
      k = k_ref[pl.ds(j * bk, bk), :]
      mask = _raw_mask(t_pos, j * bk + jnp.arange(bk, dtype=jnp.int32), seg_q,
                       segk_ref[pl.ds(j * bk, bk)], cfg.window) if masked else None
      return grad_step(dq, _dot_t(q, k) * cfg.scale, mask, k, v_ref[pl.ds(j * bk, bk), :])

    dq = _loops(*_raw_blocks(i, bq, bk, kvlo_ref[...]), raw_body,
                functools.partial(raw_body, masked=False), dq)

  def entry_body(j, dq, masked=True):
    ek = ek_ref[pl.ds(j * bc, bc), :]
    seg_e = eseg_ref[pl.ds(j * bc, bc)]
    if masked:
      mask = _entry_mask(t_pos, eends_ref[pl.ds(j * bc, bc)], seg_q, seg_e)
    else:
      mask = (seg_e == jnp.max(seg_q))[None, :]
    return grad_step(dq, _dot_t(q, ek) * cfg.scale, mask, ek, ev_ref[pl.ds(j * bc, bc), :])

  dq = _loops(*_entry_blocks(bc, elo_ref[...], ehi_ref[...]), entry_body,
              functools.partial(entry_body, masked=False), dq)
  dq_ref[...] = (dq * cfg.scale).astype(dq_ref.dtype)


def _dkv_loop(cfg: _Cfg, k, v, key_mask, q_ref, do_ref, lse_ref, delta_ref, q_lo, q_hi):
  """dk, dv of one key tile, summed over the query blocks [q_lo, q_hi) and the group's heads."""
  bqb = cfg.bq_bwd

  def q_body(ii, carry, g):
    dk, dv = carry
    rows = pl.ds(ii * bqb, bqb)
    q = q_ref[rows, g, :]
    do = do_ref[rows, g, :]
    t_pos = ii * bqb + jnp.arange(bqb, dtype=jnp.int32)
    s = _dot_t(q, k) * cfg.scale
    p = jnp.where(key_mask(t_pos, rows), jnp.exp(s - lse_ref[g, rows][:, None]), 0.0)
    dv = dv + _dot_tn(p.astype(do.dtype), do)
    ds = p * (_dot_t(do, v) - delta_ref[g, rows][:, None])
    dk = dk + _dot_tn(ds.astype(q.dtype), q)
    return dk, dv

  def head_body(g, carry):
    return jax.lax.fori_loop(q_lo, q_hi, functools.partial(q_body, g=g), carry)

  zeros = jnp.zeros(k.shape, _F32)
  return jax.lax.fori_loop(0, cfg.group, head_body, (zeros, zeros))


def _dkv_raw_kernel(k_ref, v_ref, segk_ref, qhi_ref, q_ref, do_ref, segq_ref, lse_ref,
                    delta_ref, dk_ref, dv_ref, *, cfg: _Cfg):
  j = pl.program_id(0)
  bkb = cfg.bk_bwd
  s_pos = j * bkb + jnp.arange(bkb, dtype=jnp.int32)
  seg_k = segk_ref[...]

  def key_mask(t_pos, rows):
    return _raw_mask(t_pos, s_pos, segq_ref[rows], seg_k, cfg.window)

  q_lo = jax.lax.div(j * bkb, cfg.bq_bwd)
  q_hi = _cdiv(jnp.max(qhi_ref[...]), cfg.bq_bwd)
  dk, dv = _dkv_loop(cfg, k_ref[...], v_ref[...], key_mask, q_ref, do_ref, lse_ref, delta_ref,
                     q_lo, q_hi)
  dk_ref[...] = (dk * cfg.scale).astype(dk_ref.dtype)
  dv_ref[...] = dv.astype(dv_ref.dtype)


def _dkv_entry_kernel(ek_ref, ev_ref, eends_ref, eseg_ref, eqlo_ref, eqhi_ref, q_ref, do_ref,
                      segq_ref, lse_ref, delta_ref, dk_ref, dv_ref, *, cfg: _Cfg):
  ends, seg_e = eends_ref[...], eseg_ref[...]

  def key_mask(t_pos, rows):
    return _entry_mask(t_pos, ends, segq_ref[rows], seg_e)

  q_lo = jax.lax.div(jnp.min(eqlo_ref[...]), cfg.bq_bwd)
  q_hi = _cdiv(jnp.max(eqhi_ref[...]), cfg.bq_bwd)
  dk, dv = _dkv_loop(cfg, ek_ref[...], ev_ref[...], key_mask, q_ref, do_ref, lse_ref, delta_ref,
                     q_lo, q_hi)
  dk_ref[...] = (dk * cfg.scale).astype(dk_ref.dtype)
  dv_ref[...] = dv.astype(dv_ref.dtype)


def _backward_kernels(cfg: _Cfg, res, do):
  q, k, v, seg, ek, ev, eends, eseg, sink_hq, kvlo, elo, ehi, kqhi, eqlo, eqhi, o, lse = res
  b, tp, h, dp = q.shape
  kh, cp, g = k.shape[2], ek.shape[1], cfg.group
  delta = jnp.einsum("bthd,bthd->bht", o.astype(_F32), do.astype(_F32))
  full_kv = pl.BlockSpec((None, tp, None, dp), lambda i, b_, h_: (b_, 0, h_ // g, 0))
  full_e = pl.BlockSpec((None, cp, None, dp), lambda i, b_, h_: (b_, 0, h_ // g, 0))
  q_vec = pl.BlockSpec((None, cfg.bq), lambda i, b_, h_: (b_, i))
  row_t = pl.BlockSpec((None, tp), lambda i, b_, h_: (b_, 0))
  row_c = pl.BlockSpec((None, cp), lambda i, b_, h_: (b_, 0))
  head_t = pl.BlockSpec((None, None, cfg.bq), lambda i, b_, h_: (b_, h_, i))
  dq = pl.pallas_call(
      functools.partial(_dq_kernel, cfg=cfg),
      grid=(tp // cfg.bq, b, h),
      in_specs=[_q_spec(cfg, dp), full_kv, full_kv, q_vec, row_t, full_e, full_e, row_c, row_c,
                q_vec, q_vec, q_vec, _q_spec(cfg, dp), head_t, head_t],
      out_specs=_q_spec(cfg, dp),
      out_shape=jax.ShapeDtypeStruct(q.shape, q.dtype),
      compiler_params=cfg.params,
      interpret=cfg.interpret,
      name="chunk_attention_dq",
  )(q, k, v, seg, seg, ek, ev, eends, eseg, kvlo, elo, ehi, do, lse, delta)

  # dk/dv programs see every query head of their group: G heads of q, do, lse and delta.
  group_q = pl.BlockSpec((None, tp, g, dp), lambda j, b_, kv: (b_, 0, kv, 0))
  group_t = pl.BlockSpec((None, g, tp), lambda j, b_, kv: (b_, kv, 0))
  seg_all = pl.BlockSpec((None, tp), lambda j, b_, kv: (b_, 0))
  common = [group_q, group_q, seg_all, group_t, group_t]
  dk = dv = jnp.zeros(k.shape, k.dtype)
  if cfg.window > 0:
    key_tile = pl.BlockSpec((None, cfg.bk_bwd, None, dp), lambda j, b_, kv: (b_, j, kv, 0))
    key_vec = pl.BlockSpec((None, cfg.bk_bwd), lambda j, b_, kv: (b_, j))
    dk, dv = pl.pallas_call(
        functools.partial(_dkv_raw_kernel, cfg=cfg),
        grid=(tp // cfg.bk_bwd, b, kh),
        in_specs=[key_tile, key_tile, key_vec, key_vec] + common,
        out_specs=[key_tile, key_tile],
        out_shape=[jax.ShapeDtypeStruct(k.shape, k.dtype)] * 2,
        compiler_params=cfg.params,
        interpret=cfg.interpret,
        name="chunk_attention_dkv_raw",
    )(k, v, seg, kqhi, q, do, seg, lse, delta)
  entry_tile = pl.BlockSpec((None, cfg.bc_bwd, None, dp), lambda j, b_, kv: (b_, j, kv, 0))
  entry_vec = pl.BlockSpec((None, cfg.bc_bwd), lambda j, b_, kv: (b_, j))
  dek, dev = pl.pallas_call(
      functools.partial(_dkv_entry_kernel, cfg=cfg),
      grid=(cp // cfg.bc_bwd, b, kh),
      in_specs=[entry_tile, entry_tile, entry_vec, entry_vec, entry_vec, entry_vec] + common,
      out_specs=[entry_tile, entry_tile],
      out_shape=[jax.ShapeDtypeStruct(ek.shape, ek.dtype)] * 2,
      compiler_params=cfg.params,
      interpret=cfg.interpret,
      name="chunk_attention_dkv_entries",
  )(ek, ev, eends, eseg, eqlo, eqhi, q, do, seg, lse, delta)
  # The sink has value zero: d sink_h = -sum_t p_sink(t) * delta(t).
  dsink = -jnp.sum(jnp.exp(sink_hq[:, :1].T[:, :, None] - lse) * delta, axis=(0, 2))
  dsink_hq = jnp.zeros_like(sink_hq).at[:, 0].set(dsink)
  return dq, dk, dv, dek, dev, dsink_hq


@functools.partial(jax.custom_vjp, nondiff_argnums=(0,))
def _attention(cfg, q, k, v, seg, ek, ev, eends, eseg, sink_hq, kvlo, elo, ehi, kqhi, eqlo,
               eqhi):
  del kqhi, eqlo, eqhi
  return _forward(cfg, q, k, v, seg, ek, ev, eends, eseg, sink_hq, kvlo, elo, ehi)[0]


def _attention_fwd(cfg, *args):
  q, k, v, seg, ek, ev, eends, eseg, sink_hq, kvlo, elo, ehi = args[:12]
  o, lse = _forward(cfg, q, k, v, seg, ek, ev, eends, eseg, sink_hq, kvlo, elo, ehi)
  return o, args + (o, lse)


def _attention_bwd(cfg, res, do):
  dq, dk, dv, dek, dev, dsink = _backward_kernels(cfg, res, do)
  return (dq, dk, dv, None, dek, dev, None, None, dsink) + (None,) * 6


_attention.defvjp(_attention_fwd, _attention_bwd)


def _config(block_sizes: AttentionBlockSizes, t: int, c: int, window: int, scale: float,
            group: int, interpret: bool):
  bs = block_sizes
  return _Cfg(window=window, scale=scale, group=group, bq=gpu_tile(bs.block_q, t),
              bk=gpu_tile(bs.block_k, t), bc=gpu_tile(bs.block_c, c),
              bq_bwd=gpu_tile(bs.block_q_bwd, t), bk_bwd=gpu_tile(bs.block_k_bwd, t),
              bc_bwd=gpu_tile(bs.block_c_bwd, c), num_warps=bs.num_warps,
              num_stages=bs.num_stages, interpret=bool(interpret))


def chunk_attention_gpu(q_BxTxHxD, k_BxTxKxD, v_BxTxKxD, segment_ids_BxT, entry_k_BxCxKxD,
                        entry_v_BxCxKxD, entry_ends_BxC, entry_segment_ids_BxC, *, sink_H,
                        window: int, scale: float, interpret, block_sizes: AttentionBlockSizes):
  """Pallas Triton implementation of ``kernels.chunk_attention`` (same semantics)."""
  b, t, h, d = q_BxTxHxD.shape
  kh, c = k_BxTxKxD.shape[2], entry_k_BxCxKxD.shape[1]
  cfg = _config(block_sizes, t, c, window, scale, h // kh, interpret)
  tp = round_up(t, max(cfg.bq, cfg.bk, cfg.bq_bwd, cfg.bk_bwd))
  cp = round_up(max(c, 1), max(cfg.bc, cfg.bc_bwd))  # C = 0: one block of padding entries
  dp = max(16, next_power_of_2(d))
  pad_td = lambda x: pad_to(pad_to(x, 1, tp), 3, dp)
  pad_cd = lambda x: pad_to(pad_to(x, 1, cp), 3, dp)
  seg = pad_to(segment_ids_BxT.astype(jnp.int32), 1, tp, mode="edge")
  eends = pad_to(entry_ends_BxC.astype(jnp.int32), 1, cp, layout.PAD_END)
  eseg = pad_to(entry_segment_ids_BxC.astype(jnp.int32), 1, cp, layout.PAD_SEGMENT)
  # Ranges are plain integer work on [B, T] and [B, C]; XLA computes them once per call.
  kvlo = layout.raw_key_start(seg, window)
  elo, ehi = layout.visible_entry_range(eends, eseg, seg)
  kqhi = jnp.minimum(jnp.arange(tp, dtype=jnp.int32) + window, layout.document_ends(seg))
  eqlo, eqhi = layout.entry_query_range(eends, seg)
  sink = jnp.full((h,), -jnp.inf, _F32) if sink_H is None else sink_H.astype(_F32)
  sink_hq = jnp.broadcast_to(sink[:, None], (h, cfg.bq))
  o = _attention(cfg, pad_td(q_BxTxHxD), pad_td(k_BxTxKxD), pad_td(v_BxTxKxD), seg,
                 pad_cd(entry_k_BxCxKxD), pad_cd(entry_v_BxCxKxD), eends, eseg, sink_hq, kvlo,
                 elo, ehi, kqhi, eqlo, eqhi)
  return o[:, :t, :, :d]
