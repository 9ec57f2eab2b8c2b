"""Incremental decoding with per-layer caches: prefill, jitted one-token steps, greedy generation.

Each layer's attention kind owns its cache (``Kind.init_cache``, modules in chunkformer/kvcache/):
``full`` keeps every raw key and value; ``window`` a ring buffer of the last W; ``fixed`` and
``dynamic`` that ring plus the open chunk's buffered slots and the closed entries (compressed
cache). The caches live in the Flax ``cache``
collection and are threaded explicitly through these functions; parameters are the training
parameters, unchanged. Rows of a batch decode in lockstep (one shared position); a cache holds
one document per row. ``cache_bytes`` measures the actual arrays.

Prefill under a mesh (``layout=`` a ``runtime.Runtime``, or anything with its ``mesh`` and
fitted axis ``rules``): the prompt and the forward pass's activations are split as in training,
so with ``mesh.context = N`` each device holds T/N of the prompt's tokens (context
parallelism); the cache it leaves is sharded as GSPMD chose and ``step`` decodes from it as
from any other cache (one token at a time: nothing to split along the tokens).

Inference-time eviction (chunkformer/eviction; full-attention models only): ``eviction=`` a
policy prunes every layer's cache once after the prompt's forward pass to the policy's budget;
decoding continues from the pruned cache, each kept key keeping its position.

Sparse prefill (chunkformer/sparse_prefill): ``sparse=`` a pattern or a per-head Plan makes the
prompt's full-attention layers attend over estimated sparse index sets; the caches are those
of a dense prefill.

  logits_BxTxV, cache = prefill(model, params, prompt_BxT, max_len[, eviction=SnapKV(budget=64)]
                                [, layout=runtime][, sparse=BlockSparse(top=64)])
  logits_BxV, cache = step(model, params, cache, tokens_Bx1)
  tokens_BxN = generate(model, params, prompt_BxT, num_tokens[, eviction=...])
"""

from __future__ import annotations

import contextlib
import functools
import math

import flax.linen as nn
import jax
import jax.numpy as jnp

from chunkformer import sharding as sharding_lib
from chunkformer.config import ModelConfig
from chunkformer.config_sections import capabilities
from chunkformer.eviction import prune
from chunkformer.kvcache import full as full_cache
from chunkformer.model import Transformer, init_cache
from chunkformer.sparse_prefill import plan as sparse_plan

Array = jax.Array

# init_cache (imported above) is part of this API. It lives in model.py (the cache collection is
# the model's module tree), so that sparse_prefill/, below this module, builds caches without it.


def cache_index(cache: dict) -> Array:
  """Tokens written into the cache so far (every layer holds the same count)."""
  return cache["block_0"]["attn"]["state"]["index"]


def _apply(model: Transformer, params, cache: dict, tokens_BxT: Array, start,
           sparse=None) -> tuple[Array, dict]:
  positions = jnp.broadcast_to(start + jnp.arange(tokens_BxT.shape[1]), tokens_BxT.shape)
  logits, mutated = model.apply({"params": params, "cache": cache}, tokens_BxT, positions,
                                decode=True, sparse=sparse, mutable=["cache"])
  return logits, mutated["cache"]


def _check_eviction(model: Transformer, prompt_len: int, eviction) -> None:
  """Refuses a bad policy, a model it cannot prune or a budget the prompt cannot hold, before
  anything compiles or runs."""
  if eviction is not None:
    prune.check_policy(eviction)
    prune.check_model(model.model)
    eviction.tokens(prompt_len)


def _check_layout(model: Transformer, prompt_BxT, layout, sparse=None) -> None:
  """Refuses a prompt the layout's mesh cannot split, and kernels that cannot run split,
  before anything compiles."""
  mesh = layout.mesh
  context = mesh.shape["context"]
  b, t = prompt_BxT.shape
  if t % context:
    raise ValueError(f"prompt of {t} tokens does not split over mesh.context={context} devices")
  rows = nn.logical_to_mesh_axes(sharding_lib.BATCH_AXES,
                                 sharding_lib.normalize_rules(layout.rules))[0]
  shards = math.prod(mesh.shape[a] for a in ((rows,) if isinstance(rows, str) else rows or ()))
  if b % shards:
    raise ValueError(f"prompt of {b} rows does not split over the {shards} batch shards of the "
                     f"mesh {dict(mesh.shape)}")
  if context > 1:
    for i, layer in enumerate(model.model.layers):
      refused = capabilities.context_refusal(layer.implementation, context, "a prompt")
      if refused is not None:
        raise ValueError(f"model.attention[layer {i}].implementation: {refused}")
    refused = (None if sparse is None else
               capabilities.context_refusal(sparse.implementation, context, "a prompt"))
    if refused is not None:
      raise ValueError(f"sparse.implementation: {refused}")


def prefill_kept(model: Transformer, params, prompt_BxT: Array, max_len: int,
                 eviction=None, layout=None, sparse=None
                 ) -> tuple[Array, dict, list[Array] | None]:
  """``prefill``, also returning each layer's kept positions kept_BxKxN (None: no eviction)."""
  if prompt_BxT.shape[1] > max_len:
    raise ValueError(f"prompt of {prompt_BxT.shape[1]} tokens exceeds max_len {max_len}")
  _check_eviction(model, prompt_BxT.shape[1], eviction)
  sparse = sparse_plan.resolve(model.model, sparse)
  if layout is None:
    return _prefill(model, params, prompt_BxT, max_len, eviction, sparse=sparse)
  _check_layout(model, prompt_BxT, layout, sparse)
  rules = sharding_lib.normalize_rules(layout.rules)
  with jax.set_mesh(layout.mesh):
    prompt_BxT = jax.device_put(prompt_BxT, sharding_lib.batch_sharding(layout.mesh, rules))
    return _prefill(model, params, prompt_BxT, max_len, eviction, rules, sparse)


