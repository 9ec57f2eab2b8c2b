"""Fixed chunk compression (DeepSeek-V4 style) and sliding-window attention.

``fixed``: one softmax over raw tokens in a sliding window of W and the compressed entries of
fixed chunks of M tokens whose last token is <= t (same document), plus an optional learned
per-head sink logit and an optional top-k selection of entries by a light indexer.
``window``: the same without entries (sliding-window attention only).

Entries come from ``Compressor`` modules: ``compressor`` (shared KV: one vector is both key and
value, DeepSeek's layout) or ``key_compressor`` + ``value_compressor`` (attn.shared_kv=False).
Chunk boundaries may be shifted per layer or kv head (stagger, chunk_offset) and by a random
phase per row in training (rng stream 'phase'). With ``mutable=["intermediates"]`` the realised
pooling weights (``.../compressor/pool_weights``) and the offsets (``chunk_offsets``) are sown.

Indexer (attn.topk > 0): ``attn.indexer = "lightning"`` is DeepSeek-V4's (own compressor,
several ReLU heads from the low-rank query, KL training; attention/lightning_indexer.py).
``"simple"`` is a simplified one: one indexer query per kv head, ``indexer`` (x W_idx), scored
against the entry keys; each query keeps the top-k visible entries by that score (hard
selection). It learns through a straight-through term: the selected entries' attention logits
get ``score - stop_gradient(score)`` added (zero in the forward pass), so its gradient is the
one it would get as an additive logit bias.

Projections (attn.layout): ``qwen3`` (q/k/v/o, attention/common.py) or ``deepseek_v4``
(low-rank query, K = V raw tokens, grouped low-rank output; attention/v4_projection.py).
Values that carry RoPE are rotated back at the query position after attention
(``common.derotate``, all implementations and decoding alike).

Implementation (attn.implementation): ``dispatch.compressed_attention`` runs the blockwise XLA
path ("xla": ``query_blocks.attend_selected``, queries in blocks under remat at long T, so the
scores held are L x C, not T x C, the tail and the indexer's scores, top-k and KL computed per
block too) or ``kernels.chunk_attention`` ("pallas_gpu" / "pallas_tpu") over the same entries
(one end per entry, so per-head stagger, the tail and the indexer stay on "xla":
``config_sections/capabilities.py``).

Decoding (ctx.decode, cache from ``init_cache``): a ring buffer of the last W raw keys/values,
the open chunk's buffered slots (and the previous chunk's, for overlap), closed entries in a
buffer of static capacity (the lightning indexer's own entries too), attended through
``kernels.decode_attention``; see ``chunkformer/kvcache/fixed.py``. This module hands the step
the indexer's selection as a function (``_decode_select``).
"""

from __future__ import annotations

from typing import ClassVar

import flax.linen as nn
import jax
import jax.numpy as jnp

from chunkformer.attention import compressed_core, dispatch, query_blocks
from chunkformer.attention.common import AttentionContext, derotate, projections
from chunkformer.attention.lightning_indexer import LightningIndexer
from chunkformer.compression import Compressor, chunk_offsets, fixed_chunks, tail_start
from chunkformer.config import AttentionConfig, ModelConfig
from chunkformer.kvcache import common as cache_lib
from chunkformer.kvcache import fixed as fixed_cache
from chunkformer.layers import Projection
from kernels.layout import document_starts

Array = jax.Array


