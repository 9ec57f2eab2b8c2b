"""Decoding state of the ``dynamic`` kind: a compressed cache whose chunks close on content.

Per layer (static shapes; one document per row, rows in lockstep as chunkformer/decode.py):
- ``ring_k``/``ring_v``/``ring_pos``: the last W raw keys/values (chunkformer/kvcache/common.py);
- ``entries_{s}`` B x C x K x D per compressor stream s and ``num_entries`` B: closed entries in
  order of their end, C = ``chunking.boundaries.capacity(attn, max_len)`` (never overflows);
- ``cur_kv_{s}``/``cur_z_{s}`` B x S x K x R, ``cur_len`` B, ``cur_start`` B: the open chunk's
  buffered compressor values and gate logits (S = the longest chunk), its length and the
  position of its first token;
- the boundary owner with the router also keeps ``router_prev`` B x E, the previous token's
  attention input (the router compares x_{t-1} and x_t);
- ``index`` and ``x_hist`` (chunkformer/kvcache/common.py).
A step appends one token: the owner decides whether the open chunk closes (the same rule as
``chunking.enforce_lengths`` on the open length; under the router's 'start' rule the chunk
ending at the previous token, before the new token joins) and hands the decision to its group
through ``shared``; every layer buffers the token and, on a close, pools the buffer exactly as
the forward pass pools the chunk (the compressor's slot buffer path: same weights, same slot
bias by position in the chunk), writes entry ``num_entries`` and attends over ring + entries
with ``kernels.decode_attention``.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp

import kernels
from chunkformer import chunking
from chunkformer.compression import Compressor
from chunkformer.config import AttentionConfig, ModelConfig
from chunkformer.kvcache import common as cache_lib

Array = jax.Array


class Parts(NamedTuple):
  """The bound submodules of one dynamic attention layer that a decoding step calls."""

  qkv: object
  compressors: dict[str, Compressor]
  router: object | None  # the owner's BoundaryRouter (router rule only)
  sink_H: Array | None


def init_state(model: ModelConfig, attn: AttentionConfig, layer: int, batch: int, max_len: int,
               capacity: int, slots: int, owner: bool) -> dict[str, Array]:
  del layer
  state = cache_lib.init_common(model, batch)
  if attn.window:
    state.update(cache_lib.init_ring(model, batch, attn.window))
  k, d = model.num_kv_heads, model.head_dim
  dtype = jnp.dtype(model.dtype)
  streams = ("kv",) if attn.shared_kv else ("k", "v")
  for s in streams:
    state[f"entries_{s}"] = jnp.zeros((batch, capacity, k, d), dtype)
    state[f"cur_kv_{s}"] = jnp.zeros((batch, slots, k, d), dtype)
    if attn.pooling in ("gated", "gated_no_bias"):
      state[f"cur_z_{s}"] = jnp.zeros((batch, slots, k, d), dtype)
  for name in ("num_entries", "cur_len", "cur_start"):
    state[name] = jnp.zeros((batch,), jnp.int32)
  if owner and attn.boundary == "router":
    state["router_prev"] = jnp.zeros((batch, model.d_model), dtype)
  del max_len
  return state


def prefill_state(attn: AttentionConfig, compressors: dict[str, Compressor], delay: int,
                  x_BxTxE: Array, k_BxTxKxD: Array, v_BxTxKxD: Array, ends_BxT: Array,
                  entries: dict[str, Array], state: dict) -> dict:
  """The cache after a prompt of T tokens (one document, positions 0..T-1) in a fresh cache.

  With ``delay`` 1 a chunk ending at the prompt's last token is not visible yet: it stays open
  and the first step closes it (the forward pass's entry for it is not counted).
  """
  b, t, _ = x_BxTxE.shape
  if delay:
    ends_BxT = ends_BxT.at[:, t - 1].set(False)
  new = dict(state)
  if attn.window:
    new = cache_lib.ring_fill(new, k_BxTxKxD, v_BxTxKxD)
  index_T = jnp.arange(t)
  last_end_B = jnp.max(jnp.where(ends_BxT, index_T, -1), axis=1)
  new["num_entries"] = jnp.sum(ends_BxT, axis=1, dtype=jnp.int32)
  new["cur_start"] = (last_end_B + 1).astype(jnp.int32)
  new["cur_len"] = (t - 1 - last_end_B).astype(jnp.int32)
  slots = state[f"cur_kv_{next(iter(compressors))}"].shape[1]
  tok_BxS = new["cur_start"][:, None] + jnp.arange(slots)[None]
  in_chunk = (tok_BxS < t)[:, :, None, None]
  zeros = jnp.zeros((b, t), jnp.int32)
  for s, comp in compressors.items():
    new[f"entries_{s}"] = jax.lax.dynamic_update_slice_in_dim(
        state[f"entries_{s}"], entries[s].astype(state[f"entries_{s}"].dtype), 0, axis=1)
    kv, z = comp.project(x_BxTxE, zeros)
    for name, value in (("kv", kv), ("z", z)):
      if value is not None:
        gathered = jnp.take_along_axis(value, jnp.clip(tok_BxS, 0, t - 1)[:, :, None, None],
                                       axis=1)
        new[f"cur_{name}_{s}"] = jnp.where(in_chunk, gathered, 0).astype(
            state[f"cur_{name}_{s}"].dtype)
  if "router_prev" in state:
    new["router_prev"] = x_BxTxE[:, -1].astype(state["router_prev"].dtype)
  return cache_lib.advance(new, x_BxTxE)


def _decide_close(attn: AttentionConfig, router, x_Bx1xE: Array, tokens_Bx1: Array,
                  length_B: Array, state: dict, new: dict) -> Array:
  """close_B: the owner's decision that the open chunk, ``length_B`` tokens long, closes now.

  The rule of ``chunking.enforce_lengths``: a proposal closes a chunk of >= min_chunk tokens,
  max_chunk tokens always close.
  """
  t = state["index"]
  b = x_Bx1xE.shape[0]
  if attn.boundary == "fixed":
    return jnp.broadcast_to((t + 1 + attn.chunk_offset) % attn.chunk_size == 0, (b,))
  if attn.boundary == "delimiter":
    proposal = chunking.delimiter_proposals(tokens_Bx1, attn.delimiter_ids)[:, 0]
  else:
    pair_Bx2xE = jnp.concatenate([state["router_prev"][:, None].astype(x_Bx1xE.dtype), x_Bx1xE],
                                 axis=1)
    # At index 0 the token starts the document: mark it so, and the router returns p = 0.
    seg_Bx2 = jnp.broadcast_to(jnp.stack([0, jnp.where(t == 0, 1, 0)]), (b, 2))
    proposal = chunking.hard_proposals(router(pair_Bx2xE, seg_Bx2)[:, 1])
    new["router_prev"] = x_Bx1xE[:, 0].astype(state["router_prev"].dtype)
  return (length_B >= 1) & ((proposal & (length_B >= attn.min_chunk))
                            | (length_B >= attn.max_chunk))


def step(model: ModelConfig, attn: AttentionConfig, parts: Parts, key: str, delay: int,
         x_Bx1xE: Array, ctx, state: dict, shared: dict) -> tuple[Array, dict, dict]:
  """Appends token ``t = state['index']``: (o_Bx1xHxD, new state, shared).

  ``delay`` 0: token t joins the open chunk, which then closes if the rule says t ends it.
  ``delay`` 1 (router 'start' rule): the open chunk, ending at t - 1, closes if the rule says
  t starts a new chunk; then token t joins the (possibly new) open chunk.
  """
  x_win, wctx = cache_lib.step_input(x_Bx1xE, state)
  q, k, v = (a[:, -1:] for a in parts.qkv(x_win, wctx))
  t = state["index"]
  new = dict(state)
  joined_B = state["cur_len"] + 1 - delay  # open chunk length when the decision is taken
  if key in shared:
    close_B = shared[key]["ends"][:, 0]
  else:
    close_B = _decide_close(attn, parts.router, x_Bx1xE, ctx.tokens_BxT, joined_B, state, new)
    shared = {**shared, key: {"ends": close_B[:, None], "probs": None}}
  b = x_Bx1xE.shape[0]
  for s, comp in parts.compressors.items():
    kv, z = comp.project(x_win)
    slots = state[f"cur_kv_{s}"].shape[1]

    def append(buffers_in, slot_B, kv=kv, z=z, slots=slots):
      fill_BxS = (jnp.arange(slots)[None] == slot_B[:, None])[:, :, None, None]
      return {name: jnp.where(fill_BxS, value[:, -1:], buffers_in[name])
              for name, value in (("kv", kv), ("z", z)) if value is not None}

    buffers = {name: state[f"cur_{name}_{s}"] for name in ("kv", "z")
               if f"cur_{name}_{s}" in state}
    if not delay:
      buffers = append(buffers, state["cur_len"])
    kh = kv.shape[2]
    valid = jnp.broadcast_to((jnp.arange(slots)[None] < joined_B[:, None])[:, None, :, None],
                             (b, 1, slots, kh))
    pooled = comp.pool_slots(buffers["kv"][:, None],
                             buffers["z"][:, None] if "z" in buffers else None, valid)
    entry = comp.finish(pooled, jnp.broadcast_to(state["cur_start"][:, None, None], (b, 1, kh)))
    cap = state[f"entries_{s}"].shape[1]
    write_BxC = (jnp.arange(cap)[None] == state["num_entries"][:, None]) & close_B[:, None]
    new[f"entries_{s}"] = jnp.where(write_BxC[:, :, None, None],
                                    entry.astype(state[f"entries_{s}"].dtype),
                                    state[f"entries_{s}"])
    if delay:  # token t opens the next chunk, or extends the unclosed one
      buffers = append(buffers, jnp.where(close_B, 0, state["cur_len"]))
    for name, value in buffers.items():
      new[f"cur_{name}_{s}"] = value
  new["num_entries"] = state["num_entries"] + close_B.astype(jnp.int32)
  new["cur_len"] = jnp.where(close_B, delay, state["cur_len"] + 1).astype(jnp.int32)
  new["cur_start"] = jnp.where(close_B, t + 1 - delay, state["cur_start"]).astype(jnp.int32)
  if attn.window:
    new = cache_lib.ring_write(new, k, v)
    ring_k, ring_v = new["ring_k"], new["ring_v"]
    ring_valid = jnp.broadcast_to(new["ring_pos"] >= 0, ring_k.shape[:2])
  else:  # no raw tokens: a zero-slot window (every implementation takes W = 0)
    ring_k = ring_v = jnp.zeros((b, 0) + k.shape[2:], k.dtype)
    ring_valid = jnp.zeros((b, 0), bool)
  streams = ("kv",) if attn.shared_kv else ("k", "v")
  ek, ev = new[f"entries_{streams[0]}"], new[f"entries_{streams[-1]}"]
  o = kernels.decode_attention(q[:, 0], ring_k.astype(q.dtype), ring_v.astype(q.dtype),
                               ring_valid, ek.astype(q.dtype), ev.astype(q.dtype),
                               new["num_entries"], sink_H=parts.sink_H,
                               implementation=attn.implementation, interpret=attn.interpret)
  return o[:, None], cache_lib.advance(new, x_Bx1xE), shared
