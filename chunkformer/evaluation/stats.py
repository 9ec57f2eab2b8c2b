"""Statistics of a periodicity sweep: does needle accuracy depend on the needle's phase?

Inputs: ``correct_SxK`` (S sampled haystacks x K needle offsets; 0/1 outcomes or fractions in
[0, 1] such as token accuracy) and the absolute needle positions ``offsets_K``. Letters: S
haystacks, K offsets, G phase groups, P a candidate period, R bootstrap resamples or
permutations, F frequencies.

Two seeded, mutually independent sources of randomness:
- Bootstrap intervals resample haystacks (rows): the spread they show is haystack-to-haystack
  variation, and the offsets of one haystack stay together. Percentile intervals for means,
  basic (reflected) intervals for the max-min gap, whose plug-in value is biased upwards.
- Permutation tests shuffle the offset columns with one permutation shared by every haystack,
  which keeps each haystack's difficulty intact and tests "accuracy does not depend on the
  phase". The null treats offsets as exchangeable; a slow trend over the K offsets has little
  power at short periods, so it barely moves the test.

The *periodic share* at period P is the fraction of the variance of the per-offset accuracy
explained by the per-phase means (eta squared of the grouping ``offset mod P``). When K is a
multiple of P it equals the spectral power at 1/P and all its harmonics over the total power
(a single weak phase spreads its power over all harmonics, so one DFT bin under-reports it).

This module is the entry point (``analyze``, the record every sweep variant stores); the
estimates live in ``estimates`` and the permutation tests in ``period_tests``, re-exported here.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from chunkformer.evaluation.estimates import (
    Estimate,
    PhaseAccuracy,
    _fail,
    as_correct_SxK,
    as_offsets_K,
    bootstrap_mean_accuracy,
    bootstrap_offset_accuracy,
    offset_gap,
    periodic_share,
    phase_accuracy,
    phases_of_offsets,
    spectrum,
)
from chunkformer.evaluation.period_tests import (
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
    "as_correct_SxK",
    "as_offsets_K",
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


def _jsonable(values) -> list:
  """Python floats, NaN mapped to None (strict JSON has no NaN)."""
  return [None if math.isnan(v) else float(v) for v in np.asarray(values, dtype=np.float64)]


def _phase_record(accuracy: PhaseAccuracy, p_value: float) -> dict[str, Any]:
  mean_G = accuracy.accuracy.mean
  return {
      "phases": [int(p) for p in accuracy.phases_G],
      "accuracy_by_phase": _jsonable(mean_G),
      "accuracy_by_phase_low": _jsonable(accuracy.accuracy.low),
      "accuracy_by_phase_high": _jsonable(accuracy.accuracy.high),
      "weakest_phase": int(accuracy.phases_G[int(np.argmin(mean_G))]),
      "max_gap": accuracy.gap.mean,
      "max_gap_low": accuracy.gap.low,
      "max_gap_high": accuracy.gap.high,
      "phase_p_value": p_value,
  }


def analyze(correct_SxK, offsets_K, chunk_sizes: int | Sequence[int], phases=None, seed: int = 0,
            *, num_resamples: int = 2000, num_permutations: int = 2000,
            confidence: float = 0.95, alpha: float = 0.05,
            tolerance: float = 0.1) -> dict[str, Any]:
  """Every sweep statistic, as JSON-serialisable python types.

  Args:
    correct_SxK: outcomes in [0, 1], S haystacks x K needle offsets.
    offsets_K: absolute needle positions, strictly increasing integers.
    chunk_sizes: the chunk sizes M of interest; the first is the primary one.
    phases: optional phase labels, [K] or [S, K], replacing ``offset mod M`` in the primary
      per-phase fields (dynamic chunking: phase inside the chunk the needle landed in).
    seed: seeds the bootstrap and permutation streams (independent of each other).
    alpha, tolerance: the period detection rule (``detect_period``).
  Returns:
    A flat dict. Primary fields: ``offsets``, ``accuracy_by_offset`` (+ ``_low``/``_high``),
    ``mean_accuracy`` (+ ``_low``/``_high``), ``offset_gap`` (descriptive), ``chunk_size``,
    ``phase_source`` ("offset mod M" or "caller"), ``phases``, ``accuracy_by_phase``
    (+ interval), ``weakest_phase``, ``max_gap`` (+ interval), ``phase_p_value`` (test of the
    grouping shown in ``accuracy_by_phase``), ``periodic_share`` and ``p_value`` (always the
    absolute grouping ``offset mod M``: a periodic blind spot in position), ``detected_period``
    (int or None), ``detection_p_value`` (family-wise), ``period_scan``, ``spectrum`` (None
    when offsets are unevenly spaced) and ``by_chunk_size`` (one record per M with the
    per-phase fields, ``periodic_share`` and ``p_value``).
  """
  correct_SxK = as_correct_SxK(correct_SxK)
  num_offsets = correct_SxK.shape[1]
  offsets_K = as_offsets_K(offsets_K, num_offsets)
  sizes = [chunk_sizes] if isinstance(chunk_sizes, (int, np.integer)) else list(chunk_sizes)
  if not sizes or any(int(m) < 1 for m in sizes):
    _fail("chunk_sizes", f"expected one or more ints >= 1, got {chunk_sizes!r}")
  sizes = [int(m) for m in sizes]
  boot = dict(num_resamples=num_resamples, confidence=confidence, seed=seed)
  perm = dict(num_permutations=num_permutations, seed=seed)

  by_offset = bootstrap_offset_accuracy(correct_SxK, **boot)
  overall = bootstrap_mean_accuracy(correct_SxK, **boot)
  by_chunk_size = []
  for size in sizes:
    phases_K = phases_of_offsets(offsets_K, size)
    record = {"chunk_size": size}
    record.update(_phase_record(phase_accuracy(correct_SxK, phases_K, **boot),
                                phase_permutation_test(correct_SxK, phases_K, **perm)))
    record["periodic_share"] = periodic_share(by_offset.mean, phases_K)
    record["p_value"] = record["phase_p_value"]
    by_chunk_size.append(record)
  primary = by_chunk_size[0]
  if phases is None:
    primary_phases = {k: v for k, v in primary.items()
                      if k not in ("chunk_size", "periodic_share", "p_value")}
    source = "offset mod M"
  else:
    primary_phases = _phase_record(phase_accuracy(correct_SxK, phases, **boot),
                                   phase_permutation_test(correct_SxK, phases, **perm))
    source = "caller"

  scan = period_scan(correct_SxK, offsets_K, num_permutations=num_permutations, seed=seed)
  detected = detect_period(scan, alpha=alpha, tolerance=tolerance)
  if detected is not None:
    detection_p = float(scan.adjusted_p_values[scan.periods == detected][0])
  else:
    detection_p = float(scan.adjusted_p_values.min()) if scan.periods.size else 1.0
  steps = np.diff(offsets_K)
  if np.all(steps == steps[0]):
    frequencies_F, power_F = spectrum(by_offset.mean, int(steps[0]))
    spectral = {"frequencies": _jsonable(frequencies_F), "power": _jsonable(power_F)}
  else:
    spectral = None

  result = {
      "offsets": [int(o) for o in offsets_K],
      "num_haystacks": int(correct_SxK.shape[0]),
      "accuracy_by_offset": _jsonable(by_offset.mean),
      "accuracy_by_offset_low": _jsonable(by_offset.low),
      "accuracy_by_offset_high": _jsonable(by_offset.high),
      "mean_accuracy": overall.mean,
      "mean_accuracy_low": overall.low,
      "mean_accuracy_high": overall.high,
      "offset_gap": offset_gap(correct_SxK),
      "chunk_size": primary["chunk_size"],
      "phase_source": source,
  }
  result.update(primary_phases)
  result.update({
      "periodic_share": primary["periodic_share"],
      "p_value": primary["p_value"],
      "detected_period": detected,
      "detection_p_value": detection_p,
      "detection_alpha": float(alpha),
      "period_scan": {
          "periods": [int(p) for p in scan.periods],
          "shares": _jsonable(scan.shares),
          "adjusted_shares": _jsonable(scan.adjusted_shares),
          "p_values": _jsonable(scan.p_values),
          "adjusted_p_values": _jsonable(scan.adjusted_p_values),
      },
      "spectrum": spectral,
      "by_chunk_size": by_chunk_size,
      "num_resamples": int(num_resamples),
      "num_permutations": int(num_permutations),
      "confidence": float(confidence),
      "seed": int(seed),
  })
  return result
