"""Executed against useful work of the chunk-attention kernels, counted from their loop bounds.

numpy only (no device, no tracing): for one row's layout (documents, entry ends, window) and the
tiles a kernel runs with, ``count`` replays the kernel's loop bounds program by program and
returns how many tiles it computes (``executed``), how many tiles hold at least one visible
(query, key) pair (``needed``), and the visible pairs themselves (``useful_pairs``) against
the pairs its tiles cover (``executed_pairs``), and how many of the executed tiles build and
apply a mask (``masked``: every kernel runs interior tiles unmasked). Counts are per
query head (the dk/dv kernels loop over a kv head's G query heads, G tiles per kv-head program:
the same per query head). The GPU dk/dv kernel is one kernel over raw-key and entry columns
alike (``layout.key_columns``); ``gpu_dkv_raw`` and ``gpu_dkv_entries`` count its
programs over each source, and the GPU forward and dq tile entries by their key block.

The bounds mirror ``attention_gpu``, ``attention_mgpu`` (64-row tiles; ``grid_steps``: the steps its
programs walk, the union of their tiles' ranges) and ``attention_tpu`` (whose grid also walks a
static worst-case step count: ``grid_steps``) exactly: padding of T, C and the edge-padded segment
ids included. ``missed`` counts needed tiles outside the loops (a kernel with ``missed > 0`` would
drop visible scores; tests/test_kernel_tiles.py checks it is zero).
"""

from __future__ import annotations

import dataclasses

import numpy as np

from kernels.block_sizes import AttentionBlockSizes
from kernels.layout import PAD_END

KERNELS = ("gpu_fwd", "gpu_dq", "gpu_dkv_raw", "gpu_dkv_entries", "mgpu_fwd", "tpu_fwd",
           "tpu_dq", "tpu_dkv_raw", "tpu_dkv_entries")


@dataclasses.dataclass(frozen=True)
class Tiles:
  """Tile sizes of one kernel family (forward/dq tiles and dk/dv tiles)."""

  bq: int
  bk: int
  bc: int
  bq_bwd: int
  bk_bwd: int
  bc_bwd: int
  bq_fwd: int = 0  # tokens per GPU forward program (0: bq; bq / G with one program per kv head)
  program_rows: int = 0  # Mosaic GPU forward: rows per program (its 64-row warpgroups' union)


@dataclasses.dataclass(frozen=True)
class Count:
  executed: int  # tiles computed
  needed: int  # tiles holding >= 1 visible pair
  missed: int  # needed tiles not computed (must be 0)
  executed_pairs: int  # executed tiles x tile area
  useful_pairs: int  # visible (query, key) pairs of real tokens
  grid_steps: int  # programs x inner steps the grid walks (TPU: static worst case)
  masked: int = -1  # executed tiles that build and apply a mask (-1: every executed one)

  def __post_init__(self):
    if self.masked < 0:
      object.__setattr__(self, "masked", self.executed)

  @property
  def tile_ratio(self) -> float:
    return self.executed / max(self.needed, 1)

  @property
  def pair_ratio(self) -> float:
    return self.executed_pairs / max(self.useful_pairs, 1)


def gpu_tiles(block_sizes: AttentionBlockSizes, t: int, c: int, group: int = 1) -> Tiles:
  """The tiles ``attention_gpu`` runs with for T = t, C = c and G = group query heads per kv
  head (clamped and grouped as its ``_config``)."""
  from kernels import attention_gpu

  del c  # raw keys and entries share one column axis: entries are tiled as raw keys
  cfg = attention_gpu._config(block_sizes, t, 0, 1.0, group, True)
  return Tiles(cfg.bq, cfg.bk, cfg.bk, cfg.bq_bwd, cfg.bk_bwd, cfg.bk_bwd, cfg.bq_fwd)


def mgpu_tiles(block_sizes: AttentionBlockSizes, t: int, c: int, group: int = 1) -> Tiles:
  """The tiles ``attention_mgpu`` runs with (64-row tiles, one key block size for raw keys and
  entries, ``program_rows`` per program), beside the Triton backward's."""
  from kernels import attention_gpu, attention_mgpu

  mosaic = dataclasses.replace(block_sizes, forward="mosaic")
  del c
  cfg = attention_gpu._config(mosaic, t, 0, 1.0, group, True)
  bk = attention_mgpu.key_block(cfg)
  return Tiles(attention_mgpu.ROWS, bk, bk, cfg.bq_bwd, cfg.bk_bwd, cfg.bk_bwd,
               attention_mgpu.ROWS, attention_mgpu.program_rows(cfg))


def tpu_tiles(block_sizes: AttentionBlockSizes, t: int, c: int) -> Tiles:
  """The tiles ``attention_tpu`` runs with (one set for forward and backward)."""
  clamp = lambda n, length: _round_up(length, 8) if length <= n else n
  bs = block_sizes
  bq, bk, bc = clamp(bs.block_q, t), clamp(bs.block_k, t), clamp(bs.block_c, max(c, 1))
  return Tiles(bq, bk, bc, bq, bk, bc)


