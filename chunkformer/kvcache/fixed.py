"""Decoding cache of the ``window`` and ``fixed`` kinds: a compressed KV cache and its step.

Per layer (all arrays of static shape, see ``init_state``):
- ``ring_k``/``ring_v`` B x W x K x D, ``ring_pos`` W: the last W raw keys/values (after RoPE);
- ``entries_{s}`` B x C x K_s x D_s per compressor stream s (``kv``, or ``k`` and ``v``; plus
  ``index``, the lightning indexer's own entries, K_s = 1, D_s = ``index_head_dim``): closed
  entries, entry j of kv head k at index j (C = max_len // M + 1 covers every offset);
- ``cur_kv_{s}``/``cur_z_{s}`` B x M x K_s x R_s and ``cur_valid`` M x K: the open chunk's
  buffered compressor values and gate logits (its partial pooling state); with overlap also
  ``prev_*``, the last closed chunk, which the next entry pools as well;
- ``index`` and ``x_hist`` (see chunkformer/kvcache/common.py).
A step appends one token; when it is the last of a chunk (``(t + offset + 1) mod M == 0`` per
kv head) the chunk is pooled exactly as in the forward pass and written as entry j. Offsets are
the layer's static ones (random phases are a training-only augmentation); the index stream
uses kv head 0's offset, as the indexer's forward pass. Then one ``kernels.decode_attention``
call attends over the ring and the entries; per-kv-head visibility (staggered heads, the
indexer's top-k) goes in as its ``entry_visible_BxCxK`` mask.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

import kernels
from chunkformer.compression import Compressor, pooling, static_offsets
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


def init_state(model: ModelConfig, attn: AttentionConfig, layer: int, batch: int, max_len: int,
               uses_entries: bool) -> dict[str, Array]:
  del layer
  state = cache_lib.init_common(model, batch)
  if attn.window:
    state.update(cache_lib.init_ring(model, batch, attn.window))
  if not uses_entries:
    return state
  m = attn.chunk_size
  dtype = jnp.dtype(model.dtype)
  gated = attn.pooling in ("gated", "gated_no_bias")
  for s, (k, d) in streams(model, attn).items():
    r = d * (2 if attn.overlap else 1)
    state[f"entries_{s}"] = jnp.zeros((batch, entry_capacity(max_len, m), k, d), dtype)
    for buf in ("cur", "prev") if attn.overlap else ("cur",):
      state[f"{buf}_kv_{s}"] = jnp.zeros((batch, m, k, r), dtype)
      if gated:
        state[f"{buf}_z_{s}"] = jnp.zeros((batch, m, k, r), dtype)
  state["cur_valid"] = jnp.zeros((m, model.num_kv_heads), bool)
  if attn.overlap:
    state["prev_valid"] = jnp.zeros((m, model.num_kv_heads), bool)
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
        tok = tok[:, :kv.shape[2]]  # the index stream (one head) follows kv head 0
        tok_B1MK = jnp.broadcast_to(tok[None, None], (b, 1) + tok.shape)
        new[f"{buf}_kv_{s}"] = pooling.gather_slots(kv, tok_B1MK)[:, 0]
        if z is not None:
          new[f"{buf}_z_{s}"] = pooling.gather_slots(z, tok_B1MK)[:, 0]
  return cache_lib.advance(new, x_BxTxE)


def _close_chunks(model, attn, layer, compressors, x_win, state, new) -> None:
  """Buffers token t's compressor values; pools and writes the chunks that close at t."""
  t = state["index"]
  m = attn.chunk_size
  offsets_K = _offsets(model, attn, layer)
  b = x_win.shape[0]
  cur_valid_MxK = state["cur_valid"] | (jnp.arange(m)[:, None] == ((t + offsets_K) % m)[None])
  for s, comp in compressors.items():
    kv, z = comp.project(x_win)
    kh = kv.shape[2]  # K, or 1 for the index stream (kv head 0's chunks)
    slot_K = (t + offsets_K[:kh]) % m
    fill_MxK = jnp.arange(m)[:, None] == slot_K[None]
    closing_K = slot_K == m - 1
    cur_valid = cur_valid_MxK[:, :kh]
    capacity = state[f"entries_{s}"].shape[1]
    write_CxK = (jnp.arange(capacity)[:, None] == ((t + offsets_K[:kh]) // m)[None]) & closing_K
    cur = {}
    for name, value in (("kv", kv), ("z", z)):
      if value is not None:
        cur[name] = jnp.where(fill_MxK[None, :, :, None], value[:, -1:],
                              state[f"cur_{name}_{s}"])
    prev = {}
    if attn.overlap:
      prev = dict(prev_kv=state[f"prev_kv_{s}"][:, None],
                  prev_z=state[f"prev_z_{s}"][:, None] if "z" in cur else None,
                  prev_valid=jnp.broadcast_to(state["prev_valid"][:, :kh], (b, 1, m, kh)))
    pooled = comp.pool_slots(cur["kv"][:, None], cur["z"][:, None] if "z" in cur else None,
                             jnp.broadcast_to(cur_valid, (b, 1, m, kh)), **prev)
    entry = comp.finish(pooled, jnp.broadcast_to(t - (m - 1), (b, 1, kh)))
    new[f"entries_{s}"] = jnp.where(write_CxK[None, :, :, None], entry.astype(
        state[f"entries_{s}"].dtype), state[f"entries_{s}"])
    for name, value in cur.items():
      new[f"cur_{name}_{s}"] = value
      if attn.overlap:
        new[f"prev_{name}_{s}"] = jnp.where(closing_K[None, None, :, None], value,
                                            state[f"prev_{name}_{s}"])
  closing_K = (t + offsets_K) % m == m - 1
  new["cur_valid"] = cur_valid_MxK & ~closing_K[None]
  if attn.overlap:
    new["prev_valid"] = jnp.where(closing_K[None], cur_valid_MxK, state["prev_valid"])


def step(model: ModelConfig, attn: AttentionConfig, layer: int, parts: Parts, x_Bx1xE: Array,
         state: dict) -> tuple[Array, dict]:
  """Appends token ``state['index']``: (o_Bx1xHxD, new state)."""
  x_win, wctx = cache_lib.step_input(x_Bx1xE, state)
  q, k, v = (a[:, -1:] for a in parts.qkv(x_win, wctx))
  t = state["index"]
  new = dict(state)
  b, kh, d = q.shape[0], model.num_kv_heads, model.head_dim
  if attn.window:
    new = cache_lib.ring_write(new, k, v)
    ring_k, ring_v = new["ring_k"], new["ring_v"]
    ring_valid = jnp.broadcast_to(new["ring_pos"] >= 0, ring_k.shape[:2])
  else:  # no raw tokens: a zero-slot window (every implementation takes W = 0)
    ring_k = ring_v = jnp.zeros((b, 0, kh, d), q.dtype)
    ring_valid = jnp.zeros((b, 0), bool)
  entry_visible = None
  if parts.compressors:
    _close_chunks(model, attn, layer, parts.compressors, x_win, state, new)
    main = ("kv",) if attn.shared_kv else ("k", "v")
    ek, ev = new[f"entries_{main[0]}"], new[f"entries_{main[-1]}"]
    visible_CxK = entry_ends(model, attn, layer, ek.shape[1]) <= t
    # Visible entries of head k are a prefix; the longest one bounds what the kernel reads.
    num_entries = jnp.broadcast_to(jnp.max(jnp.sum(visible_CxK, axis=0)), (b,))
    staggered = len(set(static_offsets(model, attn, layer).tolist())) > 1
    if staggered or parts.select is not None:
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
