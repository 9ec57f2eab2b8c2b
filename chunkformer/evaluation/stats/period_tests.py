"""Permutation tests of a periodicity sweep: one phase grouping, and a scan over periods.

Part of the sweep statistics (``stats`` is the entry point). Null: the offset columns are
shuffled with one permutation shared by every haystack. Letters as in ``estimates``; P a
candidate period, N observed-plus-permuted statistics.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

import numpy as np

from chunkformer.evaluation.stats.estimates import (
    _PERMUTATION_STREAM,
    _as_phases,
    _between_ss_N,
    _fail,
    _group_index,
    _rng,
    as_correct_YxJ,
    as_offsets_J,
)

# Permutations processed at once on the trial-level path (bounds memory to ~Y*J*_PERM_BLOCK).
_PERM_BLOCK = 128


class PeriodScan(NamedTuple):
  """Phase-effect statistics for each candidate period (arrays of shape [P])."""

  periods: np.ndarray
  shares: np.ndarray  # periodic share (eta squared of the grouping offset mod P)
  adjusted_shares: np.ndarray  # share corrected for the P-1 fitted phase means
  p_values: np.ndarray  # per-period permutation p-value
  adjusted_p_values: np.ndarray  # family-wise over all candidate periods (min-p)


def _permutations_RxJ(num_offsets: int, num_permutations: int, seed: int) -> np.ndarray:
  if num_permutations < 1:
    _fail("num_permutations", f"must be >= 1, got {num_permutations}")
  rng = _rng(seed, _PERMUTATION_STREAM)
  return rng.permuted(np.tile(np.arange(num_offsets), (num_permutations, 1)), axis=1)


def _ge_counts(stats_N: np.ndarray, reference: np.ndarray) -> np.ndarray:
  """How many of stats_N are >= each reference value, up to float round-off."""
  # Equal groupings reached by different permutations differ only by round-off; count them.
  tolerance = 1e-9 * max(np.abs(stats_N).max(), np.abs(reference).max()) + 1e-30
  return stats_N.size - np.searchsorted(np.sort(stats_N), reference - tolerance, side="left")


def _phase_statistics(correct_YxJ: np.ndarray, index: np.ndarray, num_groups: int,
                      perms_RxJ: np.ndarray) -> np.ndarray:
  """Between-phase sum of squares, observed first then one per permutation: shape [R + 1].

  Per-offset phases: computed on the offset-mean curve (trial level is Y times that).
  Per-trial phases: computed on trials, the columns permuted under the fixed phase labels.
  """
  centered_YxJ = correct_YxJ - correct_YxJ.mean()
  if index.ndim == 1:
    curve_J = centered_YxJ.mean(axis=0)
    curves_NxJ = np.concatenate([curve_J[None], curve_J[perms_RxJ]])
    return _between_ss_N(curves_NxJ, index, num_groups)
  counts_G = np.bincount(index.ravel(), minlength=num_groups)
  stats = []
  identity = np.arange(correct_YxJ.shape[1])[None]
  all_perms = np.concatenate([identity, perms_RxJ])
  for start in range(0, all_perms.shape[0], _PERM_BLOCK):
    block_BxJ = all_perms[start:start + _PERM_BLOCK]
    permuted_YxBxJ = centered_YxJ[:, block_BxJ]
    num_block = block_BxJ.shape[0]
    flat = (np.arange(num_block)[None, :, None] * num_groups + index[:, None, :]).ravel()
    sums_BxG = np.bincount(flat, weights=permuted_YxBxJ.ravel(),
                           minlength=num_block * num_groups).reshape(num_block, num_groups)
    stats.append((sums_BxG**2 / counts_G).sum(axis=1))
  return np.concatenate(stats)


def phase_permutation_test(correct_YxJ, phases, *, num_permutations: int = 2000,
                           seed: int = 0) -> float:
  """Permutation p-value of the phase effect, ``(1 + #{null >= observed}) / (1 + n)``.

  Statistic: between-phase variance (for per-offset phases, of the offset means; equivalent to
  the periodic share since the total variance does not change under permutation). Null:
  offsets shuffled with one permutation shared by all haystacks, phases kept in place.

  Args:
    correct_YxJ: outcomes in [0, 1].
    phases: integer phases, shape [J] or [Y, J] (see ``phase_accuracy``).
  """
  correct_YxJ = as_correct_YxJ(correct_YxJ)
  labels_G, index = _group_index(_as_phases(phases, correct_YxJ.shape))
  perms_RxJ = _permutations_RxJ(correct_YxJ.shape[1], num_permutations, seed)
  stats_N = _phase_statistics(correct_YxJ, index, labels_G.size, perms_RxJ)
  count = _ge_counts(stats_N[1:], stats_N[:1])[0]
  return float((1 + count) / (1 + num_permutations))


def candidate_periods(num_offsets: int) -> np.ndarray:
  """Periods with at least three full cycles in the sweep: 2 .. J // 3."""
  return np.arange(2, num_offsets // 3 + 1)


def period_scan(correct_YxJ, offsets_J, periods: Sequence[int] | None = None, *,
                num_permutations: int = 2000, seed: int = 0) -> PeriodScan:
  """Periodic share and permutation p-values of the grouping ``offset mod P`` for each P.

  All periods share one set of permutations (the same as ``phase_permutation_test`` with
  the same seed), so the family-wise adjustment over periods is Westfall-Young max-T: each
  period's statistic is standardised by the mean and spread of its own permutation null, and
  its adjusted p-value compares the observed value with the null maximum over all periods,
  ``(1 + #{max_P z_null >= z_observed}) / (1 + n)`` (never below the per-period p-value).
  """
  correct_YxJ = as_correct_YxJ(correct_YxJ)
  num_offsets = correct_YxJ.shape[1]
  offsets_J = as_offsets_J(offsets_J, num_offsets)
  periods = candidate_periods(num_offsets) if periods is None else np.asarray(periods, np.int64)
  if periods.ndim != 1 or np.any(periods < 1):
    _fail("periods", "expected a 1-D sequence of ints >= 1")
  if periods.size == 0:
    empty = np.zeros(0)
    return PeriodScan(periods, empty, empty, empty, empty)
  perms_RxJ = _permutations_RxJ(num_offsets, num_permutations, seed)
  curve_J = correct_YxJ.mean(axis=0)
  total = float(np.sum((curve_J - curve_J.mean()) ** 2))
  stats_NxP = np.stack([
      _phase_statistics(correct_YxJ, index, labels.size, perms_RxJ)
      for labels, index in (_group_index(np.mod(offsets_J, p)) for p in periods)], axis=1)
  num_stats = stats_NxP.shape[0]
  p_values = np.array([_ge_counts(stats_NxP[1:, j], stats_NxP[:1, j])[0]
                       for j in range(periods.size)])
  p_values = (1 + p_values) / num_stats
  # Max-T: standardise each period's statistic by its permutation null, then compare the
  # observed value with the null distribution of the maximum over periods.
  null_NxP = stats_NxP[1:]
  spread_P = np.maximum(null_NxP.std(axis=0), 1e-12 * total + 1e-30)
  z_NxP = (stats_NxP - null_NxP.mean(axis=0)) / spread_P
  max_null_R = np.sort(z_NxP[1:].max(axis=1))
  exceed_P = max_null_R.size - np.searchsorted(max_null_R, z_NxP[0] - 1e-9, side="left")
  adjusted = np.maximum((1 + exceed_P) / num_stats, p_values)
  if total <= 1e-24 * num_offsets:
    shares = np.zeros(periods.size)
  else:
    shares = stats_NxP[0] / total
  groups = np.array([np.unique(np.mod(offsets_J, p)).size for p in periods])
  adjusted_shares = 1.0 - (1.0 - shares) * (num_offsets - 1) / np.maximum(num_offsets - groups, 1)
  return PeriodScan(periods, shares, adjusted_shares, p_values, adjusted)


def detect_period(scan: PeriodScan, *, alpha: float = 0.05,
                  tolerance: float = 0.1) -> int | None:
  """The smallest significant period that explains about as much as the best one.

  Rule: keep the periods whose family-wise adjusted p-value is <= alpha; among them find the
  best adjusted share (share corrected for the number of phase means fitted, so that noise
  does not favour long periods); return the smallest kept period whose adjusted share is at
  least ``(1 - tolerance)`` times that best. Multiples of the true period explain the same
  variance (their phase grouping refines the true one) and are passed over; a divisor of the
  true period explains only part of it (a single weak phase of period 8 leaves 3/7 of its
  power to period 4) and falls short. None when no period is significant.
  """
  keep = scan.adjusted_p_values <= alpha
  if not np.any(keep):
    return None
  best = float(np.max(scan.adjusted_shares[keep]))
  close = keep & (scan.adjusted_shares >= best - tolerance * abs(best))
  return int(np.min(scan.periods[close]))
