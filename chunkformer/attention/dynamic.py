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
static-capacity packed buffer (``kernels.segment_pool``), and ``compressed_core.attend`` (the
blockwise XLA path, or ``kernels.chunk_attention`` for Pallas) runs one softmax over the raw
tokens of the sliding window W, the visible entries (end <= t, same document) and the optional
sink. With ``mutable=["intermediates"]`` the entries and their end
positions (``entries``, ``entry_ends``) are sown, and by each group's owner its ``end_flags``.
Parameter names equal the ``fixed`` kind's (``qkv``, ``compressor`` or
``key_compressor``/``value_compressor``, ``sink``, ``out``), so a fixed checkpoint runs
through this kind with ``boundary="fixed"`` (identical outputs while chunks hold M tokens;
tested); the slot-bias table has ``max_chunk`` rows for the router and delimiter rules
(``chunk_size`` for fixed).

Boundaries are computed once per group of ``boundary_group`` consecutive layers (0: all layers)
by the group's first dynamic layer (its *owner*, which holds the router weights ``router``)
from that layer's attention input, and handed to the other layers in ``shared``. With the
router, every entry is multiplied by ``straight_through(p_end)`` (exactly 1 in the forward
pass), the router's gradient from the language-model loss; the owner sows the weighted ratio
loss into ``aux_loss`` and the measured mean chunk length (tokens per entry) into
``aux_metrics``.

Projections follow ``attn.layout`` (qwen3 or deepseek_v4, as the fixed kind), and values that
carry RoPE are rotated back at the query position after attention (``common.derotate``).

Decoding (ctx.decode): see chunkformer/attention/dynamic_decode.py.
"""

from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp

import kernels
from chunkformer import chunking
from chunkformer.attention import compressed_core, dynamic_decode
from chunkformer.attention.common import AttentionContext, derotate, projections
from chunkformer.compression import Compressor
from chunkformer.config import AttentionConfig, ModelConfig
from chunkformer.kvcache import common as cache_lib

Array = jax.Array


def boundary_key(attn: AttentionConfig, layer: int) -> str:
  """Name under which a layer's boundaries live in ``shared``: same key, same boundaries."""
  group = 0 if attn.boundary_group == 0 else layer // attn.boundary_group
  return (f"dynamic_boundaries/group{group}/{attn.boundary}-{attn.router_rule}/M{attn.chunk_size}"
          f"+{attn.chunk_offset}/len{attn.min_chunk}-{attn.max_chunk}/{attn.delimiters}")


def owns_boundaries(model: ModelConfig, layer: int) -> bool:
  """Whether ``layer`` computes its group's boundaries (no earlier layer shares its key)."""
  key = boundary_key(model.layers[layer], layer)
  return not any(a.kind == "dynamic" and boundary_key(a, i) == key
                 for i, a in enumerate(model.layers[:layer]))


def num_slots(attn: AttentionConfig) -> int:
  """Rows of the slot-bias table: the longest chunk the predictor can close."""
  return attn.chunk_size if attn.boundary == "fixed" else attn.max_chunk


