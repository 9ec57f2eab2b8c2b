"""Pieces shared by the Pallas Triton chunk-attention kernels (``attention_gpu`` forward,
``attention_gpu_bwd`` backward): the static configuration, float32-accumulating dots, the key
columns, and the test that leaves interior tiles unmasked.

Key columns: the kernels see raw keys and entries as one column axis of one buffer, raw keys
in columns [0, Tp) and entries in [Tp, Tp + Cp) (``layout.key_columns``), each column with the
queries [lo, hi) that see it. So one visibility rule serves both sources (query t sees column j iff
lo[j] <= t < hi[j]), the forward and dq walk window and entry blocks in one loop, and the dk/dv
kernel is one kernel over every column block.
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
  bk: int  # key columns (raw keys or entries) per step of the forward and dq
  bq_bwd: int
  bk_bwd: int  # key columns per dk/dv program
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


def cdiv(a, b):
  return jax.lax.div(a + b - 1, b)


def visible(t_pos, lo, hi):
  """rows x columns: query t_pos[r] sees column c (lo[c] <= t < hi[c])."""
  return (t_pos[:, None] >= lo[None, :]) & (t_pos[:, None] < hi[None, :])


def mask_boundary(s, interior, t_pos, lo_ref, hi_ref, cols):
  """Scores ``s`` of the columns ``cols`` with the invisible ones at -inf, unless the tile is
  ``interior`` (every row sees every column: ``layout.column_block_bounds``): then no mask is
  built or applied. The branch holds the mask's small loads and arithmetic only; the step's
  K/V loads stay outside it, so Triton pipelines them across every step."""
  def masked(s):
    return jnp.where(visible(t_pos, lo_ref[cols], hi_ref[cols]), s, -jnp.inf)
  return jax.lax.cond(interior, lambda s: s, masked, s)


def key_steps(steps_ref, i, entry_block0):
  """(n_steps, block(n)): the column blocks query block i walks, in one loop.

  ``steps_ref`` holds ``layout.query_key_blocks`` of every query block (rows raw_lo, raw_n,
  entry_lo, entry_n): step n < raw_n is raw block raw_lo + n, the rest are the entry blocks in
  order, entry block e being column block ``entry_block0`` (Tp / bk) + e.
  """
  raw_lo, n_raw, ent_lo, n_ent = (steps_ref[r, i] for r in range(4))
  ent_at = entry_block0 + ent_lo - n_raw
  return n_raw + n_ent, lambda n: jnp.where(n < n_raw, raw_lo + n, ent_at + n)


def program_specs(cfg: Cfg, q_shape, n_cols: int):
  """BlockSpecs of a forward / dq program (grid: query block, row, kv head or head): its query
  tile, the whole K/V column buffer of its kv head, one column vector, one vector per column
  block of block_k, and the key blocks of every query block (``layout.query_key_blocks``)."""
  dp, gf, bq = q_shape[3], cfg.fwd_group, cfg.bq_fwd
  n_q_blocks = q_shape[1] // bq
  kv_head = (lambda h_: h_) if gf > 1 else (lambda h_: h_ // cfg.group)  # grid axis 2 -> kv
  if gf > 1:  # the kv head's G query heads, as extra rows of the tile
    tile = pl.BlockSpec((None, bq, gf, dp), lambda i, b_, kv: (b_, i, kv, 0))
  else:
    tile = pl.BlockSpec((None, bq, None, dp), lambda i, b_, h_: (b_, i, h_, 0))
  return dict(
      tile=tile,
      kv=pl.BlockSpec((None, n_cols, None, dp), lambda i, b_, h_: (b_, 0, kv_head(h_), 0)),
      cols=pl.BlockSpec((None, n_cols), lambda i, b_, h_: (b_, 0)),
      blocks=pl.BlockSpec((None, n_cols // cfg.bk), lambda i, b_, h_: (b_, 0)),
      steps=pl.BlockSpec((None, 4, n_q_blocks), lambda i, b_, h_: (b_, 0, 0)))