class FixedAttention(nn.Module):
  """The ``fixed`` kind (see module docstring); contract in attention/common.py."""

  model: ModelConfig
  attn: AttentionConfig
  layer: int
  uses_entries: ClassVar[bool] = True

  @classmethod
  def init_cache(cls, model: ModelConfig, attn: AttentionConfig, layer: int, batch: int,
                 max_len: int) -> dict[str, Array]:
    """An empty decoding cache for ``max_len`` tokens (see kvcache/fixed.py)."""
    return fixed_cache.init_state(model, attn, layer, batch, max_len, cls.uses_entries)

  def compressors(self) -> dict[str, Compressor]:
    if not self.uses_entries:
      return {}
    m, a = self.model, self.attn
    keys_norm = a.entry_norm != "none"
    if a.shared_kv:  # tied K/V: values are the normalised, rotated keys
      return {"kv": Compressor(m, a, token_shift=True, normalise=keys_norm, name="compressor")}
    return {"k": Compressor(m, a, token_shift=True, normalise=keys_norm, name="key_compressor"),
            "v": Compressor(m, a, token_shift=m.value_shift, normalise=a.entry_norm == "all",
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
    indexer = None
    if compressors and a.topk:
      if a.indexer == "lightning":
        indexer = LightningIndexer(m, a, name="indexer")
      else:
        indexer = Projection((m.num_kv_heads, m.head_dim), ("embed", "kv_heads", "head_dim"),
                             name="indexer")
    if ctx.decode:
      state = self.variable("cache", "state", cache_lib.missing_cache)
      streams = dict(compressors)
      if isinstance(indexer, LightningIndexer):
        streams["index"] = indexer.compressor
      if x_BxTxE.shape[1] == 1:
        parts = fixed_cache.Parts(qkv, streams, self._decode_select(qkv, indexer), sink_H)
        o, state.value = fixed_cache.step(m, a, self.layer, parts, x_BxTxE, state.value)
      else:  # prefill: the parallel forward pass, then the cache it leaves behind
        q, k, v = qkv(x_BxTxE, ctx)
        o, entries = self._forward(x_BxTxE, ctx, qkv, q, k, v, compressors, indexer, sink_H)
        state.value = fixed_cache.prefill_state(m, a, self.layer, streams, x_BxTxE, k, v,
                                                entries, state.value)
    else:
      q, k, v = qkv(x_BxTxE, ctx)
      o, _ = self._forward(x_BxTxE, ctx, qkv, q, k, v, compressors, indexer, sink_H)
    return out(derotate(m, a, o, ctx.positions_BxT)), shared

  def _forward(self, x_BxTxE, ctx, qkv, q, k, v, compressors, indexer,
               sink_H) -> tuple[Array, dict[str, Array]]:
    """(o_BxTxHxD, entries_BxCxKxD per compressor stream)."""
    m, a = self.model, self.attn
    b, t, _ = x_BxTxE.shape
    entries = {}
    if compressors:
      rng = self.make_rng("phase") if (ctx.train and a.random_phase) else None
      offsets = chunk_offsets(m, a, self.layer, b, rng)
      if offsets is not None:
        self.sow("intermediates", "chunk_offsets", offsets)
      chunks = fixed_chunks(t, a.chunk_size, offsets, b, m.num_kv_heads, ctx.positions_BxT,
                            ctx.segment_ids_BxT, a.window_tokens, a.compress_window_align)
      for stream, comp in compressors.items():
        entries[stream] = comp.compress(x_BxTxE, chunks, ctx.segment_ids_BxT)
      ek = entries.get("kv", entries.get("k"))
      selector = None
      if isinstance(indexer, LightningIndexer):
        selector, entries["index"] = indexer.selector(
            x_BxTxE, qkv.query_residual(x_BxTxE), ctx, offsets, q, ek, chunks.ends_BxCxK,
            chunks.segment_ids_BxCxK)
      elif indexer is not None:
        selector = _simple_selector(indexer(x_BxTxE), ek, chunks.ends_BxCxK,
                                    chunks.segment_ids_BxCxK, ctx.segment_ids_BxT, a.topk)
      # Long rows on the XLA path run in blocks of queries (score memory L x C, not T x C),
      # the tail and the indexer's selection cut into the same blocks.
      o, stats = dispatch.compressed_attention(
          q, k, v, ctx.segment_ids_BxT, kind=a.kind, window=a.window,
          tail=self._tail(offsets, b, t, ctx.segment_ids_BxT), selector=selector,
          entry_k_BxCxKxD=ek, entry_v_BxCxKxD=entries.get("v"),
          entry_ends_BxCxK=chunks.ends_BxCxK, entry_segment_ids_BxCxK=chunks.segment_ids_BxCxK,
          sink_H=sink_H, implementation=a.implementation, interpret=a.interpret,
          row_layout=ctx.row_layout)
      if isinstance(indexer, LightningIndexer):
        indexer.sow_kl(stats)
      return o, entries
    o = compressed_core.compressed_attention(q, k, v, ctx.segment_ids_BxT, window=a.window,
                                             sink_H=sink_H)
    return o, entries

  def _tail(self, offsets_BxK: Array | None, batch: int, seq_len: int,
            segment_ids_BxT: Array) -> compressed_core.Tail | None:
    """The uncompressed tail's first raw key per query (attn.tail), or None for the fixed
    local window."""
    a = self.attn
    if not a.tail:
      return None
    if offsets_BxK is None:
      offsets_BxK = jnp.zeros((batch, self.model.num_kv_heads), jnp.int32)
    query = jnp.arange(seq_len)[None, None, :]
    doc_start = document_starts(segment_ids_BxT)[:, None, :]
    start_BxKxT = tail_start(query, doc_start, offsets_BxK[:, :, None], a)
    return compressed_core.Tail(a.tail_span, start_BxKxT)

  def _decode_select(self, qkv, indexer) -> fixed_cache.Select | None:
    """The indexer's top-k for one decoding step (kvcache/fixed.py calls it), or None."""
    a = self.attn
    if indexer is None:
      return None
    if isinstance(indexer, LightningIndexer):
      def select(x_win, ctx, state, visible_Bx1xKxC):
        selected_Bx1xC = indexer.select(
            x_win[:, -1:], qkv.query_residual(x_win[:, -1:]), ctx.positions_BxT[:, -1:],
            state["entries_index"][:, :, 0], visible_Bx1xKxC[:, :, 0])
        return jnp.broadcast_to(selected_Bx1xC[:, :, None], visible_Bx1xKxC.shape)
      return select

    def select(x_win, ctx, state, visible_Bx1xKxC):
      del ctx
      ek = state["entries_kv" if a.shared_kv else "entries_k"]
      return compressed_core.index_entries(indexer(x_win)[:, -1:], ek.astype(x_win.dtype),
                                           visible_Bx1xKxC, a.topk)[0]
    return select


class WindowAttention(FixedAttention):
  """The ``window`` kind: sliding-window attention over the last W raw tokens only."""

  uses_entries: ClassVar[bool] = False


def _simple_selector(index_q_BxTxKxD: Array, entry_k_BxCxKxD: Array, ends_BxCxK: Array,
                     entry_segment_ids_BxCxK: Array | None, segment_ids_BxT: Array,
                     topk: int) -> query_blocks.EntrySelector:
  """The simple indexer's top-k and straight-through bias per block of query rows."""

  def select(rows, query_index_BxL, own_BxL) -> query_blocks.Selection:
    visible = compressed_core.per_head_entry_visibility(
        ends_BxCxK, entry_segment_ids_BxCxK, query_index_BxL, rows["segment_ids"])
    visible &= own_BxL[:, :, None, None]
    selected, bias = compressed_core.index_entries(rows["index_q"], entry_k_BxCxKxD, visible,
                                                   topk)
    return query_blocks.Selection(selected, bias, {})

  return query_blocks.EntrySelector(dict(index_q=index_q_BxTxKxD, segment_ids=segment_ids_BxT),
                                    select)
