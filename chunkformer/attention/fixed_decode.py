"""Decoding state of the ``window`` and ``fixed`` kinds: a compressed KV cache.

Per layer (all arrays of static shape, see ``init_state``):
- ``ring_k``/``ring_v`` B x W x K x D, ``ring_pos`` W: the last W raw keys/values (after RoPE);
- ``entries_{s}`` B x C x K x D per compressor stream s (``kv``, or ``k`` and ``v``): closed
  entries, entry j of kv head k at index j (C = max_len // M + 1 covers every offset);
- ``cur_kv_{s}``/``cur_z_{s}`` B x M x K x R and ``cur_valid`` M x K: the open chunk's buffered
  compressor values and gate logits (its partial pooling state); with overlap also
  ``prev_*``, the last closed chunk, which the next entry pools as well;
- ``index`` and ``x_hist`` (see chunkformer/kvcache/common.py).
A step appends one token; when it is the last of a chunk (``(t + offset + 1) mod M == 0`` per
kv head) the chunk is pooled exactly as in the forward pass and written as entry j. Offsets are
the layer's static ones (random phases are a training-only augmentation).
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from chunkformer.attention import compressed_core
from chunkformer.compression import Compressor, pooling, static_offsets
from chunkformer.config import AttentionConfig, ModelConfig
from chunkformer.kvcache import common as cache_lib

Array = jax.Array


class Parts(NamedTuple):
  """The bound submodules of one attention layer that a decoding step calls."""

  qkv: object
  compressors: dict[str, Compressor]
  indexer: object | None
  sink_H: Array | None


def entry_capacity(max_len: int, chunk_size: int) -> int:
  """Entries of a cache for ``max_len`` tokens: chunks ending by then, for any offset < M."""
  return max_len // chunk_size + 1


def init_state(model: ModelConfig, attn: AttentionConfig, layer: int, batch: int, max_len: int,
               uses_entries: bool) -> dict[str, Array]:
  del layer
  state = cache_lib.init_common(model, batch)
  if attn.window:
    state.update(cache_lib.init_ring(model, batch, attn.window))
  if not uses_entries:
    return state
  m, k, d = attn.chunk_size, model.num_kv_heads, model.head_dim
  r = d * (2 if attn.overlap else 1)
  dtype = jnp.dtype(model.dtype)
  gated = attn.pooling in ("gated", "gated_no_bias")
  for s in _streams(attn):
    state[f"entries_{s}"] = jnp.zeros((batch, entry_capacity(max_len, m), k, d), dtype)
    for buf in ("cur", "prev") if attn.overlap else ("cur",):
      state[f"{buf}_kv_{s}"] = jnp.zeros((batch, m, k, r), dtype)
      if gated:
        state[f"{buf}_z_{s}"] = jnp.zeros((batch, m, k, r), dtype)
  state["cur_valid"] = jnp.zeros((m, k), bool)
  if attn.overlap:
    state["prev_valid"] = jnp.zeros((m, k), bool)
  return state


def _streams(attn: AttentionConfig) -> tuple[str, ...]:
  return ("kv",) if attn.shared_kv else ("k", "v")


def _offsets(model, attn, layer) -> Array:
  return jnp.asarray(static_offsets(model, attn, layer), jnp.int32)


def entry_ends(model: ModelConfig, attn: AttentionConfig, layer: int, capacity: int) -> Array:
  """ends_CxK: the last token of entry j of kv head k, ``(j+1)*M - 1 - offset_k``."""
  j = np.arange(capacity)[:, None]
  return jnp.asarray((j + 1) * attn.chunk_size - 1 - static_offsets(model, attn, layer)[None])


def prefill_state(model: ModelConfig, attn: AttentionConfig, layer: int,
                  compressors: dict[str, Compressor], x_BxTxE: Array, k_BxTxKxD: Array,
                  v_BxTxKxD: Array, entries: dict[str, Array], state: dict) -> dict:
  """The cache after a prompt of T tokens written into a fresh cache (index 0).

  ``entries`` are the forward pass's entries of the prompt (C = ceil(T/M) per stream); the
  unfinished last ones are overwritten by the step that closes their chunk.
  """
  t = x_BxTxE.shape[1]
  new = dict(state)
  if attn.window:
    new = cache_lib.ring_fill(new, k_BxTxKxD, v_BxTxKxD)
  if compressors:
    m = attn.chunk_size
    offsets = _offsets(model, attn, layer)
    # Slots of the chunk holding token T (still open) and of the chunk before it.
    tok_MxK = ((t + offsets) // m * m)[None] + jnp.arange(m)[:, None] - offsets[None]
    new["cur_valid"] = (tok_MxK >= 0) & (tok_MxK < t)
    if attn.overlap:
      new["prev_valid"] = tok_MxK - m >= 0
    b = x_BxTxE.shape[0]
    zeros = jnp.zeros((b, t), jnp.int32)
    for s, comp in compressors.items():
      new[f"entries_{s}"] = jax.lax.dynamic_update_slice_in_dim(
          state[f"entries_{s}"], entries[s].astype(state[f"entries_{s}"].dtype), 0, axis=1)
      kv, z = comp.project(x_BxTxE, zeros)
      for buf, tok in (("cur", tok_MxK), ("prev", tok_MxK - m)):
        if f"{buf}_kv_{s}" not in state:
          continue
        tok_B1MK = jnp.broadcast_to(tok[None, None], (b, 1) + tok.shape)
        new[f"{buf}_kv_{s}"] = pooling.gather_slots(kv, tok_B1MK)[:, 0]
        if z is not None:
          new[f"{buf}_z_{s}"] = pooling.gather_slots(z, tok_B1MK)[:, 0]
  return cache_lib.advance(new, x_BxTxE)


def _close_chunks(model, attn, layer, compressors, x_win, state, new) -> None:
  """Buffers token t's compressor values; pools and writes the chunks that close at t."""
  t = state["index"]
  m = attn.chunk_size
  offsets = _offsets(model, attn, layer)
  slot_K = (t + offsets) % m
  fill_MxK = jnp.arange(m)[:, None] == slot_K[None]
  closing_K = slot_K == m - 1
  cur_valid = state["cur_valid"] | fill_MxK
  capacity = state[f"entries_{_streams(attn)[0]}"].shape[1]
  write_CxK = (jnp.arange(capacity)[:, None] == ((t + offsets) // m)[None]) & closing_K[None]
  b = x_win.shape[0]
  for s, comp in compressors.items():
    kv, z = comp.project(x_win)
    bufs = {"kv": kv[:, -1], "z": None if z is None else z[:, -1]}
    cur = {}
    for name, value in bufs.items():
      if value is not None:
        cur[name] = jnp.where(fill_MxK[None, :, :, None], value[:, None],
                              state[f"cur_{name}_{s}"])
    prev = {}
    if attn.overlap:
      prev = dict(prev_kv=state[f"prev_kv_{s}"][:, None],
                  prev_z=state[f"prev_z_{s}"][:, None] if "z" in cur else None,
                  prev_valid=jnp.broadcast_to(state["prev_valid"], (b, 1, m) + slot_K.shape))
    pooled = comp.pool_slots(cur["kv"][:, None], cur["z"][:, None] if "z" in cur else None,
                             jnp.broadcast_to(cur_valid, (b, 1, m) + slot_K.shape), **prev)
    start = jnp.broadcast_to(t - (m - 1), (b, 1) + slot_K.shape)
    entry = comp.finish(pooled, start)
    new[f"entries_{s}"] = jnp.where(write_CxK[None, :, :, None], entry.astype(
        state[f"entries_{s}"].dtype), state[f"entries_{s}"])
    for name, value in cur.items():
      new[f"cur_{name}_{s}"] = value
      if attn.overlap:
        new[f"prev_{name}_{s}"] = jnp.where(closing_K[None, None, :, None], value,
                                            state[f"prev_{name}_{s}"])
  new["cur_valid"] = cur_valid & ~closing_K[None]
  if attn.overlap:
    new["prev_valid"] = jnp.where(closing_K[None], cur_valid, state["prev_valid"])


def step(model: ModelConfig, attn: AttentionConfig, layer: int, parts: Parts, x_Bx1xE: Array,
         state: dict) -> tuple[Array, dict]:
  """Appends token ``state['index']``: (o_Bx1xHxD, new state)."""
  x_win, wctx = cache_lib.step_input(x_Bx1xE, state)
  q, k, v = (a[:, -1:] for a in parts.qkv(x_win, wctx))
  t = state["index"]
  new = dict(state)
  kh, d = model.num_kv_heads, model.head_dim
  qg = compressed_core.split_heads(q, kh)
  scale = d**-0.5
  key_sets = []
  if attn.window:
    new = cache_lib.ring_write(new, k, v)
    scores = jnp.einsum("bqkgd,bwkd->bqkgw", qg, new["ring_k"],
                        preferred_element_type=jnp.float32) * scale
    ring_v = new["ring_v"]
    key_sets.append((scores, new["ring_pos"] >= 0,
                   lambda w: jnp.einsum("bqkgw,bwkd->bqkgd", w, ring_v.astype(w.dtype))))
  if parts.compressors:
    _close_chunks(model, attn, layer, parts.compressors, x_win, state, new)
    streams = _streams(attn)
    ek = new[f"entries_{streams[0]}"]
    ev = new[f"entries_{streams[-1]}"]
    visible_1x1xKxC = (entry_ends(model, attn, layer, ek.shape[1]) <= t).T[None, None]
    scores = jnp.einsum("bqkgd,bckd->bqkgc", qg, ek, preferred_element_type=jnp.float32) * scale
    visible = visible_1x1xKxC
    if parts.indexer is not None:
      visible = jnp.broadcast_to(visible, scores.shape[:3] + scores.shape[-1:])
      visible, bias = compressed_core.index_entries(parts.indexer(x_win)[:, -1:], ek, visible,
                                                    attn.topk)
      scores = scores + bias[:, :, :, None]
    key_sets.append((scores, visible[:, :, :, None],
                   lambda w: jnp.einsum("bqkgc,bckd->bqkgd", w, ev.astype(w.dtype))))
  sink = None
  if parts.sink_H is not None:
    sink = parts.sink_H.astype(jnp.float32).reshape(kh, -1)
  o = compressed_core.merge_parts(key_sets, sink)
  b = x_Bx1xE.shape[0]
  return o.reshape(b, 1, -1, d).astype(q.dtype), cache_lib.advance(new, x_Bx1xE)
