"""THE dispatch point of attention: which implementation serves a layer, and calling it.

Every layer's implementation is decided here from the one capability table
(``config_sections/capabilities.py``, also read by config validation):
- ``resolve`` replaces ``auto`` in a layer's AttentionConfig before the layer is built (the
  decoder's Block does it), so every consumer below it (the kinds, their caches, the kernels)
  sees a concrete name: per platform the first implementation of ``capabilities.AUTO`` that
  serves the layer (GPU: ``pallas_gpu``, TPU: ``splash`` for kind full and ``pallas_tpu`` for
  the compressed kinds, CPU: ``blockwise`` for kind full; ``xla`` where nothing else serves);
- ``full_attention`` and ``compressed_attention`` run the code path the table names for kind
  full and for the compressed kinds, refusing (from the same table) what the implementation
  does not serve. Decoding passes the name on to ``kernels.decode_attention``, whose switch
  uses the same names (``kvcache/`` never imports attention/).
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

import kernels
from chunkformer.attention import blockwise, compressed_core, query_blocks
from chunkformer.attention.common import document_causal_mask
from chunkformer.config import AttentionConfig, capabilities

Array = jax.Array


def choose(attn: AttentionConfig, num_kv_heads: int, platform: str) -> str:
  """The concrete implementation ``auto`` means for this layer on ``platform``."""
  return capabilities.choose(attn, num_kv_heads, platform)


def resolve(attn: AttentionConfig, num_kv_heads: int,
            platform: str | None = None) -> AttentionConfig:
  """``attn`` itself, or with ``auto`` replaced by ``choose`` (platform: JAX's default)."""
  if attn.implementation != "auto":
    return attn
  platform = jax.default_backend() if platform is None else platform
  return dataclasses.replace(attn, implementation=choose(attn, num_kv_heads, platform))


def _require(implementation: str, kind: str, option: str | None = None) -> None:
  """The runtime's check against the table (config validation refuses the same earlier)."""
  if implementation not in capabilities.TABLE:
    raise ValueError(f"unknown attention implementation {implementation!r} "
                     f"(one of {list(capabilities.TABLE)}; resolve 'auto' first)")
  cap = capabilities.TABLE[implementation]
  if kind not in cap.kinds:
    raise ValueError(f"{implementation!r} serves kinds {list(cap.kinds)}, not {kind!r}")
  if option is not None and option not in cap.options:
    raise ValueError(f"{capabilities.OPTIONS[option].what} runs with implementation "
                     f"{' | '.join(capabilities.servers(option))}, not {implementation!r}")


def full_attention(q_BxTxHxD: Array, k_BxTxKxD: Array, v_BxTxKxD: Array, segment_ids_BxT: Array,
                   implementation: str, interpret: bool = False,
                   row_layout: kernels.RowLayout | None = None) -> Array:
  """Document-causal attention of every query over its document's earlier keys; o_BxTxHxD.

  ``row_layout``: ``kernels.row_layout(segment_ids_BxT)`` if the caller has it (the model's
  context), read by the Pallas kernels."""
  _require(implementation, "full")
  if implementation == "xla":
    mask = document_causal_mask(segment_ids_BxT)
    return jax.nn.dot_product_attention(q_BxTxHxD, k_BxTxKxD, v_BxTxKxD, mask=mask,
                                        implementation="xla")
  if implementation == "blockwise":
    return blockwise.blockwise_attention(q_BxTxHxD, k_BxTxKxD, v_BxTxKxD, segment_ids_BxT)
  if implementation == "splash":
    from chunkformer.attention import splash  # Pallas TPU imports: only where it runs
    return splash.splash_attention(q_BxTxHxD, k_BxTxKxD, v_BxTxKxD, segment_ids_BxT,
                                   interpret=interpret)
  # The project's kernels with a raw-key window covering the whole row and no entries (one
  # padding entry that no query sees).
  b, t = segment_ids_BxT.shape
  kh, d = k_BxTxKxD.shape[2:]
  no_entries = jnp.zeros((b, 1, kh, d), k_BxTxKxD.dtype)
  return kernels.chunk_attention(
      q_BxTxHxD, k_BxTxKxD, v_BxTxKxD, segment_ids_BxT, no_entries, no_entries,
      jnp.full((b, 1), kernels.PAD_END, jnp.int32),
      jnp.full((b, 1), kernels.PAD_SEGMENT, jnp.int32),
      window=t, implementation=implementation, interpret=interpret, row_layout=row_layout)


def compressed_attention(q_BxTxHxD: Array, k_BxTxKxD: Array, v_BxTxKxD: Array,
                         segment_ids_BxT: Array, *, kind: str, window: int,
                         entry_k_BxCxKxD: Array, entry_v_BxCxKxD: Array | None,
                         entry_ends_BxCxK: Array, entry_segment_ids_BxCxK: Array,
                         sink_H: Array | None, implementation: str, interpret: bool,
                         tail: compressed_core.Tail | None = None,
                         selector: query_blocks.EntrySelector | None = None,
                         max_scores: int | None = None,
                         row_layout: kernels.RowLayout | None = None
                         ) -> tuple[Array, dict[str, Array]]:
  """(o_BxTxHxD, the selector's statistics) of the window + entries attention of ``kind``.

  ``xla``: ``query_blocks.attend_selected`` (``compressed_core``'s blockwise path, in query
  blocks when the row's T x C scores exceed ``max_scores``); the Pallas names:
  ``kernels.chunk_attention``, which reads one end per entry (the kv heads' ends must agree)
  and takes no tail or entry selection; ``row_layout`` as for ``full_attention``.
  """
  _require(implementation, kind)
  if implementation == "xla":
    return query_blocks.attend_selected(
        q_BxTxHxD, k_BxTxKxD, v_BxTxKxD, segment_ids_BxT, window=window,
        entry_k_BxCxKxD=entry_k_BxCxKxD, entry_v_BxCxKxD=entry_v_BxCxKxD,
        entry_ends_BxCxK=entry_ends_BxCxK, entry_segment_ids_BxCxK=entry_segment_ids_BxCxK,
        sink_H=sink_H, tail=tail, selector=selector, max_scores=max_scores)
  if tail is not None:
    _require(implementation, kind, "tail")
  if selector is not None:
    _require(implementation, kind, "topk")
  ev = entry_k_BxCxKxD if entry_v_BxCxKxD is None else entry_v_BxCxKxD
  o = kernels.chunk_attention(
      q_BxTxHxD, k_BxTxKxD, v_BxTxKxD, segment_ids_BxT, entry_k_BxCxKxD, ev,
      entry_ends_BxCxK[:, :, 0], entry_segment_ids_BxCxK[:, :, 0], window=window, sink_H=sink_H,
      implementation=implementation, interpret=interpret, row_layout=row_layout)
  return o, {}
