"""Full causal attention (GQA/MQA): the control of the study.

Implementations (``attn.implementation``; ``auto`` is resolved per platform and the path run by
``attention.dispatch``, from the table in ``config_sections/capabilities.py``):
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

from chunkformer.attention import context_axis, ring
from chunkformer.attention.common import AttentionContext, OutputProjection, QKVProjection
from chunkformer.attention.dispatch import full_attention
from chunkformer.config import AttentionConfig, ModelConfig
from chunkformer.kvcache import common as cache_lib
from chunkformer.kvcache import full as full_cache

Array = jax.Array


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
                               self.attn.interpret, ctx.row_layout)
    return OutputProjection(self.model, name="out")(o_BxTxHxD), shared
