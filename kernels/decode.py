"""decode_attention: the public op and its implementation switch."""

from __future__ import annotations

import jax

from kernels import implementation as implementations
from kernels import reference
from kernels.block_sizes import DecodeBlockSizes

Array = jax.Array


def decode_attention(q_BxHxD, window_k_BxWxKxD, window_v_BxWxKxD, window_valid_BxW,
                     entry_k_BxCxKxD, entry_v_BxCxKxD, num_entries_B, *, sink_H=None,
                     entry_visible_BxCxK=None, scale=None, implementation: str = "xla",
                     interpret=False, num_splits: int = 4,
                     block_sizes: DecodeBlockSizes | None = None) -> Array:
  """Single-query attention over the compressed cache: window ring buffer plus entries.

  Query b (head h, key/value head h // (H/K)) sees window slots w with ``window_valid[b, w]``
  (ring-buffer order does not matter) and entries ``c < num_entries[b]`` for which
  ``entry_visible[b, c, k]`` holds (when given: per-kv-head visibility, e.g. entries of heads
  whose chunk boundaries are staggered, or an indexer's top-k selection), plus the optional
  sink logit with value zero, in one softmax. ``num_entries`` bounds the entries read (the
  Pallas loops stop there), so it should be the largest visible index + 1, not the capacity.
  ``scale`` defaults to D**-0.5. The Pallas paths split the entry axis into ``num_splits``
  parts computed in parallel and merged by their log-sum-exp (split-K / flash-decoding), so
  long caches keep the machine busy at batch 1.
  Returns o_BxHxD in q's dtype (zeros where nothing is visible).
  """
  implementations.check(implementation)
  if q_BxHxD.ndim != 3:
    raise ValueError(f"q_BxHxD must have rank 3, got shape {q_BxHxD.shape}")
  b, h, d = q_BxHxD.shape
  if window_k_BxWxKxD.shape != window_v_BxWxKxD.shape or window_k_BxWxKxD.ndim != 4 or (
      window_k_BxWxKxD.shape[0] != b or window_k_BxWxKxD.shape[3] != d):
    raise ValueError(f"window_k/window_v must be BxWxKxD with B={b}, D={d}, got "
                     f"{window_k_BxWxKxD.shape}, {window_v_BxWxKxD.shape}")
  kh = window_k_BxWxKxD.shape[2]
  if h % kh:
    raise ValueError(f"query heads H={h} must be a multiple of key/value heads K={kh}")
  if window_valid_BxW.shape != window_k_BxWxKxD.shape[:2]:
    raise ValueError(f"window_valid_BxW must have shape {window_k_BxWxKxD.shape[:2]}, got "
                     f"{window_valid_BxW.shape}")
  if entry_k_BxCxKxD.shape != entry_v_BxCxKxD.shape or entry_k_BxCxKxD.ndim != 4 or (
      entry_k_BxCxKxD.shape[0] != b or entry_k_BxCxKxD.shape[2:] != (kh, d)):
    raise ValueError(f"entry_k/entry_v must be BxCxKxD with B={b}, K={kh}, D={d}, got "
                     f"{entry_k_BxCxKxD.shape}, {entry_v_BxCxKxD.shape}")
  if num_entries_B.shape != (b,):
    raise ValueError(f"num_entries_B must have shape {(b,)}, got {num_entries_B.shape}")
  if entry_visible_BxCxK is not None and (entry_visible_BxCxK.shape != entry_k_BxCxKxD.shape[:3]
                                          or entry_visible_BxCxK.dtype != bool):
    raise ValueError(f"entry_visible_BxCxK must be bool of shape {entry_k_BxCxKxD.shape[:3]}, "
                     f"got {entry_visible_BxCxK.dtype} {entry_visible_BxCxK.shape}")
  if sink_H is not None and sink_H.shape != (h,):
    raise ValueError(f"sink_H must have shape {(h,)}, got {sink_H.shape}")
  if num_splits < 1:
    raise ValueError(f"num_splits must be >= 1, got {num_splits}")
  args = (q_BxHxD, window_k_BxWxKxD, window_v_BxWxKxD, window_valid_BxW, entry_k_BxCxKxD,
          entry_v_BxCxKxD, num_entries_B)
  if scale is None:
    scale = d**-0.5
  if implementation == "xla":
    return reference.decode_attention_reference(*args, sink_H=sink_H, scale=scale,
                                                entry_visible_BxCxK=entry_visible_BxCxK)
  if implementation in implementations.PALLAS:
    from kernels import decode_kernels
    default = DecodeBlockSizes.gpu() if implementation == "pallas_gpu" else DecodeBlockSizes.tpu()
    return decode_kernels.decode_attention_pallas(
        *args, sink_H=sink_H, entry_visible_BxCxK=entry_visible_BxCxK, scale=float(scale),
        backend=implementation, interpret=interpret,
        num_splits=num_splits, block_sizes=block_sizes or default)
