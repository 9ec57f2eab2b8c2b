"""DeepSeek-V4's attention projections (``attn.layout = "deepseek_v4"``).

- query: low rank, ``q_r = RMSNorm(x W_qa)`` (learned scale), ``q = q_r W_qb`` per head, then
  an RMS normalisation per head without a scale, then RoPE. ``q_r`` also feeds the lightning
  indexer (attention/lightning_indexer.py).
- one vector per raw token serves as key and value: ``kv = RMSNorm(x W_kv)``, RoPE'd, so the
  layer rotates its output back (``common.derotate``).
- output: the H heads in G groups; each group's concatenated heads go through its own low-rank
  map ``W_oa[g]`` (H/G * D -> R), and ``W_ob`` maps the G * R channels back to the model width.

Weight names and shapes (logical axes in brackets; the names without a rule in the mesh table,
``q_rank``, ``group_heads``, ``o_rank``, are replicated):
``wq_a`` E x Rq [embed, q_rank], ``q_norm/scale`` Rq, ``wq_b`` Rq x H x D [q_rank, heads,
head_dim], ``wkv`` E x K x D [embed, kv_heads, head_dim], ``kv_norm/scale`` D;
``wo_a`` G x H/G x D x R [heads, group_heads, head_dim, o_rank], ``wo_b`` G x R x E [heads,
o_rank, embed]. chunkformer/convert/deepseek_v4.py maps the reference's tensors onto them.
"""

from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp

from chunkformer.config import AttentionConfig, ModelConfig
from chunkformer.layers import (
  Projection,
  RMSNorm,
  TokenShift,
  apply_rope,
  dense_init,
  layer_rope,
  rms_normalize,
)

Array = jax.Array


class V4Projection(nn.Module):
  """x_BxTxE -> (q_BxTxHxD, kv_BxTxKxD, kv_BxTxKxD): K = V (see module docstring)."""

  model: ModelConfig
  attn: AttentionConfig

  def setup(self):
    m, a = self.model, self.attn
    self.wq_a = Projection((a.query_rank,), ("embed", "q_rank"))
    self.q_norm = RMSNorm(axis_name="q_rank")
    self.wq_b = Projection((m.num_heads, m.head_dim), ("q_rank", "heads", "head_dim"))
    self.wkv = Projection((m.num_kv_heads, m.head_dim), ("embed", "kv_heads", "head_dim"))
    self.kv_norm = RMSNorm(axis_name="head_dim")
    if m.key_shift:
      self.key_shift = TokenShift(m.key_shift, (m.num_kv_heads, m.head_dim))
      if m.query_shift:
        self.query_shift = TokenShift(m.key_shift, (m.num_heads, m.head_dim),
                                      ("heads", "head_dim"))

  def query_residual(self, x_BxTxE: Array) -> Array:
    """q_r_BxTxRq = RMSNorm(x W_qa): the low-rank query, shared with the lightning indexer."""
    return self.q_norm(self.wq_a(x_BxTxE))

  def __call__(self, x_BxTxE: Array, ctx) -> tuple[Array, Array, Array]:
    m = self.model
    rope = layer_rope(m, self.attn)
    q = self.wq_b(self.query_residual(x_BxTxE))
    if m.key_shift and m.query_shift:
      q = q + self.query_shift(x_BxTxE, ctx.segment_ids_BxT)
    q = rms_normalize(q)
    kv = self.wkv(x_BxTxE)
    if m.key_shift:
      kv = kv + self.key_shift(x_BxTxE, ctx.segment_ids_BxT)
    kv = self.kv_norm(kv)
    q = nn.with_logical_constraint(apply_rope(q, ctx.positions_BxT, rope),
                                   ("batch", "length", "heads", "head_dim"))
    kv = nn.with_logical_constraint(apply_rope(kv, ctx.positions_BxT, rope),
                                    ("batch", "length", "kv_heads", "head_dim"))
    return q, kv, kv


class GroupedOutputProjection(nn.Module):
  """o_BxTxHxD -> y_BxTxE through G grouped low-rank maps (see module docstring)."""

  model: ModelConfig
  attn: AttentionConfig

  @nn.compact
  def __call__(self, o_BxTxHxD: Array) -> Array:
    m, a = self.model, self.attn
    b, t, h, d = o_BxTxHxD.shape
    g, r = a.output_groups, a.output_rank
    wo_a = self.param("wo_a", nn.with_logical_partitioning(
        dense_init(h // g * d), ("heads", "group_heads", "head_dim", "o_rank")), (g, h // g, d, r))
    wo_b = self.param("wo_b", nn.with_logical_partitioning(
        dense_init(g * r), ("heads", "o_rank", "embed")), (g, r, m.d_model))
    o = o_BxTxHxD.reshape(b, t, g, h // g, d)
    z_BxTxGxR = jnp.einsum("btgjd,gjdr->btgr", o, wo_a.astype(o.dtype))
    return jnp.einsum("btgr,gre->bte", z_BxTxGxR, wo_b.astype(o.dtype))
