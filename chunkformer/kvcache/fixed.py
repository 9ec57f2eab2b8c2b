"""Decoding cache of the ``window`` and ``fixed`` kinds: a compressed KV cache and its step.

Per layer (all arrays of static shape, see ``init_state``):
- ``ring_k``/``ring_v`` B x W x K x D, ``ring_pos`` W: the last raw keys/values (after RoPE):
  the local window's W tokens, or with ``attn.tail`` the tokens that can be in the tail
  (``attn.tail_span``: S, or up to W + S - 2 under "start" alignment);
- ``entries_{s}`` B x C x K_s x D_s per compressor stream s (``kv``, or ``k`` and ``v``; plus
  ``index``, the lightning indexer's own entries, K_s = 1, D_s = ``index_head_dim``): closed
  entries, entry j of kv head k at index j (C = max_len // S + 1 covers every offset);
- ``win_kv_{s}``/``win_z_{s}`` B x W' x K_s x R_s and ``win_pos`` W': the compressor values
  and gate logits of the last W' tokens (W' = the compressor's window), token t at slot
  t mod W', ``win_pos`` its index (-1: empty);
- ``index`` and ``x_hist`` (see chunkformer/kvcache/common.py).
A step appends one token; when it is the last of a chunk (``(t + offset + 1) mod S == 0`` per
kv head) the window of the W' tokens ending at t is pooled exactly as in the forward pass and
written as entry j. Offsets are the layer's static ones (random phases are a training-only
augmentation); the index stream uses kv head 0's offset, as the indexer's forward pass. Then
one ``kernels.decode_attention`` call attends over the ring and the entries; per-kv-head
visibility (staggered heads, entries whose window "start" alignment drops, the indexer's
top-k) goes in as its ``entry_visible_BxCxK`` mask.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

import kernels
from chunkformer.compression import Compressor, static_offsets, tail_start
from chunkformer.config import AttentionConfig, ModelConfig
from chunkformer.context import AttentionContext
from chunkformer.kvcache import common as cache_lib

Array = jax.Array

# select(x_win, ctx, state, visible_Bx1xKxC) -> selected_Bx1xKxC: the indexer's top-k among the
# visible entries for the newest token (the last row of x_win), given the cache after its
# chunks closed. Built by the attention kind, so this module never imports attention/.
Select = Callable[[Array, AttentionContext, dict, Array], Array]


class Parts(NamedTuple):
  """The bound submodules of one attention layer that a decoding step calls."""

  qkv: object
  compressors: dict[str, Compressor]  # per cache stream, "index" included
  select: Select | None  # the top-k indexer (None: every visible entry)
  sink_H: Array | None


def entry_capacity(max_len: int, chunk_size: int) -> int:
  """Entries of a cache for ``max_len`` tokens: chunks ending by then, for any offset < M."""
  return max_len // chunk_size + 1


def raw_tokens(attn: AttentionConfig) -> int:
  """Raw keys/values the ring holds: the local window, or the uncompressed tail's span."""
  return attn.tail_span if attn.tail else attn.window


def init_state(model: ModelConfig, attn: AttentionConfig, layer: int, batch: int, max_len: int,
               uses_entries: bool) -> dict[str, Array]:
  del layer
  state = cache_lib.init_common(model, batch)
  if raw_tokens(attn):
    state.update(cache_lib.init_ring(model, batch, raw_tokens(attn)))
  if not uses_entries:
    return state
  w = attn.window_tokens
  dtype = jnp.dtype(model.dtype)
  gated = attn.pooling in ("gated", "gated_no_bias")
  for s, (k, d) in streams(model, attn).items():
    g = attn.map_groups
    state[f"entries_{s}"] = jnp.zeros((batch, entry_capacity(max_len, attn.chunk_size), k, d),
                                      dtype)
    state[f"win_kv_{s}"] = jnp.zeros((batch, w, k, g * d), dtype)
    if gated:
      gate_width = g * (d if attn.gate == "vector" else 1)
      state[f"win_z_{s}"] = jnp.zeros((batch, w, k, gate_width), dtype)
  state["win_pos"] = jnp.full((w,), -1, jnp.int32)
  return state


