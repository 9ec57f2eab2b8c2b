"""Is accuracy by residue periodic? Likelihood-ratio tests on the counts per residue.

The position-matched tests give, per residue r = t_K mod R (R = 24), k_r correct answers of
n_r independent prompts. Two nested binomial models of a period P (P divides R):
- the phase effect: accuracy depends on r mod P (P free rates) against one rate for all
  (G-test of outcome x phase, chi-square with P - 1 degrees of freedom);
- the lack of fit: R free rates against the P phase rates (G_R - G_P, chi-square with R - P
  degrees of freedom): the residue effect left once the phase is known.
A curve is periodic with period P when the phase effect is significant AND the lack of fit is
not: the phase explains the residues. The detected period is the smallest candidate that
passes, its phase effect Bonferroni-adjusted over the candidates. The prompt is the unit, so
the power grows with the prompts; a permutation of the R residue columns (the residue as the
unit) cannot: with one weak phase of period 12 only two of 24 residues carry it, and no
arrangement of them is rarer than 12 / C(24, 2) = 0.043.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from scipy import stats as scipy_stats

from chunkformer.evaluation.stats.estimates import _fail


def _xlogy(x: np.ndarray, y: np.ndarray) -> np.ndarray:
  return np.where(x > 0, x * np.log(np.where(y > 0, y, 1.0)), 0.0)


def g_statistic(correct_R, total_R, groups_R) -> float:
  """The likelihood-ratio statistic of outcome x group (0 log 0 = 0)."""
  k = np.asarray(correct_R, np.float64)
  n = np.asarray(total_R, np.float64)
  groups = np.asarray(groups_R)
  k_G = np.bincount(groups, weights=k)
  n_G = np.bincount(groups, weights=n)
  p0 = k.sum() / n.sum()
  keep = n_G > 0
  k_G, n_G = k_G[keep], n_G[keep]
  p_G = k_G / n_G
  g = 2 * np.sum(_xlogy(k_G, p_G / p0 if p0 > 0 else np.zeros_like(p_G))
                 + _xlogy(n_G - k_G, (1 - p_G) / (1 - p0) if p0 < 1 else np.zeros_like(p_G)))
  return float(max(g, 0.0))


def _checked(correct_R, total_R) -> tuple[np.ndarray, np.ndarray]:
  k = np.asarray(correct_R, np.float64).ravel()
  n = np.asarray(total_R, np.float64).ravel()
  if k.shape != n.shape or k.size < 2 or np.any(n <= 0) or np.any(k < 0) or np.any(k > n):
    _fail("correct_R", f"counts per residue: correct {k.tolist()} of {n.tolist()}")
  return k, n


def phase_p_value(correct_R, total_R, period: int) -> float:
  """The phase effect of r mod ``period`` (chi-square, period - 1 degrees of freedom)."""
  k, n = _checked(correct_R, total_R)
  if period < 2:
    _fail("period", f"must be >= 2, got {period}")
  g = g_statistic(k, n, np.arange(k.size) % period)
  return float(scipy_stats.chi2.sf(g, min(period, k.size) - 1))


def lack_of_fit_p_value(correct_R, total_R, period: int) -> float:
  """The residue effect beyond r mod ``period`` (1.0 when the period has every residue)."""
  k, n = _checked(correct_R, total_R)
  df = k.size - min(period, k.size)
  if df == 0:
    return 1.0
  residues = np.arange(k.size)
  g = g_statistic(k, n, residues) - g_statistic(k, n, residues % period)
  return float(scipy_stats.chi2.sf(max(g, 0.0), df))


def detect_period(correct_R, total_R, periods: Sequence[int], *,
                  alpha: float = 0.05) -> tuple[int | None, float | None]:
  """(the smallest candidate period whose phase effect is significant after Bonferroni over
  the candidates and whose lack of fit is not (p > alpha), its adjusted p), or (None, None)."""
  for period in sorted(periods):
    adjusted = min(1.0, len(periods) * phase_p_value(correct_R, total_R, period))
    if adjusted <= alpha and lack_of_fit_p_value(correct_R, total_R, period) > alpha:
      return int(period), adjusted
  return None, None
