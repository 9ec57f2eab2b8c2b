"""chunk_attention forward on Hopper GPUs: a Pallas Mosaic GPU kernel (TMA, warpgroup MMA).

``AttentionBlockSizes(forward="mosaic")`` selects it; the backward stays the Triton one of
``attention_gpu_bwd`` (it reads this forward's o and natural-log lse, B x H x Tp).

One program per (head, block_q rows, batch row) runs block_q / 64 consumer warpgroups of 64
query rows (one ``wgmma`` M) and one producer warpgroup that streams K/V blocks by TMA into a
ring of ``num_stages`` shared-memory slots. Window blocks and entry blocks go through ONE loop
(a step is a raw-key block or an entry block, from the union of the warpgroups' ranges), so the
ring never drains between the two key sources. Per 64-row tile the block ranges (lo, hi and the
interior run that every row sees in full) are computed once in XLA (``tile_bounds``); each
consumer skips the steps outside its range, runs its interior steps without a mask and masks
only its boundary steps. An entry's own validity (padding, or an id that disagrees with its
end's document: ``layout.document_runs``) is one bias column of -inf, so no per-entry document
test runs in the loop. The sink logit seeds the running max (value zero), as in the Triton
kernel; the online softmax runs in base 2 (``exp2``).

Raw keys and entries come as one key buffer (``layout.key_columns``: columns
[0, Tp) raw keys, [Tp, Tp + Cp) entries), so a step's TMA copies differ only in their column.
Its K is passed transposed (B x K x Dp x (Tp + Cp)) because the interpreter of the pinned JAX
does not take a transposed ``wgmma`` operand: one XLA transpose of K per call, so the code the
interpreter checks is the code a GPU runs. Three more concessions to the interpreter, all under
``interpret``: layout hints are skipped (no CPU rule for ``layout_cast`` /
``broadcasted_iota(layout=)``), the probabilities of the second ``wgmma`` are staged in shared
memory (its A operand must be there; on a GPU they stay in registers), and every TMA copy has
its own barrier (a GPU could share one with an expected byte count).

Inputs must be bfloat16 or float16 (``wgmma`` has no float32 path that matches XLA's default
precision); the head dim is padded to a multiple of 64 (128-byte swizzle).
"""

from __future__ import annotations

import math
import os

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import mosaic_gpu as plgpu

from kernels import layout
from kernels.attention_gpu_common import F32, Cfg
from kernels.padding import round_up

ROWS = 64  # query rows per consumer warpgroup: one wgmma M
DTYPES = (jnp.bfloat16, jnp.float16)
LOG2E = math.log2(math.e)
# Columns of tile_bounds: raw-key blocks [lo, hi) with interior [a, z), then entry blocks.
RAW_LO, RAW_HI, RAW_A, RAW_Z, ENT_LO, ENT_HI, ENT_A, ENT_Z = range(8)


def check_inputs(dtype, d: int) -> None:
  if jnp.dtype(dtype) not in [jnp.dtype(x) for x in DTYPES]:
    raise ValueError(f"AttentionBlockSizes(forward='mosaic') runs bfloat16 or float16 inputs "
                     f"(warpgroup MMA), got {jnp.dtype(dtype).name}; use forward='triton'")
  if round_up(d, 64) > 256:
    raise ValueError(f"AttentionBlockSizes(forward='mosaic') takes head dims up to 256, got {d}")


def check_device(device=None) -> None:
  """Warpgroup MMA needs compute capability >= 9.0 (Hopper): a clear error on older GPUs,
  before anything compiles. Devices that report no capability (CPU interpret mode) pass."""
  device = device or jax.devices()[0]
  capability = getattr(device, "compute_capability", None)
  if capability is not None and float(capability) < 9.0:
    raise ValueError(f"AttentionBlockSizes(forward='mosaic') needs a Hopper or later GPU "
                     f"(compute capability >= 9.0: warpgroup MMA); {device.device_kind} has "
                     f"{capability}; use forward='triton'")