def streams(model: ModelConfig, attn: AttentionConfig) -> dict[str, tuple[int, int]]:
  """Cache streams of a layer with entries -> (kv heads, head dim) of their entries."""
  found = {s: (model.num_kv_heads, model.head_dim)
           for s in (("kv",) if attn.shared_kv else ("k", "v"))}
  if attn.topk and attn.indexer == "lightning":
    found["index"] = (1, attn.index_head_dim)
  return found


def _offsets(model, attn, layer) -> Array:
  return jnp.asarray(static_offsets(model, attn, layer), jnp.int32)


def entry_ends(model: ModelConfig, attn: AttentionConfig, layer: int, capacity: int) -> Array:
  """ends_CxK: the last token of entry j of kv head k, ``(j+1)*M - 1 - offset_k``."""
  j = np.arange(capacity)[:, None]
  return jnp.asarray((j + 1) * attn.chunk_size - 1 - static_offsets(model, attn, layer)[None])


def entry_kept(attn: AttentionConfig, ends_CxK: Array) -> Array:
  """kept_CxK: entries "start" alignment keeps, those whose window begins at or after token 0
  (a decoded row is one document); every entry under "end" alignment."""
  if attn.compress_window_align != "start":
    return jnp.ones(ends_CxK.shape, bool)
  return ends_CxK - (attn.window_tokens - 1) >= 0


def prefill_state(model: ModelConfig, attn: AttentionConfig, layer: int,
                  compressors: dict[str, Compressor], x_BxTxE: Array, k_BxTxKxD: Array,
                  v_BxTxKxD: Array, entries: dict[str, Array], state: dict) -> dict:
  """The cache after a prompt of T tokens written into a fresh cache (index 0).

  ``entries`` are the forward pass's entries of the prompt (C = ceil(T/M) per stream); the
  unfinished last ones are overwritten by the step that closes their chunk.
  """
  t = x_BxTxE.shape[1]
  new = dict(state)
  if raw_tokens(attn):
    new = cache_lib.ring_fill(new, k_BxTxKxD, v_BxTxKxD)
  if compressors:
    w = attn.window_tokens
    r = jnp.arange(w)
    tau = t - 1 - (t - 1 - r) % w  # the last prompt token of each slot (token tau at tau mod W)
    new["win_pos"] = jnp.where(tau >= 0, tau, -1).astype(jnp.int32)
    src = jnp.clip(tau, 0, t - 1)
    zeros = jnp.zeros(x_BxTxE.shape[:2], jnp.int32)
    for s, comp in compressors.items():
      new[f"entries_{s}"] = jax.lax.dynamic_update_slice_in_dim(
          state[f"entries_{s}"], entries[s].astype(state[f"entries_{s}"].dtype), 0, axis=1)
      for name, value in zip(("kv", "z"), comp.project(x_BxTxE, zeros), strict=True):
        if value is not None:
          new[f"win_{name}_{s}"] = value[:, src].astype(state[f"win_{name}_{s}"].dtype)
  return cache_lib.advance(new, x_BxTxE)


