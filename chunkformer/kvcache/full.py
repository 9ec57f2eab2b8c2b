"""Decoding state of the ``full`` kind: every raw key/value, the uncompressed baseline."""

from __future__ import annotations

import jax
import jax.numpy as jnp

from chunkformer.config import ModelConfig
from chunkformer.kvcache import common as cache_lib

Array = jax.Array


def init_state(model: ModelConfig, batch: int, max_len: int) -> dict[str, Array]:
  """``k``/``v`` B x max_len x K x D (after RoPE), plus index and history."""
  state = cache_lib.init_common(model, batch)
  shape = (batch, max_len, model.num_kv_heads, model.head_dim)
  dtype = jnp.dtype(model.dtype)
  state.update(k=jnp.zeros(shape, dtype), v=jnp.zeros(shape, dtype))
  return state


def append(qkv, x_BxTxE: Array, state: dict) -> tuple[Array, dict]:
  """Appends T >= 1 tokens at ``index`` and attends causally over the cache: (o_BxTxHxD, state)."""
  t = x_BxTxE.shape[1]
  x_win, ctx = cache_lib.step_input(x_BxTxE, state)
  q, k, v = (a[:, -t:] for a in qkv(x_win, ctx))
  index = state["index"]
  new = dict(state)
  for name, value in (("k", k), ("v", v)):
    new[name] = jax.lax.dynamic_update_slice_in_dim(state[name], value.astype(state[name].dtype),
                                                    index, axis=1)
  cap = state["k"].shape[1]
  mask = jnp.arange(cap)[None, :] <= index + jnp.arange(t)[:, None]
  o = jax.nn.dot_product_attention(q, new["k"].astype(q.dtype), new["v"].astype(q.dtype),
                                   mask=mask[None, None], implementation="xla")
  return o, cache_lib.advance(new, x_BxTxE)
