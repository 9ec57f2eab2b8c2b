"""Full attention on TPU through JAX's splash attention (``attention.implementation: splash``).

``jax.experimental.pallas.ops.tpu.splash_attention``: a causal mask per head and segment ids
for packed documents (a key is visible iff causal and the ids are equal, today's dense rule), the
kernel's own custom VJP. GQA runs one MQA kernel per kv head over its H/K query heads (vmapped
with the batch). Splash tiles T by 128: T is padded with a segment id no real token has (padded
keys lie after every real query, so causality hides them) and sliced back. It does not scale the
logits itself, so q is scaled by D**-0.5 first. ``interpret=True`` runs it on CPU (tests).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax.experimental.pallas.ops.tpu.splash_attention import splash_attention_kernel as splash
from jax.experimental.pallas.ops.tpu.splash_attention import splash_attention_mask as masks

Array = jax.Array
TILE = 128  # splash's default and smallest lane-aligned block


def splash_attention(q_BxTxHxD: Array, k_BxTxKxD: Array, v_BxTxKxD: Array,
                     segment_ids_BxT: Array, *, interpret: bool = False,
                     block: int = 512) -> Array:
  """Document-causal GQA attention of every query; o_BxTxHxD in q's dtype."""
  b, t, h, d = q_BxTxHxD.shape
  kh = k_BxTxKxD.shape[2]
  g = h // kh
  tp = -(-t // TILE) * TILE
  pad = tp - t
  widths = ((0, 0), (0, pad), (0, 0), (0, 0))
  q, k, v = (jnp.pad(x, widths) for x in (q_BxTxHxD * d**-0.5, k_BxTxKxD, v_BxTxKxD))
  seg = jnp.pad(segment_ids_BxT, ((0, 0), (0, pad)), constant_values=jnp.min(segment_ids_BxT) - 1)
  blk = max(TILE, min(block, tp) // TILE * TILE)
  while tp % blk:  # the largest multiple of 128 up to ``block`` that divides the padded length
    blk -= TILE
  sizes = splash.BlockSizes(block_q=blk, block_kv=blk, block_kv_compute=blk, block_q_dkv=blk,
                            block_kv_dkv=blk, block_kv_dkv_compute=blk, block_q_dq=blk,
                            block_kv_dq=blk)
  kernel = splash.make_splash_mqa_single_device(
      masks.MultiHeadMask([masks.CausalMask((tp, tp))] * g), block_sizes=sizes,
      interpret=interpret)

  def one(q_GxTxD, k_TxD, v_TxD, seg_T):
    return kernel(q_GxTxD, k_TxD, v_TxD, segment_ids=splash.SegmentIds(q=seg_T, kv=seg_T))

  q_BxKxGxTxD = q.reshape(b, tp, kh, g, d).transpose(0, 2, 3, 1, 4)
  k_BxKxTxD, v_BxKxTxD = (x.transpose(0, 2, 1, 3) for x in (k, v))
  per_row = jax.vmap(one, in_axes=(0, 0, 0, None))  # over kv heads, one row's segment ids
  o = jax.vmap(per_row)(q_BxKxGxTxD, k_BxKxTxD, v_BxKxTxD, seg)
  return o.transpose(0, 3, 1, 2, 4).reshape(b, tp, h, d)[:, :t].astype(q_BxTxHxD.dtype)
