"""How reports, verdict lines, study tables and notebooks print numbers: one missing mark and
one p-value form, so a value reads the same wherever it appears."""

from __future__ import annotations

from typing import Any

MISSING = "-"


def number(value: Any, spec: str = ".3f") -> str:
  """``value`` in ``spec``; MISSING for None or NaN (an undefined statistic)."""
  if value is None or (isinstance(value, float) and value != value):
    return MISSING
  return format(value, spec)


def percent(value: float | None) -> str:
  """A share as percent points with one decimal (0.125 -> '12.5'); MISSING for None."""
  return MISSING if value is None else f"{100 * value:.1f}"


def interval(value: Any, low: Any, high: Any) -> str:
  """'value [low, high]', each as ``number`` (MISSING where undefined)."""
  return f"{number(value)} [{number(low)}, {number(high)}]"


def p_value(value: float | None) -> str:
  """Small p-values in scientific notation (a permutation floor such as 5.0e-04 stays exact)."""
  if value is None:
    return MISSING
  return f"{value:.1e}" if value < 1e-3 else f"{value:.3f}"
