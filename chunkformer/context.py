"""What a forward pass tells every layer about its rows (``AttentionContext``).

Its own module so that the attention kinds, the caches (``kvcache/``) and the model share it
without importing each other.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax

Array = jax.Array


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class AttentionContext:
  tokens_BxT: Array
  positions_BxT: Array  # position of each token inside its document
  segment_ids_BxT: Array  # document id per token; attention never crosses documents
  train: bool = dataclasses.field(default=False, metadata=dict(static=True))
  # Incremental decoding: kinds read and update their 'cache' collection (chunkformer/decode.py).
  decode: bool = dataclasses.field(default=False, metadata=dict(static=True))
  # Context parallelism (mesh.context_strategy / context_load_balance): how full attention's
  # K/V cross the context axis, and whether the rows arrive in the load-balanced token order
  # (attention/load_balance.py; positions and segment ids are reordered with the tokens).
  kv_exchange: str = dataclasses.field(default="all_gather", metadata=dict(static=True))
  load_balanced: bool = dataclasses.field(default=False, metadata=dict(static=True))
  # Sparse prefill (chunkformer/sparse_prefill): a Plan the full-attention layers read while a
  # prompt fills an empty cache (decode.prefill(..., sparse=)); None: dense attention.
  sparse: Any = dataclasses.field(default=None, metadata=dict(static=True))
  # kernels.RowLayout of segment_ids_BxT (document runs, starts, ends), computed once per step
  # by the model, outside the layer scan and remat, for every layer's Pallas kernel; None: each
  # kernel call computes it.
  row_layout: Any = None
