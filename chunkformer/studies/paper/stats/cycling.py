"""Gate cycling's statistics: does accuracy by phase move with the gates?

After the gates are cycled by delta offsets, the prediction is A_delta(r) = A_0((r - delta)
mod S). ``changes`` pairs the observed changes A_delta(r) - A_0(r) with the predicted ones
A_0((r - delta) mod S) - A_0(r) over every cycle, leaving out the boundary phase S - 1 both
as the phase read and as the phase a prediction copies (its weakness comes from the window
boundary, not from the gate); ``r_squared`` scores them.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np


def r_squared(observed, predicted) -> float | None:
  """1 - SS_res / SS_tot of observed values against predictions (None without variation)."""
  observed, predicted = np.asarray(observed, np.float64), np.asarray(predicted, np.float64)
  total = np.sum((observed - observed.mean()) ** 2)
  if total == 0:
    return None
  return float(1.0 - np.sum((observed - predicted) ** 2) / total)


def changes(accuracy: Mapping[int, np.ndarray], stride: int) -> tuple[list[float], list[float]]:
  """(observed, predicted) changes over every cycle (module docstring); ``accuracy[0]`` is
  the model as trained."""
  base = np.asarray(accuracy[0], np.float64)
  boundary = stride - 1
  observed, predicted = [], []
  for delta, acc in accuracy.items():
    if delta == 0:
      continue
    for r in range(stride):
      source = (r - delta) % stride
      if boundary in (r, source):
        continue
      observed.append(float(acc[r] - base[r]))
      predicted.append(float(base[source] - base[r]))
  return observed, predicted


def cycle_r_squared(accuracy: Mapping[int, np.ndarray], stride: int) -> float | None:
  """R^2 of the observed against the predicted changes (None without a cycle or variation)."""
  observed, predicted = changes(accuracy, stride)
  return r_squared(observed, predicted) if observed else None