def program_rows(cfg: Cfg) -> int:
  """Query rows per program: 64 or 128 (one or two consumer warpgroups)."""
  return max(ROWS, cfg.bq)


def key_block(cfg: Cfg) -> int:
  """Keys (and entries) per step: block_k, at least 64 (the 128-byte swizzle of K^T rows)."""
  return max(64, cfg.bk)


def padded_head_dim(d: int) -> int:
  return round_up(d, 64)


def xla_cpu_threads() -> int:
  """The threads of XLA's CPU pools in this process: ``PJRT_NPROC`` (or ``NPROC``) where set
  before JAX started, else the CPUs this process may run on (XLA's own rule)."""
  for name in ("PJRT_NPROC", "NPROC"):
    value = os.environ.get(name, "")
    if value.isdigit():
      return int(value)
  return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()


def check_interpreter_threads(threads: int) -> None:
  """The interpreter runs each of a program's ``threads`` warpgroups as an XLA CPU computation
  started from its own Python thread, and the grid loop's thread-map callback holds one of
  XLA's CPU worker threads while they run. A warpgroup waiting at a barrier holds a worker too,
  so with fewer workers than warpgroups + 1 the call can deadlock: it did on 2 cores
  (docs/kernels.md), deterministically on one. A clear error instead of a hang."""
  have, need = xla_cpu_threads(), threads + 1
  if have < need:
    raise ValueError(
        f"the Mosaic GPU interpreter runs {threads} warpgroups and needs at least {need} XLA "
        f"CPU threads, but this process has {have}: set PJRT_NPROC={max(8, need)} before JAX "
        f"starts (the tests' conftest.py does)")


def interpret_params(interpret):
  """The Mosaic GPU interpreter's parameters for ``interpret`` (True: defaults), or None."""
  if not interpret:
    return None
  if not isinstance(interpret, bool):
    return interpret  # already InterpretGPUParams (e.g. with detect_races=True)
  params = getattr(plgpu, "InterpretParams", None)  # public on newer JAX, if ever
  if params is None:  # JAX 0.10.x keeps it private
    from jax._src.pallas.mosaic_gpu.interpret.params import InterpretGPUParams as params
  return params()


def _cdiv(a, b):
  return (a + b - 1) // b


