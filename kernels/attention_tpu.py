"""chunk_attention on TPU: Pallas Mosaic kernels with scalar-prefetched block ranges.

Forward and dq: grid (B, H, query blocks, steps). The step axis walks first over the raw-key
blocks of the query block's window, then over its visible entry blocks. Per query block the
first block and the block count of each source are computed in XLA and scalar-prefetched into
SMEM; the key/entry index maps read them, so a step past the block's range repeats the previous
block index (Pallas skips the DMA) and ``pl.when`` skips its compute. The static step count is
the worst case (window blocks + all entry blocks); skipped steps cost only grid overhead.

dk/dv (``attention_tpu_dkv``): grid (B, K, key or entry blocks, steps); the steps walk over the
H/K query heads of the group times the query blocks that can see the key block (prefetched
ranges again), so GQA/MQA gradients are summed in VMEM.

Interior tiles (every query of the tile sees every key or entry of it) run without a mask, in
every kernel: per key and per entry block the bounds of its columns' query ranges
(``layout.key_columns``, ``layout.column_block_bounds``) are scalar-prefetched too, and each
step takes the masked or the unmasked branch by two scalar compares.

Layout: tensors heads-major (B, H, T, D), as Mosaic tiles the last two dimensions. Per-row
scalars follow splash attention: a column (one value per sublane row) is stored broadcast over
128 lanes, a row (one value per lane) broadcast over 8 sublanes; the running max and sum are
replicated over 128 lanes.
"""

from __future__ import annotations

import dataclasses
import functools
import math

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from kernels import layout
from kernels.attention_tpu_dkv import dkv_call
from kernels.block_sizes import AttentionBlockSizes
from kernels.padding import pad_to, round_up
from kernels.tpu_common import (
  F32,
  LANES,
  NN,
  NT,
  SUBLANES,
  clamp_step,
  dot,
  init_softmax,
  online_update,
)


@dataclasses.dataclass(frozen=True)
class _Cfg:
  window: int
  scale: float
  group: int
  bq: int
  bk: int
  bc: int
  nq: int  # query blocks
  raw_steps: int  # static worst-case raw-key blocks per query block
  entry_steps: int  # static worst-case entry blocks per query block
  raw_q_steps: int  # static worst-case query blocks per raw-key block
  interpret: object


def tpu_tile(requested: int, length: int) -> int:
  """The whole (8-aligned) length if it fits in one tile, else the requested tile."""
  if length <= requested:
    return round_up(length, SUBLANES)
  return requested


def _columns(x_BxL):
  return jnp.broadcast_to(x_BxL[:, :, None], x_BxL.shape + (LANES,))


def _rows(x_BxL):
  return jnp.broadcast_to(x_BxL[:, None, :], (x_BxL.shape[0], SUBLANES, x_BxL.shape[1]))


Q_MAJOR_PREFETCH = 8  # forward / dq: 4 per-query-block ranges, 4 per-column-block bounds


# ------------------------------------------------------------------ forward and dq (q-major)


def _q_major_specs(cfg: _Cfg, h: int, d: int):
  """Index maps shared by the forward and dq kernels (``Q_MAJOR_PREFETCH`` arrays: 4 [B, nq]
  ranges, then the raw-key and entry blocks' bounds)."""
  g = cfg.group

  def raw_block(b, i, j, raw_lo, raw_n, *_):
    return raw_lo[b, i] + clamp_step(j, raw_n[b, i])

  def entry_block(b, i, j, raw_lo, raw_n, ent_lo, ent_n, *_):
    del raw_lo, raw_n
    return ent_lo[b, i] + clamp_step(j - cfg.raw_steps, ent_n[b, i])

  kv_head = lambda h: jax.lax.div(h, g)
  return dict(
      q=pl.BlockSpec((None, None, cfg.bq, d), lambda b, h, i, j, *_: (b, h, i, 0)),
      col=pl.BlockSpec((None, None, cfg.bq, LANES), lambda b, h, i, j, *_: (b, h, i, 0)),
      qseg=pl.BlockSpec((None, cfg.bq, LANES), lambda b, h, i, j, *_: (b, i, 0)),
      k=pl.BlockSpec((None, None, cfg.bk, d),
                     lambda b, h, i, j, *p: (b, kv_head(h), raw_block(b, i, j, *p), 0)),
      kseg=pl.BlockSpec((None, SUBLANES, cfg.bk),
                        lambda b, h, i, j, *p: (b, 0, raw_block(b, i, j, *p))),
      e=pl.BlockSpec((None, None, cfg.bc, d),
                     lambda b, h, i, j, *p: (b, kv_head(h), entry_block(b, i, j, *p), 0)),
      erow=pl.BlockSpec((None, SUBLANES, cfg.bc),
                        lambda b, h, i, j, *p: (b, 0, entry_block(b, i, j, *p))),
      sink=pl.BlockSpec((SUBLANES, h), lambda *_: (0, 0), memory_space=pltpu.SMEM),
  )


