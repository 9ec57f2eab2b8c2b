"""The end flags a dynamic model actually used, recovered during an evaluation forward pass.

The ``dynamic`` kind computes its boundaries once per group (``attention/dynamic.py``) and
does not sow them. For the sweep's phases and the achieved compression ratio we read the
first dynamic layer's boundaries (group 0's owner):
- ``delimiter`` and ``fixed`` rules depend on tokens and positions only, so they are recomputed
  with the kind's own ``predict_boundaries``;
- the learned ``router`` needs the owner's hidden states: its output probabilities are captured
  with Flax's ``capture_intermediates`` (filter ``capture_filter``) and turned into end flags
  by the same ``predict_boundaries``.
If a kind sows ``end_flags`` (bool ends_BxT) into "intermediates", those win.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import jax

from chunkformer import chunking
from chunkformer.attention import dynamic
from chunkformer.attention.common import AttentionContext
from chunkformer.config import AttentionConfig, ModelConfig

END_FLAGS = "end_flags"  # an optional sown name that overrides the recomputation
_CALL = "__call__"  # where capture_intermediates stores a module's output


def first_dynamic(model: ModelConfig) -> tuple[int, AttentionConfig] | None:
  """(layer, attention config) of the first dynamic layer, or None."""
  for layer, attn in enumerate(model.layers):
    if attn.kind == "dynamic":
      return layer, attn
  return None


def capture_filter(model: ModelConfig):
  """``capture_intermediates`` filter keeping the boundary router's output (None: not needed)."""
  found = first_dynamic(model)
  if found is None or found[1].boundary != "router":
    return None
  return lambda module, method: method == _CALL and isinstance(module, chunking.BoundaryRouter)


def _find(tree: Any, path: tuple[str, ...]) -> Any:
  for part in path:
    if not isinstance(tree, Mapping) or part not in tree:
      return None
    tree = tree[part]
  return tree


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


def end_flags(model: ModelConfig, intermediates: Any, tokens_BxT: jax.Array,
              positions_BxT: jax.Array, segment_ids_BxT: jax.Array) -> jax.Array | None:
  """bool ends_BxT of the first dynamic layer (module docstring); None for other models."""
  sown = _sown(intermediates, END_FLAGS)
  if sown is not None:
    return sown.astype(bool)
  found = first_dynamic(model)
  if found is None:
    return None
  layer, attn = found
  probs = None
  if attn.boundary == "router":
    captured = _find(intermediates, (f"block_{layer}", "attn", "router", _CALL))
    if captured is None:
      raise ValueError(f"layer {layer}: no captured router output; apply the model with "
                       "capture_intermediates=capture_filter(model)")
    probs = captured[0] if isinstance(captured, (tuple, list)) else captured
  ctx = AttentionContext(tokens_BxT, positions_BxT, segment_ids_BxT)
  return dynamic.predict_boundaries(attn, ctx, probs)
