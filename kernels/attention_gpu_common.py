"""Pieces shared by the Pallas Triton chunk-attention kernels (``attention_gpu`` forward,
``attention_gpu_bwd`` backward): the static configuration, float32-accumulating dots, the key
columns, and the test that leaves interior tiles unmasked.

Key columns: the kernels see raw keys and entries as one column axis of one buffer, raw keys
in columns [0, Tp) and entries in [Tp, Tp + Cp) (``key_columns``), each column with the queries
[lo, hi) that see it. So one visibility rule serves both sources (query t sees column j iff
lo[j] <= t < hi[j]), the forward and dq walk window and entry blocks in one loop, and the dk/dv
kernel is one kernel over every column block.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as pltriton

from kernels import layout

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


def key_columns(seg_BxTp, entry_ends_BxCp, entry_segment_ids_BxCp, doc_end_BxTp, window: int):
  """(lo, hi), both B x (Tp + Cp) int32: the queries [lo, hi) that see each key column.

  Raw key s: [s, min(s + W, end of its document)) (empty when W = 0). Entry c: [its end, end of
  its end's document), empty for padding and for an entry whose id is not its end's document
  (``layout.document_runs`` gave it ``PAD_SEGMENT``). Under the layout conventions this is
  exactly ``kernels.reference``'s visibility, and both bounds are non-decreasing within each
  source (``layout.entry_query_range``).
  """
  tp = seg_BxTp.shape[1]
  pos = jnp.arange(tp, dtype=jnp.int32)
  raw_hi = jnp.minimum(pos + window, doc_end_BxTp)
  raw_lo = jnp.broadcast_to(pos, raw_hi.shape)
  ent_lo, ent_hi = layout.entry_query_range(entry_ends_BxCp, seg_BxTp, doc_end_BxTp)
  ent_hi = jnp.where(entry_segment_ids_BxCp == layout.PAD_SEGMENT, ent_lo, ent_hi)
  return (jnp.concatenate([raw_lo, ent_lo], axis=1).astype(jnp.int32),
          jnp.concatenate([raw_hi, ent_hi], axis=1).astype(jnp.int32))


def visible(t_pos, lo, hi):
  """rows x columns: query t_pos[r] sees column c (lo[c] <= t < hi[c])."""
  return (t_pos[:, None] >= lo[None, :]) & (t_pos[:, None] < hi[None, :])


def mask_boundary(s, interior, t_pos, lo, hi):
  """Scores ``s`` with the invisible ones at -inf, unless the tile is ``interior`` (every row
  sees every column): then the mask is neither built nor applied. A branch around arithmetic
  only: the step's loads stay outside it, so Triton pipelines them across every step."""
  return jax.lax.cond(interior, lambda s: s,
                      lambda s: jnp.where(visible(t_pos, lo, hi), s, -jnp.inf), s)


def sees_whole_block(lo, hi, first, last):
  """Every query in [first, last] sees every column of the block (lo, hi: its columns')."""
  return (jnp.max(lo) <= first) & (jnp.min(hi) > last)


def key_steps(i, bq, bk, entry_block0, window, kvlo, elo, ehi):
  """(n_raw, n_steps, block(n)): the column blocks query block i walks, in one loop.

  Raw keys: query t sees [kvlo[t], t] (kvlo = max(t - W + 1, its document's start)); entries:
  [elo[t], ehi[t]) (``layout.visible_entry_range``); all bounds non-decreasing in t. So the
  block needs raw blocks [min kvlo / bk, cdiv(last query + 1, bk)) and entry blocks
  [min elo / bk, cdiv(max ehi, bk)), the latter from column block ``entry_block0`` (Tp / bk).
  Step n < n_raw is raw block raw_lo + n, the rest are entry blocks in order.
  """
  if window > 0:
    raw_lo = jax.lax.div(jnp.min(kvlo), bk)
    n_raw = jnp.maximum(cdiv(i * bq + bq, bk) - raw_lo, 0)
  else:  # no window: no raw step at all
    raw_lo = n_raw = jnp.int32(0)
  ent_lo = jax.lax.div(jnp.min(elo), bk)
  n_ent = jnp.maximum(cdiv(jnp.max(ehi), bk) - ent_lo, 0)
  ent_at = entry_block0 + ent_lo - n_raw
  return n_raw, n_raw + n_ent, lambda n: jnp.where(n < n_raw, raw_lo + n, ent_at + n)


def query_steps(lo, hi, bq):
  """(first, stop) query blocks a column block's dk/dv loop walks: those holding a query that
  sees one of its columns (columns that no query sees, lo == hi, add none)."""
  seen = hi > lo
  first = jnp.min(jnp.where(seen, lo, jnp.iinfo(jnp.int32).max))
  return jax.lax.div(first, bq), cdiv(jnp.max(jnp.where(seen, hi, 0)), bq)


def program_specs(cfg: Cfg, q_shape, n_cols: int):
  """BlockSpecs of a forward / dq program (grid: query block, row, kv head or head): its query
  tile, the whole K/V column buffer of its kv head, one column vector, one query vector."""
  dp, gf, bq = q_shape[3], cfg.fwd_group, cfg.bq_fwd
  kv_head = (lambda h_: h_) if gf > 1 else (lambda h_: h_ // cfg.group)  # grid axis 2 -> kv
  if gf > 1:  # the kv head's G query heads, as extra rows of the tile
    tile = pl.BlockSpec((None, bq, gf, dp), lambda i, b_, kv: (b_, i, kv, 0))
  else:
    tile = pl.BlockSpec((None, bq, None, dp), lambda i, b_, h_: (b_, i, h_, 0))
  return dict(
      tile=tile,
      kv=pl.BlockSpec((None, n_cols, None, dp), lambda i, b_, h_: (b_, 0, kv_head(h_), 0)),
      cols=pl.BlockSpec((None, n_cols), lambda i, b_, h_: (b_, 0)),
      q_vec=pl.BlockSpec((None, bq), lambda i, b_, h_: (b_, i)))
