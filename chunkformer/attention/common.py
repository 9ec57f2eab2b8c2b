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

from chunkformer.config import ModelConfig
from chunkformer.context import AttentionContext
from chunkformer.layers import Projection, RMSNorm, TokenShift, apply_rope

Array = jax.Array


class QKVProjection(nn.Module):
  """Queries, raw keys and values, with QK-norm, RoPE and the optional token shift.

  Returns q_BxTxHxD, k_BxTxKxD, v_BxTxKxD. RoPE is applied at ``ctx.positions_BxT``;
  ``rope_dim == 0`` (model.rope = False) leaves them unrotated.
  """

  model: ModelConfig

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
    if m.qk_norm:
      q = RMSNorm(axis_name="head_dim", eps=m.norm_eps, name="q_norm")(q)
      k = RMSNorm(axis_name="head_dim", eps=m.norm_eps, name="k_norm")(k)
    q = apply_rope(q, ctx.positions_BxT, m.rope_dim, m.rope_base)
    k = apply_rope(k, ctx.positions_BxT, m.rope_dim, m.rope_base)
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


def document_causal_mask(segment_ids_BxT: Array) -> Array:
  """mask_Bx1xTxT: query t sees key s iff s <= t and both lie in the same document."""
  t = segment_ids_BxT.shape[1]
  causal = jnp.tril(jnp.ones((t, t), dtype=bool))
  same_doc = segment_ids_BxT[:, :, None] == segment_ids_BxT[:, None, :]
  return (causal[None] & same_doc)[:, None]

