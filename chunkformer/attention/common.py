"""What every attention kind shares: its calling contract and the q/k/v/o projections.

Contract: an attention kind is a Linen module constructed as
``Kind(model=ModelConfig, attn=AttentionConfig, layer=int)`` and called as
``y_BxTxE, shared = kind(x_BxTxE, ctx, shared)``.
- ``ctx`` (AttentionContext) carries the row's tokens, positions and document ids, and whether
  this is a training pass (random chunk phases apply only then).
- ``shared`` is a dict handed from layer to layer by the decoder; a kind may read or add
  entries (the dynamic kind stores its boundary prediction there so that a group of layers
  computes it once). Kinds that share nothing return it unchanged.
- Auxiliary losses are sown into the ``aux_loss`` collection, diagnostics into ``aux_metrics``
  (see chunkformer/objective.py).
"""

from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp

from chunkformer.attention import v4_projection
from chunkformer.config import AttentionConfig, ModelConfig
from chunkformer.context import AttentionContext
from chunkformer.layers import (
  Projection,
  RMSNorm,
  Rope,
  TokenShift,
  apply_rope,
  derotates_output,
  layer_rope,
)

Array = jax.Array


class QKVProjection(nn.Module):
  """Queries, raw keys and values, with QK-norm, RoPE and the optional token shift.

  Returns q_BxTxHxD, k_BxTxKxD, v_BxTxKxD. RoPE (the layer's, ``layers.layer_rope``) is
  applied at ``ctx.positions_BxT``; ``rope_dim == 0`` (model.rope = False) leaves them
  unrotated. Where the layer's entries carry RoPE as values (``layers.derotates_output``) the
  raw values are rotated as well, and the kind rotates its output back (``derotate``).
  """

  model: ModelConfig
  attn: AttentionConfig | None = None  # None: a layer without entries (kind 'full')

  @nn.compact
  def __call__(self, x_BxTxE: Array, ctx: AttentionContext) -> tuple[Array, Array, Array]:
    m = self.model
    q = Projection((m.num_heads, m.head_dim), ("embed", "heads", "head_dim"), name="q")(x_BxTxE)
    k = Projection((m.num_kv_heads, m.head_dim), ("embed", "kv_heads", "head_dim"),
                   name="k")(x_BxTxE)
    v = Projection((m.num_kv_heads, m.head_dim), ("embed", "kv_heads", "head_dim"),
                   name="v")(x_BxTxE)
    if m.key_shift:
      shift = TokenShift(m.key_shift, (m.num_kv_heads, m.head_dim), name="key_shift")
      k = k + shift(x_BxTxE, ctx.segment_ids_BxT)
      if m.value_shift:
        v = v + TokenShift(m.key_shift, (m.num_kv_heads, m.head_dim),
                           name="value_shift")(x_BxTxE, ctx.segment_ids_BxT)
      if m.query_shift:
        q = q + TokenShift(m.key_shift, (m.num_heads, m.head_dim), ("heads", "head_dim"),
                           name="query_shift")(x_BxTxE, ctx.segment_ids_BxT)
    if m.qk_norm:
      q = RMSNorm(axis_name="head_dim", eps=m.norm_eps, name="q_norm")(q)
      k = RMSNorm(axis_name="head_dim", eps=m.norm_eps, name="k_norm")(k)
    rope = Rope(m.rope_dim, m.rope_base) if self.attn is None else layer_rope(m, self.attn)
    q = apply_rope(q, ctx.positions_BxT, rope)
    k = apply_rope(k, ctx.positions_BxT, rope)
    if self.attn is not None and derotates_output(m, self.attn):
      v = apply_rope(v, ctx.positions_BxT, rope)
    q = nn.with_logical_constraint(q, ("batch", "length", "heads", "head_dim"))
    k = nn.with_logical_constraint(k, ("batch", "length", "kv_heads", "head_dim"))
    v = nn.with_logical_constraint(v, ("batch", "length", "kv_heads", "head_dim"))
    return q, k, v


class OutputProjection(nn.Module):
  model: ModelConfig

  @nn.compact
  def __call__(self, o_BxTxHxD: Array) -> Array:
    return Projection((self.model.d_model,), ("heads", "head_dim", "embed"), in_axes=2,
                      name="o")(o_BxTxHxD)


def projections(model: ModelConfig, attn: AttentionConfig) -> tuple[nn.Module, nn.Module]:
  """(q/k/v projection, output projection) of the layer's layout, named ``qkv`` and ``out``."""
  if attn.layout == "deepseek_v4":
    return (v4_projection.V4Projection(model, attn, name="qkv"),
            v4_projection.GroupedOutputProjection(model, attn, name="out"))
  return QKVProjection(model, attn, name="qkv"), OutputProjection(model, name="out")


def derotate(model: ModelConfig, attn: AttentionConfig, o_BxTxHxD: Array,
             positions_BxT: Array) -> Array:
  """The attention output with its rope channels rotated back by the query position.

  Every value of a layer where ``derotates_output`` holds carries RoPE at its own position
  (entries at their chunk start, raw tokens at theirs), so rotating the output by -t makes each
  value's contribution depend on its offset from the query only (DeepSeek-V4's inverse
  ``apply_rotary_emb`` on the output). Linear in the output, hence the same post-op for the
  XLA path, the Pallas kernels and decoding. Other layers pass through unchanged.
  """
  if not derotates_output(model, attn):
    return o_BxTxHxD
  return apply_rope(o_BxTxHxD, positions_BxT, layer_rope(model, attn), inverse=True)


def document_causal_mask(segment_ids_BxT: Array) -> Array:
  """mask_Bx1xTxT: query t sees key s iff s <= t and both lie in the same document."""
  t = segment_ids_BxT.shape[1]
  causal = jnp.tril(jnp.ones((t, t), dtype=bool))
  same_doc = segment_ids_BxT[:, :, None] == segment_ids_BxT[:, None, :]
  return (causal[None] & same_doc)[:, None]

