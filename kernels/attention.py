"""chunk_attention: the public op and its implementation switch."""

from __future__ import annotations

import jax

from kernels import implementation as implementations
from kernels import layout, reference
from kernels.block_sizes import AttentionBlockSizes

Array = jax.Array


def _check_shapes(q, k, v, segment_ids, entry_k, entry_v, entry_ends, entry_segment_ids,
                  window, sink_H):
  if q.ndim != 4:
    raise ValueError(f"q_BxTxHxD must have rank 4, got shape {q.shape}")
  b, t, h, d = q.shape
  if k.shape != v.shape or k.ndim != 4 or k.shape[:2] != (b, t) or k.shape[3] != d:
    raise ValueError(f"k/v must be BxTxKxD matching q {q.shape}, got {k.shape}, {v.shape}")
  kh = k.shape[2]
  if h % kh:
    raise ValueError(f"query heads H={h} must be a multiple of key/value heads K={kh}")
  if segment_ids.shape != (b, t):
    raise ValueError(f"segment_ids_BxT must have shape {(b, t)}, got {segment_ids.shape}")
  if entry_k.shape != entry_v.shape or entry_k.ndim != 4 or entry_k.shape[0] != b or (
      entry_k.shape[2:] != (kh, d)):
    raise ValueError(f"entry_k/entry_v must be BxCxKxD with B={b}, K={kh}, D={d}, got "
                     f"{entry_k.shape}, {entry_v.shape}")
  c = entry_k.shape[1]
  if entry_ends.shape != (b, c) or entry_segment_ids.shape != (b, c):
    raise ValueError(f"entry_ends/entry_segment_ids must have shape {(b, c)}, got "
                     f"{entry_ends.shape}, {entry_segment_ids.shape}")
  if window < 0:
    raise ValueError(f"window must be >= 0, got {window}")
  if sink_H is not None and sink_H.shape != (h,):
    raise ValueError(f"sink_H must have shape {(h,)}, got {sink_H.shape}")


def _device_kind(interpret) -> str | None:
  """The device the kernel compiles for (None in interpret mode: the default tiles)."""
  return None if interpret else jax.devices()[0].device_kind


def chunk_attention(q_BxTxHxD, k_BxTxKxD, v_BxTxKxD, segment_ids_BxT, entry_k_BxCxKxD,
                    entry_v_BxCxKxD, entry_ends_BxC, entry_segment_ids_BxC, *, window: int,
                    sink_H=None, scale=None, implementation: str = "xla", interpret=False,
                    block_sizes: AttentionBlockSizes | None = None,
                    row_layout: layout.RowLayout | None = None) -> Array:
  """Attention of every query over [raw keys in its window] union [its visible entries].

  Query t (head h, key/value head h // (H/K): GQA, K = 1 is MQA) attends in one softmax to
  raw keys s with ``t - window < s <= t`` and ``segment_ids[s] == segment_ids[t]`` (window = 0:
  none) and to entries c with ``entry_ends[c] <= t`` and ``entry_segment_ids[c] ==
  segment_ids[t]``, plus the optional per-head sink logit ``sink_H[h]`` whose value is zero.
  ``scale`` defaults to D**-0.5. Entry keys must already be normalised and rotated. Entries
  follow the packed layout of ``kernels.layout`` (ordered by end, padding end ``PAD_END``).
  Queries that see nothing output zeros. A document is a contiguous run of equal ids (an id
  that reappears later in the row is a new document, see ``kernels.layout.document_runs``).

  implementation: "xla" (pure jnp, differentiable by jax), "pallas_gpu" (Triton) or
  "pallas_tpu" (Mosaic); the Pallas paths carry a custom VJP. ``interpret`` runs the Pallas
  code on CPU (True, or ``pltpu.InterpretParams(...)`` for "pallas_tpu"). ``block_sizes``
  defaults to ``AttentionBlockSizes.gpu(device kind)`` (the per-device table) / ``.tpu()``; for
  "pallas_gpu" its ``forward="mosaic"`` runs the Mosaic GPU forward (``attention_mgpu``, bf16 /
  f16; ``interpret`` True or ``InterpretGPUParams`` runs it in the Mosaic GPU interpreter).
  ``row_layout``: ``kernels.row_layout(segment_ids_BxT)`` when the caller has it already (a
  model computes it once per step for all its layers); else computed here.
  Returns o_BxTxHxD in q's dtype.
  """
  implementations.check(implementation)
  _check_shapes(q_BxTxHxD, k_BxTxKxD, v_BxTxKxD, segment_ids_BxT, entry_k_BxCxKxD,
                entry_v_BxCxKxD, entry_ends_BxC, entry_segment_ids_BxC, window, sink_H)
  # Documents become contiguous runs here, once for every implementation: the kernels' block
  # ranges assume it, so a reappearing id would otherwise give tile-size-dependent results.
  if row_layout is not None and row_layout.run_BxT.shape != segment_ids_BxT.shape:
    raise ValueError(f"row_layout must describe segment_ids_BxT {segment_ids_BxT.shape}, got "
                     f"{row_layout.run_BxT.shape}")
  run_BxT, entry_run_BxC = layout.document_runs(
      segment_ids_BxT, entry_ends_BxC, entry_segment_ids_BxC,
      None if row_layout is None else row_layout.run_BxT)
  args = (q_BxTxHxD, k_BxTxKxD, v_BxTxKxD, run_BxT, entry_k_BxCxKxD, entry_v_BxCxKxD,
          entry_ends_BxC, entry_run_BxC)
  if scale is None:
    scale = q_BxTxHxD.shape[-1]**-0.5
  if implementation == "xla":
    return reference.chunk_attention_reference(*args, window=window, sink_H=sink_H,
                                               scale=scale)
  if implementation == "pallas_gpu":
    from kernels import attention_gpu
    return attention_gpu.chunk_attention_gpu(
        *args, sink_H=sink_H, window=window, scale=float(scale), interpret=interpret,
        block_sizes=block_sizes or AttentionBlockSizes.gpu(_device_kind(interpret)),
        row_layout=row_layout)
  from kernels import attention_tpu
  return attention_tpu.chunk_attention_tpu(
      *args, sink_H=sink_H, window=window, scale=float(scale), interpret=interpret,
      block_sizes=block_sizes or AttentionBlockSizes.tpu(), row_layout=row_layout)
