"""The decoder: a Qwen3-style transformer with one attention kind per layer.

Mixed precision: parameters stay in ``model.param_dtype`` and are cast to ``model.dtype`` where
they are used; norms, softmax statistics, pooling weights and the logits are float32.
``model.remat`` and ``model.scan_layers`` choose how blocks are stacked (layer_stack.py).
"""

from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp

import kernels
from chunkformer import layer_stack
from chunkformer.attention import (
  AttentionContext,
  attention_class,
  context_axis,
  dispatch,
  load_balance,
)
from chunkformer.config import ConfigError, ModelConfig, capabilities
from chunkformer.layers import RMSNorm, SwiGLU

Array = jax.Array


class Block(nn.Module):
  """Pre-norm residual block: x + attn(norm(x)), then x + mlp(norm(x))."""

  model: ModelConfig
  layer: int

  @nn.compact
  def __call__(self, x_BxTxE: Array, ctx: AttentionContext, shared: dict) -> tuple[Array, dict]:
    m = self.model
    attn_cfg = dispatch.resolve(m.layer_attention(self.layer), m.num_kv_heads)
    attention = attention_class(attn_cfg.kind)(m, attn_cfg, self.layer, name="attn")
    y, shared = attention(RMSNorm(eps=m.norm_eps, name="attn_norm")(x_BxTxE), ctx, shared)
    dtype = x_BxTxE.dtype  # the residual stream keeps its dtype (a scan carry must)
    x_BxTxE = x_BxTxE + y.astype(dtype)
    x_BxTxE = x_BxTxE + SwiGLU(m.mlp_dim, name="mlp")(
        RMSNorm(eps=m.norm_eps, name="mlp_norm")(x_BxTxE)).astype(dtype)
    return nn.with_logical_constraint(x_BxTxE, ("batch", "length", "act_embed")), shared


def block_class(model: ModelConfig, in_scan: bool) -> type[nn.Module]:
  """Block, wrapped in ``nn.remat`` with the ``model.remat`` policy unless it is 'none'."""
  if model.remat == "none":
    return Block
  # Inside a scan the loop boundary already keeps XLA from merging recomputation with the
  # forward pass, so common-subexpression prevention would only cost performance.
  return nn.remat(Block, policy=layer_stack.REMAT_POLICIES[model.remat], prevent_cse=not in_scan)


class BlockUnit(nn.Module):
  """One repetition of the layer pattern, as a scan body: (x, shared) carry, ctx broadcast."""

  model: ModelConfig
  first_layer: int  # the layer whose static behaviour every repetition shares

  @nn.compact
  def __call__(self, carry: tuple[Array, dict], ctx: AttentionContext):
    x_BxTxE, shared = carry
    cls = block_class(self.model, in_scan=True)
    for j in range(self.model.pattern_period):
      x_BxTxE, shared = cls(self.model, self.first_layer + j, name=f"block_{j}")(
          x_BxTxE, ctx, shared)
    return (x_BxTxE, shared), None


def head_weights(m: ModelConfig, params) -> tuple[Array, float, str | None]:
  """The output head as (w_VxE as the head uses it, logit scale, rounding dtype).

  ``logits = (x @ w.T) * scale``, rounded to ``rounding dtype`` first where the head computes
  in ``model.dtype`` (the untied Dense); the tiled loss (chunkformer/loss_tiles.py) reproduces
  the head's logits from the final hidden states with these.
  """
  dtype = jnp.dtype(m.dtype)
  if m.tie_embeddings:
    scale = m.d_model**-0.5 if m.scale_tied_logits else 1.0
    return params["embedding"].astype(dtype), scale, None
  return params["unembed"]["kernel"].astype(dtype).T, 1.0, m.dtype


def init_cache(model: ModelConfig, batch: int, max_len: int) -> dict:
  """Empty caches of every layer for ``max_len`` tokens, as the ``cache`` collection of the
  unscanned Transformer (``block_<layer>/attn/state``: each kind's ``init_cache``). Public as
  ``decode.init_cache``; here so that what decode runs (sparse_prefill/) builds caches without
  importing decode."""
  return {f"block_{layer}": {"attn": {"state": attention_class(attn.kind).init_cache(
      model, attn, layer, batch, max_len)}} for layer, attn in enumerate(model.layers)}


