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

Array = jax.Array


class FullAttention(nn.Module):
  model: ModelConfig
  attn: AttentionConfig
  layer: int

  @nn.compact
  def __call__(self, x_BxTxE: Array, ctx: AttentionContext, shared: dict) -> tuple[Array, dict]:
    q, k, v = QKVProjection(self.model, name="qkv")(x_BxTxE, ctx)
    mask = document_causal_mask(ctx.segment_ids_BxT)
    o_BxTxHxD = jax.nn.dot_product_attention(q, k, v, mask=mask, implementation="xla")
    return OutputProjection(self.model, name="out")(o_BxTxHxD), shared
