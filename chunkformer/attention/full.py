"""Full causal attention (GQA/MQA): the control of the study.

Implementations (``attn.implementation``; ``auto`` is resolved per platform by
``attention.implementation.resolve`` before the layer is built):
- ``xla``: ``jax.nn.dot_product_attention`` with a dense B x 1 x T x T document-causal mask
  (XLA materialises every score: memory grows as T**2);
- ``blockwise``: the online-softmax path of ``attention.blockwise`` (custom VJP), memory
  T x block, any platform; the choice of ``auto`` on CPU;
- ``splash``: JAX's TPU splash attention with segment ids (``attention.splash``); ``auto`` on
  TPU;
- ``pallas_gpu`` / ``pallas_tpu``: the project's chunk-attention kernels with a raw-key window
  covering the whole row and no entries (one padding entry that no query sees); ``auto`` on GPU
  takes ``pallas_gpu``. The kernels read documents as contiguous runs of equal ids
  (``kernels.document_runs``), which is every packed batch the data pipeline makes.

Under ``mesh.context_strategy: ring`` (with the context axis split over several devices and
``xla``, the only implementation context parallelism runs) the layer runs ``attention.ring``
instead: the same attention with each device's K/V block passed round the context devices.
"""

from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp

import kernels
from chunkformer.attention import blockwise, context_axis, ring
from chunkformer.attention.common import (
  AttentionContext,
  OutputProjection,
  QKVProjection,
  document_causal_mask,
)
from chunkformer.config import AttentionConfig, ModelConfig
from chunkformer.kvcache import common as cache_lib
from chunkformer.kvcache import full as full_cache
from kernels.implementation import PALLAS

Array = jax.Array


def full_attention(q_BxTxHxD: Array, k_BxTxKxD: Array, v_BxTxKxD: Array, segment_ids_BxT: Array,
                   implementation: str, interpret: bool = False) -> Array:
  """Document-causal attention of every query over its document's earlier keys; o_BxTxHxD."""
  if implementation == "xla":
    mask = document_causal_mask(segment_ids_BxT)
    return jax.nn.dot_product_attention(q_BxTxHxD, k_BxTxKxD, v_BxTxKxD, mask=mask,
                                        implementation="xla")
  if implementation == "blockwise":
    return blockwise.blockwise_attention(q_BxTxHxD, k_BxTxKxD, v_BxTxKxD, segment_ids_BxT)
  if implementation == "splash":
    from chunkformer.attention import splash  # Pallas TPU imports: only where it runs
    return splash.splash_attention(q_BxTxHxD, k_BxTxKxD, v_BxTxKxD, segment_ids_BxT,
                                   interpret=interpret)
  if implementation not in PALLAS:
    raise ValueError(f"full attention: unknown implementation {implementation!r} "
                     f"(resolve 'auto' first)")
  b, t = segment_ids_BxT.shape
  kh, d = k_BxTxKxD.shape[2:]
  no_entries = jnp.zeros((b, 1, kh, d), k_BxTxKxD.dtype)
  return kernels.chunk_attention(
      q_BxTxHxD, k_BxTxKxD, v_BxTxKxD, segment_ids_BxT, no_entries, no_entries,
      jnp.full((b, 1), kernels.PAD_END, jnp.int32),
      jnp.full((b, 1), kernels.PAD_SEGMENT, jnp.int32),
      window=t, implementation=implementation, interpret=interpret)


class FullAttention(nn.Module):
  model: ModelConfig
  attn: AttentionConfig
  layer: int

  @classmethod
  def init_cache(cls, model: ModelConfig, attn: AttentionConfig, layer: int, batch: int,
                 max_len: int) -> dict[str, Array]:
    """An empty decoding cache (every raw key/value) for ``max_len`` tokens."""
    del attn, layer
    return full_cache.init_state(model, batch, max_len)

  @nn.compact
  def __call__(self, x_BxTxE: Array, ctx: AttentionContext, shared: dict) -> tuple[Array, dict]:
    qkv = QKVProjection(self.model, name="qkv")
    if ctx.decode:
      state = self.variable("cache", "state", cache_lib.missing_cache)
      attend = None
      if ctx.sparse is not None and ctx.sparse.covers(self.layer):
        def attend(q, k, v):  # a sparse prefill (chunkformer/sparse_prefill)
          o, index = ctx.sparse.attend(self.layer, q, k, v)
          self.sow(full_cache.SPARSE_INDEX, "index", index)  # stored only where asked for
          return o
      o_BxTxHxD, q_BxTxHxD, state.value = full_cache.append(qkv, x_BxTxE, state.value, attend)
      self.sow(full_cache.QUERIES, "q", q_BxTxHxD)  # stored only where eviction asks for it
      return OutputProjection(self.model, name="out")(o_BxTxHxD), shared
    q, k, v = qkv(x_BxTxE, ctx)
    axis = context_axis.current() if ctx.kv_exchange == "ring" else None
    if axis is not None:
      o_BxTxHxD = ring.ring_attention(q, k, v, ctx.segment_ids_BxT, axis,
                                      balanced=ctx.load_balanced)
      return OutputProjection(self.model, name="out")(o_BxTxHxD), shared
    o_BxTxHxD = full_attention(q, k, v, ctx.segment_ids_BxT, self.attn.implementation,
                               self.attn.interpret)
    return OutputProjection(self.model, name="out")(o_BxTxHxD), shared
