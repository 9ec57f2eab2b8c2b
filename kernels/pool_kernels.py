"""segment_pool with Pallas: one program per (row, entry, channel block), GPU and TPU.

Every entry's chunk is a contiguous token range [start, end] (``kernels.layout``), so a program
walks only its own tokens, in blocks of ``block_t`` rows, with an online per-channel softmax:
exact per-entry maxima, no one-hot matrices, no scatter. The slot bias is added to the logits in
XLA beforehand (an elementwise gather fused into one pass), so the kernel pools
``softmax(z) * values`` only.

- GPU (Triton): token rows are read straight from HBM at the entry's start offset.
- TPU (Mosaic): the entry ranges are scalar-prefetched into SMEM; values and logits stay in
  HBM (``pl.ANY``) and each token block is copied into VMEM with ``pltpu.sync_copy`` at an
  8-row aligned offset. The copies are synchronous (no double buffering): correct and simple,
  not yet tuned.

Backward (both): analytic, in XLA, from the kernel's per-entry log-sum-exp and float32 entries:
``w_j = exp(z_j - lse_e)``, ``dv_j = w_j * dE_e``, ``dz_j = w_j * (v_j - E_e) * dE_e`` with the
entry quantities gathered per token. It is one memory-bound pass, no forward recompute.
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu
from jax.experimental.pallas import triton as pltriton

from kernels import layout
from kernels.block_sizes import PoolBlockSizes
from kernels.padding import gpu_tile, pad_to, round_up

_F32 = jnp.float32


@dataclasses.dataclass(frozen=True)
class _Cfg:
  backend: str
  bt: int
  bn: int
  num_warps: int
  num_stages: int
  interpret: object


def _pool_loop(load, start, end, bt, bn, row0):
  """Online per-channel softmax pool over rows [start, end] read in blocks from ``row0``."""

  def body(k, carry):
    m, denom, acc = carry
    z, v = load(row0 + k * bt)
    rows = row0 + k * bt + jax.lax.broadcasted_iota(jnp.int32, (bt, bn), 0)
    z = jnp.where((rows >= start) & (rows <= end), z.astype(_F32), -jnp.inf)
    m_new = jnp.maximum(m, jnp.max(z, axis=0, keepdims=True))
    m_safe = jnp.where(m_new == -jnp.inf, 0.0, m_new)
    p = jnp.exp(z - m_safe)
    alpha = jnp.exp(m - m_safe)
    denom = alpha * denom + jnp.sum(p, axis=0, keepdims=True)
    acc = alpha * acc + jnp.sum(p * v.astype(_F32), axis=0, keepdims=True)
    return m_new, denom, acc

  init = (jnp.full((1, bn), -jnp.inf, _F32), jnp.zeros((1, bn), _F32), jnp.zeros((1, bn), _F32))
  # Padding entries have start PAD_END > end: zero blocks.
  n_blocks = jnp.maximum(jax.lax.div(end + 1 - row0 + bt - 1, bt), 0)
  m, denom, acc = jax.lax.fori_loop(0, n_blocks, body, init)
  seen = denom > 0
  entry = acc / jnp.where(seen, denom, 1.0)
  m_safe = jnp.where(m == -jnp.inf, 0.0, m)
  lse = jnp.where(seen, m_safe + jnp.log(jnp.where(seen, denom, 1.0)), 0.0)
  return entry, lse


def _gpu_kernel(start_ref, end_ref, z_ref, v_ref, e_ref, lse_ref, *, cfg: _Cfg):
  start, end = start_ref[()], end_ref[()]

  def load(row):
    return z_ref[pl.ds(row, cfg.bt), :], v_ref[pl.ds(row, cfg.bt), :]

  entry, lse = _pool_loop(load, start, end, cfg.bt, cfg.bn, start)
  e_ref[...] = entry[0]
  lse_ref[...] = lse[0]


def _tpu_kernel(starts_ref, ends_ref, z_hbm, v_hbm, e_ref, lse_ref, z_buf, v_buf, *, cfg: _Cfg):
  b, c, n = pl.program_id(0), pl.program_id(1), pl.program_id(2)
  start, end = starts_ref[b, c], ends_ref[b, c]
  cols = pl.ds(n * cfg.bn, cfg.bn)

  def load(row):
    pltpu.sync_copy(z_hbm.at[b, pl.ds(row, cfg.bt), cols], z_buf)
    pltpu.sync_copy(v_hbm.at[b, pl.ds(row, cfg.bt), cols], v_buf)
    return z_buf[...], v_buf[...]

  # DMA row offsets aligned to the 8-row sublane tile; the mask drops the rows before start.
  row0 = jax.lax.div(jnp.minimum(start, end + 1), 8) * 8
  entry, lse = _pool_loop(load, start, end, cfg.bt, cfg.bn, row0)
  e_ref[...] = entry
  lse_ref[...] = lse


def _forward(cfg: _Cfg, z, v, starts, ends):
  """z/v_BxTpxNp, starts/ends_BxC (inclusive token range per entry) -> entries, lse BxCxNp."""
  b, tp, n = z.shape
  c = starts.shape[1]
  grid = (b, c, n // cfg.bn)
  # Entries leave the kernel in float32: the backward needs them unrounded (a bf16 entry in
  # dz_j = w_j * (v_j - E_e) * dE_e costs ~1e-2 relative in the slot-bias gradient).
  out_shape = [jax.ShapeDtypeStruct((b, c, 1, n), _F32),
               jax.ShapeDtypeStruct((b, c, 1, n), _F32)]
  if cfg.backend == "pallas_gpu":
    scalar = pl.BlockSpec((None, None), lambda b_, c_, n_: (b_, c_))
    rows = pl.BlockSpec((None, tp, cfg.bn), lambda b_, c_, n_: (b_, 0, n_))
    out = pl.BlockSpec((None, None, None, cfg.bn), lambda b_, c_, n_: (b_, c_, 0, n_))
    entries, lse = pl.pallas_call(
        functools.partial(_gpu_kernel, cfg=cfg), grid=grid, in_specs=[scalar, scalar, rows, rows],
        out_specs=[out, out], out_shape=out_shape,
        compiler_params=pltriton.CompilerParams(num_warps=cfg.num_warps,
                                                num_stages=cfg.num_stages),
        interpret=cfg.interpret, name="segment_pool_gpu")(starts, ends, z, v)
  else:
    hbm = pl.BlockSpec(memory_space=pl.ANY)
    out = pl.BlockSpec((None, None, 1, cfg.bn), lambda b_, c_, n_, *_: (b_, c_, 0, n_))
    entries, lse = pl.pallas_call(
        functools.partial(_tpu_kernel, cfg=cfg),
        grid_spec=pltpu.PrefetchScalarGridSpec(
            num_scalar_prefetch=2, grid=grid, in_specs=[hbm, hbm], out_specs=[out, out],
            scratch_shapes=[pltpu.VMEM((cfg.bt, cfg.bn), z.dtype),
                            pltpu.VMEM((cfg.bt, cfg.bn), v.dtype)]),
        out_shape=out_shape,
        compiler_params=pltpu.CompilerParams(
            dimension_semantics=("parallel", "parallel", "parallel")),
        interpret=cfg.interpret, name="segment_pool_tpu")(starts, ends, z, v)
  return entries[:, :, 0], lse[:, :, 0]


def _gather_entries(x_BxCxN, entry_of_token_BxT, fill):
  """x[entry_of_token] per token; tokens pooled nowhere (index C) get ``fill``."""
  padded = jnp.concatenate([x_BxCxN, jnp.full_like(x_BxCxN[:, :1], fill)], axis=1)
  return jnp.take_along_axis(padded, entry_of_token_BxT[:, :, None], axis=1)


@functools.partial(jax.custom_vjp, nondiff_argnums=(0,))
def _pool(cfg, z, v, starts, ends, entry_of_token):
  del entry_of_token
  return _forward(cfg, z, v, starts, ends)[0].astype(v.dtype)


def _pool_fwd(cfg, z, v, starts, ends, entry_of_token):
  entries_f32, lse = _forward(cfg, z, v, starts, ends)
  return entries_f32.astype(v.dtype), (z, v, entry_of_token, entries_f32, lse)


def _pool_bwd(cfg, res, d_entries):
  del cfg
  z, v, entry_of_token, entries, lse = res
  w = jnp.exp(z.astype(_F32) - _gather_entries(lse, entry_of_token, jnp.inf))
  g = _gather_entries(d_entries.astype(_F32), entry_of_token, 0.0)
  dv = (w * g).astype(v.dtype)
  dz = w * g * (v.astype(_F32) - _gather_entries(entries, entry_of_token, 0.0))
  return dz.astype(z.dtype), dv, None, None, None


_pool.defvjp(_pool_fwd, _pool_bwd)


def segment_pool_pallas(values_BxTxN, logits_BxTxN, structure: layout.ChunkStructure, *,
                        slot_bias_SxN, backend: str, interpret, block_sizes: PoolBlockSizes):
  """Pallas implementation of ``kernels.segment_pool`` (same semantics and outputs)."""
  b, t, n = values_BxTxN.shape
  entry_of_token, pos, entry_ends, entry_seg, entry_starts, _ = structure
  capacity = entry_ends.shape[1]
  z = logits_BxTxN.astype(_F32)
  if slot_bias_SxN is not None:
    z = z + slot_bias_SxN.astype(_F32)[jnp.minimum(pos, slot_bias_SxN.shape[0] - 1)]
  bs = block_sizes
  if backend == "pallas_gpu":
    bt, bn = gpu_tile(bs.block_t, t), gpu_tile(bs.block_n, n)
  else:
    if bs.block_t % 8 or bs.block_n % 128:
      raise ValueError(f"pallas_tpu segment_pool needs block_t a multiple of 8 and block_n a "
                       f"multiple of 128, got block_t={bs.block_t}, block_n={bs.block_n}")
    bt, bn = bs.block_t, bs.block_n
    interpret = interpret if isinstance(interpret, pltpu.InterpretParams) else bool(interpret)
  cfg = _Cfg(backend=backend, bt=bt, bn=bn, num_warps=bs.num_warps, num_stages=bs.num_stages,
             interpret=interpret if backend == "pallas_tpu" else bool(interpret))
  # Rows past T are padding that the masks drop; a block starting at the last token (or 8-row
  # aligned below it) must still fit.
  tp, np_ = round_up(t, 8) + bt, round_up(n, bn)
  pad = lambda x: pad_to(pad_to(x, 1, tp), 2, np_)
  starts = jnp.where(entry_starts < t, entry_starts, layout.PAD_END).astype(jnp.int32)
  ends = jnp.where(entry_ends < t, entry_ends, -1).astype(jnp.int32)
  entries = _pool(cfg, pad(z), pad(values_BxTxN), starts, ends,
                  pad_to(entry_of_token, 1, tp, capacity))
  return entries[:, :, :n], entry_ends, entry_seg
