"""Decoding state of the ``full`` kind: every raw key/value, the uncompressed baseline.

``index`` counts the tokens of the row (the next token's position). An evicted cache
(chunkformer/eviction) also holds ``length``: the slots written, smaller than ``index`` once
eviction dropped entries; the kept keys carry RoPE at their original positions, so new tokens
are written at slot ``length`` but rotated at position ``index``.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from chunkformer.config import ModelConfig
from chunkformer.kvcache import common as cache_lib

Array = jax.Array

# The collection a prefill may read each full layer's queries from (eviction scores them);
# nothing is stored unless the caller makes it mutable.
QUERIES = "prompt_queries"
# The collection a sparse prefill may leave each full layer's index set in (tests, benchmark).
SPARSE_INDEX = "sparse_index"


def init_state(model: ModelConfig, batch: int, max_len: int) -> dict[str, Array]:
  """``k``/``v`` B x max_len x K x D (after RoPE), plus index and history."""
  state = cache_lib.init_common(model, batch)
  shape = (batch, max_len, model.num_kv_heads, model.head_dim)
  dtype = jnp.dtype(model.dtype)
  state.update(k=jnp.zeros(shape, dtype), v=jnp.zeros(shape, dtype))
  return state


def written(state: dict) -> Array:
  """Slots of ``k``/``v`` holding tokens (``index`` unless eviction compacted the cache)."""
  return state.get("length", state["index"])


def append(qkv, x_BxTxE: Array, state: dict, attend=None) -> tuple[Array, Array, dict]:
  """Appends T >= 1 tokens and attends causally over the cache: (o_BxTxHxD, q_BxTxHxD, state).

  ``attend(q, k, v) -> o`` (a sparse prefill) replaces the dense attention; it sees only the
  new tokens' keys, so it is for a prompt written into an empty cache (``decode.prefill``).
  """
  t = x_BxTxE.shape[1]
  x_win, ctx = cache_lib.step_input(x_BxTxE, state)
  q, k, v = (a[:, -t:] for a in qkv(x_win, ctx))
  slot = written(state)
  new = dict(state)
  for name, value in (("k", k), ("v", v)):
    new[name] = jax.lax.dynamic_update_slice_in_dim(state[name], value.astype(state[name].dtype),
                                                    slot, axis=1)
  if attend is not None:
    # The keys as the cache holds them, so a keep-everything pattern equals the dense path.
    o = attend(q, *(new[name][:, :t].astype(q.dtype) for name in ("k", "v")))
  else:
    cap = state["k"].shape[1]
    mask = jnp.arange(cap)[None, :] <= slot + jnp.arange(t)[:, None]
    o = jax.nn.dot_product_attention(q, new["k"].astype(q.dtype), new["v"].astype(q.dtype),
                                     mask=mask[None, None], implementation="xla")
  new = cache_lib.advance(new, x_BxTxE)
  if "length" in state:
    new["length"] = state["length"] + t
  return o, q, new