def capacity(attn: AttentionConfig, seq_len: int) -> int:
  """Packed entries per row of ``seq_len`` tokens (no closed chunk is ever dropped)."""
  needed = chunking.entry_capacity(seq_len, attn.shortest_chunk, attn.capacity_multiple)
  if not attn.entry_capacity:
    return needed
  if attn.entry_capacity < -(-seq_len // attn.shortest_chunk):
    raise ValueError(f"entry_capacity {attn.entry_capacity} cannot hold the chunks of a row of "
                     f"{seq_len} tokens (chunks of >= {attn.shortest_chunk} tokens)")
  return attn.entry_capacity


def visibility_delay(attn: AttentionConfig) -> int:
  """Tokens between a chunk's last token and the first query that sees its entry.

  1 for the router's ``start`` rule (the chunk ending at t - 1 is closed by x_t), else 0.
  """
  return int(attn.boundary == "router" and attn.router_rule == "start")


def predict_boundaries(attn: AttentionConfig, ctx: AttentionContext,
                       probs_BxT: Array | None) -> Array:
  """ends_BxT (a chunk's last token) of the configured predictor.

  ``probs`` is the router's output for 'router'. The flag at t depends on tokens
  <= t + ``visibility_delay(attn)``; entries become visible that many tokens after their end.
  """
  seg = ctx.segment_ids_BxT
  if attn.boundary == "fixed":
    return chunking.fixed_end_flags(ctx.positions_BxT, attn.chunk_size, attn.chunk_offset)
  if attn.boundary == "delimiter":
    proposals = chunking.delimiter_proposals(ctx.tokens_BxT, attn.delimiter_ids)
  else:
    proposals = chunking.hard_proposals(probs_BxT)
    if visibility_delay(attn):  # p_t starts a chunk at t: the chunk before it ends at t - 1
      proposals = jnp.pad(proposals[:, 1:], ((0, 0), (0, 1)))
  return chunking.enforce_lengths(proposals, seg, min_chunk=attn.min_chunk,
                                  max_chunk=attn.max_chunk)


class DynamicAttention(nn.Module):
  """The ``dynamic`` kind (see module docstring); contract in attention/common.py."""

  model: ModelConfig
  attn: AttentionConfig
  layer: int

  @classmethod
  def init_cache(cls, model: ModelConfig, attn: AttentionConfig, layer: int, batch: int,
                 max_len: int) -> dict[str, Array]:
    """An empty decoding cache for ``max_len`` tokens (see dynamic_decode.init_state)."""
    return dynamic_decode.init_state(model, attn, layer, batch, max_len,
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
      parts = dynamic_decode.Parts(qkv, compressors, router, sink_H)
      o, state.value, shared = dynamic_decode.step(
          m, a, parts, boundary_key(a, self.layer), visibility_delay(a), x_BxTxE, ctx,
          state.value, shared)
      return out(derotate(m, a, o, ctx.positions_BxT)), shared
    q, k, v = qkv(x_BxTxE, ctx)
    ends_BxT, probs_BxT, shared = self._boundaries(x_BxTxE, ctx, shared, router)
    o, entries = self._forward(x_BxTxE, ctx, q, k, v, compressors, sink_H, ends_BxT, probs_BxT)
    if ctx.decode:  # prefill: the parallel forward pass, then the cache it leaves behind
      state = self.variable("cache", "state", cache_lib.missing_cache)
      state.value = dynamic_decode.prefill_state(a, compressors, visibility_delay(a), x_BxTxE,
                                                 k, v, ends_BxT, entries, state.value)
    return out(derotate(m, a, o, ctx.positions_BxT)), shared

  def _boundaries(self, x_BxTxE, ctx, shared, router) -> tuple[Array, Array | None, dict]:
    """(ends_BxT, probs_BxT or None, shared): computed by the owner, read by the others."""
    a = self.attn
    key = boundary_key(a, self.layer)
    if router is None and key in shared:
      return shared[key]["ends"], shared[key]["probs"], shared
    if router is None and a.boundary == "router":
      raise ValueError(f"layer {self.layer}: the router boundaries of its group ({key}) come "
                       "from an earlier layer through `shared`, which does not hold them")
    probs = None if router is None else router(x_BxTxE, ctx.segment_ids_BxT)
    ends = predict_boundaries(a, ctx, probs)
    if probs is not None and a.ratio_loss_weight:
      decided = chunking.decided_probs(probs, ends, ctx.segment_ids_BxT, min_chunk=a.min_chunk,
                                       max_chunk=a.max_chunk, delay=visibility_delay(a))
      self.sow("aux_loss", "ratio_loss",
               a.ratio_loss_weight * chunking.ratio_loss(ends, decided, a.chunk_size))
    self.sow("aux_metrics", "mean_chunk_len", chunking.mean_chunk_length(ends))
    self.sow("intermediates", "end_flags", ends)  # for analysis: the group's end flags
    return ends, probs, {**shared, key: {"ends": ends, "probs": probs}}

  def _forward(self, x_BxTxE, ctx, q, k, v, compressors, sink_H, ends_BxT,
               probs_BxT) -> tuple[Array, dict[str, Array]]:
    """(o_BxTxHxD, packed entries_BxCxKxD per compressor stream)."""
    a = self.attn
    b, t, _ = x_BxTxE.shape
    seg = ctx.segment_ids_BxT
    cap = capacity(a, t)
    layout = chunking.packed_layout(ends_BxT, seg, cap)
    valid_BxC = layout.valid_BxC
    first_BxC = jnp.where(valid_BxC, layout.entry_starts_BxC, 0)
    start_pos_BxC = jnp.take_along_axis(ctx.positions_BxT, first_BxC, axis=1)
    delay = visibility_delay(a)
    scale_BxC = None
    if probs_BxT is not None:
      # The decision that closed each chunk: p at its last token, or with the 'start' rule at
      # the token after it (none for a chunk the maximum length closed at the row's end).
      decided_BxC = jnp.where(valid_BxC, layout.entry_ends_BxC + delay, t)
      p_BxC = jnp.take_along_axis(probs_BxT, jnp.minimum(decided_BxC, t - 1), axis=1)
      scale_BxC = jnp.where(decided_BxC < t, chunking.straight_through(p_BxC), 1.0)
    entries = {}
    for stream, comp in compressors.items():
      kv, z = comp.project(x_BxTxE, seg)
      kh, r = kv.shape[2:]
      bias = comp.slot_bias()
      pooled, entry_ends, entry_seg = kernels.segment_pool(
          kv.reshape(b, t, kh * r),
          jnp.zeros((b, t, kh * r), kv.dtype) if z is None else z.reshape(b, t, kh * r),
          ends_BxT, seg, capacity=cap,
          slot_bias_SxN=None if bias is None else jnp.reshape(bias, (bias.shape[0], kh * r)),
          implementation=a.implementation, interpret=a.interpret)
      positions = jnp.broadcast_to(start_pos_BxC[:, :, None], (b, cap, kh))
      entry = comp.finish(pooled.reshape(b, cap, kh, r), positions)
      if scale_BxC is not None:
        entry = entry * scale_BxC[:, :, None, None].astype(entry.dtype)
      entries[stream] = entry
    # For analysis (mutable=["intermediates"]): where the chunks closed and what they hold.
    self.sow("intermediates", "entry_ends", entry_ends)
    self.sow("intermediates", "entries", entries)
    ek = entries.get("kv", entries.get("k"))
    ev = entries.get("v", ek)
    if delay:  # entries become visible `delay` tokens after their last token
      entry_ends = jnp.where(entry_ends == kernels.PAD_END, entry_ends, entry_ends + delay)
    # With "xla" this is the fixed kind's blockwise path (custom softmax VJP), faster on CPU than
    # the kernels' plain reference, which stays the oracle of the Pallas kernels.
    per_head = (b, cap, ek.shape[2])
    o = compressed_core.attend(
        q, k, v, seg, window=a.window, entry_k_BxCxKxD=ek, entry_v_BxCxKxD=ev,
        entry_ends_BxCxK=jnp.broadcast_to(entry_ends[:, :, None], per_head),
        entry_segment_ids_BxCxK=jnp.broadcast_to(entry_seg[:, :, None], per_head),
        sink_H=sink_H, implementation=a.implementation, interpret=a.interpret)
    return o, entries