def _round_up(n: int, m: int) -> int:
  return -(-n // m) * m


def _cdiv(a, b):
  return -(-a // b)


def _doc_bounds(seg_T: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
  """(document start, one past document end) of every position (documents = contiguous runs)."""
  t = seg_T.shape[0]
  pos = np.arange(t)
  is_start = np.r_[True, seg_T[1:] != seg_T[:-1]]
  is_last = np.r_[seg_T[1:] != seg_T[:-1], True]
  start = np.maximum.accumulate(np.where(is_start, pos, 0))
  end = np.minimum.accumulate(np.where(is_last, pos + 1, t)[::-1])[::-1]
  return start, end


def _intervals(seg_T, ends_C, window, t_real):
  """Per query: raw keys [rlo, rhi) and entries [elo, ehi) it sees (padded layout)."""
  tp = seg_T.shape[0]
  pos = np.arange(tp)
  doc_start, doc_end = _doc_bounds(seg_T)
  rlo = np.maximum(pos - window + 1, doc_start)
  rhi = np.where(window > 0, pos + 1, rlo)
  elo = np.searchsorted(ends_C, doc_start, side="left")
  ehi = np.maximum(np.searchsorted(ends_C, pos, side="right"), elo)
  # Useful pairs: real queries and real keys only.
  real = pos < t_real
  rhi_real = np.minimum(rhi, t_real)
  return (rlo, rhi, elo, ehi, doc_end,
          int(np.sum(np.where(real, np.maximum(rhi_real - rlo, 0), 0))),
          int(np.sum(np.where(real, ehi - elo, 0))))


def _needed(lo_T, hi_T, real_T, bq, bk, nk):
  """needed[i, j]: query block i (rows of bq) and key block j (bk) share a visible pair."""
  nq = lo_T.shape[0] // bq
  diff = np.zeros((nq, nk + 1), np.int64)
  ok = real_T & (hi_T > lo_T)
  rows = np.arange(lo_T.shape[0])[ok] // bq
  np.add.at(diff, (rows, lo_T[ok] // bk), 1)
  np.add.at(diff, (rows, (hi_T[ok] - 1) // bk + 1), -1)
  return np.cumsum(diff, axis=1)[:, :nk] > 0


def _ran(lo_N, hi_N, n_inner):
  """ran[i, j]: program i's loop covers inner block j (ranges [lo, hi), clipped)."""
  j = np.arange(n_inner)
  return (j[None, :] >= lo_N[:, None]) & (j[None, :] < hi_N[:, None])


def _count(ran, needed, area, useful, grid_steps, masked=-1):
  return Count(executed=int(ran.sum()), needed=int(needed.sum()), missed=int(
      (needed & ~ran).sum()), executed_pairs=int(ran.sum()) * area, useful_pairs=useful,
      grid_steps=int(grid_steps), masked=masked)


def count(kernel: str, segment_ids_T, entry_ends_C, window: int, tiles: Tiles) -> Count:
  """Executed and useful work of ``kernel`` (one of ``KERNELS``) on one row's layout.

  ``segment_ids_T``: documents as contiguous runs; ``entry_ends_C``: visible-from positions,
  sorted, ``PAD_END`` for padding (``kernels.chunk_structure``'s layout). Tile sizes are the
  ones the kernel runs with after clamping to the lengths (``gpu_tile`` / ``tpu_tile``).
  """
  if kernel not in KERNELS:
    raise ValueError(f"kernel must be one of {KERNELS}, got {kernel!r}")
  seg = np.asarray(segment_ids_T)
  ends = np.asarray(entry_ends_C, np.int64)
  t, c = seg.shape[0], max(ends.shape[0], 1)
  x = tiles
  tpu = kernel.startswith("tpu")
  if tpu:
    tp = _round_up(t, np.lcm(x.bq, x.bk))
    cp = _round_up(c, x.bc)
    x = dataclasses.replace(x, bq_bwd=x.bq, bk_bwd=x.bk, bc_bwd=x.bc)  # one tile set on TPU
  else:  # GPU: powers of two, so the largest tile is a multiple of the others
    tp = _round_up(t, max(x.bq, x.bk, x.bq_bwd, x.bk_bwd, x.program_rows))
    cp = _round_up(c, max(x.bc, x.bc_bwd))
  seg_p = np.concatenate([seg, np.full(tp - t, seg[-1])])  # edge padding, as the kernels
  ends_p = np.concatenate([ends, np.full(cp - ends.shape[0], PAD_END)])
  rlo, rhi, elo, ehi, doc_end, raw_useful, entry_useful = _intervals(seg_p, ends_p, window, t)
  real = np.arange(tp) < t
  per = lambda a, n: a.reshape(-1, n)
  if kernel in ("gpu_fwd", "gpu_dq") and x.bq_fwd:  # token tile of a per-kv-head program
    x = dataclasses.replace(x, bq=x.bq_fwd)
  if kernel.endswith(("fwd", "dq")):
    nq = tp // x.bq
    raw_need = _needed(rlo, rhi, real, x.bq, x.bk, tp // x.bk)
    raw_need[:, np.arange(tp // x.bk) * x.bk >= t] = False
    ent_need = _needed(elo, ehi, real, x.bq, x.bc, cp // x.bc)
    raw_lo = per(rlo, x.bq).min(axis=1) // x.bk
    raw_hi = _cdiv(np.arange(nq) * x.bq + x.bq, x.bk)
    ent_lo = per(elo, x.bq).min(axis=1) // x.bc
    ent_hi = _cdiv(per(ehi, x.bq).max(axis=1), x.bc)
    raw_steps = ent_steps = 0
    if tpu:
      raw_steps = 0 if window == 0 else min(tp // x.bk, _cdiv(x.bq + window - 1, x.bk) + 1)
      raw_hi = np.minimum(raw_hi, raw_lo + raw_steps)
      ent_steps = cp // x.bc
    raw = _ran(raw_lo, raw_hi, tp // x.bk) if window > 0 else np.zeros_like(raw_need)
    ent = _ran(ent_lo, ent_hi, cp // x.bc)
    # Interior blocks (seen in full by every query of the tile) run without a mask.
    raw_full = _ran(_cdiv(per(rlo, x.bq).max(axis=1), x.bk), (np.arange(nq) * x.bq + 1) // x.bk,
                    tp // x.bk)
    ent_full = _ran(_cdiv(per(elo, x.bq).max(axis=1), x.bc), per(ehi, x.bq).min(axis=1) // x.bc,
                    cp // x.bc)
    masked = int((raw & ~raw_full).sum() + (ent & ~ent_full).sum())
    steps = nq * (raw_steps + ent_steps) if tpu else int(raw.sum() + ent.sum())
    if kernel == "mgpu_fwd":  # one loop per program over the union of its tiles' ranges
      per_program = lambda lo, hi: np.maximum(
          per(hi, x.program_rows // x.bq)[:, -1] - per(lo, x.program_rows // x.bq)[:, 0], 0)
      steps = int((per_program(raw_lo, raw_hi).sum() if window > 0 else 0)
                  + per_program(ent_lo, ent_hi).sum())
    r = _count(raw, raw_need, x.bq * x.bk, raw_useful, 0)
    e = _count(ent, ent_need, x.bq * x.bc, entry_useful, 0)
    return Count(r.executed + e.executed, r.needed + e.needed, r.missed + e.missed,
                 r.executed_pairs + e.executed_pairs, raw_useful + entry_useful, int(steps),
                 masked)
  if kernel.endswith("dkv_raw"):
    if window == 0:
      return Count(0, 0, 0, 0, 0, 0)
    nk, nq = tp // x.bk_bwd, tp // x.bq_bwd
    need = _needed(rlo, rhi, real, x.bq_bwd, x.bk_bwd, nk).T  # key block x query block
    need[np.arange(nk) * x.bk_bwd >= t] = False
    kq_hi = np.minimum(np.arange(tp) + window, doc_end)
    lo = np.arange(nk) * x.bk_bwd // x.bq_bwd
    hi = _cdiv(per(kq_hi, x.bk_bwd).max(axis=1), x.bq_bwd)
    steps = 0
    if tpu:
      q_steps = min(nq, _cdiv(x.bk_bwd + window - 1, x.bq_bwd) + 1)
      hi = np.minimum(hi, lo + q_steps)
      steps = nk * q_steps
    ran = _ran(lo, hi, nq)
    full = _ran(_cdiv(np.arange(nk) * x.bk_bwd + x.bk_bwd - 1, x.bq_bwd),
                per(kq_hi, x.bk_bwd).min(axis=1) // x.bq_bwd, nq)
    return _count(ran, need, x.bq_bwd * x.bk_bwd, raw_useful, steps or int(ran.sum()),
                  int((ran & ~full).sum()))
  nk, nq = cp // x.bc_bwd, tp // x.bq_bwd
  need = _needed(elo, ehi, real, x.bq_bwd, x.bc_bwd, nk).T
  inside = ends_p < tp
  eq_lo = np.where(inside, ends_p, tp)
  eq_hi = np.where(inside, doc_end[np.where(inside, ends_p, 0)], tp)
  # layout.column_query_blocks: the query range of the entries some query sees.
  seen = eq_hi > eq_lo
  lo = per(np.where(seen, eq_lo, np.iinfo(np.int32).max), x.bc_bwd).min(axis=1) // x.bq_bwd
  hi = _cdiv(per(np.where(seen, eq_hi, 0), x.bc_bwd).max(axis=1), x.bq_bwd)
  ran = _ran(lo, hi, nq)
  full = _ran(_cdiv(per(eq_lo, x.bc_bwd).max(axis=1), x.bq_bwd),
              per(eq_hi, x.bc_bwd).min(axis=1) // x.bq_bwd, nq)
  steps = nk * nq if tpu else int(ran.sum())
  return _count(ran, need, x.bq_bwd * x.bc_bwd, entry_useful, steps,
                int((ran & ~full).sum()))
