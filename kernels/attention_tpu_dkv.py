"""chunk_attention on TPU, dk and dv: the key-major Pallas Mosaic kernel of ``attention_tpu``.

Grid (B, K, key or entry blocks, steps): the steps walk over the H/K query heads of the group
times the query blocks that can see the block (scalar-prefetched ranges), so GQA/MQA gradients
are summed in VMEM. Scores are computed transposed (keys on sublanes, queries on lanes), as in
splash attention. A step whose every query sees every key of the block (an interior tile, from
the prefetched ``layout.column_block_bounds``) runs without a mask. ``cfg`` is
``attention_tpu``'s static configuration (not imported here: that module imports this one).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from kernels.tpu_common import F32, LANES, NN, NT, SUBLANES, clamp_step, dot


def _dkv_kernel(qlo_ref, qn_ref, lo_max_ref, hi_min_ref, k_ref, v_ref, *refs, cfg,
                entries: bool, q_steps: int):
  if entries:
    eends_ref, eseg_ref, *refs = refs
  else:
    kseg_ref, *refs = refs
  q_ref, do_ref, qseg_ref, lse_ref, delta_ref, dk_ref, dv_ref, dk_sc, dv_sc = refs
  b, c, s_idx = pl.program_id(0), pl.program_id(2), pl.program_id(3)
  qi = jax.lax.rem(s_idx, q_steps)

  @pl.when(s_idx == 0)
  def _init():
    dk_sc[...] = jnp.zeros(dk_sc.shape, F32)
    dv_sc[...] = jnp.zeros(dv_sc.shape, F32)

  first = (qlo_ref[b, c] + qi) * cfg.bq
  # Every query of this step sees every key of the block: no mask.
  interior = (lo_max_ref[b, c] <= first) & (hi_min_ref[b, c] > first + cfg.bq - 1)

  def step(masked: bool):
    k, v, q, do = k_ref[...], v_ref[...], q_ref[...], do_ref[...]
    st = dot(k, q, NT) * cfg.scale  # keys x queries
    p = jnp.exp(st - lse_ref[...][:1, :])
    if masked:
      t_pos = first + jax.lax.broadcasted_iota(jnp.int32, st.shape, 1)
      seg_q = qseg_ref[...][:1, :]
      if entries:
        mask = (eends_ref[...][:, :1] <= t_pos) & (eseg_ref[...][:, :1] == seg_q)
      else:
        s_pos = c * cfg.bk + jax.lax.broadcasted_iota(jnp.int32, st.shape, 0)
        mask = ((s_pos <= t_pos) & (s_pos > t_pos - cfg.window)
                & (kseg_ref[...][:, :1] == seg_q))
      p = jnp.where(mask, p, 0.0)
    dv_sc[...] += dot(p.astype(do.dtype), do, NN)
    ds = p * (dot(v, do, NT) - delta_ref[...][:1, :])
    dk_sc[...] += dot(ds.astype(q.dtype), q, NN)

  active = qi < qn_ref[b, c]
  pl.when(active & interior)(lambda: step(masked=False))
  pl.when(active & jnp.logical_not(interior))(lambda: step(masked=True))

  @pl.when(s_idx == cfg.group * q_steps - 1)
  def _finish():
    dk_ref[...] = (dk_sc[...] * cfg.scale).astype(dk_ref.dtype)
    dv_ref[...] = dv_sc[...].astype(dv_ref.dtype)


def dkv_call(cfg, prefetch, keys, values, key_cols, q, do, qseg_rows, lse_rows,
              delta_rows, *, entries: bool):
  b, kh, length, d = keys.shape
  bk = cfg.bc if entries else cfg.bk
  q_steps = cfg.nq if entries else cfg.raw_q_steps
  g = cfg.group

  def q_block(b_, c, s, qlo, qn, *_):
    return qlo[b_, c] + clamp_step(jax.lax.rem(s, q_steps), qn[b_, c])

  head = lambda kv, s: kv * g + jax.lax.div(s, q_steps)
  key_spec = pl.BlockSpec((None, None, bk, d), lambda b_, kv, c, s, *_: (b_, kv, c, 0))
  col_spec = pl.BlockSpec((None, bk, LANES), lambda b_, kv, c, s, *_: (b_, c, 0))
  q_spec = pl.BlockSpec((None, None, cfg.bq, d),
                        lambda b_, kv, c, s, *p: (b_, head(kv, s), q_block(b_, c, s, *p), 0))
  qrow_spec = pl.BlockSpec((None, SUBLANES, cfg.bq),
                           lambda b_, kv, c, s, *p: (b_, 0, q_block(b_, c, s, *p)))
  hrow_spec = pl.BlockSpec((None, None, SUBLANES, cfg.bq),
                           lambda b_, kv, c, s, *p: (b_, head(kv, s), 0, q_block(b_, c, s, *p)))
  return pl.pallas_call(
      functools.partial(_dkv_kernel, cfg=cfg, entries=entries, q_steps=q_steps),
      grid_spec=pltpu.PrefetchScalarGridSpec(
          num_scalar_prefetch=4,
          grid=(b, kh, length // bk, g * q_steps),
          in_specs=[key_spec, key_spec] + [col_spec] * len(key_cols)
          + [q_spec, q_spec, qrow_spec, hrow_spec, hrow_spec],
          out_specs=[key_spec, key_spec],
          scratch_shapes=[pltpu.VMEM((bk, d), F32), pltpu.VMEM((bk, d), F32)]),
      out_shape=[jax.ShapeDtypeStruct(keys.shape, keys.dtype)] * 2,
      compiler_params=pltpu.CompilerParams(
          dimension_semantics=("parallel", "parallel", "parallel", "arbitrary")),
      interpret=cfg.interpret,
      name="chunk_attention_dkv_entries_tpu" if entries else "chunk_attention_dkv_raw_tpu",
  )(*prefetch, keys, values, *key_cols, q, do, qseg_rows, lse_rows, delta_rows)
