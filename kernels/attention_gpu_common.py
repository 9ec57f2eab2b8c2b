"""Pieces shared by the Pallas Triton chunk-attention kernels (``attention_gpu`` forward,
``attention_gpu_bwd`` backward): the static configuration, float32-accumulating dots, the two
visibility masks, and the block ranges of a query tile split into boundary and interior blocks.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as pltriton

F32 = jnp.float32


@dataclasses.dataclass(frozen=True)
class Cfg:
  window: int
  scale: float
  group: int  # query heads per key/value head
  fwd_group: int  # query heads one forward program serves (the group, or 1: one per head)
  bq_fwd: int  # tokens per forward program (its tile has bq_fwd * fwd_group rows)
  bq: int
  bk: int
  bc: int
  bq_bwd: int
  bk_bwd: int
  bc_bwd: int
  num_warps: int
  num_stages: int
  interpret: bool
  fused_bwd: bool = False  # dk/dv kernels add dq by atomics (no dq kernel)
  mosaic_fwd: bool = False  # the forward is attention_mgpu's (Mosaic GPU), not Triton's
  mosaic_interpret: object = None  # its interpreter: True or InterpretGPUParams (None: compile)

  @property
  def params(self):
    return pltriton.CompilerParams(num_warps=self.num_warps, num_stages=self.num_stages)


def dot_t(a, b):
  """a @ b.T with float32 accumulation."""
  return jax.lax.dot_general(a, b, (((1,), (1,)), ((), ())), preferred_element_type=F32)


def dot(a, b):
  return jax.lax.dot_general(a, b, (((1,), (0,)), ((), ())), preferred_element_type=F32)


def dot_tn(a, b):
  """a.T @ b with float32 accumulation."""
  return jax.lax.dot_general(a, b, (((0,), (0,)), ((), ())), preferred_element_type=F32)


def raw_mask(t_pos, s_pos, seg_q, seg_k, window):
  return ((s_pos[None, :] <= t_pos[:, None]) & (s_pos[None, :] > t_pos[:, None] - window)
          & (seg_k[None, :] == seg_q[:, None]))


def entry_mask(t_pos, ends, seg_q, seg_e):
  return (ends[None, :] <= t_pos[:, None]) & (seg_e[None, :] == seg_q[:, None])


def cdiv(a, b):
  return jax.lax.div(a + b - 1, b)


def _interior(lo, hi, first_full, stop_full):
  """[lo, hi) split at the interior blocks [a, b): a = first_full, b = stop_full clamped."""
  a = jnp.clip(first_full, lo, hi)
  return a, jnp.clip(stop_full, a, hi)


def split_loops(lo, hi, first_full, stop_full, masked, unmasked, carry):
  """``masked`` over the boundary blocks of [lo, hi), ``unmasked`` over its interior ones.

  Interior blocks are those every query of the tile sees in full (no mask to build or apply);
  they form one contiguous run because the per-query bounds are non-decreasing.
  """
  a, b = _interior(lo, hi, first_full, stop_full)
  carry = jax.lax.fori_loop(lo, a, masked, carry)
  carry = jax.lax.fori_loop(a, b, unmasked, carry)
  return jax.lax.fori_loop(b, hi, masked, carry)


def raw_blocks(i, bq, bk, kvlo):
  """(lo, hi, first interior, stop interior) raw-key blocks of query block i.

  Query t sees keys [kvlo[t], t] (kvlo = max(t - W + 1, its document's start), non-decreasing):
  block j is needed from the first query's kvlo on, and seen in full by every query of the
  block when it starts at or after the last query's kvlo and ends at or before the first query.
  """
  lo = jax.lax.div(jnp.min(kvlo), bk)
  return lo, cdiv(i * bq + bq, bk), cdiv(jnp.max(kvlo), bk), jax.lax.div(i * bq + 1, bk)


def entry_blocks(bc, elo, ehi):
  """(lo, hi, first interior, stop interior) entry blocks of a query block with per-query
  visible ranges [elo, ehi) (both non-decreasing): interior = seen by every query (they then
  all lie in one document; only an entry's own document id is still checked)."""
  return (jax.lax.div(jnp.min(elo), bc), cdiv(jnp.max(ehi), bc), cdiv(jnp.max(elo), bc),
          jax.lax.div(jnp.min(ehi), bc))


def q_spec(cfg, dp):
  """One program's query tile of one head: (bq, Dp) of B x Tp x H x Dp."""
  return pl.BlockSpec((None, cfg.bq, None, dp), lambda i, b, h: (b, i, h, 0))
