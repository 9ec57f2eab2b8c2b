"""DeepSeek-V4's lightning indexer (``attn.indexer = "lightning"``, fixed kind, top-k > 0).

Scores every causally visible entry for every query and keeps the top-k, as the reference:
- its own compressor (``compressor``: the layer's pooling, overlap and chunks, at width
  ``index_head_dim`` with one head), whose entries are RMS-normed and RoPE'd like the main ones;
- ``index_heads`` query heads from the low-rank query residual, ``q_I = q_r W_qb`` (RoPE'd);
- per-head weights from x, ``w = x W_w * index_head_dim^-1/2 * index_heads^-1/2``;
- ``score[t, c] = sum_j w_j[t] * relu(q_I[t, j] . k_I[c])``; the top-k visible entries by
  score are selected (all of them when fewer are visible; exactly k, ties to the lower index).
The reference's Hadamard rotation of q_I and k_I (``rotate_activation``) is orthonormal and
applied to both, so it leaves every score unchanged: it serves its FP8 path and is omitted.

Training signal (DeepSeek-V3.2's): the indexer is trained only by a KL term toward the main
attention, and the main model gets no gradient from it (selection is hard; the indexer's inputs
are stop-gradient). Target: each query head's attention restricted to the visible entries,
summed over heads and renormalised (stop-gradient); prediction: softmax of the index scores
over the same visible entries. ``attn.indexer_loss_weight * KL`` is sown into ``aux_loss`` as
``indexer_kl``, averaged over the queries that see at least one entry. This is V3.2's dense
warm-up loss, used throughout training (V3.2 then restricts it to the selected entries; with
all visible entries the indexer also learns to rank the ones it would drop).

In the layer (``selector``) the scores, the top-k and the KL are computed per block of query
rows (``query_blocks.EntrySelector``): the KL's sum and count add up over the blocks, so long
rows never hold the T x C index scores or the T x H x C target at once (same results).
"""

from __future__ import annotations

import dataclasses
from typing import NamedTuple

import flax.linen as nn
import jax
import jax.numpy as jnp

from chunkformer.attention import compressed_core, query_blocks
from chunkformer.compression import Compressor, fixed_chunks
from chunkformer.config import AttentionConfig, ModelConfig
from chunkformer.layers import Projection, apply_rope, layer_rope

Array = jax.Array


def index_model(model: ModelConfig, attn: AttentionConfig) -> ModelConfig:
  """The model config the indexer's compressor sees: one head of ``index_head_dim`` channels,
  the layer's rotating channels, no token shift."""
  rope_fraction = model.rope_dim / attn.index_head_dim if model.rope else 0.0
  return dataclasses.replace(model, num_kv_heads=1, head_dim=attn.index_head_dim,
                             rope_fraction=rope_fraction, key_shift=0, value_shift=False,
                             query_shift=False)


def index_scores(q_BxTxIxD: Array, weights_BxTxI: Array, entry_k_BxCxD: Array) -> Array:
  """score_BxTxC = sum_j w_j relu(q_j . k_c) (float32)."""
  dots = jnp.einsum("btid,bcd->btic", q_BxTxIxD, entry_k_BxCxD,
                    preferred_element_type=jnp.float32)
  return jnp.einsum("btic,bti->btc", jax.nn.relu(dots), weights_BxTxI.astype(jnp.float32))


def entry_attention_target(q_BxTxHxD: Array, entry_k_BxCxKxD: Array,
                           visible_BxTxKxC: Array) -> Array:
  """target_BxTxC: each head's attention over the visible entries, summed over heads, then
  normalised (zeros for a query that sees none)."""
  b, t, h, d = q_BxTxHxD.shape
  qg = compressed_core.split_heads(q_BxTxHxD, entry_k_BxCxKxD.shape[2])
  scores = jnp.einsum("btkgd,bckd->btkgc", qg, entry_k_BxCxKxD,
                      preferred_element_type=jnp.float32) * d**-0.5
  mask = visible_BxTxKxC[:, :, :, None]
  scores = jnp.where(mask, scores, -jnp.inf)
  m = jnp.max(scores, axis=-1, keepdims=True)
  p = jnp.exp(scores - jnp.where(jnp.isfinite(m), m, 0.0))
  p = p / jnp.maximum(jnp.sum(p, axis=-1, keepdims=True), 1e-30)
  mass = jnp.sum(p, axis=(2, 3))
  return mass / jnp.maximum(jnp.sum(mass, axis=-1, keepdims=True), 1e-30)