def _q_major_steps(cfg: _Cfg, prefetch, raw_step, entry_step):
  """Runs raw_step / entry_step on the active steps of this program.

  Each gets a mask function, or None on an interior tile (no mask to build or apply): raw
  ``mask(s, kseg_rows, seg_q)``, entries ``mask(s, ends_rows, eseg_rows, seg_q)``, with ``s``
  the query x key score tile.
  """
  raw_lo, raw_n, ent_lo, ent_n, raw_lo_max, raw_hi_min, ent_lo_max, ent_hi_min = prefetch
  b, i, j = pl.program_id(0), pl.program_id(2), pl.program_id(3)
  first, last = i * cfg.bq, i * cfg.bq + cfg.bq - 1
  t_pos = lambda shape: first + jax.lax.broadcasted_iota(jnp.int32, shape, 0)

  def run(active, interior, step, mask_fn):
    pl.when(active & interior)(lambda: step(None))
    pl.when(active & jnp.logical_not(interior))(lambda: step(mask_fn))

  # Blocks as the index maps clamp them: an inactive step reads in-range bounds.
  if cfg.window > 0:
    block = raw_lo[b, i] + clamp_step(j, raw_n[b, i])
    run((j < cfg.raw_steps) & (j < raw_n[b, i]),
        (raw_lo_max[b, block] <= first) & (raw_hi_min[b, block] > last), raw_step,
        lambda s, kseg, seg_q: _raw_mask_q_major(cfg, t_pos(s.shape), block, kseg, seg_q))

  e = j - cfg.raw_steps
  block = ent_lo[b, i] + clamp_step(e, ent_n[b, i])
  run((e >= 0) & (e < ent_n[b, i]),
      (ent_lo_max[b, block] <= first) & (ent_hi_min[b, block] > last), entry_step,
      lambda s, ends, eseg, seg_q: (ends[:1, :] <= t_pos(s.shape)) & (eseg[:1, :] == seg_q))


def _raw_mask_q_major(cfg: _Cfg, t_pos, block, kseg, seg_q):
  s_pos = block * cfg.bk + jax.lax.broadcasted_iota(jnp.int32, t_pos.shape, 1)
  return (s_pos <= t_pos) & (s_pos > t_pos - cfg.window) & (kseg[:1, :] == seg_q)


def _fwd_kernel(*refs, cfg: _Cfg):
  prefetch, refs = refs[:Q_MAJOR_PREFETCH], list(refs[Q_MAJOR_PREFETCH:])
  q_ref, qseg_ref = refs.pop(0), refs.pop(0)
  k_ref, v_ref, kseg_ref = (refs.pop(0), refs.pop(0), refs.pop(0)) if cfg.window else (None,) * 3
  ek_ref, ev_ref, eends_ref, eseg_ref, sink_ref, o_ref, lse_ref, m_sc, l_sc, acc_sc = refs
  h, j = pl.program_id(1), pl.program_id(3)

  @pl.when(j == 0)
  def _init():
    init_softmax(m_sc, l_sc, acc_sc, sink_ref[0, h])

  def update(s, mask, v):
    online_update(m_sc, l_sc, acc_sc, s, mask, v)

  q = q_ref[...]
  seg_q = qseg_ref[...][:, :1]  # bq x 1

  def raw_step(mask_fn):
    s = dot(q, k_ref[...], NT) * cfg.scale
    update(s, mask_fn and mask_fn(s, kseg_ref[...], seg_q), v_ref[...])

  def entry_step(mask_fn):
    s = dot(q, ek_ref[...], NT) * cfg.scale
    update(s, mask_fn and mask_fn(s, eends_ref[...], eseg_ref[...], seg_q), ev_ref[...])

  _q_major_steps(cfg, prefetch, raw_step, entry_step)

  @pl.when(j == cfg.raw_steps + cfg.entry_steps - 1)
  def _finish():
    denom = l_sc[...]
    seen = denom > 0
    o_ref[...] = (acc_sc[...] / jnp.where(seen, denom, 1.0)[:, :1]).astype(o_ref.dtype)
    # Rows that saw nothing get lse 0: the backward masks every logit of such a row anyway.
    m = jnp.where(m_sc[...] == -jnp.inf, 0.0, m_sc[...])
    lse_ref[...] = jnp.where(seen, m + jnp.log(jnp.where(seen, denom, 1.0)), 0.0)


