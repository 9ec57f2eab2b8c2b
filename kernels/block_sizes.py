"""Tile sizes of the Pallas kernels, one small frozen dataclass per op.

GPU (Triton) tiles must be powers of two and at least 16 on every matmul dimension; TPU
(Mosaic) tiles want multiples of 128 on the lane (last) dimension and 8 on the sublane one.
Inputs whose lengths do not tile are padded internally and sliced back, so the block sizes are
upper bounds: a block never exceeds the padded length it tiles.
"""

from __future__ import annotations

import dataclasses

BACKWARDS = ("split", "fused")
FORWARDS = ("triton", "mosaic")


def _check_positive(obj) -> None:
  for f in dataclasses.fields(obj):
    value = getattr(obj, f.name)
    if isinstance(value, int) and value < 1:
      raise ValueError(f"{type(obj).__name__}.{f.name} must be >= 1, got {value}")


@dataclasses.dataclass(frozen=True)
class AttentionBlockSizes:
  """chunk_attention tiles: queries, raw keys and entries, forward and backward."""

  block_q: int = 64  # queries per program (forward and dq)
  # GPU kernels see raw keys and entries as one column axis, tiled by block_k (forward and dq
  # steps) and block_k_bwd (dk/dv programs); block_c and block_c_bwd tile entries on TPU only.
  block_k: int = 64  # raw keys per inner step
  block_c: int = 64  # entries per inner step (TPU)
  block_q_bwd: int = 32  # queries per inner step of the dk/dv kernels
  block_k_bwd: int = 32  # raw keys per program of the dk/dv kernel
  block_c_bwd: int = 32  # entries per program of the entry dk/dv kernel (TPU)
  num_warps: int = 4  # Triton only
  num_stages: int = 2  # Triton only
  # Triton backward: "split" = a dq kernel beside the dk/dv kernels (7 score-sized matmuls per
  # tile pair); "fused" = the dk/dv kernels also add dq with atomics (FlashAttention-2's 5).
  backward: str = "split"
  # GPU forward: "triton", or "mosaic" (``attention_mgpu``: TMA, warpgroup MMA, Hopper and
  # later; bfloat16/float16). Mosaic runs block_q / 64 warpgroups of 64 rows, one ring of
  # num_stages K/V slots of block_k columns (raw keys and entries alike); num_warps does not
  # apply.
  forward: str = "triton"

  def __post_init__(self):
    _check_positive(self)
    if self.backward not in BACKWARDS:
      raise ValueError(f"AttentionBlockSizes.backward must be one of {BACKWARDS}, "
                       f"got {self.backward!r}")
    if self.forward not in FORWARDS:
      raise ValueError(f"AttentionBlockSizes.forward must be one of {FORWARDS}, "
                       f"got {self.forward!r}")
    if self.forward == "mosaic":
      if self.block_q not in (64, 128) or self.block_k not in (64, 128):
        raise ValueError(f"AttentionBlockSizes(forward='mosaic') needs block_q and block_k in "
                         f"(64, 128), got block_q={self.block_q}, block_k={self.block_k}")

  @classmethod
  def gpu(cls, device_kind: str | None = None) -> AttentionBlockSizes:
    """The tiles for ``device_kind`` (``jax.Device.device_kind``) from ``GPU_ATTENTION_TILES``,
    else the defaults (every GPU the table does not name, and interpret mode)."""
    return GPU_ATTENTION_TILES.get(device_kind or "", cls())

  @classmethod
  def tpu(cls) -> AttentionBlockSizes:
    return cls(block_q=128, block_k=128, block_c=128, block_q_bwd=128, block_k_bwd=128,
               block_c_bwd=128)


# Hopper: 128-row forward tiles with 8 warps and 3 stages (the configuration of Triton's
# fused-attention tutorial for head dim 128 on H100), >= 64-row backward tiles. Chosen, not yet
# tuned: bench.device_check measures them (the H200 figures of 2026-12-04 ran the defaults).
_HOPPER = AttentionBlockSizes(block_q=128, block_k=64, block_c=64, block_q_bwd=64, block_k_bwd=64,
                              block_c_bwd=64, num_warps=8, num_stages=3)
GPU_ATTENTION_TILES = {
    "NVIDIA H100": _HOPPER,
    "NVIDIA H100 80GB HBM3": _HOPPER,
    "NVIDIA H200": _HOPPER,
}


@dataclasses.dataclass(frozen=True)
class PoolBlockSizes:
  """segment_pool tiles: entries per program, tokens per inner step, channels per program."""

  block_c: int = 16
  block_t: int = 32
  block_n: int = 64
  num_warps: int = 4  # Triton only
  num_stages: int = 2  # Triton only

  def __post_init__(self):
    _check_positive(self)

  @classmethod
  def gpu(cls) -> PoolBlockSizes:
    return cls()

  @classmethod
  def tpu(cls) -> PoolBlockSizes:
    return cls(block_c=8, block_t=128, block_n=128)


@dataclasses.dataclass(frozen=True)
class DecodeBlockSizes:
  """decode_attention tiles: window slots and entries per inner step."""

  block_w: int = 64
  block_c: int = 64
  num_warps: int = 4  # Triton only
  num_stages: int = 2  # Triton only

  def __post_init__(self):
    _check_positive(self)

  @classmethod
  def gpu(cls) -> DecodeBlockSizes:
    return cls()

  @classmethod
  def tpu(cls) -> DecodeBlockSizes:
    return cls(block_w=128, block_c=128)