class Transformer(nn.Module):
  """tokens_BxT -> logits_BxTxV.

  ``positions_BxT`` default to 0..T-1 and ``segment_ids_BxT`` to a single document per row.
  ``train`` switches on training-only behaviour (random chunk phases). ``decode`` appends the
  tokens to each layer's cache in the ``cache`` collection instead (chunkformer/decode.py).
  ``hidden`` returns the final-normed hidden states x_BxTxE instead of the logits (the head is
  then ``head_weights``; the tiled loss never forms B x T x V logits). ``sparse`` (a
  chunkformer.sparse_prefill Plan; only with ``decode``, into an empty cache) makes the full
  layers attend through the plan's sparse patterns.
  """

  model: ModelConfig
  # Context parallelism (mesh.context_strategy / mesh.context_load_balance; runtime.build sets
  # them): they act only where the mesh in force splits the tokens (attention/context_axis.py).
  kv_exchange: str = "all_gather"
  load_balance: bool = False

  @nn.compact
  def __call__(self, tokens_BxT: Array, positions_BxT: Array | None = None,
               segment_ids_BxT: Array | None = None, train: bool = False,
               decode: bool = False, hidden: bool = False, sparse=None) -> Array:
    m = self.model
    if sparse is not None and not decode:
      raise ValueError("sparse prefill (a chunkformer.sparse_prefill Plan) runs with decode=True "
                       "into an empty cache: use decode.prefill(..., sparse=)")
    dtype = jnp.dtype(m.dtype)
    if positions_BxT is None:
      positions_BxT = jnp.broadcast_to(jnp.arange(tokens_BxT.shape[1]), tokens_BxT.shape)
    if segment_ids_BxT is None:
      segment_ids_BxT = jnp.zeros_like(tokens_BxT)
    # Load balancing: the rows enter in the balanced token order (positions travel with their
    # tokens, so RoPE and the documents are the true ones) and the hidden states leave in the
    # natural order, so the head, the logits and the loss never see the reorder.
    balance = context_axis.current() if self.load_balance and not decode else None
    if balance is not None:
      tokens_BxT, positions_BxT, segment_ids_BxT = (
          load_balance.reorder(x, ("batch", "length"), balance)
          for x in (tokens_BxT, positions_BxT, segment_ids_BxT))
    # The kernels' view of the documents, once per step for every layer that reads it (outside
    # the layer scan and remat).
    reads_layout = not decode and any(
        capabilities.TABLE[dispatch.resolve(m.layer_attention(i), m.num_kv_heads)
                           .implementation].reads_row_layout for i in range(m.num_layers))
    ctx = AttentionContext(tokens_BxT, positions_BxT, segment_ids_BxT, train=train,
                           decode=decode, kv_exchange=self.kv_exchange,
                           load_balanced=balance is not None, sparse=sparse,
                           row_layout=kernels.row_layout(segment_ids_BxT) if reads_layout else None)
    embedding = self.param(
        "embedding",
        nn.with_logical_partitioning(nn.initializers.normal(stddev=1.0), ("vocab", "embed")),
        (m.vocab_size, m.d_model))
    x_BxTxE = jnp.take(embedding, tokens_BxT, axis=0).astype(dtype)
    x_BxTxE = nn.with_logical_constraint(x_BxTxE, ("batch", "length", "act_embed"))
    shared: dict = {}
    stack = layer_stack.plan(m)
    if stack.repeats and decode:
      raise ConfigError("config field 'model.scan_layers': decoding runs the unscanned layout; "
                        "convert params with layer_stack.unstack_params and set it False")
    cls = block_class(m, in_scan=False)
    for layer in range(stack.unrolled):
      x_BxTxE, shared = cls(m, layer, name=f"block_{layer}")(x_BxTxE, ctx, shared)
    if stack.repeats:
      scan = nn.scan(BlockUnit, variable_axes={c: 0 for c in layer_stack.SCANNED_COLLECTIONS},
                     split_rngs={"params": True, "phase": True}, in_axes=(nn.broadcast,),
                     length=stack.repeats,
                     metadata_params={nn.PARTITION_NAME: layer_stack.SCAN_AXIS_NAME})
      (x_BxTxE, shared), _ = scan(m, stack.unrolled, name=layer_stack.SCAN_NAME)(
          (x_BxTxE, shared), ctx)
    if balance is not None:
      x_BxTxE = load_balance.reorder(x_BxTxE, ("batch", "length", "act_embed"), balance,
                                     inverse=True)
    x_BxTxE = RMSNorm(eps=m.norm_eps, name="final_norm")(x_BxTxE)
    if hidden:
      return x_BxTxE
    if m.tie_embeddings:
      logits = jnp.einsum("bte,ve->btv", x_BxTxE, embedding.astype(dtype),
                          preferred_element_type=jnp.float32)
      if m.scale_tied_logits:  # unit-scale embeddings: divide so initial logits are unit scale
        logits = logits * m.d_model**-0.5
    else:
      logits = nn.Dense(m.vocab_size, use_bias=False, dtype=dtype, name="unembed",
                        kernel_init=nn.with_logical_partitioning(
                            nn.initializers.normal(stddev=m.d_model**-0.5),
                            ("embed", "vocab")))(x_BxTxE)
    return nn.with_logical_constraint(logits.astype(jnp.float32), ("batch", "length", "vocab"))
