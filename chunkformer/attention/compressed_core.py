"""Attention over [raw tokens in a sliding window] union [visible compressed entries].

Pure functions shared by the ``window``, ``fixed`` and ``dynamic`` kinds and their decoding
step; this is their ``xla`` implementation (``attention.dispatch`` chooses between it and the
Pallas kernels, ``config_sections/capabilities.py`` says which serves what). The cost
scales with compression: no T x T score matrix is built. Queries are cut into blocks of
P = min(W, T) tokens that attend to their own and the previous key block (2P keys, masked to
the window), and to the C entries (T x C scores); one softmax spans both parts and the optional
sink (each part normalised on its own, then merged exactly by log-sum-exp).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from typing import NamedTuple

import jax
import jax.numpy as jnp

import kernels
from chunkformer.compression.pooling import previous_chunk

Array = jax.Array


class Tail(NamedTuple):
  """The uncompressed tail: raw tokens only from a per-query first key on.

  Query t of kv head k sees raw key s iff ``start[b, k, t] <= s <= t`` (same document): its
  own, still open chunk ``t - (t + o) mod S .. t`` (o the chunk grid's offset), or under
  "start" alignment the document's tokens before its first full window
  (``compression.tail_start``). ``span`` bounds t - start + 1.
  """

  span: int
  start_BxKxT: Array


def split_heads(q_BxTxHxD: Array, num_kv_heads: int) -> Array:
  """q_BxTxKxGxD: query head h uses key/value head h // G (as jax.nn.dot_product_attention)."""
  b, t, h, d = q_BxTxHxD.shape
  return q_BxTxHxD.reshape(b, t, num_kv_heads, h // num_kv_heads, d)


def merge_parts(parts: list[tuple[Array, Array, Callable[[Array], Array]]],
                sink: Array | None) -> Array:
  """Attention output of one softmax over the union of several key sets.

  ``parts`` are (scores, mask, values) with scores/mask of shape [per-query..., keys] and
  ``values(weights)`` the weighted sum [per-query..., D]. Each part is normalised on its own
  and the parts are merged by their log-sum-exp (exactly the softmax over the concatenated
  keys, as flash attention merges blocks); ``sink`` (broadcastable to the per-query shape) adds
  one value-zero logit per head. A query that sees nothing gets zeros.
  """
  outs, lses = [], []
  for scores, mask, values in parts:
    probs, lse = _part_softmax(scores.astype(jnp.float32), mask)
    outs.append(values(probs))
    lses.append(lse)
  if sink is not None:
    lses.append(jnp.broadcast_to(sink.astype(jnp.float32), lses[0].shape))
  m = functools.reduce(jnp.maximum, lses)
  m = jax.lax.stop_gradient(jnp.where(jnp.isfinite(m), m, 0.0))
  scale = [jnp.exp(lse - m) for lse in lses]
  total = sum(scale)
  total = jnp.where(total > 0, total, 1.0)
  # The sink's scale joins the total only: its value is zero.
  return sum(o * (w / total)[..., None] for o, w in zip(outs, scale, strict=False))


@jax.custom_vjp
def _part_softmax(scores: Array, mask: Array) -> tuple[Array, Array]:
  return _part_softmax_fwd(scores, mask)[0]


def _part_softmax_fwd(scores, mask):
  masked = jnp.where(mask, scores, -jnp.inf)
  m = jnp.max(masked, axis=-1, keepdims=True)
  m = jnp.where(jnp.isfinite(m), m, 0.0)  # nothing visible: weights 0, lse -inf, never NaN
  e = jnp.exp(masked - m)
  total = jnp.sum(e, axis=-1, keepdims=True)
  probs = e / jnp.where(total > 0, total, 1.0)
  lse = (m + jnp.log(total))[..., 0]
  return (probs, lse), probs


def _part_softmax_bwd(probs, cotangents):
  # d scores = P * (dP - sum(P * dP) + dlse): two passes over the scores, where autodiff of
  # max/exp/sum/divide would take several (the backward pass dominates the layer's cost).
  d_probs, d_lse = cotangents
  r = jnp.sum(probs * d_probs, axis=-1, keepdims=True)
  return probs * (d_probs - r + d_lse[..., None]), None


_part_softmax.defvjp(_part_softmax_fwd, _part_softmax_bwd)


def select_topk(index_scores_BxTxKxC: Array, visible_BxTxKxC: Array, k: int) -> Array:
  """selected_BxTxKxC: the k visible entries with the highest indexer score (all if fewer).

  Hard selection by threshold at the k-th largest visible score (ties may admit a few more).
  The k-th score comes from a sort along the entries, not ``lax.top_k``: XLA's partitioner
  gives TopK its whole input on every device, which under a mesh that splits the tokens
  all-gathers every query's scores; a sort along the entries stays split along the queries.
  (A threshold does not care which of +0 and -0 ranks first, so a float sort will do.)
  """
  scores = jnp.where(visible_BxTxKxC, index_scores_BxTxKxC.astype(jnp.float32), -jnp.inf)
  c = scores.shape[-1]
  ascending = jnp.sort(jax.lax.stop_gradient(scores), axis=-1)
  kth = ascending[..., max(c - k, 0)][..., None]
  return visible_BxTxKxC & (scores >= kth)


def index_entries(index_q_BxTxKxD: Array, entry_k_BxCxKxD: Array, visible_BxTxKxC: Array,
                  topk: int) -> tuple[Array, Array]:
  """(selected_BxTxKxC, bias_BxTxKxC) of the light indexer (a simplified lightning indexer).

  One indexer query per kv head scores the entry keys; the top-k visible entries are kept
  (hard). ``bias = score - stop_gradient(score)`` on the selected entries is zero in the
  forward pass; added to their attention logits it gives the indexer the gradient of an
  additive logit bias (straight-through), so it learns which entries attention uses.
  """
  score = jnp.einsum("btkd,bckd->btkc", index_q_BxTxKxD, entry_k_BxCxKxD,
                     preferred_element_type=jnp.float32) * index_q_BxTxKxD.shape[-1]**-0.5
  selected = select_topk(score, visible_BxTxKxC, topk)
  bias = jnp.where(selected, score - jax.lax.stop_gradient(score), 0.0)
  return selected, bias


def per_head_entry_visibility(ends_BxCxK: Array, entry_segment_ids_BxCxK: Array | None,
                              query_index_BxT: Array, segment_ids_BxT: Array | None) -> Array:
  """visible_BxTxKxC: ``kernels.entry_visible`` per kv head (the fixed kind's per-head ends)."""
  if entry_segment_ids_BxCxK is None:  # one document: every query's document is the entry's
    entry_segment_ids_BxCxK = jnp.zeros_like(ends_BxCxK)
    segment_ids_BxT = jnp.zeros_like(query_index_BxT)
  return kernels.entry_visible(
      jnp.moveaxis(ends_BxCxK, 1, 2)[:, None], jnp.moveaxis(entry_segment_ids_BxCxK, 1, 2)[:, None],
      query_index_BxT[:, :, None, None], segment_ids_BxT[:, :, None, None])


def _pad_rows(x_BxTx_: Array, length: int, fill=0) -> Array:
  pad = [(0, 0)] * x_BxTx_.ndim
  pad[1] = (0, length - x_BxTx_.shape[1])
  return jnp.pad(x_BxTx_, pad, constant_values=fill)


def _query_major(x_BxTxKx_: Array, n: int, p: int) -> Array:
  """B x T x K x ... -> B x K x N x P x ... (rows padded to N*P)."""
  x = _pad_rows(x_BxTxKx_, n * p)
  x = x.reshape((x.shape[0], n, p) + x.shape[2:])
  return jnp.moveaxis(x, 3, 1)


def compressed_attention(q_BxTxHxD: Array, k_BxTxKxD: Array, v_BxTxKxD: Array,
                         segment_ids_BxT: Array, *, window: int,
                         tail: Tail | None = None,
                         entry_k_BxCxKxD: Array | None = None,
                         entry_v_BxCxKxD: Array | None = None,
                         entry_ends_BxCxK: Array | None = None,
                         entry_segment_ids_BxCxK: Array | None = None,
                         entry_select_BxTxKxC: Array | None = None,
                         entry_bias_BxTxKxC: Array | None = None,
                         sink_H: Array | None = None) -> Array:
  """o_BxTxHxD of one softmax over window keys and visible entries (see module docstring).

  Query t sees raw key s iff ``t - W < s <= t`` in the same document (W = 0: none; with a
  ``tail``, W = its span and only the keys from t's tail start on, see ``Tail``) and entry
  c iff ``entry_ends[c] <= t`` in the same document (and ``entry_select``, if given).
  ``entry_bias`` is added to the entry logits (the indexer's straight-through term).
  Scores are laid out B x K x N x G x P x keys (query block n, row p), so that every
  contraction is a plain batched matmul with the batch axes leading.
  """
  b, t, h, d = q_BxTxHxD.shape
  kh = k_BxTxKxD.shape[2]
  g = h // kh
  scale = d**-0.5
  if tail is not None:
    window = tail.span
  p = max(min(window, t), 1)
  n = math.ceil(t / p)
  tp = n * p
  # q_BxKxNxGxPxD
  q = jnp.moveaxis(_query_major(split_heads(q_BxTxHxD, kh), n, p), 4, 3)
  q_index = jnp.arange(tp).reshape(n, p)
  q_seg = _pad_rows(segment_ids_BxT, tp, -1).reshape(b, n, p)
  parts = []
  sink = None
  if sink_H is not None:
    sink = sink_H.astype(jnp.float32).reshape(1, kh, 1, g, 1)  # per query: B x K x N x G x P

  if window > 0:
    kb, vb = (_query_major(x, n, p) for x in (k_BxTxKxD, v_BxTxKxD))  # B x K x N x P x D
    key_seg, key_index = q_seg, q_index
    if n > 1:  # every block also sees the previous one: P >= W keys back
      kb, vb = (jnp.concatenate([jnp.pad(x, ((0, 0), (0, 0), (1, 0), (0, 0), (0, 0)))[:, :, :-1],
                                 x], axis=3) for x in (kb, vb))
      key_seg = jnp.concatenate([previous_chunk(q_seg, -1), q_seg], axis=2)
      key_index = jnp.concatenate([q_index - p, q_index], axis=1)
    scores = jnp.einsum("bkngpd,bknsd->bkngps", q, kb, preferred_element_type=jnp.float32)
    delta = q_index[:, :, None] - key_index[:, None, :]
    mask = (delta >= 0) & (delta < window) & (key_index[:, None, :] >= 0)
    mask &= (key_index < t)[:, None, :]
    mask = mask[None] & (q_seg[..., None] == key_seg[:, :, None, :])  # B x N x P x S
    mask = mask[:, None]  # B x 1 x N x P x S
    if tail is not None:  # keys from the query's tail start on only
      start = _pad_rows(jnp.moveaxis(tail.start_BxKxT, 2, 1), tp).reshape(b, n, p, kh)
      start = jnp.moveaxis(start, 3, 1)  # B x K x N x P
      mask = mask & (key_index[None, None, :, None, :] >= start[..., None])  # B x K x N x P x S
    parts.append((scores * scale, mask[:, :, :, None],
                  lambda w, vb=vb: jnp.einsum("bkngps,bknsd->bkngpd", w, vb.astype(w.dtype))))

  if entry_k_BxCxKxD is not None:
    ek = jnp.moveaxis(entry_k_BxCxKxD, 2, 1)  # B x K x C x D
    scores = jnp.einsum("bkngpd,bkcd->bkngpc", q, ek, preferred_element_type=jnp.float32)
    ends = jnp.moveaxis(entry_ends_BxCxK, 2, 1)[:, :, None, None, :]  # B x K x 1 x 1 x C
    if entry_segment_ids_BxCxK is None:  # one document
      visible = ends <= q_index[None, None, :, :, None]
    else:
      visible = kernels.entry_visible(
          ends, jnp.moveaxis(entry_segment_ids_BxCxK, 2, 1)[:, :, None, None, :],
          q_index[None, None, :, :, None], q_seg[:, None, :, :, None])
    if entry_select_BxTxKxC is not None:
      visible &= _query_major(entry_select_BxTxKxC, n, p)
    scores = scores * scale
    if entry_bias_BxTxKxC is not None:
      scores = scores + _query_major(entry_bias_BxTxKxC, n, p)[:, :, :, None]
    ev = ek if entry_v_BxCxKxD is None else jnp.moveaxis(entry_v_BxCxKxD, 2, 1)
    parts.append((scores, visible[:, :, :, None],
                  lambda w: jnp.einsum("bkngpc,bkcd->bkngpd", w, ev.astype(w.dtype))))

  o = merge_parts(parts, sink)  # B x K x N x G x P x D
  o = jnp.transpose(o, (0, 2, 4, 1, 3, 5)).reshape(b, tp, h, d)
  return o[:, :t].astype(q_BxTxHxD.dtype)


def attend(q_BxTxHxD: Array, k_BxTxKxD: Array, v_BxTxKxD: Array, segment_ids_BxT: Array, *,
           window: int, tail: Tail | None = None, entry_k_BxCxKxD: Array,
           entry_v_BxCxKxD: Array | None,
           entry_ends_BxCxK: Array, entry_segment_ids_BxCxK: Array, sink_H: Array | None,
           entry_select_BxTxKxC: Array | None = None,
           entry_bias_BxTxKxC: Array | None = None) -> Array:
  """``compressed_attention`` over documents as contiguous runs: the ``xla`` implementation of
  the compressed kinds for a whole row (``attention.dispatch`` picks it or the kernels)."""
  # Documents as contiguous runs, as kernels.chunk_attention reads them.
  run_BxT, entry_run_BxCxK = kernels.document_runs(segment_ids_BxT, entry_ends_BxCxK,
                                                  entry_segment_ids_BxCxK)
  return compressed_attention(
      q_BxTxHxD, k_BxTxKxD, v_BxTxKxD, run_BxT, window=window, tail=tail,
      entry_k_BxCxKxD=entry_k_BxCxKxD, entry_v_BxCxKxD=entry_v_BxCxKxD,
      entry_ends_BxCxK=entry_ends_BxCxK, entry_segment_ids_BxCxK=entry_run_BxCxK,
      entry_select_BxTxKxC=entry_select_BxTxKxC, entry_bias_BxTxKxC=entry_bias_BxTxKxC,
      sink_H=sink_H)
