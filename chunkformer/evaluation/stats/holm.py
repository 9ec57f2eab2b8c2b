"""Holm's step-down adjustment: family-wise error control over several p-values.

A claim rests on several phase tests (one per variant and depth); judged one by one at a level
alpha, the chance that at least one of them passes by chance grows with their number. Holm's
adjusted p-values control that family-wise error at alpha under any dependence between the
tests: sorted ascending, p_(k) becomes max over j <= k of min(1, (n - j + 1) p_(j)).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from chunkformer.evaluation.stats.estimates import _fail


def holm(p_values: Sequence[float]) -> np.ndarray:
  """Holm-adjusted p-values, in the order given (module docstring)."""
  p = np.asarray(p_values, np.float64).ravel()
  if p.size and (not np.all(np.isfinite(p)) or p.min() < 0 or p.max() > 1):
    _fail("p_values", f"expected p-values in [0, 1], got {list(p_values)!r}")
  order = np.argsort(p, kind="stable")
  scaled = np.minimum(1.0, p[order] * (p.size - np.arange(p.size)))
  adjusted = np.empty_like(p)
  adjusted[order] = np.maximum.accumulate(scaled) if p.size else scaled
  return adjusted
