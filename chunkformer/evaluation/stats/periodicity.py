"""Statistics of a periodicity sweep: does needle accuracy depend on the needle's phase?

Inputs: ``correct_YxJ`` (Y sampled haystacks x J needle offsets; 0/1 outcomes or fractions in
[0, 1] such as token accuracy) and the absolute needle positions ``offsets_J``. Letters: Y
haystacks, J offsets, G phase groups, P a candidate period, R bootstrap resamples or
permutations, F frequencies. These differ on purpose from kernels/, where S is slots or keys
and K kv heads (``records`` states the convention for evaluation/).

Two seeded, mutually independent sources of randomness:
- Bootstrap intervals resample haystacks (rows): the spread they show is haystack-to-haystack
  variation, and the offsets of one haystack stay together. Percentile intervals for means,
  basic (reflected) intervals for the max-min gap, whose plug-in value is biased upwards.
- Permutation tests shuffle the offset columns with one permutation shared by every haystack,
  which keeps each haystack's difficulty intact and tests "accuracy does not depend on the
  phase". The null treats offsets as exchangeable; a slow trend over the J offsets has little
  power at short periods, so it barely moves the test.

The *periodic share* at period P is the fraction of the variance of the per-offset accuracy
explained by the per-phase means (eta squared of the grouping ``offset mod P``). When J is a
multiple of P it equals the spectral power at 1/P and all its harmonics over the total power
(a single weak phase spreads its power over all harmonics, so one DFT bin under-reports it).

This module is the entry point (``analyze``, a typed ``analysis.Analysis``); the
estimates live in ``estimates`` and the permutation tests in ``period_tests``, re-exported here.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from chunkformer.evaluation.stats.analysis_types import (
  Analysis,
  Curve,
  Interval,
  PeriodScanTable,
  PeriodTest,
  PhaseTable,
  Spectrum,
  as_float,
  as_floats,
  as_ints,
)
from chunkformer.evaluation.stats.estimates import (
  Estimate,
  PhaseAccuracy,
  _fail,
  as_correct_YxJ,
  as_offsets_J,
  bootstrap_mean_accuracy,
  bootstrap_offset_accuracy,
  offset_gap,
  periodic_share,
  phase_accuracy,
  phases_of_offsets,
  spectrum,
)
from chunkformer.evaluation.stats.period_tests import (
  PeriodScan,
  candidate_periods,
  detect_period,
  period_scan,
  phase_permutation_test,
)

__all__ = [
    "Estimate",
    "PeriodScan",
    "PhaseAccuracy",
    "analyze",
    "as_correct_YxJ",
    "as_offsets_J",
    "bootstrap_mean_accuracy",
    "bootstrap_offset_accuracy",
    "candidate_periods",
    "detect_period",
    "offset_gap",
    "period_scan",
    "periodic_share",
    "phase_accuracy",
    "phase_permutation_test",
    "phases_of_offsets",
    "spectrum",
]


def _phase_table(accuracy: PhaseAccuracy, p_value: float) -> PhaseTable:
  mean_G = accuracy.accuracy.mean
  return PhaseTable(
      phases=as_ints(accuracy.phases_G),
      accuracy=Curve.of(mean_G, accuracy.accuracy.low, accuracy.accuracy.high),
      weakest_phase=int(accuracy.phases_G[int(np.argmin(mean_G))]),
      gap=Interval.of(accuracy.gap.mean, accuracy.gap.low, accuracy.gap.high),
      p_value=as_float(p_value))


def analyze(correct_YxJ, offsets_J, chunk_sizes: int | Sequence[int], phases=None, seed: int = 0,
            *, num_resamples: int = 2000, num_permutations: int = 2000,
            confidence: float = 0.95, alpha: float = 0.05,
            tolerance: float = 0.1, periods: Sequence[int] | None = None) -> Analysis:
  """Every sweep statistic of one correctness matrix, as a typed ``analysis.Analysis``.

  Args:
    correct_YxJ: outcomes in [0, 1], Y haystacks x J needle offsets.
    offsets_J: absolute needle positions, strictly increasing integers.
    chunk_sizes: the chunk sizes M of interest; the first is the primary one.
    phases: optional phase labels, [J] or [Y, J], replacing ``offset mod M`` in the primary
      phase table (dynamic chunking: phase inside the chunk the needle landed in).
    seed: seeds the bootstrap and permutation streams (independent of each other).
    alpha, tolerance: the period detection rule (``detect_period``).
    periods: the candidate periods of the scan; None: 2 .. J // 3 (``candidate_periods``).
      A circular axis such as residues mod 24 takes the divisors of its modulus instead.
  Returns:
    ``Analysis``: ``accuracy_by_offset`` and ``mean_accuracy`` with bootstrap intervals,
    ``offset_gap`` (descriptive), ``phase`` (the primary grouping: ``offset mod M`` or the
    caller's phases, ``phase_source``), ``by_chunk_size`` (one ``PeriodTest`` of ``offset mod
    M`` per M, the primary first: periodic share and p-value of a periodic blind spot in
    position), ``detected_period`` (or None) with its family-wise ``detection_p_value``,
    ``period_scan`` and ``spectrum`` (None when offsets are unevenly spaced).
  """
  correct_YxJ = as_correct_YxJ(correct_YxJ)
  num_offsets = correct_YxJ.shape[1]
  offsets_J = as_offsets_J(offsets_J, num_offsets)
  sizes = [chunk_sizes] if isinstance(chunk_sizes, (int, np.integer)) else list(chunk_sizes)
  if not sizes or any(int(m) < 1 for m in sizes):
    _fail("chunk_sizes", f"expected one or more ints >= 1, got {chunk_sizes!r}")
  sizes = [int(m) for m in sizes]
  boot = dict(num_resamples=num_resamples, confidence=confidence, seed=seed)
  perm = dict(num_permutations=num_permutations, seed=seed)

  by_offset = bootstrap_offset_accuracy(correct_YxJ, **boot)
  overall = bootstrap_mean_accuracy(correct_YxJ, **boot)
  by_chunk_size = []
  for size in sizes:
    phases_J = phases_of_offsets(offsets_J, size)
    table = _phase_table(phase_accuracy(correct_YxJ, phases_J, **boot),
                         phase_permutation_test(correct_YxJ, phases_J, **perm))
    by_chunk_size.append(PeriodTest(size, table, as_float(periodic_share(by_offset.mean,
                                                                          phases_J)),
                                    table.p_value))
  if phases is None:
    primary, source = by_chunk_size[0].table, "offset mod M"
  else:
    primary = _phase_table(phase_accuracy(correct_YxJ, phases, **boot),
                           phase_permutation_test(correct_YxJ, phases, **perm))
    source = "caller"

  scan = period_scan(correct_YxJ, offsets_J, periods, num_permutations=num_permutations,
                     seed=seed)
  detected = detect_period(scan, alpha=alpha, tolerance=tolerance)
  if detected is not None:
    detection_p = float(scan.adjusted_p_values[scan.periods == detected][0])
  else:
    detection_p = float(scan.adjusted_p_values.min()) if scan.periods.size else 1.0
  steps = np.diff(offsets_J)
  spectral = None
  if np.all(steps == steps[0]):
    spectral = Spectrum(*(as_floats(x) for x in spectrum(by_offset.mean, int(steps[0]))))

  return Analysis(
      offsets=as_ints(offsets_J), num_haystacks=int(correct_YxJ.shape[0]),
      accuracy_by_offset=Curve.of(by_offset.mean, by_offset.low, by_offset.high),
      mean_accuracy=Interval.of(overall.mean, overall.low, overall.high),
      offset_gap=as_float(offset_gap(correct_YxJ)), phase_source=source, phase=primary,
      by_chunk_size=tuple(by_chunk_size),
      detected_period=None if detected is None else int(detected),
      detection_p_value=as_float(detection_p), detection_alpha=float(alpha),
      period_scan=PeriodScanTable(as_ints(scan.periods), as_floats(scan.shares),
                                  as_floats(scan.adjusted_shares), as_floats(scan.p_values),
                                  as_floats(scan.adjusted_p_values)),
      spectrum=spectral, num_resamples=int(num_resamples),
      num_permutations=int(num_permutations), confidence=float(confidence), seed=int(seed))
