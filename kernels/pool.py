"""segment_pool: the public op and its implementation switch."""

from __future__ import annotations

import jax

from kernels import implementation as implementations
from kernels import layout, reference
from kernels.block_sizes import PoolBlockSizes

Array = jax.Array


def segment_pool(values_BxTxN, logits_BxTxN, ends_BxT, segment_ids_BxT, *, capacity: int,
                 slot_bias_SxN=None, implementation: str = "xla", interpret=False,
                 block_sizes: PoolBlockSizes | None = None,
                 structure: layout.ChunkStructure | None = None):
  """Pools every closed chunk into one packed entry (per-channel gated softmax).

  Entry c, the c-th closed chunk of the row in order of its end, is
  ``sum_j softmax_j(logits[j] + slot_bias[min(pos_j, S - 1)]) * values[j]`` over the chunk's
  tokens j (softmax per channel, ``pos_j`` = j's offset in its chunk; slot positions past S - 1
  share the last bias). ``ends_BxT[t]`` (bool) closes a chunk at t; a document start always
  starts a new chunk; a chunk not closed by an end flag (the row's or a document's trailing
  open chunk) produces no entry; closed chunks beyond ``capacity`` are dropped. See
  ``kernels.layout`` for the full rules.

  Returns ``(entries_BxCxN, entry_ends_BxC, entry_segment_ids_BxC)`` with C = capacity;
  padding entries have end ``PAD_END``, segment id ``PAD_SEGMENT`` and zero values.
  implementation / interpret as in ``chunk_attention``; gradients flow to values, logits and
  slot_bias on every path. ``structure``: the caller's ``kernels.chunk_structure(ends_BxT,
  segment_ids_BxT, capacity)``, when it already has it (otherwise computed here).
  """
  implementations.check(implementation)
  if values_BxTxN.ndim != 3 or logits_BxTxN.shape != values_BxTxN.shape:
    raise ValueError(f"values/logits must be BxTxN of equal shape, got {values_BxTxN.shape}, "
                     f"{logits_BxTxN.shape}")
  b, t, n = values_BxTxN.shape
  if ends_BxT.shape != (b, t) or segment_ids_BxT.shape != (b, t):
    raise ValueError(f"ends/segment_ids must have shape {(b, t)}, got {ends_BxT.shape}, "
                     f"{segment_ids_BxT.shape}")
  if capacity < 1:
    raise ValueError(f"capacity must be >= 1, got {capacity}")
  if slot_bias_SxN is not None and (slot_bias_SxN.ndim != 2 or slot_bias_SxN.shape[1] != n):
    raise ValueError(f"slot_bias_SxN must have shape (S, {n}), got {slot_bias_SxN.shape}")
  if structure is None:
    structure = layout.chunk_structure(ends_BxT, segment_ids_BxT, capacity)
  elif structure.entry_ends_BxC.shape != (b, capacity):
    raise ValueError(f"structure holds {structure.entry_ends_BxC.shape} entries, expected "
                     f"{(b, capacity)}")
  args = (values_BxTxN, logits_BxTxN, structure)
  if implementation == "xla":
    return reference.pool_structure(*args, slot_bias_SxN=slot_bias_SxN)
  if implementation in implementations.PALLAS:
    from kernels import pool_kernels
    default = PoolBlockSizes.gpu() if implementation == "pallas_gpu" else PoolBlockSizes.tpu()
    return pool_kernels.segment_pool_pallas(
        *args, slot_bias_SxN=slot_bias_SxN, backend=implementation,
        interpret=interpret, block_sizes=block_sizes or default)