def _dq_kernel(*refs, cfg: _Cfg):
  prefetch, refs = refs[:Q_MAJOR_PREFETCH], list(refs[Q_MAJOR_PREFETCH:])
  q_ref, qseg_ref = refs.pop(0), refs.pop(0)
  k_ref, v_ref, kseg_ref = (refs.pop(0), refs.pop(0), refs.pop(0)) if cfg.window else (None,) * 3
  ek_ref, ev_ref, eends_ref, eseg_ref, do_ref, lse_ref, delta_ref, dq_ref, acc_sc = refs
  j = pl.program_id(3)

  @pl.when(j == 0)
  def _init():
    acc_sc[...] = jnp.zeros(acc_sc.shape, F32)

  q, do = q_ref[...], do_ref[...]
  seg_q = qseg_ref[...][:, :1]

  def grad_step(s, mask, k, v):
    p = jnp.exp(s - lse_ref[...][:, :1])
    if mask is not None:
      p = jnp.where(mask, p, 0.0)
    ds = p * (dot(do, v, NT) - delta_ref[...][:, :1])
    acc_sc[...] += dot(ds.astype(k.dtype), k, NN)

  def raw_step(mask_fn):
    k = k_ref[...]
    s = dot(q, k, NT) * cfg.scale
    grad_step(s, mask_fn and mask_fn(s, kseg_ref[...], seg_q), k, v_ref[...])

  def entry_step(mask_fn):
    ek = ek_ref[...]
    s = dot(q, ek, NT) * cfg.scale
    grad_step(s, mask_fn and mask_fn(s, eends_ref[...], eseg_ref[...], seg_q), ek,
              ev_ref[...])

  _q_major_steps(cfg, prefetch, raw_step, entry_step)

  @pl.when(j == cfg.raw_steps + cfg.entry_steps - 1)
  def _finish():
    dq_ref[...] = (acc_sc[...] * cfg.scale).astype(dq_ref.dtype)


def _q_major_call(kernel, cfg: _Cfg, prefetch, q, k, v, qseg, kseg, ek, ev, eends, eseg, extra,
                  extra_specs, out_shape, out_specs, scratch, name):
  specs = _q_major_specs(cfg, q.shape[1], q.shape[-1])
  raw = [k, v, kseg] if cfg.window else []
  raw_specs = [specs["k"], specs["k"], specs["kseg"]] if cfg.window else []
  b, h, tp = q.shape[:3]
  return pl.pallas_call(
      functools.partial(kernel, cfg=cfg),
      grid_spec=pltpu.PrefetchScalarGridSpec(
          num_scalar_prefetch=Q_MAJOR_PREFETCH,
          grid=(b, h, cfg.nq, cfg.raw_steps + cfg.entry_steps),
          in_specs=[specs["q"], specs["qseg"]] + raw_specs
          + [specs["e"], specs["e"], specs["erow"], specs["erow"]]
          + [specs[s] for s in extra_specs],
          out_specs=[specs[s] for s in out_specs],
          scratch_shapes=scratch),
      out_shape=out_shape,
      compiler_params=pltpu.CompilerParams(
          dimension_semantics=("parallel", "parallel", "parallel", "arbitrary")),
      interpret=cfg.interpret,
      name=name,
  )(*prefetch, q, qseg, *raw, ek, ev, eends, eseg, *extra)


# ------------------------------------------------------------------ ranges, custom VJP, API