def tile_bounds(kvlo, elo, ehi, window: int, bk: int):
  """B x (Tp / 64) x 8 int32: per 64-row tile its raw-key and entry block ranges.

  The blocks a tile needs are ``layout.query_key_blocks`` of 64-row tiles (query t sees keys
  [kvlo[t], t] and entries [elo[t], ehi[t]), all non-decreasing); it sees a block in full (its
  interior) from its last row's lower bound to its first row's upper one.
  """
  b, tp = kvlo.shape
  tiles = lambda x: x.reshape(b, tp // ROWS, ROWS)
  kb, eb_lo, eb_hi = tiles(kvlo), tiles(elo), tiles(ehi)
  first = jnp.arange(tp // ROWS, dtype=jnp.int32)[None, :] * ROWS
  r_lo, r_n, e_lo, e_n = layout.query_key_blocks(kvlo, elo, ehi, ROWS, bk, bk, window)
  r_hi, e_hi = r_lo + r_n, e_lo + e_n  # no window: no raw step at all (r_n = 0)
  r_a = jnp.clip(_cdiv(kb[..., -1], bk), r_lo, r_hi)
  r_z = jnp.clip((first + 1) // bk, r_a, r_hi)
  e_a = jnp.clip(_cdiv(eb_lo[..., -1], bk), e_lo, e_hi)
  e_z = jnp.clip(eb_hi[..., 0] // bk, e_a, e_hi)
  cols = jnp.broadcast_arrays(r_lo, r_hi, r_a, r_z, e_lo, e_hi, e_a, e_z)
  return jnp.stack(cols, -1).astype(jnp.int32)


def _kernel(q_ref, kT_ref, v_ref, bias_ref, rows_ref, bounds_ref, sink_ref, o_ref, lse_ref,
            smem, bars, done_bar, *, cfg: Cfg, wgs: int, bk: int, slots: int, entry0: int,
            interpreting: bool):
  q_smem, k_smem, v_smem, bias_smem, rows_smem, lse_smem, *p_smem = smem
  q_bar, r_bar, k_bar, v_bar, e_bar = bars
  dtype = q_smem.dtype
  dp = q_smem.shape[-1]
  bi, hi, pi, wg = (lax.axis_index(n) for n in ("batch", "heads", "q", "wg"))
  kv = lax.div(hi, jnp.int32(cfg.group))
  tile0 = wgs * pi  # the program's first 64-row tile
  bound = lambda tile, j: bounds_ref[bi, tile, j]

  def union(j_lo, j_hi):
    """(first block, count) of the warpgroups' ranges: the steps the program walks."""
    lo = bound(tile0, j_lo)
    hi_ = bound(tile0 + wgs - 1, j_hi)  # bounds are non-decreasing over the tiles
    return lo, jnp.maximum(hi_ - lo, 0)

  raw_lo, n_raw = union(RAW_LO, RAW_HI)
  ent_lo, n_ent = union(ENT_LO, ENT_HI)
  n_steps = n_raw + n_ent

  if interpreting:  # no CPU rule for layout hints
    hint = lambda x, _: x
    iota = lambda shape, dim: lax.broadcasted_iota(jnp.int32, shape, dim)
  else:
    hint = plgpu.layout_cast
    iota = lambda shape, dim: plgpu.broadcasted_iota(jnp.int32, shape, dim,
                                                     layout=plgpu.Layout.WGMMA)

  def consumer():
    tile = tile0 + wg
    base = tile * ROWS
    qs = q_smem.at[wg]
    plgpu.copy_gmem_to_smem(q_ref.at[bi, pl.ds(base, ROWS), hi], qs, q_bar.at[wg])
    plgpu.copy_gmem_to_smem(rows_ref.at[bi, :, pl.ds(base, ROWS)], rows_smem.at[wg],
                            r_bar.at[wg])
    plgpu.barrier_wait(q_bar.at[wg])
    plgpu.barrier_wait(r_bar.at[wg])
    row_layout = plgpu.Layout.WGMMA.reduce(1)
    kvlo, e_lo, e_hi = (hint(rows_smem.at[wg, i][...], row_layout) for i in range(3))
    per_row = lambda x: lax.broadcast_in_dim(x, (ROWS, bk), [0])
    t_pos = base + iota((ROWS, bk), 0)
    col = iota((ROWS, bk), 1)
    sink = sink_ref[hi] * LOG2E
    m = hint(jnp.full((ROWS,), sink, F32), row_layout)
    denom = hint(jnp.full((ROWS,), jnp.where(sink == -jnp.inf, 0.0, 1.0), F32), row_layout)
    acc = hint(jnp.zeros((ROWS, dp), F32), plgpu.Layout.WGMMA)
    mine = [bound(tile, j) for j in range(8)]

    def update(slot, carry, mask, bias):
      """One block of the online softmax (base 2); mask None: the whole tile is visible."""
      acc, m, denom = carry

      def scores(acc_ref):
        plgpu.wgmma(acc_ref, qs, k_smem.at[slot])
        return acc_ref[...]

      s = pl.run_scoped(scores, plgpu.ACC((ROWS, bk), F32)) * (cfg.scale * LOG2E)
      if bias is not None:
        s = s + lax.broadcast_in_dim(bias, s.shape, [1])
      if mask is not None:
        s = jnp.where(mask, s, -jnp.inf)
      m_new = jnp.maximum(m, s.max(axis=1))
      m_safe = jnp.where(m_new == -jnp.inf, 0.0, m_new)
      alpha = jnp.exp2(m - m_safe)
      p = jnp.exp2(s - per_row(m_safe))
      denom = denom * alpha + p.sum(axis=1)

      def values(acc_ref):
        a = p.astype(dtype)
        if interpreting:  # the interpreter takes wgmma's A operand from shared memory only
          p_smem[0].at[wg][...] = a
          a = p_smem[0].at[wg]
        plgpu.wgmma(acc_ref, a, v_smem.at[slot])
        return acc_ref[...]

      acc = acc * lax.broadcast_in_dim(alpha, acc.shape, [0]) + pl.run_scoped(
          values, plgpu.ACC((ROWS, dp), F32))
      return acc, m_new, denom

    def block_kind(blk, lo, hi_, a, z):
      """0: outside this tile's range (skip), 1: boundary (masked), 2: interior (unmasked)."""
      return jnp.where((blk < lo) | (blk >= hi_), 0, jnp.where((blk >= a) & (blk < z), 2, 1))

    def step(s, carry):
      slot = lax.rem(s, jnp.int32(slots))
      plgpu.barrier_wait(k_bar.at[slot])
      plgpu.barrier_wait(v_bar.at[slot])
      is_raw = s < n_raw
      blk = jnp.where(is_raw, raw_lo + s, ent_lo + s - n_raw)
      cols = blk * bk + col

      def raw(carry):
        mask = (cols >= per_row(kvlo)) & (cols <= t_pos)
        kind = block_kind(blk, *mine[RAW_LO:RAW_Z + 1])
        return lax.switch(kind, [lambda c: c, lambda c: update(slot, c, mask, None),
                                 lambda c: update(slot, c, None, None)], carry)

      def entries(carry):
        plgpu.barrier_wait(e_bar.at[slot])
        bias = hint(bias_smem.at[slot][...], plgpu.Layout.WGMMA.reduce(0))
        mask = (cols >= per_row(e_lo)) & (cols < per_row(e_hi))
        kind = block_kind(blk, *mine[ENT_LO:ENT_Z + 1])
        return lax.switch(kind, [lambda c: c, lambda c: update(slot, c, mask, bias),
                                 lambda c: update(slot, c, None, bias)], carry)

      carry = lax.cond(is_raw, raw, entries, carry)
      plgpu.barrier_arrive(done_bar.at[slot])
      return carry

    acc, m, denom = lax.fori_loop(0, n_steps, step, (acc, m, denom))
    seen = denom > 0
    denom_safe = jnp.where(seen, denom, 1.0)
    qs[...] = (acc / lax.broadcast_in_dim(denom_safe, acc.shape, [0])).astype(dtype)
    # Natural-log lse for the Triton backward; rows that saw nothing get 0 (it masks them).
    lse_smem.at[wg][...] = jnp.where(
        seen, (jnp.where(m == -jnp.inf, 0.0, m) + jnp.log2(denom_safe)) / LOG2E, 0.0)
    plgpu.commit_smem()
    plgpu.copy_smem_to_gmem(qs, o_ref.at[bi, pl.ds(base, ROWS), hi])
    plgpu.copy_smem_to_gmem(lse_smem.at[wg], lse_ref.at[bi, hi, pl.ds(base, ROWS)])
    plgpu.wait_smem_to_gmem(0)

  def producer():
    @pl.loop(0, n_steps)
    def _(s):
      slot = lax.rem(s, jnp.int32(slots))

      @pl.when(s >= slots)
      def _():  # the slot's previous block has been consumed by every warpgroup
        plgpu.barrier_wait(done_bar.at[slot])

      # Columns of the key buffer: raw keys from 0, entries from entry0.
      start = jnp.where(s < n_raw, (raw_lo + s) * bk, entry0 + (ent_lo + s - n_raw) * bk)
      plgpu.copy_gmem_to_smem(kT_ref.at[bi, kv, :, pl.ds(start, bk)], k_smem.at[slot],
                              k_bar.at[slot])
      plgpu.copy_gmem_to_smem(v_ref.at[bi, pl.ds(start, bk), kv], v_smem.at[slot],
                              v_bar.at[slot])

      @pl.when(s >= n_raw)
      def _():
        plgpu.copy_gmem_to_smem(bias_ref.at[bi, pl.ds(start, bk)], bias_smem.at[slot],
                                e_bar.at[slot])

    @pl.loop(jnp.maximum(n_steps - slots, 0), n_steps)
    def _(s):  # observe the consumers' last phases before the barriers are freed
      plgpu.barrier_wait(done_bar.at[lax.rem(s, jnp.int32(slots))])

  pl.when(wg < wgs)(consumer)
  pl.when(wg == wgs)(producer)


def forward(cfg: Cfg, q, k, v, lo, hi, blo, bhi, steps, sink_hq, kvlo, elo, ehi):
  """(o_BxTpxHxDp, lse_BxHxTp), the contract of ``attention_gpu._forward`` (same padded
  inputs: k and v the key buffer of raw keys then entries, lo / hi its columns' query ranges;
  Tp a multiple of ``program_rows(cfg)`` and ``key_block(cfg)``, Cp of the latter, Dp of 64).
  Its per-tile ranges (``tile_bounds``) stand in for the Triton forward's column-block bounds
  and query blocks' steps."""
  del blo, bhi, steps
  b, tp, h, dp = q.shape
  rows, bk, slots = program_rows(cfg), key_block(cfg), cfg.num_stages
  wgs = rows // ROWS
  threads = wgs + 1  # the consumer warpgroups and the producer
  dtype = q.dtype
  interpret = interpret_params(cfg.mosaic_interpret)
  if interpret is not None:
    check_interpreter_threads(threads)
  bounds = tile_bounds(kvlo, elo, ehi, cfg.window, bk)
  row_ranges = jnp.stack([kvlo, elo, ehi], axis=1)  # B x 3 x Tp, TMA'd per tile
  # An entry no query sees (padding, or an id that is not its end's document) is a column of
  # -inf; the loop reads the bias of entry columns only.
  bias = jnp.where(hi > lo, 0.0, -jnp.inf).astype(F32)
  kT = jnp.transpose(k, (0, 2, 3, 1))
  sink = sink_hq[:, 0]

  def chunk_attention_fwd_mosaic(*refs):
    swizzled = (plgpu.TilingTransform((8, 64)), plgpu.SwizzleTransform(128))
    smem = (plgpu.SMEM((wgs, ROWS, dp), dtype, transforms=swizzled),
            plgpu.SMEM((slots, dp, bk), dtype, transforms=swizzled),
            plgpu.SMEM((slots, bk, dp), dtype, transforms=swizzled),
            plgpu.SMEM((slots, bk), F32),
            plgpu.SMEM((wgs, 3, ROWS), jnp.int32),
            plgpu.SMEM((wgs, ROWS), F32))
    if interpret is not None:  # staged probabilities (see the module docstring)
      smem += (plgpu.SMEM((wgs, ROWS, bk), dtype, transforms=swizzled),)
    bars = tuple(plgpu.Barrier(num_barriers=n) for n in (wgs, wgs, slots, slots, slots))
    done = plgpu.Barrier(num_arrivals=wgs, num_barriers=slots)
    kernel = lambda smem, bars, done: _kernel(*refs, smem, bars, done, cfg=cfg, wgs=wgs, bk=bk,
                                              slots=slots, entry0=tp,
                                              interpreting=interpret is not None)
    pl.run_scoped(kernel, smem, bars, done, collective_axes="wg")

  return plgpu.kernel(
      chunk_attention_fwd_mosaic,
      out_type=(jax.ShapeDtypeStruct(q.shape, dtype), jax.ShapeDtypeStruct((b, h, tp), F32)),
      grid=(h, tp // rows, b), grid_names=("heads", "q", "batch"),
      num_threads=threads, thread_name="wg",
      compiler_params=plgpu.CompilerParams(approx_math=True),
      interpret=interpret,
  )(q, kT, v, bias, row_ranges, bounds, sink)
