"""Cache pieces shared by the attention kinds' decoding paths.

A layer's cache is a dict of arrays held in the Flax ``cache`` collection (variable
``state``). Every kind's cache has ``index`` (tokens written so far) and, when the model mixes
previous tokens into keys (``model.key_shift`` = w > 1), ``x_hist``: the last w-1 hidden states,
so that one decoding step can recompute the token shift exactly.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from chunkformer.config import ModelConfig
from chunkformer.context import AttentionContext

Array = jax.Array


def history_len(model: ModelConfig) -> int:
  return max(model.key_shift - 1, 0)


def init_common(model: ModelConfig, batch: int) -> dict[str, Array]:
  state = {"index": jnp.zeros((), jnp.int32)}
  if history_len(model):
    state["x_hist"] = jnp.zeros((batch, history_len(model), model.d_model), jnp.dtype(model.dtype))
  return state


def missing_cache() -> dict:
  raise ValueError("decoding needs an initialised cache: use chunkformer.decode.init_cache and "
                   "pass it as the 'cache' collection")


def step_input(x_BxTxE: Array, state: dict) -> tuple[Array, AttentionContext]:
  """Hidden states to project when appending T tokens (history + new) and their context.

  Callers keep the last T rows of whatever they project; positions continue from ``index``.
  """
  x_win = x_BxTxE
  if "x_hist" in state:
    x_win = jnp.concatenate([state["x_hist"].astype(x_BxTxE.dtype), x_BxTxE], axis=1)
  b, w, _ = x_win.shape
  positions = jnp.broadcast_to(state["index"] + x_BxTxE.shape[1] - w + jnp.arange(w), (b, w))
  zeros = jnp.zeros((b, w), jnp.int32)
  return x_win, AttentionContext(zeros, positions, zeros)


def advance(state: dict, x_BxTxE: Array) -> dict:
  """index += T and the hidden-state history shifted by the new tokens."""
  new = dict(state, index=state["index"] + x_BxTxE.shape[1])
  if "x_hist" in state:
    h = state["x_hist"].shape[1]
    new["x_hist"] = jnp.concatenate([state["x_hist"], x_BxTxE.astype(state["x_hist"].dtype)],
                                    axis=1)[:, -h:]
  return new


def init_ring(model: ModelConfig, batch: int, window: int) -> dict[str, Array]:
  """Ring buffer of the last W raw keys/values (after RoPE); ``ring_pos`` -1 marks empty."""
  shape = (batch, window, model.num_kv_heads, model.head_dim)
  dtype = jnp.dtype(model.dtype)
  return {"ring_k": jnp.zeros(shape, dtype), "ring_v": jnp.zeros(shape, dtype),
          "ring_pos": jnp.full((window,), -1, jnp.int32)}


def ring_write(state: dict, k_Bx1xKxD: Array, v_Bx1xKxD: Array) -> dict:
  """Writes the token at ``index`` into ring slot index mod W."""
  w = state["ring_pos"].shape[0]
  slot = state["index"] % w
  return dict(
      state,
      ring_k=jax.lax.dynamic_update_slice_in_dim(state["ring_k"], k_Bx1xKxD.astype(
          state["ring_k"].dtype), slot, axis=1),
      ring_v=jax.lax.dynamic_update_slice_in_dim(state["ring_v"], v_Bx1xKxD.astype(
          state["ring_v"].dtype), slot, axis=1),
      ring_pos=state["ring_pos"].at[slot].set(state["index"]))


def ring_fill(state: dict, k_BxTxKxD: Array, v_BxTxKxD: Array) -> dict:
  """The ring after a prompt of T tokens written from index 0: token tau sits at tau mod W."""
  w = state["ring_pos"].shape[0]
  t = k_BxTxKxD.shape[1]
  r = jnp.arange(w)
  tau = t - 1 - (t - 1 - r) % w  # the last prompt token of each slot
  valid = tau >= 0
  src = jnp.clip(tau, 0, t - 1)
  keep = valid[None, :, None, None]
  return dict(
      state,
      ring_k=jnp.where(keep, k_BxTxKxD[:, src], 0).astype(state["ring_k"].dtype),
      ring_v=jnp.where(keep, v_BxTxKxD[:, src], 0).astype(state["ring_v"].dtype),
      ring_pos=jnp.where(valid, tau, -1).astype(jnp.int32))
