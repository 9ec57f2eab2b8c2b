"""block_sparse_attention on TPU: a Pallas Mosaic forward kernel with scalar-prefetched blocks.

Grid (B, H, query blocks, steps): the first S steps walk the query block's listed key blocks,
the rest the head's gathered columns in chunks of 128 (sorted by position: the chunks past the
last column a query block keeps and sees are skipped like unlisted blocks). The block list, the
counts and the column-chunk counts are scalar-prefetched into SMEM; the key/value index map
reads the listed block of the step and repeats the last listed block past the count, so Pallas
skips the DMA, and ``pl.when`` skips the compute: an unlisted block costs only grid overhead.
Tensors are heads-major (B, H, T, D) as Mosaic tiles the last two dimensions; per-column
"visible from" positions (a column not kept by the query block gets a position after every
query) are rows broadcast over 8 sublanes, the running max and sum columns replicated over 128
lanes (the layout of ``attention_tpu``).
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from kernels.padding import pad_to, round_up
from kernels.tpu_common import F32, LANES, NT, SUBLANES, dot, init_softmax, online_update

Array = jax.Array
NEVER = 2**30


@dataclasses.dataclass(frozen=True)
class _Cfg:
  block: int
  scale: float
  group: int
  slots: int  # S: block steps
  chunks: int  # column steps (0: no columns)


def _kernel(blocks_ref, counts_ref, chunks_ref, q_ref, k_ref, v_ref, *refs, cfg: _Cfg):
  o_ref, m_sc, l_sc, acc_sc = refs[-4:]
  b, h, i, j = (pl.program_id(a) for a in range(4))
  bq = cfg.block

  @pl.when(j == 0)
  def _init():
    init_softmax(m_sc, l_sc, acc_sc)

  def update(s, mask, v):
    online_update(m_sc, l_sc, acc_sc, s, mask, v)

  q = q_ref[...]

  @pl.when(j < counts_ref[b, h, i])
  def _block():
    blk = blocks_ref[b, h, i, jnp.minimum(j, cfg.slots - 1)]
    s = dot(q, k_ref[...], NT) * cfg.scale
    t_pos = i * bq + jax.lax.broadcasted_iota(jnp.int32, s.shape, 0)
    s_pos = blk * bq + jax.lax.broadcasted_iota(jnp.int32, s.shape, 1)
    update(s, s_pos <= t_pos, v_ref[...])

  if cfg.chunks:
    kc_ref, vc_ref, cvis_ref = refs[:3]

    @pl.when((j >= cfg.slots) & (j - cfg.slots < chunks_ref[b, h, i]))
    def _columns():
      s = dot(q, kc_ref[...], NT) * cfg.scale
      t_pos = i * bq + jax.lax.broadcasted_iota(jnp.int32, s.shape, 0)
      update(s, cvis_ref[...][:1, :] <= t_pos, vc_ref[...])

  @pl.when(j == cfg.slots + cfg.chunks - 1)
  def _finish():
    denom = l_sc[...]
    o_ref[...] = (acc_sc[...] / jnp.where(denom > 0, denom, 1.0)[:, :1]).astype(o_ref.dtype)


def block_sparse_tpu(q, k, v, blocks, counts, columns, keep, *, block: int, scale: float,
                     interpret) -> Array:
  """Pallas Mosaic implementation of ``kernels.block_sparse_attention`` on inputs padded to
  whole blocks (T = N * block), kept columns already exclusive of the listed blocks."""
  if block % SUBLANES:
    raise ValueError(f"pallas_tpu: block must be a multiple of {SUBLANES}, got {block}")
  interpret = interpret if isinstance(interpret, pltpu.InterpretParams) else bool(interpret)
  b, tp, h, d = q.shape
  kh = k.shape[2]
  n, s = blocks.shape[2:]
  g = h // kh
  v_count = columns.shape[2]
  cols = round_up(v_count, LANES) if v_count else 0
  cfg = _Cfg(block=block, scale=scale, group=g, slots=s, chunks=cols // LANES)
  # Past its count a step keeps the last listed block: the same block index, so no new DMA.
  slot = jnp.minimum(jnp.arange(s), jnp.maximum(counts[..., None] - 1, 0))
  listed = jnp.take_along_axis(jnp.clip(blocks, 0, n - 1), slot, axis=3).astype(jnp.int32)
  heads_major = lambda x: jnp.swapaxes(x, 1, 2)

  def kv_map(b_, h_, i, j, blocks_ref, *_):
    # lax.div: jnp's // lowers through ops Mosaic handles per device kind
    return (b_, jax.lax.div(h_, g), blocks_ref[b_, h_, i, jnp.minimum(j, s - 1)], 0)

  kv_spec = pl.BlockSpec((None, None, block, d), kv_map)
  q_spec = pl.BlockSpec((None, None, block, d), lambda b_, h_, i, j, *_: (b_, h_, i, 0))
  in_specs = [q_spec, kv_spec, kv_spec]
  args = [heads_major(q), heads_major(k), heads_major(v)]
  col_chunks = jnp.zeros((b, h, n), jnp.int32)
  if cols:
    heads = jnp.arange(h) // g
    idx = jnp.clip(columns, 0, tp - 1)[..., None]
    gather = lambda x: pad_to(jnp.take_along_axis(x[:, :, heads].transpose(0, 2, 1, 3), idx,
                                                  axis=2), 2, cols)
    cvis = pad_to(jnp.where(keep, columns[:, :, None, :], NEVER), 3, cols, NEVER)
    # Columns come sorted by position: a query block's chunks end at the last column it keeps
    # and sees; later chunk steps repeat that chunk's index (no DMA) and skip their compute.
    seen = cvis <= (jnp.arange(n) * block + block - 1)[:, None]
    last = jnp.max(jnp.where(seen, jnp.arange(cols) + 1, 0), axis=-1)
    col_chunks = -(-last // LANES)
    chunk = lambda b_, h_, i, j, chunks_ref: jnp.minimum(
        jnp.maximum(j - s, 0), jnp.maximum(chunks_ref[b_, h_, i] - 1, 0))
    col_spec = pl.BlockSpec((None, None, LANES, d), lambda b_, h_, i, j, _, __, c: (
        b_, h_, chunk(b_, h_, i, j, c), 0))
    cvis = jnp.broadcast_to(cvis[:, :, :, None, :], (b, h, n, SUBLANES, cols))
    in_specs += [col_spec, col_spec,
                 pl.BlockSpec((None, None, None, SUBLANES, LANES),
                              lambda b_, h_, i, j, _, __, c: (b_, h_, i, 0,
                                                              chunk(b_, h_, i, j, c)))]
    args += [gather(k), gather(v), cvis.astype(jnp.int32)]
  o = pl.pallas_call(
      functools.partial(_kernel, cfg=cfg),
      grid_spec=pltpu.PrefetchScalarGridSpec(
          num_scalar_prefetch=3,
          grid=(b, h, n, s + cfg.chunks),
          in_specs=in_specs,
          out_specs=q_spec,
          scratch_shapes=[pltpu.VMEM((block, LANES), F32), pltpu.VMEM((block, LANES), F32),
                          pltpu.VMEM((block, d), F32)]),
      out_shape=jax.ShapeDtypeStruct((b, h, tp, d), q.dtype),
      compiler_params=pltpu.CompilerParams(
          dimension_semantics=("parallel", "parallel", "parallel", "arbitrary")),
      interpret=interpret,
      name="block_sparse_fwd_tpu",
  )(listed, counts.astype(jnp.int32), col_chunks.astype(jnp.int32), *args)
  return jnp.swapaxes(o, 1, 2)