def kl_to_target(target_BxTxC: Array, scores_BxTxC: Array, visible_BxTxC: Array) -> Array:
  """Mean over queries seeing >= 1 entry of KL(target || softmax(scores over visible))."""
  total, queries = kl_sums(target_BxTxC, scores_BxTxC, visible_BxTxC)
  return total / jnp.maximum(queries, 1)


def kl_sums(target_BxTxC: Array, scores_BxTxC: Array, visible_BxTxC: Array) -> tuple[Array, Array]:
  """(sum of KL(target || softmax(scores over visible)) over the queries seeing >= 1 entry,
  their number): sums over blocks of queries add up to the whole row's."""
  logits = jnp.where(visible_BxTxC, scores_BxTxC, -jnp.inf)
  m = jax.lax.stop_gradient(jnp.max(logits, axis=-1, keepdims=True))
  m = jnp.where(jnp.isfinite(m), m, 0.0)
  lse = m + jnp.log(jnp.maximum(jnp.sum(jnp.exp(logits - m), axis=-1, keepdims=True), 1e-30))
  log_pred = jnp.where(visible_BxTxC, scores_BxTxC - lse, 0.0)
  safe_t = jnp.where(target_BxTxC > 0, target_BxTxC, 1.0)
  kl = jnp.sum(jnp.where(target_BxTxC > 0, target_BxTxC * (jnp.log(safe_t) - log_pred), 0.0),
               axis=-1)
  sees = jnp.any(visible_BxTxC, axis=-1)
  return jnp.sum(jnp.where(sees, kl, 0.0)), jnp.sum(sees).astype(jnp.float32)


def select_exactly_topk(scores_BxTxC: Array, visible_BxTxC: Array, k: int) -> Array:
  """selected_BxTxC: the k highest-scoring visible entries (all when fewer are visible).

  Exactly k, as the reference's ``topk``: ReLU scores tie at 0 often, and a threshold would
  admit every tied entry. Ties go to the lower entry index, and the order is ``lax.top_k``'s
  (floats' total order: +0 above -0). It is found by a stable sort along the entries rather
  than ``lax.top_k``: XLA's partitioner gives TopK its whole input on every device, which under
  a mesh that splits the tokens all-gathers every query's scores, where a sort along the
  entries stays split along the queries.
  """
  masked = jax.lax.stop_gradient(jnp.where(visible_BxTxC, scores_BxTxC, -jnp.inf))
  c = masked.shape[-1]
  _, order_BxTxC = jax.lax.sort((descending_key(masked), jax.lax.broadcasted_iota(
      jnp.int32, masked.shape, masked.ndim - 1)), dimension=masked.ndim - 1, num_keys=1,
      is_stable=True)
  idx_BxTxK = order_BxTxC[..., :min(k, c)]
  hit = jnp.any(idx_BxTxK[..., None] == jnp.arange(c), axis=-2)
  return hit & visible_BxTxC


def descending_key(x: Array) -> Array:
  """int32 keys whose ascending order is float32 ``x``'s descending total order (the order of
  ``lax.top_k``; a sort of floats would tie -0 with +0): the bits of a negative float count
  down, so flipping all but the sign bit of those orders them as integers, then ``~`` turns
  ascending into descending without overflow."""
  bits = jax.lax.bitcast_convert_type(x.astype(jnp.float32), jnp.int32)
  return ~(bits ^ ((bits >> 31) & 0x7FFFFFFF))


class IndexInputs(NamedTuple):
  """The indexer's per-query inputs and its own entries (one chunking shared by the kv heads)."""

  q_BxTxIxD: Array  # index heads' queries (RoPE'd)
  weights_BxTxI: Array  # their weights
  entries_BxCxD: Array
  ends_BxCx1: Array  # entry ends and segments (kv-head axis of one)
  segment_ids_BxCx1: Array | None


