"""The implementation switch shared by every op (and by ``chunkformer.config``)."""

from __future__ import annotations

IMPLEMENTATIONS = ("xla", "pallas_gpu", "pallas_tpu")
PALLAS = ("pallas_gpu", "pallas_tpu")


def check(implementation: str) -> str:
  """The name itself, or a ValueError listing the valid ones."""
  if implementation not in IMPLEMENTATIONS:
    raise ValueError(f"implementation must be one of {IMPLEMENTATIONS}, got {implementation!r}")
  return implementation
