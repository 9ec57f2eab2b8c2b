"""Applies a policy to the caches a prefill left: select per layer, then compact.

After the prompt's forward pass every full-attention layer's cache holds the prompt's T keys
and values (RoPE at their positions). The policy picks n per row and kv head; ``compact``
moves them to the cache's first n slots, in position order, and leaves room for the tokens
still to come (``max_len - T``), so the cache holds n + (max_len - T) slots instead of
max_len. Positions are kept: ``index`` stays T (the next token is rotated at position T) while
``length`` = n counts the written slots (``kvcache/full.py``). Only full-attention layers are
evicted; a model with any other kind is refused before its forward pass.
"""

from __future__ import annotations

from collections.abc import Mapping

import jax
import jax.numpy as jnp

from chunkformer.config import ModelConfig
from chunkformer.config_sections.errors import ConfigError
from chunkformer.eviction.specs import LayerInputs, Policy

Array = jax.Array


def check_model(model: ModelConfig) -> None:
  """ConfigError naming the first layer that is not full attention."""
  for layer, attn in enumerate(model.layers):
    if attn.kind != "full":
      raise ConfigError(
          f"config field 'model.layers[{layer}].kind': eviction prunes full-attention caches "
          f"only, and layer {layer} is {attn.kind!r} (its cache is already compressed)")


def check_policy(policy: Policy) -> None:
  if not isinstance(policy, Policy):
    raise ConfigError(f"eviction: give a policy of chunkformer.eviction (SnapKV(budget=...), "
                      f"...), got {policy!r}")


def _state(cache: Mapping, layer: int) -> dict:
  return cache[f"block_{layer}"]["attn"]["state"]


def _queries(sown: Mapping, layer: int) -> Array:
  q = sown[f"block_{layer}"]["attn"]["q"]
  return q[0] if isinstance(q, (tuple, list)) else q


def layer_inputs(model: ModelConfig, cache: Mapping, sown: Mapping, prompt_len: int,
                 num_queries: int) -> list[LayerInputs]:
  """Every layer's prompt keys, values and last ``num_queries`` queries (``full_cache.QUERIES``
  as sown by the prefill's forward pass)."""
  out = []
  for layer in range(model.num_layers):
    state = _state(cache, layer)
    q = _queries(sown, layer)[:, prompt_len - num_queries:] if num_queries else (
        jnp.zeros(state["k"].shape[:1] + (0, model.num_heads, model.head_dim), state["k"].dtype))
    out.append(LayerInputs(state["k"][:, :prompt_len], state["v"][:, :prompt_len], q))
  return out


def compact(state: Mapping, kept_BxKxN: Array, room: int) -> dict:
  """The layer's state holding only the kept keys/values, then ``room`` empty slots."""
  new = dict(state)
  index = kept_BxKxN.transpose(0, 2, 1)[..., None]  # B x N x K x 1
  for name in ("k", "v"):
    kept = jnp.take_along_axis(state[name], index, axis=1)
    new[name] = jnp.pad(kept, ((0, 0), (0, room), (0, 0), (0, 0)))
  new["length"] = jnp.asarray(kept_BxKxN.shape[-1], jnp.int32)
  return new


def evict(model: ModelConfig, cache: Mapping, sown: Mapping, tokens_BxT: Array,
          policy: Policy, room: int) -> tuple[dict, list[Array]]:
  """(the compacted cache, kept_BxKxN per layer) for a prompt ``tokens_BxT`` whose forward
  pass filled ``cache`` (room: slots left for the tokens to come)."""
  b, t = tokens_BxT.shape
  n = policy.tokens(t)
  layers = layer_inputs(model, cache, sown, t, policy.queries(t))
  lengths_B = jnp.full((b,), t, jnp.int32)  # decoding rows share one length
  kept = policy.select(layers, tokens_BxT, lengths_B, n)
  new = {f"block_{layer}": {"attn": {"state": compact(_state(cache, layer), k, room)}}
         for layer, k in enumerate(kept)}
  return new, kept

