"""Padding to tile multiples: kernels pad inputs up and slice outputs back, never guess."""

from __future__ import annotations

import jax.numpy as jnp


def round_up(n: int, multiple: int) -> int:
  return -(-n // multiple) * multiple


def next_power_of_2(n: int) -> int:
  return 1 << max(n - 1, 0).bit_length()


def pad_to(x, axis: int, size: int, value=0, mode: str = "constant"):
  """Pads ``axis`` of x at the end up to ``size`` (edge mode repeats the last element)."""
  extra = size - x.shape[axis]
  if extra < 0:
    raise ValueError(f"cannot pad axis {axis} of shape {x.shape} down to {size}")
  if extra == 0:
    return x
  widths = [(0, 0)] * x.ndim
  widths[axis] = (0, extra)
  if mode == "edge":
    return jnp.pad(x, widths, mode="edge")
  return jnp.pad(x, widths, constant_values=value)


def gpu_tile(requested: int, length: int) -> int:
  """A power-of-two tile >= 16 no larger than needed to cover ``length``."""
  if requested & (requested - 1):
    raise ValueError(f"Triton block sizes must be powers of two, got {requested}")
  return max(16, min(requested, next_power_of_2(length)))
