"""block_sparse_attention on GPU: a Pallas Triton forward kernel (flash-attention style).

One program per (query block, row, query head). It runs one online softmax over the key blocks
its index lists (a dynamic-count loop, so an unlisted block is neither loaded nor computed) and
then over the head's gathered vertical columns in chunks up to the last column it keeps and
can see (columns arrive sorted by position), each column masked by its causal position and the
query block's keep flag (both folded into one "visible from" position: a column not kept gets a
position after every query).

Padding: D to a power of two >= 16 and the column count to a power of two >= 16 (Triton's
tiles); the block list to a power of two with -1 in the unused slots. The query block is the
index's block and must itself be a power of two >= 16.
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as pltriton

from kernels.padding import next_power_of_2, pad_to

Array = jax.Array
_F32 = jnp.float32
NEVER = 2**30  # a column position no query reaches


@dataclasses.dataclass(frozen=True)
class _Cfg:
  block: int
  scale: float
  group: int  # query heads per key/value head
  slots: int  # padded block-list length
  chunk: int  # columns per inner step (0: no columns)
  columns: int  # padded column count
  interpret: bool


def _dot_t(a, b):
  return jax.lax.dot_general(a, b, (((1,), (1,)), ((), ())), preferred_element_type=_F32)


def _dot(a, b):
  return jax.lax.dot_general(a, b, (((1,), (0,)), ((), ())), preferred_element_type=_F32)


def _update(carry, s, mask, v):
  acc, m, denom = carry
  s = jnp.where(mask, s, -jnp.inf)
  m_new = jnp.maximum(m, jnp.max(s, axis=1))
  m_safe = jnp.where(m_new == -jnp.inf, 0.0, m_new)
  alpha = jnp.exp(m - m_safe)
  p = jnp.exp(s - m_safe[:, None])
  return (alpha[:, None] * acc + _dot(p.astype(v.dtype), v), m_new,
          alpha * denom + jnp.sum(p, axis=1))


def _kernel(blocks_ref, q_ref, k_ref, v_ref, *refs, cfg: _Cfg):
  o_ref = refs[-1]
  i = pl.program_id(0)
  bq = cfg.block
  q = q_ref[...]
  t_pos = i * bq + jnp.arange(bq, dtype=jnp.int32)
  blocks = blocks_ref[...]
  slot = jnp.arange(cfg.slots, dtype=jnp.int32)
  count = jnp.sum((blocks >= 0).astype(jnp.int32))
  carry = (jnp.zeros(q.shape, _F32), jnp.full((bq,), -jnp.inf, _F32), jnp.zeros((bq,), _F32))

  def block_body(s, carry):
    # The s-th listed block as a vector reduction: a scalar read at a dynamic index of a
    # vector ref is not something every Triton lowering offers.
    j = jnp.sum(jnp.where(slot == s, blocks, 0))
    k = k_ref[pl.ds(j * bq, bq), :]
    mask = (j * bq + jnp.arange(bq, dtype=jnp.int32))[None, :] <= t_pos[:, None]
    return _update(carry, _dot_t(q, k) * cfg.scale, mask, v_ref[pl.ds(j * bq, bq), :])

  carry = jax.lax.fori_loop(0, count, block_body, carry)
  if cfg.chunk:
    kc_ref, vc_ref, cvis_ref = refs[:3]

    def column_body(c, carry):
      rows = pl.ds(c * cfg.chunk, cfg.chunk)
      mask = cvis_ref[rows][None, :] <= t_pos[:, None]
      return _update(carry, _dot_t(q, kc_ref[rows, :]) * cfg.scale, mask, vc_ref[rows, :])

    # Columns come sorted by position: past the last one this block keeps and sees, none is.
    seen = cvis_ref[...] <= i * bq + bq - 1
    last = jnp.max(jnp.where(seen, jnp.arange(cfg.columns, dtype=jnp.int32) + 1, 0))
    carry = jax.lax.fori_loop(0, jax.lax.div(last + cfg.chunk - 1, cfg.chunk), column_body,
                              carry)
  acc, _, denom = carry
  o_ref[...] = (acc / jnp.where(denom > 0, denom, 1.0)[:, None]).astype(o_ref.dtype)


def block_sparse_gpu(q, k, v, blocks, counts, columns, keep, *, block: int, scale: float,
                     interpret) -> Array:
  """Pallas Triton implementation of ``kernels.block_sparse_attention`` on inputs padded to
  whole blocks (T = N * block), kept columns already exclusive of the listed blocks."""
  if block < 16 or block & (block - 1):
    raise ValueError(f"pallas_gpu: block must be a power of two >= 16, got {block}")
  b, tp, h, d = q.shape
  kh = k.shape[2]
  n, s = blocks.shape[2:]
  dp = max(16, next_power_of_2(d))
  slots = max(16, next_power_of_2(s))
  listed = jnp.where(jnp.arange(s) < counts[..., None], blocks, -1)
  listed = pad_to(listed, 3, slots, -1)
  v_count = columns.shape[2]
  cols = max(16, next_power_of_2(v_count)) if v_count else 0
  cfg = _Cfg(block=block, scale=scale, group=h // kh, slots=slots, chunk=min(64, cols),
             columns=cols, interpret=bool(interpret))
  pad_d = lambda x: pad_to(x, 3, dp)
  g = cfg.group
  q_spec = pl.BlockSpec((None, block, None, dp), lambda i, b_, h_: (b_, i, h_, 0))
  kv_spec = pl.BlockSpec((None, tp, None, dp), lambda i, b_, h_: (b_, 0, h_ // g, 0))
  in_specs = [pl.BlockSpec((None, None, None, slots), lambda i, b_, h_: (b_, h_, i, 0)),
              q_spec, kv_spec, kv_spec]
  args = [listed, pad_d(q), pad_d(k), pad_d(v)]
  if cols:
    heads = jnp.arange(h) // g
    idx = jnp.clip(columns, 0, tp - 1)[..., None]
    gather = lambda x: pad_to(pad_to(jnp.take_along_axis(
        x[:, :, heads].transpose(0, 2, 1, 3), idx, axis=2), 2, cols), 3, dp)
    # Where a column is visible from: its position if the query block keeps it, else never.
    cvis = jnp.where(keep, columns[:, :, None, :], NEVER)
    col_spec = pl.BlockSpec((None, None, cols, dp), lambda i, b_, h_: (b_, h_, 0, 0))
    in_specs += [col_spec, col_spec,
                 pl.BlockSpec((None, None, None, cols), lambda i, b_, h_: (b_, h_, i, 0))]
    args += [gather(k), gather(v), pad_to(cvis, 3, cols, NEVER)]
  o = pl.pallas_call(
      functools.partial(_kernel, cfg=cfg),
      grid=(n, b, h),
      in_specs=in_specs,
      out_specs=q_spec,
      out_shape=jax.ShapeDtypeStruct((b, tp, h, dp), q.dtype),
      compiler_params=pltriton.CompilerParams(num_warps=4, num_stages=2),
      interpret=cfg.interpret,
      name="block_sparse_fwd",
  )(*args)
  return o[..., :d]
