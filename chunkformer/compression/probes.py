"""Read-outs for the periodicity analysis: learned slot biases and realised pooling weights.

Keys are module paths such as ``block_0/attn/compressor`` (``key_compressor`` /
``value_compressor`` with separate key/value compression).
"""

from __future__ import annotations

import flax.linen as nn
import jax

Array = jax.Array


def _path(keys) -> str:
  return "/".join(str(getattr(k, "key", k)) for k in keys)


def slot_biases(params) -> dict[str, Array]:
  """{compressor path: ape_SxKxR}: the learned slot bias (slot gain) of every gated compressor.

  Row s is slot s of a chunk (token phase (t + offset) mod M); R = D channels, or 2D with
  overlap (first half: the entry's view of the previous chunk).
  """
  out = {}
  for keys, value in jax.tree_util.tree_leaves_with_path(nn.meta.unbox(params)):
    if str(getattr(keys[-1], "key", "")) == "ape":
      out[_path(keys[:-1])] = value
  return out


def pool_weights(model: nn.Module, params, tokens_BxT: Array, positions_BxT: Array | None = None,
                 segment_ids_BxT: Array | None = None) -> dict[str, Array]:
  """{compressor path: weights_BxCxSxK}: pooling weight of every slot, averaged over channels.

  From one forward pass (evaluation mode). S = M, or 2M with overlap (slots 0..M-1 are then
  the previous chunk). Padding slots get weight 0; each entry's weights sum to 1 (gated and
  mean pooling; the MLP pooling has no weights and is absent).
  """
  _, state = model.apply({"params": params}, tokens_BxT, positions_BxT, segment_ids_BxT,
                         mutable=["intermediates"])
  out = {}
  for keys, value in jax.tree_util.tree_leaves_with_path(state.get("intermediates", {})):
    names = [str(getattr(k, "key", k)) for k in keys]
    if "pool_weights" in names:
      out[_path(keys[:names.index("pool_weights")])] = value
  return out