@functools.partial(jax.jit, static_argnames=("model", "max_len", "rules", "sparse"))
def _prefill(model, params, prompt_BxT, max_len, eviction, rules=None, sparse=None):
  # The rules are a static argument, so a trace under one mesh layout is never reused for
  # another; inside them the model's logical constraints split its activations.
  with nn.logical_axis_rules(rules) if rules is not None else contextlib.nullcontext():
    return _prefill_body(model, params, prompt_BxT, max_len, eviction, sparse)


def _prefill_body(model, params, prompt_BxT, max_len, eviction, sparse=None):
  b, t = prompt_BxT.shape
  if eviction is None:
    logits, cache = _apply(model, params, init_cache(model.model, b, max_len), prompt_BxT, 0,
                           sparse)
    return logits, cache, None
  positions = jnp.broadcast_to(jnp.arange(t), prompt_BxT.shape)
  logits, mutated = model.apply(
      {"params": params, "cache": init_cache(model.model, b, t)}, prompt_BxT, positions,
      decode=True, sparse=sparse, mutable=["cache", full_cache.QUERIES])
  cache, kept = prune.evict(model.model, mutated["cache"], mutated[full_cache.QUERIES],
                            prompt_BxT, eviction, room=max_len - t)
  return logits, cache, kept


def prefill(model: Transformer, params, prompt_BxT: Array, max_len: int,
            eviction=None, layout=None, sparse=None) -> tuple[Array, dict]:
  """Runs the prompt through the parallel forward pass into a fresh cache of ``max_len``.

  With ``layout`` (a ``runtime.Runtime``: its ``mesh`` and ``rules``) the prompt is split over
  the mesh as a training batch is (rows over data x fsdp, tokens over context) and the forward
  pass runs under the axis rules; ValueError before compiling if the mesh cannot split it.

  With ``eviction`` (a chunkformer.eviction policy; full-attention models only, ConfigError
  otherwise) every layer's cache is then pruned to the policy's budget n and holds
  n + (max_len - T) slots.

  With ``sparse`` (a chunkformer.sparse_prefill pattern for every head of every full layer, or
  a Plan; ConfigError if it does not fit the model) the full-attention layers attend over the
  index sets their patterns estimate from the prompt (never T x T); every layer's cache is
  the one a dense prefill writes (keys and values do not depend on attention within a layer),
  and decoding from it is unchanged. Other kinds keep their own prefill.
  Returns (logits_BxTxV of the prompt, cache).
  """
  logits, cache, _ = prefill_kept(model, params, prompt_BxT, max_len, eviction, layout, sparse)
  return logits, cache


@functools.partial(jax.jit, static_argnames=("model",))
def step(model: Transformer, params, cache: dict, tokens_Bx1: Array) -> tuple[Array, dict]:
  """Appends one token per row: (logits_BxV of that token, cache).

  The caller keeps the total number of tokens within the cache's max_len: beyond it the
  caches are full and the results are not defined (``generate`` checks this).
  """
  logits, cache = _apply(model, params, cache, tokens_Bx1, cache_index(cache))
  return logits[:, 0], cache


@functools.partial(jax.jit, static_argnames=("model", "num_tokens", "max_len", "sparse"))
def _generate(model, params, prompt_BxT, num_tokens, max_len, eviction, sparse=None):
  logits, cache = prefill(model, params, prompt_BxT, max_len, eviction, sparse=sparse)
  first = jnp.argmax(logits[:, -1], axis=-1).astype(prompt_BxT.dtype)

  def body(carry, _):
    token, cache = carry
    logits, cache = step(model, params, cache, token[:, None])
    return (jnp.argmax(logits, axis=-1).astype(token.dtype), cache), token

  _, tokens_NxB = jax.lax.scan(body, (first, cache), None, length=num_tokens)
  return tokens_NxB.T


def generate(model: Transformer, params, prompt_BxT: Array, num_tokens: int,
             max_len: int | None = None, eviction=None, sparse=None) -> Array:
  """Greedy continuation: tokens_BxN (N = num_tokens) after the prompt (pruned by
  ``eviction`` after the prefill, if given; prefilled through ``sparse``, if given)."""
  needed = prompt_BxT.shape[1] + num_tokens
  max_len = needed if max_len is None else max_len
  if needed > max_len:
    raise ValueError(f"prompt + num_tokens = {needed} exceeds max_len {max_len}")
  _check_eviction(model, prompt_BxT.shape[1], eviction)
  return _generate(model, params, prompt_BxT, num_tokens, max_len, eviction,
                   sparse_plan.resolve(model.model, sparse))


def cache_bytes(cache: dict) -> int:
  """Bytes held by the cache's arrays."""
  return sum(x.size * x.dtype.itemsize for x in jax.tree_util.tree_leaves(cache))


def bytes_per_token(model: ModelConfig, max_len: int, batch: int = 1) -> float:
  """Cache bytes per token of context for a cache sized for ``max_len`` tokens."""
  shapes = jax.eval_shape(lambda: init_cache(model, batch, max_len))
  return cache_bytes(shapes) / (batch * max_len)