def _close_chunks(model, attn, layer, compressors, x_win, state, new) -> None:
  """Buffers token t's compressor values; pools and writes the windows whose chunk closes at t."""
  t = state["index"]
  m, w = attn.chunk_size, attn.window_tokens
  offsets_K = _offsets(model, attn, layer)
  b = x_win.shape[0]
  slot = t % w
  new["win_pos"] = state["win_pos"].at[slot].set(t)
  # Offset i of the window ending at t is token t - W + 1 + i, held at slot (that token) mod W.
  tok_W = t - w + 1 + jnp.arange(w)
  order_W = tok_W % w
  valid_W = (tok_W >= 0) & (new["win_pos"][order_W] == tok_W)
  for s, comp in compressors.items():
    kv, z = comp.project(x_win)
    kh = kv.shape[2]  # K, or 1 for the index stream (kv head 0's chunks)
    closing_K = (t + offsets_K[:kh]) % m == m - 1
    capacity = state[f"entries_{s}"].shape[1]
    write_CxK = (jnp.arange(capacity)[:, None] == ((t + offsets_K[:kh]) // m)[None]) & closing_K
    window = {}
    for name, value in (("kv", kv), ("z", z)):
      if value is not None:
        buf = jax.lax.dynamic_update_slice_in_dim(
            state[f"win_{name}_{s}"], value[:, -1:].astype(state[f"win_{name}_{s}"].dtype),
            slot, axis=1)
        new[f"win_{name}_{s}"] = buf
        window[name] = buf[:, order_W][:, None]  # B x 1 x W x K x R, offsets in order
    pooled = comp.pool_slots(window["kv"], window.get("z"),
                             jnp.broadcast_to(valid_W[None, None, :, None], (b, 1, w, kh)))
    entry = comp.finish(pooled, jnp.broadcast_to(t - attn.entry_position_lag, (b, 1, kh)))
    new[f"entries_{s}"] = jnp.where(write_CxK[None, :, :, None], entry.astype(
        state[f"entries_{s}"].dtype), state[f"entries_{s}"])


def step(model: ModelConfig, attn: AttentionConfig, layer: int, parts: Parts, x_Bx1xE: Array,
         state: dict) -> tuple[Array, dict]:
  """Appends token ``state['index']``: (o_Bx1xHxD, new state)."""
  x_win, wctx = cache_lib.step_input(x_Bx1xE, state)
  q, k, v = (a[:, -1:] for a in parts.qkv(x_win, wctx))
  t = state["index"]
  new = dict(state)
  b, kh, d = q.shape[0], model.num_kv_heads, model.head_dim
  if raw_tokens(attn):
    new = cache_lib.ring_write(new, k, v)
    ring_k, ring_v = new["ring_k"], new["ring_v"]
    ring_valid = new["ring_pos"] >= 0
    if attn.tail:  # the tail's tokens only (the kv heads share one chunking)
      ring_valid &= new["ring_pos"] >= tail_start(t, 0, _offsets(model, attn, layer)[0], attn)
    ring_valid = jnp.broadcast_to(ring_valid, ring_k.shape[:2])
  else:  # no raw tokens: a zero-slot window (every implementation takes W = 0)
    ring_k = ring_v = jnp.zeros((b, 0, kh, d), q.dtype)
    ring_valid = jnp.zeros((b, 0), bool)
  entry_visible = None
  if parts.compressors:
    _close_chunks(model, attn, layer, parts.compressors, x_win, state, new)
    main = ("kv",) if attn.shared_kv else ("k", "v")
    ek, ev = new[f"entries_{main[0]}"], new[f"entries_{main[-1]}"]
    ends_CxK = entry_ends(model, attn, layer, ek.shape[1])
    closed_CxK = ends_CxK <= t
    visible_CxK = closed_CxK & entry_kept(attn, ends_CxK)
    # Closed entries of head k are a prefix; the longest one bounds what the kernel reads.
    num_entries = jnp.broadcast_to(jnp.max(jnp.sum(closed_CxK, axis=0)), (b,))
    staggered = len(set(static_offsets(model, attn, layer).tolist())) > 1
    dropped = attn.compress_window_align == "start"  # visible entries are no longer a prefix
    if staggered or dropped or parts.select is not None:
      entry_visible = jnp.broadcast_to(visible_CxK, (b,) + visible_CxK.shape)
    if parts.select is not None:
      # The simple indexer's straight-through bias is zero in the forward pass: not needed here.
      selected = parts.select(x_win, wctx, new, jnp.swapaxes(entry_visible, 1, 2)[:, None])
      entry_visible = entry_visible & jnp.swapaxes(selected[:, 0], 1, 2)
  else:  # the window kind: no entries
    ek = ev = jnp.zeros((b, 0, kh, d), q.dtype)
    num_entries = jnp.zeros((b,), jnp.int32)
  cast = lambda x: x.astype(q.dtype)
  o = kernels.decode_attention(q[:, 0], cast(ring_k), cast(ring_v), ring_valid, cast(ek),
                               cast(ev), num_entries, sink_H=parts.sink_H,
                               entry_visible_BxCxK=entry_visible,
                               implementation=attn.implementation, interpret=attn.interpret)
  return o[:, None], cache_lib.advance(new, x_Bx1xE)
