"""The end flags a dynamic model actually used, read from its evaluation forward pass.

The ``dynamic`` kind computes its boundaries once per group (``chunking.boundaries.compute``)
and the group's owner sows its end flags into "intermediates"
(``chunking.boundaries.SOWN_END_FLAGS``); the per-layer packed layout, with each entry's
visible-from position, is sown too (``SOWN_VISIBLE_FROM``). Evaluation reads those values, the
first dynamic layer's group, instead of recomputing them from model internals.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import jax

from chunkformer.chunking.boundaries import SOWN_END_FLAGS
from chunkformer.config import AttentionConfig, ModelConfig

END_FLAGS = SOWN_END_FLAGS


def first_dynamic(model: ModelConfig) -> tuple[int, AttentionConfig] | None:
  """(layer, attention config) of the first dynamic layer, or None."""
  for layer, attn in enumerate(model.layers):
    if attn.kind == "dynamic":
      return layer, attn
  return None


def _sown(tree: Any, name: str) -> Any:
  if not isinstance(tree, Mapping):
    return None
  for key, value in tree.items():
    if key == name:
      return value[0] if isinstance(value, (tuple, list)) else value
    found = _sown(value, name)
    if found is not None:
      return found
  return None


def end_flags(model: ModelConfig, intermediates: Any) -> jax.Array | None:
  """bool ends_BxT of the first dynamic layer's group; None for models without one.

  ``intermediates``: the "intermediates" collection of a forward pass applied with
  ``mutable=["intermediates"]`` (``trained.Predictor`` does).
  """
  found = first_dynamic(model)
  if found is None:
    return None
  block = intermediates.get(f"block_{found[0]}") if isinstance(intermediates, Mapping) else None
  sown = _sown(block, END_FLAGS)
  if sown is None:  # layers under a scan or another naming: the first sown flags anywhere
    sown = _sown(intermediates, END_FLAGS)
  if sown is None:
    raise ValueError(f"layer {found[0]}: no sown '{END_FLAGS}'; apply the model with "
                     "mutable=['intermediates']")
  return sown.astype(bool)