def _ranges(cfg: _Cfg, seg, eends, eseg, doc_start, doc_end):
  """Scalar-prefetch arrays: per query block (forward, dq) and per key/entry block (dk, dv),
  each kernel's followed by the bounds of the raw-key and entry blocks' query ranges that
  decide which tiles are interior (``layout.column_block_bounds``)."""
  tp = seg.shape[1]
  cp = eends.shape[1]
  kvlo = layout.raw_key_start(seg, cfg.window, doc_start)
  elo, ehi = layout.visible_entry_range(eends, eseg, seg, doc_start)
  raw_lo, raw_n, ent_lo, ent_n = layout.query_key_blocks(kvlo, elo, ehi, cfg.bq, cfg.bk, cfg.bc,
                                                         cfg.window)
  # An entry block index past the entries (a query block that sees none) stays in range.
  fwd = (raw_lo, raw_n, jnp.minimum(ent_lo, cp // cfg.bc - 1), ent_n)
  # dk/dv: a key or entry block walks the query blocks that hold a query seeing one of its
  # columns (``layout.key_columns``: padding and foreign entries are seen by nobody).
  lo, hi = layout.key_columns(seg, eends, eseg, doc_end, cfg.window)

  def query_blocks(cols, block, clamp):
    first, stop = layout.column_query_blocks(lo[:, cols], hi[:, cols], block, cfg.bq)
    return jnp.minimum(first, cfg.nq - 1), jnp.clip(stop - first, 0, clamp)

  raw_bwd = query_blocks(slice(0, tp), cfg.bk, cfg.raw_q_steps)
  entry_bwd = query_blocks(slice(tp, None), cfg.bc, cfg.nq)
  raw_full = layout.column_block_bounds(lo[:, :tp], hi[:, :tp], cfg.bk)
  entry_full = layout.column_block_bounds(lo[:, tp:], hi[:, tp:], cfg.bc)
  as_int = lambda xs: tuple(x.astype(jnp.int32) for x in xs)
  return (as_int(fwd + raw_full + entry_full), as_int(raw_bwd + raw_full),
          as_int(entry_bwd + entry_full))


def _forward(cfg: _Cfg, q, k, v, seg, ek, ev, eends, eseg, sink, ranges):
  """Heads-major padded inputs -> (o_BxHxTpxD, lse_BxHxTpx128)."""
  b, h, tp, d = q.shape
  fwd, _, _ = ranges
  sink8 = jnp.broadcast_to(sink[None, :], (SUBLANES, h))
  return _q_major_call(
      _fwd_kernel, cfg, fwd, q, k, v, _columns(seg), _rows(seg), ek, ev, _rows(eends),
      _rows(eseg), [sink8], ["sink"],
      [jax.ShapeDtypeStruct(q.shape, q.dtype), jax.ShapeDtypeStruct((b, h, tp, LANES), F32)],
      ["q", "col"],
      [pltpu.VMEM((cfg.bq, LANES), F32), pltpu.VMEM((cfg.bq, LANES), F32),
       pltpu.VMEM((cfg.bq, d), F32)], "chunk_attention_fwd_tpu")


@functools.partial(jax.custom_vjp, nondiff_argnums=(0,))
def _attention(cfg, q, k, v, seg, ek, ev, eends, eseg, sink, ranges):
  return _forward(cfg, q, k, v, seg, ek, ev, eends, eseg, sink, ranges)[0]


def _attention_fwd(cfg, q, k, v, seg, ek, ev, eends, eseg, sink, ranges):
  o, lse = _forward(cfg, q, k, v, seg, ek, ev, eends, eseg, sink, ranges)
  return o, (q, k, v, seg, ek, ev, eends, eseg, sink, ranges, o, lse)


def _attention_bwd(cfg, res, do):
  q, k, v, seg, ek, ev, eends, eseg, sink, ranges, o, lse = res
  fwd, raw_bwd, entry_bwd = ranges
  delta = jnp.sum(o.astype(F32) * do.astype(F32), axis=-1)  # B x H x Tp
  lse_t = lse[..., 0]
  delta_col = jnp.broadcast_to(delta[..., None], delta.shape + (LANES,))
  dq = _q_major_call(
      _dq_kernel, cfg, fwd, q, k, v, _columns(seg), _rows(seg), ek, ev, _rows(eends),
      _rows(eseg), [do, lse, delta_col], ["q", "col", "col"],
      [jax.ShapeDtypeStruct(q.shape, q.dtype)], ["q"], [pltpu.VMEM((cfg.bq, q.shape[-1]), F32)],
      "chunk_attention_dq_tpu")[0]
  hrows = lambda x: jnp.broadcast_to(x[:, :, None, :], x.shape[:2] + (SUBLANES, x.shape[2]))
  common = (q, do, _rows(seg), hrows(lse_t), hrows(delta))
  dk = dv = jnp.zeros_like(k)
  if cfg.window:
    dk, dv = dkv_call(cfg, raw_bwd, k, v, [_columns(seg)], *common, entries=False)
  dek, dev = dkv_call(cfg, entry_bwd, ek, ev, [_columns(eends), _columns(eseg)], *common,
                       entries=True)
  # The sink has value zero: d sink_h = -sum_t p_sink(t) * delta(t).
  dsink = -jnp.sum(jnp.exp(sink[None, :, None] - lse_t) * delta, axis=(0, 2))
  return dq, dk, dv, None, dek, dev, None, None, dsink, None


_attention.defvjp(_attention_fwd, _attention_bwd)


def _config(bs: AttentionBlockSizes, t: int, c: int, window: int, scale: float, group: int,
            interpret):
  bq, bk, bc = tpu_tile(bs.block_q, t), tpu_tile(bs.block_k, t), tpu_tile(bs.block_c, max(c, 1))
  tp = round_up(t, math.lcm(bq, bk))
  cp = round_up(max(c, 1), bc)  # C = 0: one block of padding entries
  nq = tp // bq
  raw_steps = 0 if window == 0 else min(tp // bk, -(-(bq + window - 1) // bk) + 1)
  raw_q_steps = min(nq, -(-(bk + window - 1) // bq) + 1)
  return _Cfg(window=window, scale=scale, group=group, bq=bq, bk=bk, bc=bc, nq=nq,
              raw_steps=raw_steps, entry_steps=cp // bc, raw_q_steps=raw_q_steps,
              interpret=interpret), tp, cp


def chunk_attention_tpu(q_BxTxHxD, k_BxTxKxD, v_BxTxKxD, segment_ids_BxT, entry_k_BxCxKxD,
                        entry_v_BxCxKxD, entry_ends_BxC, entry_segment_ids_BxC, *, sink_H,
                        window: int, scale: float, interpret, block_sizes: AttentionBlockSizes,
                        row_layout: layout.RowLayout | None = None):
  """Pallas Mosaic implementation of ``kernels.chunk_attention`` (same semantics); ``row_layout``
  as for ``attention_gpu.chunk_attention_gpu``."""
  interpret = interpret if isinstance(interpret, pltpu.InterpretParams) else bool(interpret)
  b, t, h, d = q_BxTxHxD.shape
  kh, c = k_BxTxKxD.shape[2], entry_k_BxCxKxD.shape[1]
  cfg, tp, cp = _config(block_sizes, t, c, window, scale, h // kh, interpret)
  heads_major = lambda x, n: jnp.swapaxes(pad_to(x, 1, n), 1, 2)
  seg = pad_to(segment_ids_BxT.astype(jnp.int32), 1, tp, mode="edge")
  eends = pad_to(entry_ends_BxC.astype(jnp.int32), 1, cp, layout.PAD_END)
  eseg = pad_to(entry_segment_ids_BxC.astype(jnp.int32), 1, cp, layout.PAD_SEGMENT)
  sink = jnp.full((h,), -jnp.inf, F32) if sink_H is None else sink_H.astype(F32)
  # The kernels' scalar-prefetch arrays, once per call (the backward reuses them).
  ranges = _ranges(cfg, seg, eends, eseg, *layout.padded_document_bounds(
      layout.row_layout(segment_ids_BxT) if row_layout is None else row_layout, tp))
  o = _attention(cfg, heads_major(q_BxTxHxD, tp), heads_major(k_BxTxKxD, tp),
                 heads_major(v_BxTxKxD, tp), seg, heads_major(entry_k_BxCxKxD, cp),
                 heads_major(entry_v_BxCxKxD, cp), eends, eseg, sink, ranges)
  return jnp.swapaxes(o, 1, 2)[:, :t]
