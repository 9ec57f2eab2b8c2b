"""Where content-chunked eviction cuts the prompt: chunkformer's boundary predictors.

A source maps the prompt tokens_BxT to end flags ends_BxT ("a chunk closes at t"), the same
flags the ``dynamic`` attention kind compresses by:
- ``Delimiter``: the delimiter rule (a chunk closes at each delimiter token) under min/max
  chunk lengths (``chunking.enforce_lengths``);
- ``Router``: the end flags a trained dynamic model's boundary predictor (its learned router,
  or whatever predictor its config names) puts on the prompt, read from the flags its first
  dynamic group sows in a forward pass.
Sources are pytrees: their settings are static (part of a jitted prefill's cache key), the
router's parameters are traced.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

import jax
import jax.numpy as jnp

from chunkformer.chunking import delimiter_proposals, enforce_lengths
from chunkformer.chunking.boundaries import SOWN_END_FLAGS
from chunkformer.config_sections.errors import require

Array = jax.Array


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class Delimiter:
  """A chunk closes after every token in ``ids`` (lengths held in [min_chunk, max_chunk])."""

  ids: tuple[int, ...] = dataclasses.field(metadata=dict(static=True))
  min_chunk: int = dataclasses.field(default=1, metadata=dict(static=True))
  max_chunk: int = dataclasses.field(default=64, metadata=dict(static=True))

  def __post_init__(self):
    object.__setattr__(self, "ids", tuple(int(i) for i in self.ids))
    require(bool(self.ids), "eviction.boundaries.ids", "give at least one delimiter token id")
    require(1 <= self.min_chunk <= self.max_chunk, "eviction.boundaries.min_chunk",
            f"need 1 <= min_chunk <= max_chunk, got {self.min_chunk}, {self.max_chunk}")

  def ends(self, tokens_BxT: Array) -> Array:
    proposals = delimiter_proposals(tokens_BxT, self.ids)
    return enforce_lengths(proposals, jnp.zeros_like(tokens_BxT), min_chunk=self.min_chunk,
                           max_chunk=self.max_chunk)


def _sown(tree: Any) -> Array | None:
  if not isinstance(tree, Mapping):
    return None
  for key in sorted(tree, key=lambda k: (not str(k).startswith("block_"), _block(k))):
    value = tree[key]
    if key == SOWN_END_FLAGS:
      return value[0] if isinstance(value, (tuple, list)) else value
    found = _sown(value)
    if found is not None:
      return found
  return None


def _block(key: Any) -> int:
  name = str(key)
  return int(name[6:]) if name.startswith("block_") and name[6:].isdigit() else 0


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class Router:
  """The end flags a trained model with a dynamic layer (``model``: its Transformer, static;
  ``params``: its weights) puts on the prompt: its first dynamic group's boundaries."""

  model: Any = dataclasses.field(metadata=dict(static=True))
  params: Any = None

  def __post_init__(self):
    layers = getattr(getattr(self.model, "model", None), "layers", None)
    require(layers is not None and any(a.kind == "dynamic" for a in layers),
            "eviction.boundaries.model", "the router's model must have a dynamic layer "
            "(its boundary predictor cuts the prompt)")

  def ends(self, tokens_BxT: Array) -> Array:
    _, state = self.model.apply({"params": self.params}, tokens_BxT,
                                mutable=["intermediates"])
    return _sown(state["intermediates"]).astype(bool)
