"""The decoder: a small Qwen3-style transformer with one attention kind per layer."""

from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp

from chunkformer.attention import AttentionContext, attention_class
from chunkformer.config import ModelConfig
from chunkformer.layers import RMSNorm, SwiGLU

Array = jax.Array


class Block(nn.Module):
  """Pre-norm residual block: x + attn(norm(x)), then x + mlp(norm(x))."""

  model: ModelConfig
  layer: int

  @nn.compact
  def __call__(self, x_BxTxE: Array, ctx: AttentionContext, shared: dict) -> tuple[Array, dict]:
    m = self.model
    attn_cfg = m.layer_attention(self.layer)
    attention = attention_class(attn_cfg.kind)(m, attn_cfg, self.layer, name="attn")
    y, shared = attention(RMSNorm(eps=m.norm_eps, name="attn_norm")(x_BxTxE), ctx, shared)
    x_BxTxE = x_BxTxE + y
    mlp_in = RMSNorm(eps=m.norm_eps, name="mlp_norm")(x_BxTxE)
    x_BxTxE = x_BxTxE + SwiGLU(m.mlp_dim, name="mlp")(mlp_in)
    return nn.with_logical_constraint(x_BxTxE, ("batch", "length", "act_embed")), shared


class Transformer(nn.Module):
  """tokens_BxT -> logits_BxTxV.

  ``positions_BxT`` default to 0..T-1 and ``segment_ids_BxT`` to a single document per row.
  ``train`` switches on training-only behaviour (random chunk phases). ``decode`` appends the
  tokens to each layer's cache in the ``cache`` collection instead (chunkformer/decode.py).
  """

  model: ModelConfig

  @nn.compact
  def __call__(self, tokens_BxT: Array, positions_BxT: Array | None = None,
               segment_ids_BxT: Array | None = None, train: bool = False,
               decode: bool = False) -> Array:
    m = self.model
    dtype = jnp.dtype(m.dtype)
    if positions_BxT is None:
      positions_BxT = jnp.broadcast_to(jnp.arange(tokens_BxT.shape[1]), tokens_BxT.shape)
    if segment_ids_BxT is None:
      segment_ids_BxT = jnp.zeros_like(tokens_BxT)
    ctx = AttentionContext(tokens_BxT, positions_BxT, segment_ids_BxT, train=train,
                           decode=decode)
    embedding = self.param(
        "embedding",
        nn.with_logical_partitioning(nn.initializers.normal(stddev=1.0), ("vocab", "embed")),
        (m.vocab_size, m.d_model))
    x_BxTxE = jnp.take(embedding, tokens_BxT, axis=0).astype(dtype)
    x_BxTxE = nn.with_logical_constraint(x_BxTxE, ("batch", "length", "act_embed"))
    shared: dict = {}
    for layer in range(m.num_layers):
      x_BxTxE, shared = Block(m, layer, name=f"block_{layer}")(x_BxTxE, ctx, shared)
    x_BxTxE = RMSNorm(eps=m.norm_eps, name="final_norm")(x_BxTxE)
    if m.tie_embeddings:
      logits = jnp.einsum("bte,ve->btv", x_BxTxE, embedding.astype(dtype))
      if m.scale_tied_logits:  # unit-scale embeddings: divide so initial logits are unit scale
        logits = logits * m.d_model**-0.5
    else:
      logits = nn.Dense(m.vocab_size, use_bias=False, dtype=dtype, name="unembed",
                        kernel_init=nn.with_logical_partitioning(
                            nn.initializers.normal(stddev=m.d_model**-0.5),
                            ("embed", "vocab")))(x_BxTxE)
    return nn.with_logical_constraint(logits.astype(jnp.float32), ("batch", "length", "vocab"))
