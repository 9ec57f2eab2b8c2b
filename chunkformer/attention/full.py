"""Full causal attention (GQA/MQA): the control of the study."""

from __future__ import annotations

import flax.linen as nn
import jax

from chunkformer.attention.common import (
  AttentionContext,
  OutputProjection,
  QKVProjection,
  document_causal_mask,
)
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
      o_BxTxHxD, q_BxTxHxD, state.value = full_cache.append(qkv, x_BxTxE, state.value)
      self.sow(full_cache.QUERIES, "q", q_BxTxHxD)  # stored only where eviction asks for it
      return OutputProjection(self.model, name="out")(o_BxTxHxD), shared
    q, k, v = qkv(x_BxTxE, ctx)
    mask = document_causal_mask(ctx.segment_ids_BxT)
    o_BxTxHxD = jax.nn.dot_product_attention(q, k, v, mask=mask, implementation="xla")
    return OutputProjection(self.model, name="out")(o_BxTxHxD), shared