def _entry_visible(ends_BxCxK: Array, entry_segment_ids_BxCxK: Array | None,
                   query_index_BxL: Array, segment_ids_BxL: Array, own_BxL: Array) -> Array:
  """visible_BxLxKxC for the given query rows (none on rows that are not ``own``)."""
  visible = compressed_core.per_head_entry_visibility(ends_BxCxK, entry_segment_ids_BxCxK,
                                                      query_index_BxL, segment_ids_BxL)
  return visible & own_BxL[:, :, None, None]


class LightningIndexer(nn.Module):
  """Selects the top-k visible entries per query (see module docstring)."""

  model: ModelConfig
  attn: AttentionConfig

  def setup(self):
    a = self.attn
    self.wq_b = Projection((a.index_heads, a.index_head_dim),
                           ("q_rank", "index_heads", "index_head_dim"))
    self.weights_proj = Projection((a.index_heads,), ("embed", "index_heads"))
    self.compressor = Compressor(index_model(self.model, a), a)

  def _query(self, x_BxTxE: Array, q_r_BxTxRq: Array,
             positions_BxT: Array) -> tuple[Array, Array]:
    """(q_BxTxIxD, weights_BxTxI): the index heads' queries (RoPE'd) and their weights."""
    a = self.attn
    q = apply_rope(self.wq_b(q_r_BxTxRq), positions_BxT, layer_rope(self.model, a))
    return q, self.weights_proj(x_BxTxE) * (a.index_head_dim**-0.5 * a.index_heads**-0.5)

  def inputs(self, x_BxTxE: Array, q_r_BxTxRq: Array, positions_BxT: Array,
             segment_ids_BxT: Array, offsets_BxK: Array | None) -> IndexInputs:
    """The index queries and the indexer's own entries (same chunks as the layer)."""
    a = self.attn
    b, t, _ = x_BxTxE.shape
    q, weights = self._query(x_BxTxE, q_r_BxTxRq, positions_BxT)
    chunks = fixed_chunks(t, a.chunk_size, None if offsets_BxK is None else offsets_BxK[:, :1],
                          b, 1, positions_BxT, segment_ids_BxT, a.window_tokens,
                          a.compress_window_align)
    entries_BxCx1xD = self.compressor.compress(x_BxTxE, chunks, segment_ids_BxT)
    return IndexInputs(q, weights, entries_BxCx1xD[:, :, 0], chunks.ends_BxCxK,
                       chunks.segment_ids_BxCxK)

  def score(self, x_BxTxE: Array, q_r_BxTxRq: Array, positions_BxT: Array,
            segment_ids_BxT: Array, offsets_BxK: Array | None) -> tuple[Array, Array, Array]:
    """(score_BxTxC, visible_BxTxC, entries_BxCxD) of the indexer's own entries (same chunks
    as the layer)."""
    b, t, _ = x_BxTxE.shape
    idx = self.inputs(x_BxTxE, q_r_BxTxRq, positions_BxT, segment_ids_BxT, offsets_BxK)
    visible = _entry_visible(idx.ends_BxCx1, idx.segment_ids_BxCx1,
                             jnp.broadcast_to(jnp.arange(t), (b, t)), segment_ids_BxT,
                             jnp.ones((b, t), bool))[:, :, 0]
    return index_scores(idx.q_BxTxIxD, idx.weights_BxTxI, idx.entries_BxCxD), visible, \
        idx.entries_BxCxD

  def select(self, x_BxTxE: Array, q_r_BxTxRq: Array, positions_BxT: Array,
             entries_BxCxD: Array, visible_BxTxC: Array) -> Array:
    """selected_BxTxC: the top-k of ``visible`` among given (e.g. cached) indexer entries."""
    q, weights = self._query(x_BxTxE, q_r_BxTxRq, positions_BxT)
    scores = index_scores(q, weights, entries_BxCxD.astype(q.dtype))
    return select_exactly_topk(scores, visible_BxTxC, self.attn.topk)

  def selector(self, x_BxTxE: Array, q_r_BxTxRq: Array, ctx, offsets_BxK: Array | None,
               q_BxTxHxD: Array, entry_k_BxCxKxD: Array, entry_ends_BxCxK: Array,
               entry_segment_ids_BxCxK: Array | None
               ) -> tuple[query_blocks.EntrySelector, Array]:
    """(the top-k selection per block of query rows, the indexer's entries_BxCx1xD).

    The selection's statistics are the KL's sum and count (``kl_sum``, ``kl_queries``; none
    when ``indexer_loss_weight`` is 0): hand them to ``sow_kl``. Main entries: the layer's
    keys, ends and segments (the KL's target is its attention over them).
    """
    a = self.attn
    x, q_r = jax.lax.stop_gradient(x_BxTxE), jax.lax.stop_gradient(q_r_BxTxRq)
    idx = self.inputs(x, q_r, ctx.positions_BxT, ctx.segment_ids_BxT, offsets_BxK)
    per_query = dict(index_q=idx.q_BxTxIxD, weights=idx.weights_BxTxI,
                     segment_ids=ctx.segment_ids_BxT)
    if a.indexer_loss_weight:
      per_query["q"] = q_BxTxHxD
    kh, c = entry_ends_BxCxK.shape[2], entry_ends_BxCxK.shape[1]

    def select(rows, query_index_BxL, own_BxL) -> query_blocks.Selection:
      visible = _entry_visible(idx.ends_BxCx1, idx.segment_ids_BxCx1, query_index_BxL,
                               rows["segment_ids"], own_BxL)[:, :, 0]
      scores = index_scores(rows["index_q"], rows["weights"], idx.entries_BxCxD)
      selected = select_exactly_topk(scores, visible, a.topk)[:, :, None]
      stats = {}
      if a.indexer_loss_weight:
        visible_main = _entry_visible(entry_ends_BxCxK, entry_segment_ids_BxCxK,
                                      query_index_BxL, rows["segment_ids"], own_BxL)
        target = jax.lax.stop_gradient(
            entry_attention_target(rows["q"], entry_k_BxCxKxD, visible_main))
        stats["kl_sum"], stats["kl_queries"] = kl_sums(target, scores, visible)
      b, rows_len = query_index_BxL.shape
      return query_blocks.Selection(jnp.broadcast_to(selected, (b, rows_len, kh, c)), None,
                                    stats)

    return query_blocks.EntrySelector(per_query, select), idx.entries_BxCxD[:, :, None]

  def sow_kl(self, stats: dict[str, Array]) -> None:
    """Sows ``indexer_loss_weight`` x the mean KL from a selection's summed statistics."""
    if self.attn.indexer_loss_weight:
      kl = stats["kl_sum"] / jnp.maximum(stats["kl_queries"], 1)
      self.sow("aux_loss", "indexer_kl", self.attn.indexer_loss_weight * kl)

  def __call__(self, x_BxTxE: Array, q_r_BxTxRq: Array, ctx, offsets_BxK: Array | None,
               q_BxTxHxD: Array, entry_k_BxCxKxD: Array,
               visible_BxTxKxC: Array) -> tuple[Array, Array]:
    """(selected_BxTxKxC, entries_BxCx1xD): the top-k visible entries (shared by the kv heads)
    over the whole row and the indexer's own entries (decoding caches them); sows the KL.
    ``visible_BxTxKxC``: the main entries' visibility (the KL's target)."""
    a = self.attn
    x, q_r = jax.lax.stop_gradient(x_BxTxE), jax.lax.stop_gradient(q_r_BxTxRq)
    scores, visible, entries = self.score(x, q_r, ctx.positions_BxT, ctx.segment_ids_BxT,
                                          offsets_BxK)
    selected = select_exactly_topk(scores, visible, a.topk)[:, :, None]
    if a.indexer_loss_weight:
      target = jax.lax.stop_gradient(
          entry_attention_target(q_BxTxHxD, entry_k_BxCxKxD, visible_BxTxKxC))
      total, queries = kl_sums(target, scores, visible)
      self.sow_kl(dict(kl_sum=total, kl_queries=queries))
    return jnp.broadcast_to(selected, visible_BxTxKxC.shape), entries[:, :, None]
