"""Dynamic (boundary-predicted) chunk compression: the attention kind ``dynamic``.

Chunks are described by causal end flags (chunkformer/chunking) from one of three predictors:
``router`` (learned, H-Net style, held at the target mean length ``chunk_size`` by the ratio
loss), ``delimiter`` (a chunk closes at every configured delimiter token) or ``fixed`` (every
``chunk_size`` tokens: fixed chunking through the packed path, a control). A chunk never
crosses a document; the open chunk at a document's end produces no entry. Under the router's
``start`` rule (H-Net's reading, the default) a chunk is closed by the token after it, so its
entry becomes visible one token after its last token (chunkformer/chunking/router.py).

Per layer: the same compressor as the ``fixed`` kind (``Compressor``: projections, gate logits,
slot bias indexed by the token's position inside its chunk, RMSNorm, RoPE at the chunk's start
position; pooling gated | gated_no_bias | mean) pools each closed chunk into one entry of a
static-capacity packed buffer (``kernels.segment_pool``), and ``dispatch.compressed_attention``
(the blockwise XLA path, at long T in blocks of queries, or ``kernels.chunk_attention`` for
Pallas) runs one softmax over the raw
tokens of the sliding window W, the visible entries (end <= t, same document) and the optional
sink. Boundaries are one ``chunking.boundaries.Boundaries`` value (end flags, router
probabilities, packed layout with each entry's visible-from position). With
``mutable=["intermediates"]`` the entries, their end and visible-from positions (``entries``,
``entry_ends``, ``entry_visible_from``) are sown, and by each group's owner its ``end_flags``.
Parameter names equal the ``fixed`` kind's (``qkv``, ``compressor`` or
``key_compressor``/``value_compressor``, ``sink``, ``out``), so a fixed checkpoint runs
through this kind with ``boundary="fixed"`` (identical outputs while chunks hold M tokens;
tested); the slot-bias table has ``max_chunk`` rows for the router and delimiter rules
(``chunk_size`` for fixed).

Boundaries are computed once per group of ``boundary_group`` consecutive layers (0: all layers)
by the group's first dynamic layer (its *owner*, which holds the router weights ``router``)
from that layer's attention input (``chunking.boundaries.compute``), and handed to the other
layers in ``shared``. With the
router, every entry is multiplied by ``straight_through(p_end)`` (exactly 1 in the forward
pass), the router's gradient from the language-model loss; the owner sows the weighted ratio
loss into ``aux_loss`` and the measured mean chunk length (tokens per entry) into
``aux_metrics``.

Projections follow ``attn.layout`` (qwen3 or deepseek_v4, as the fixed kind), and values that
carry RoPE are rotated back at the query position after attention (``common.derotate``).

With the row's tokens split over a mesh axis (``mesh.context > 1``) the length rules run per
shard (``chunking.enforce_lengths(axis=)``) and each shard pools only the chunks its tokens
touch, at most ceil(T_shard / min_chunk) + 1 (``dynamic_context``), into the same entries.

Decoding (ctx.decode): see chunkformer/kvcache/dynamic.py (cache and step).
"""

from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp

import kernels
from chunkformer import chunking
from chunkformer.attention import context_axis, dispatch, dynamic_context
from chunkformer.attention.common import AttentionContext, derotate, projections
from chunkformer.chunking import boundaries as boundaries_lib
from chunkformer.chunking.boundaries import (
  Boundaries,
  boundary_key,
  capacity,
  num_slots,
  owns_boundaries,
  visibility_delay,
)
from chunkformer.compression import Compressor
from chunkformer.config import AttentionConfig, ModelConfig
from chunkformer.kvcache import common as cache_lib
from chunkformer.kvcache import dynamic as dynamic_cache

Array = jax.Array


