"""Where a layer's attention goes: each query's softmax weights over raw keys, entries and sink.

The attention kinds return outputs only. For analysis, ``capture_filter`` keeps what a forward
pass needs to rebuild every query's attention distribution: each layer's q and raw k (the
output of ``QKVProjection``) and, for the fixed kind, its entries (``Compressor.compress``);
the dynamic kind sows its packed entries and their layout itself. ``attention_weights`` returns
the weights of ``kernels.dense_attention``, the oracle of ``compressed_core`` and
``kernels.chunk_attention`` (raw key s visible to query t iff ``t - W < s <= t``, entry c iff
``kernels.entry_visible``: visible from <= t, both in t's document, plus the optional sink
logit whose value is zero); the weights times the values give the layers' outputs (tested).
Full attention is the case W = T without entries.

``extractor`` bundles this for ``trained.Predictor``; ``needle_entry_attention`` reads, for
each needle sweep row, how much the answering query attends to the entries holding the
needle's key and its value. Dense [T, T] weights: meant for the small analysis models.
Not modelled: top-k entry selection (``attn.topk``), which hides entries by an indexer score.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

import kernels
from chunkformer.attention.common import QKVProjection
from chunkformer.chunking.boundaries import SOWN_VISIBLE_FROM
from chunkformer.compression import Compressor, chunk_offsets, fixed_chunks
from chunkformer.config import ModelConfig
from chunkformer.evaluation.probes.needle_sweep import SweepRows
from kernels import AttentionWeights
from kernels import layout as kernel_layout

Array = jax.Array
_CALL = "__call__"
_COMPRESS = "compress"
# Entry streams whose vectors are the keys attention scores against (shared KV or keys).
_KEY_COMPRESSORS = ("compressor", "key_compressor")


def capture_filter(module: Any, method: str) -> bool:
  """Flax ``capture_intermediates`` filter: q/k/v of every layer and fixed-kind entries."""
  return ((isinstance(module, QKVProjection) and method == _CALL)
          or (isinstance(module, Compressor) and method == _COMPRESS))


def attention_weights(q_BxTxHxD: Array, k_BxTxKxD: Array, segment_ids_BxT: Array, *,
                      window: int, entry_k_BxCxKxD: Array | None = None,
                      entry_visible_from_BxCxK: Array | None = None,
                      entry_segment_ids_BxCxK: Array | None = None,
                      sink_H: Array | None = None) -> AttentionWeights:
  """The softmax weights of a layer: ``kernels.dense_attention``'s, the oracle of the kinds.

  ``entry_visible_from`` is the first query index that sees each entry (its end, plus the
  router's delay under the 'start' rule), per key/value head ([B, C] arrays broadcast).
  """
  return kernels.dense_attention(
      q_BxTxHxD, k_BxTxKxD, None, segment_ids_BxT, window=window,
      entry_k_BxCxKxD=entry_k_BxCxKxD, entry_visible_from_BxC=entry_visible_from_BxCxK,
      entry_segment_ids_BxC=entry_segment_ids_BxCxK, sink_H=sink_H)[1]


def _find(tree: Any, path: Sequence[str]) -> Any:
  for part in path:
    if not isinstance(tree, Mapping) or part not in tree:
      return None
    tree = tree[part]
  return tree[0] if isinstance(tree, (tuple, list)) else tree


def layer_attention(model: ModelConfig, params: Any, intermediates: Any, layer: int,
                    segment_ids_BxT: Array, positions_BxT: Array | None = None
                    ) -> tuple[AttentionWeights, Array]:
  """(weights, token_entry_BxTxK) of ``layer`` from a forward pass captured with
  ``capture_filter`` (apply with ``mutable=["intermediates"]``).

  ``token_entry[b, t, k]`` is the entry that pools token t for key/value head k (its own chunk
  under overlap), or C if no entry does (the open chunk at the row end). Kinds: full, window,
  fixed (without top-k) and dynamic.
  """
  attn = model.layer_attention(layer)
  block = f"block_{layer}"
  qkv = _find(intermediates, (block, "attn", "qkv", _CALL))
  if qkv is None:
    raise ValueError(f"layer {layer}: no captured q/k; apply with "
                     "capture_intermediates=attention_probe.capture_filter")
  q, k, _ = qkv
  b, t, kh, _ = k.shape
  sink = None
  if attn.sink and attn.kind in ("fixed", "window", "dynamic"):
    sink = nn.meta.unbox(params[block]["attn"]["sink"])
  none = jnp.zeros((b, t, kh), jnp.int32)
  if attn.kind == "full":
    return attention_weights(q, k, segment_ids_BxT, window=t), none
  if attn.kind == "window":
    return attention_weights(q, k, segment_ids_BxT, window=attn.window, sink_H=sink), none
  if attn.kind == "fixed":
    if attn.topk:
      raise NotImplementedError(f"layer {layer}: top-k entry selection is not modelled")
    offsets = chunk_offsets(model, attn, layer, b)
    chunks = fixed_chunks(t, attn.chunk_size, offsets, b, kh, positions_BxT, segment_ids_BxT,
                          attn.window_tokens, attn.compress_window_align)
    entries = next((e for name in _KEY_COMPRESSORS
                    if (e := _find(intermediates, (block, "attn", name, _COMPRESS))) is not None),
                   None)
    if entries is None:
      raise ValueError(f"layer {layer}: no captured entries; apply with "
                       "capture_intermediates=attention_probe.capture_filter")
    c = entries.shape[1]
    # Scatter each valid slot's chunk index to its token; padding slots go to a dropped row t.
    tok = jnp.where(chunks.valid_BxCxMxK, chunks.tok_BxCxMxK, t)
    chunk = jnp.broadcast_to(jnp.arange(c)[None, :, None, None], tok.shape)
    head = jnp.broadcast_to(jnp.arange(kh), tok.shape)
    row = jnp.broadcast_to(jnp.arange(b)[:, None, None, None], tok.shape)
    token_entry = jnp.full((b, t + 1, kh), c, jnp.int32).at[row, tok, head].set(chunk)[:, :t]
    weights = attention_weights(q, k, segment_ids_BxT, window=attn.window,
                                entry_k_BxCxKxD=entries, entry_visible_from_BxCxK=chunks.ends_BxCxK,
                                entry_segment_ids_BxCxK=chunks.segment_ids_BxCxK, sink_H=sink)
    return weights, token_entry
  if attn.kind == "dynamic":
    packed = _find(intermediates, (block, "attn", "entries"))
    ends_BxC = _find(intermediates, (block, "attn", "entry_ends"))
    visible_from_BxC = _find(intermediates, (block, "attn", SOWN_VISIBLE_FROM))
    if packed is None or ends_BxC is None or visible_from_BxC is None:
      raise ValueError(f"layer {layer}: the dynamic kind sows its entries only into a mutable "
                       "'intermediates' collection")
    entries = packed.get("kv", packed.get("k"))
    c = entries.shape[1]
    inside = ends_BxC < t
    end_index = jnp.where(inside, ends_BxC, 0)
    entry_seg = jnp.where(inside, jnp.take_along_axis(segment_ids_BxT, end_index, axis=1), -1)
    # Entries are ordered by end: token s belongs to the first entry ending at or after s if
    # that entry lies in s's document and its chunk starts at or before s (after the previous
    # end, and at s's document start at the earliest).
    first = jax.vmap(lambda e, s: jnp.searchsorted(e, s, side="left"))(
        jnp.where(inside, ends_BxC, t), jnp.broadcast_to(jnp.arange(t), (b, t)))
    previous_end = jnp.concatenate([jnp.full((b, 1), -1), jnp.where(inside, ends_BxC, t)],
                                   axis=1)
    starts = jnp.maximum(jnp.take_along_axis(previous_end, first, axis=1) + 1,
                         kernel_layout.document_starts(segment_ids_BxT))
    first_seg = jnp.take_along_axis(jnp.pad(entry_seg, ((0, 0), (0, 1)), constant_values=-1),
                                    first, axis=1)
    owned = (first < c) & (starts <= jnp.arange(t)) & (first_seg == segment_ids_BxT)
    token_entry = jnp.broadcast_to(jnp.where(owned, first, c)[..., None], (b, t, kh))
    weights = attention_weights(
        q, k, segment_ids_BxT, window=attn.window, entry_k_BxCxKxD=entries,
        # From the sown layout: under the router's 'start' rule an entry is visible one token
        # after its end (reading the end here was a bug: weights on not-yet-visible entries).
        entry_visible_from_BxCxK=jnp.broadcast_to(visible_from_BxC[..., None], (b, c, kh)),
        entry_segment_ids_BxCxK=jnp.broadcast_to(entry_seg[..., None], (b, c, kh)),
        sink_H=sink)
    return weights, token_entry.astype(jnp.int32)
  raise NotImplementedError(f"layer {layer}: attention kind {attn.kind!r}")


def extractor(model: ModelConfig, params: Any, layers: Sequence[int] | None = None,
              queries: Sequence[int] | None = None):
  """(extract, capture) for ``trained.Predictor``.

  Per layer l the outputs ``attn_raw/l`` [N, Q, H, T], ``attn_entries/l`` [N, Q, H, C],
  ``attn_sink/l`` [N, Q, H] (the weights of Q query positions: ``queries``, default all T)
  and ``token_entry/l`` [N, T, K] (see ``layer_attention``); ``attn_queries`` [N, Q] says
  which positions. ``params`` supplies sink logits.
  """
  layers = tuple(range(model.num_layers)) if layers is None else tuple(layers)

  def extract(collections, rows):
    intermediates = collections.get("intermediates", {})
    b, t = rows["segment_ids"].shape
    keep = jnp.arange(t) if queries is None else jnp.asarray(queries, jnp.int32)
    out = {"attn_queries": jnp.broadcast_to(keep, (b, keep.size))}
    for layer in layers:
      weights, token_entry = layer_attention(model, params, intermediates, layer,
                                             rows["segment_ids"], rows["positions"])
      out[f"attn_raw/{layer}"] = weights.raw_BxTxHxS[:, keep]
      out[f"attn_entries/{layer}"] = weights.entries_BxTxHxC[:, keep]
      out[f"attn_sink/{layer}"] = weights.sink_BxTxH[:, keep]
      out[f"token_entry/{layer}"] = token_entry
    return out

  return extract, capture_filter


def needle_entry_attention(out: Mapping[str, np.ndarray], rows: SweepRows, layer: int,
                           key_len: int) -> dict[str, np.ndarray]:
  """How the query that answers each sweep row attends to its needle, per query head.

  ``out`` holds the predictor outputs of ``extractor`` for ``rows``. The answering query is
  the last key token of the query block (it predicts the first value token). Returns [N, H]
  arrays ``key_entry`` / ``value_entry`` (weight on the entry pooling the needle's last key
  token / first value token; 0 if no entry holds it or it is not visible), ``entries`` (all
  entry weight), ``raw_needle`` (weight on the needle's raw tokens) and [N] arrays ``split``
  (key and value pooled into different entries, for key/value head 0), ``key_entry_index``,
  ``value_entry_index`` and ``query``.
  """
  raw = np.asarray(out[f"attn_raw/{layer}"])
  entries = np.asarray(out[f"attn_entries/{layer}"])
  token_entry = np.asarray(out[f"token_entry/{layer}"])
  n, _, h, c = entries.shape
  kh = token_entry.shape[-1]
  heads = np.arange(h) // (h // kh)
  offsets = np.tile(rows.offsets_J, rows.shape[0])
  query = np.asarray(rows.answer_start_N)
  kept = np.asarray(out["attn_queries"])  # N x Q
  found = kept == query[:, None]
  if not found.any(axis=1).all():
    raise ValueError("the predictor kept no weights at the answering query of some rows; "
                     f"pass queries={sorted(set(query.tolist()))} to extractor")
  slot = np.argmax(found, axis=1)
  key_token, value_token = offsets + key_len - 1, offsets + key_len
  index = np.arange(n)[:, None]
  key_entry = token_entry[index, key_token[:, None], heads[None]]  # N x H
  value_entry = token_entry[index, value_token[:, None], heads[None]]
  at_query = entries[np.arange(n), slot]  # N x H x C
  padded = np.concatenate([at_query, np.zeros((n, h, 1), at_query.dtype)], axis=-1)
  head_index = np.arange(h)[None]
  needle_len = int(rows.layouts[0].needle_len)
  needle = offsets[:, None] + np.arange(needle_len)[None]  # N x L
  raw_at_query = raw[np.arange(n), slot]  # N x H x T
  return {
      "key_entry": padded[index, head_index, key_entry],
      "value_entry": padded[index, head_index, value_entry],
      "entries": at_query.sum(axis=-1),
      "raw_needle": np.take_along_axis(raw_at_query, needle[:, None, :], axis=-1).sum(axis=-1),
      "split": key_entry[:, 0] != value_entry[:, 0],
      "key_entry_index": key_entry[:, 0],
      "value_entry_index": value_entry[:, 0],
      "query": query,
  }


def entry_spans(token_entry_T: np.ndarray, num_entries: int) -> list[str]:
  """'first-last' row index of the tokens each entry pools ('' for an entry pooling none)."""
  token_entry_T = np.asarray(token_entry_T)
  spans = []
  for c in range(num_entries):
    tokens = np.flatnonzero(token_entry_T == c)
    spans.append(f"{tokens[0]}-{tokens[-1]}" if tokens.size else "")
  return spans