class DynamicAttention(nn.Module):
  """The ``dynamic`` kind (see module docstring); contract in attention/common.py."""

  model: ModelConfig
  attn: AttentionConfig
  layer: int

  @classmethod
  def init_cache(cls, model: ModelConfig, attn: AttentionConfig, layer: int, batch: int,
                 max_len: int) -> dict[str, Array]:
    """An empty decoding cache for ``max_len`` tokens (see kvcache/dynamic.py)."""
    return dynamic_cache.init_state(model, attn, layer, batch, max_len,
                                     capacity(attn, max_len), num_slots(attn),
                                     owns_boundaries(model, layer))

  def compressors(self) -> dict[str, Compressor]:
    m, a, s = self.model, self.attn, num_slots(self.attn)
    if a.shared_kv:
      return {"kv": Compressor(m, a, token_shift=True, num_slots=s, name="compressor")}
    return {"k": Compressor(m, a, token_shift=True, num_slots=s, name="key_compressor"),
            "v": Compressor(m, a, token_shift=m.value_shift, num_slots=s,
                            name="value_compressor")}

  @nn.compact
  def __call__(self, x_BxTxE: Array, ctx: AttentionContext, shared: dict) -> tuple[Array, dict]:
    m, a = self.model, self.attn
    qkv, out = projections(m, a)
    sink_H = None
    if a.sink:
      sink_H = self.param("sink", nn.with_logical_partitioning(nn.initializers.zeros, ("heads",)),
                          (m.num_heads,))
    compressors = self.compressors()
    owner = owns_boundaries(m, self.layer)
    router = chunking.BoundaryRouter(name="router") if owner and a.boundary == "router" else None
    if ctx.decode and x_BxTxE.shape[1] == 1:
      state = self.variable("cache", "state", cache_lib.missing_cache)
      parts = dynamic_cache.Parts(qkv, compressors, router, sink_H)
      o, state.value, shared = dynamic_cache.step(
          m, a, parts, boundary_key(a, self.layer), visibility_delay(a), x_BxTxE, ctx,
          state.value, shared)
      return out(derotate(m, a, o, ctx.positions_BxT)), shared
    q, k, v = qkv(x_BxTxE, ctx)
    bounds, shared = self._boundaries(x_BxTxE, ctx, shared, router)
    o, entries = self._forward(x_BxTxE, ctx, q, k, v, compressors, sink_H, bounds)
    if ctx.decode:  # prefill: the parallel forward pass, then the cache it leaves behind
      state = self.variable("cache", "state", cache_lib.missing_cache)
      state.value = dynamic_cache.prefill_state(a, compressors, visibility_delay(a), x_BxTxE,
                                                 k, v, bounds.ends_BxT, entries, state.value)
    return out(derotate(m, a, o, ctx.positions_BxT)), shared

  def _boundaries(self, x_BxTxE, ctx, shared, router) -> tuple[Boundaries, dict]:
    """(boundaries, shared): computed by the group's owner, read by the others."""
    a = self.attn
    key = boundary_key(a, self.layer)
    seg = ctx.segment_ids_BxT
    cap = capacity(a, x_BxTxE.shape[1])
    if router is None and key in shared:
      return boundaries_lib.repacked(a, shared[key], seg, cap), shared
    if router is None and a.boundary == "router":
      raise ValueError(f"layer {self.layer}: the router boundaries of its group ({key}) come "
                       "from an earlier layer through `shared`, which does not hold them")
    probs = None if router is None else router(x_BxTxE, seg)
    bounds = boundaries_lib.compute(a, ctx.tokens_BxT, ctx.positions_BxT, seg, probs,
                                    context_axis.current())
    loss = boundaries_lib.weighted_ratio_loss(a, bounds, seg)
    if loss is not None:
      self.sow("aux_loss", "ratio_loss", loss)
    self.sow("aux_metrics", "mean_chunk_len", boundaries_lib.tokens_per_entry(bounds))
    # For analysis: the group's end flags (evaluation reads these instead of recomputing).
    self.sow("intermediates", boundaries_lib.SOWN_END_FLAGS, bounds.ends_BxT)
    return bounds, {**shared, key: bounds}

  def _forward(self, x_BxTxE, ctx, q, k, v, compressors, sink_H,
               bounds: Boundaries) -> tuple[Array, dict[str, Array]]:
    """(o_BxTxHxD, packed entries_BxCxKxD per compressor stream)."""
    a = self.attn
    b, t, _ = x_BxTxE.shape
    seg = ctx.segment_ids_BxT
    layout = bounds.layout
    cap = layout.capacity
    first_BxC = jnp.where(layout.valid_BxC, layout.entry_starts_BxC, 0)
    start_pos_BxC = jnp.take_along_axis(ctx.positions_BxT, first_BxC, axis=1)
    scale_BxC = bounds.entry_scale_BxC()
    entries = {}
    axis = context_axis.current()
    for stream, comp in compressors.items():
      kv, z = comp.project(x_BxTxE, seg)
      kh, r = kv.shape[2:]
      bias = comp.slot_bias()
      values = kv.reshape(b, t, kh * r)
      logits = jnp.zeros((b, t, kh * r), kv.dtype) if z is None else z.reshape(b, t, kh * r)
      bias = None if bias is None else jnp.reshape(bias, (bias.shape[0], kh * r))
      if axis is None:
        pooled = kernels.segment_pool(
            values, logits, bounds.ends_BxT, seg, capacity=cap, slot_bias_SxN=bias,
            implementation=a.implementation, interpret=a.interpret,
            structure=layout.structure)[0]
      else:  # the row's tokens split over devices: each pools its own chunks (dynamic_context)
        pooled = dynamic_context.pool(values, logits, layout.structure, bias, axis,
                                      a.shortest_chunk)
      positions = jnp.broadcast_to(start_pos_BxC[:, :, None], (b, cap, kh))
      entry = comp.finish(pooled.reshape(b, cap, kh, r), positions)
      if scale_BxC is not None:
        entry = entry * scale_BxC[:, :, None, None].astype(entry.dtype)
      entries[stream] = entry
    # For analysis (mutable=["intermediates"]): where the chunks closed, from when each entry
    # is visible (the router's delay included) and what they hold.
    self.sow("intermediates", "entry_ends", layout.entry_ends_BxC)
    self.sow("intermediates", boundaries_lib.SOWN_VISIBLE_FROM, layout.entry_visible_from_BxC)
    self.sow("intermediates", "entries", entries)
    ek = entries.get("kv", entries.get("k"))
    ev = entries.get("v", ek)
    # With "xla" this is the fixed kind's blockwise path (custom softmax VJP), faster on CPU than
    # the kernels' plain reference, which stays the oracle of the Pallas kernels; at long T in
    # blocks of queries, since the capacity (T / min_chunk) would make T x C scores dominate.
    per_head = (b, cap, ek.shape[2])
    o, _ = dispatch.compressed_attention(
        q, k, v, seg, kind=a.kind, window=a.window, entry_k_BxCxKxD=ek, entry_v_BxCxKxD=ev,
        entry_ends_BxCxK=jnp.broadcast_to(layout.entry_visible_from_BxC[:, :, None], per_head),
        entry_segment_ids_BxCxK=jnp.broadcast_to(layout.entry_segment_ids_BxC[:, :, None],
                                                 per_head),
        sink_H=sink_H, implementation=a.implementation, interpret=a.interpret,
        row_layout=ctx.row_layout)
    return o, entries
