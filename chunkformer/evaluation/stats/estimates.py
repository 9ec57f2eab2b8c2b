"""Per-offset and per-phase accuracy estimates of a periodicity sweep, with bootstrap intervals.

Part of the sweep statistics (``stats`` is the entry point; its docstring states the design):
inputs and phases, haystack bootstrap intervals, the per-phase accuracy and its gap, the
periodic share and the spectrum. Letters: Y haystacks, J offsets, G phase groups, R bootstrap
resamples or permutations, F frequencies.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import numpy as np

from chunkformer.config_sections.errors import ConfigError

_BOOTSTRAP_STREAM = 0
_PERMUTATION_STREAM = 1


class Estimate(NamedTuple):
  """Point estimate with a bootstrap interval; fields are arrays (or floats) of one shape."""

  mean: Any
  low: Any
  high: Any


class PhaseAccuracy(NamedTuple):
  """Accuracy per phase group and the max-min gap over groups, each with an interval."""

  phases_G: np.ndarray  # the phase label of each group, ascending
  accuracy: Estimate  # arrays of shape [G]
  gap: Estimate  # floats: max minus min of the group means, basic bootstrap interval


def _fail(argument: str, message: str) -> None:
  raise ConfigError(f"argument '{argument}': {message}")


def _rng(seed: int, stream: int) -> np.random.Generator:
  if not isinstance(seed, (int, np.integer)) or seed < 0:
    _fail("seed", f"must be a non-negative int, got {seed!r}")
  return np.random.default_rng([stream, int(seed)])


def as_correct_YxJ(correct_YxJ) -> np.ndarray:
  """Validated float64 copy of a correctness matrix [Y, J] with values in [0, 1]."""
  x = np.asarray(correct_YxJ, dtype=np.float64)
  if x.ndim != 2 or x.shape[0] < 1 or x.shape[1] < 2:
    _fail("correct_YxJ", f"expected shape [Y >= 1, J >= 2], got {x.shape}")
  if not np.all(np.isfinite(x)) or x.min() < 0.0 or x.max() > 1.0:
    _fail("correct_YxJ", "values must be finite and lie in [0, 1]")
  return x


def as_offsets_J(offsets_J, num_offsets: int) -> np.ndarray:
  """Validated int64 offsets [J]: integral and strictly increasing."""
  x = np.asarray(offsets_J)
  if x.shape != (num_offsets,):
    _fail("offsets_J", f"expected shape [{num_offsets}], got {x.shape}")
  if not np.all(np.equal(np.mod(x, 1), 0)):
    _fail("offsets_J", "offsets must be integers")
  x = x.astype(np.int64)
  if np.any(np.diff(x) <= 0):
    _fail("offsets_J", "offsets must be strictly increasing")
  return x


def _as_phases(phases, shape_YxJ: tuple[int, int]) -> np.ndarray:
  x = np.asarray(phases)
  if x.shape not in (shape_YxJ[1:], shape_YxJ):
    _fail("phases", f"expected shape [J] or [Y, J] = {shape_YxJ}, got {x.shape}")
  if not np.all(np.equal(np.mod(x, 1), 0)) or np.any(x < 0):
    _fail("phases", "phases must be non-negative integers")
  return x.astype(np.int64)


def phases_of_offsets(offsets_J, period: int, origin: int = 0) -> np.ndarray:
  """Phase of each offset inside fixed chunks of ``period`` tokens starting at ``origin``."""
  if period < 1:
    _fail("period", f"must be >= 1, got {period}")
  return np.mod(np.asarray(offsets_J, dtype=np.int64) - origin, period)


def _bootstrap_weights_RxY(num_haystacks: int, num_resamples: int, seed: int) -> np.ndarray:
  """Resampling haystacks with replacement, as multiplicities normalised to sum to one.

  Multiplicities turn every resampled statistic into a matrix product, so memory stays
  O(R * (Y + J)) instead of O(R * Y * J).
  """
  if num_resamples < 1:
    _fail("num_resamples", f"must be >= 1, got {num_resamples}")
  rng = _rng(seed, _BOOTSTRAP_STREAM)
  counts = rng.multinomial(num_haystacks, np.full(num_haystacks, 1.0 / num_haystacks),
                           size=num_resamples)
  return counts / num_haystacks


def _percentiles(samples_RxN: np.ndarray, confidence: float) -> tuple[np.ndarray, np.ndarray]:
  if not 0.0 < confidence < 1.0:
    _fail("confidence", f"must lie in (0, 1), got {confidence}")
  tail = 50.0 * (1.0 - confidence)
  with np.errstate(invalid="ignore"):
    low, high = np.nanpercentile(samples_RxN, [tail, 100.0 - tail], axis=0)
  return low, high


def bootstrap_offset_accuracy(correct_YxJ, *, num_resamples: int = 2000,
                              confidence: float = 0.95, seed: int = 0) -> Estimate:
  """Accuracy per offset (mean over haystacks) with a bootstrap interval; arrays of shape [J]."""
  correct_YxJ = as_correct_YxJ(correct_YxJ)
  weights_RxY = _bootstrap_weights_RxY(correct_YxJ.shape[0], num_resamples, seed)
  low_J, high_J = _percentiles(weights_RxY @ correct_YxJ, confidence)
  return Estimate(correct_YxJ.mean(axis=0), low_J, high_J)


def bootstrap_mean_accuracy(correct_YxJ, *, num_resamples: int = 2000,
                            confidence: float = 0.95, seed: int = 0) -> Estimate:
  """Accuracy over all trials with a bootstrap interval (floats)."""
  correct_YxJ = as_correct_YxJ(correct_YxJ)
  weights_RxY = _bootstrap_weights_RxY(correct_YxJ.shape[0], num_resamples, seed)
  samples_Rx1 = weights_RxY @ correct_YxJ.mean(axis=1, keepdims=True)
  low, high = _percentiles(samples_Rx1, confidence)
  return Estimate(float(correct_YxJ.mean()), float(low[0]), float(high[0]))


def offset_gap(correct_YxJ) -> float:
  """Max minus min of the per-offset accuracy: descriptive only.

  A max over J noisy means sits well above the true gap when many offsets share the top or
  bottom value (measured: 0.63 for a true 0.40 at Y=32, J=48), and no bootstrap interval
  fixes that (both percentile and basic intervals covered the truth in under 25% of
  simulations), so none is given. Use the phase gap and the permutation p-value for claims.
  """
  return float(np.ptp(as_correct_YxJ(correct_YxJ).mean(axis=0)))


def _group_index(phases: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
  """(labels_G ascending, index of each entry into labels_G, same shape as phases)."""
  labels_G, index = np.unique(phases, return_inverse=True)
  return labels_G, index.reshape(phases.shape)


def _phase_sums(correct_YxJ: np.ndarray, index: np.ndarray,
                num_groups: int) -> tuple[np.ndarray, np.ndarray]:
  """Per-haystack sums and trial counts of each phase group: two arrays [Y, G]."""
  num_haystacks = correct_YxJ.shape[0]
  index_YxJ = np.broadcast_to(index, correct_YxJ.shape)
  flat = (np.arange(num_haystacks)[:, None] * num_groups + index_YxJ).ravel()
  size = num_haystacks * num_groups
  sums_YxG = np.bincount(flat, weights=correct_YxJ.ravel(), minlength=size)
  counts_YxG = np.bincount(flat, minlength=size).astype(np.float64)
  return sums_YxG.reshape(-1, num_groups), counts_YxG.reshape(-1, num_groups)


def haystack_phase_accuracy(correct_YxJ, phases) -> tuple[np.ndarray, np.ndarray]:
  """(labels_G, accuracy_YxG): each haystack's accuracy in each phase group (phases as in
  ``phase_accuracy``); NaN where a haystack has no trial of a group."""
  correct_YxJ = as_correct_YxJ(correct_YxJ)
  labels_G, index = _group_index(_as_phases(phases, correct_YxJ.shape))
  sums_YxG, counts_YxG = _phase_sums(correct_YxJ, index, labels_G.size)
  with np.errstate(invalid="ignore", divide="ignore"):
    return labels_G, sums_YxG / counts_YxG


def phase_accuracy(correct_YxJ, phases, *, num_resamples: int = 2000, confidence: float = 0.95,
                   seed: int = 0) -> PhaseAccuracy:
  """Accuracy per phase and the max-min gap over phases, with bootstrap intervals.

  Args:
    correct_YxJ: outcomes in [0, 1].
    phases: integer phase of each offset, shape [J] (e.g. ``offsets_J mod M``), or of each
      trial, shape [Y, J] (dynamic chunking: phase relative to the chunk the needle actually
      landed in, which depends on the haystack).
  Returns:
    PhaseAccuracy. A group's accuracy pools all its trials (sum of outcomes / trial count);
    resamples in which a group has no trial are skipped for that group's interval.
  """
  correct_YxJ = as_correct_YxJ(correct_YxJ)
  labels_G, index = _group_index(_as_phases(phases, correct_YxJ.shape))
  sums_YxG, counts_YxG = _phase_sums(correct_YxJ, index, labels_G.size)
  mean_G = sums_YxG.sum(axis=0) / counts_YxG.sum(axis=0)
  weights_RxY = _bootstrap_weights_RxY(correct_YxJ.shape[0], num_resamples, seed)
  with np.errstate(invalid="ignore", divide="ignore"):
    samples_RxG = (weights_RxY @ sums_YxG) / (weights_RxY @ counts_YxG)
  low_G, high_G = _percentiles(samples_RxG, confidence)
  gap = float(np.ptp(mean_G))
  # Basic (reflected) interval: a resampled max-min is biased upwards like the estimate
  # itself, so percentiles of it sit too high (they cannot even reach a true gap of 0).
  # Measured coverage with 4 phases of 12 offsets, Y=32: 0.92 (percentile 0.90) at a true
  # gap of 0.4, 0.79 at a true gap of 0 (percentile 0.0).
  gaps_R = np.nanmax(samples_RxG, axis=1) - np.nanmin(samples_RxG, axis=1)
  q_low, q_high = _percentiles(gaps_R[:, None], confidence)
  gap = Estimate(gap, float(max(0.0, 2 * gap - q_high[0])), float(min(1.0, 2 * gap - q_low[0])))
  return PhaseAccuracy(labels_G, Estimate(mean_G, low_G, high_G), gap)


def _between_ss_N(centered_NxJ: np.ndarray, index_J: np.ndarray, num_groups: int) -> np.ndarray:
  """Between-group sum of squares of N centred curves grouped by index_J."""
  num_curves = centered_NxJ.shape[0]
  flat = (np.arange(num_curves)[:, None] * num_groups + index_J[None, :]).ravel()
  sums_NxG = np.bincount(flat, weights=centered_NxJ.ravel(),
                         minlength=num_curves * num_groups).reshape(num_curves, num_groups)
  counts_G = np.bincount(index_J, minlength=num_groups)
  return (sums_NxG**2 / counts_G).sum(axis=1)


def periodic_share(accuracy_J, phases_J) -> float:
  """Fraction of the variance of accuracy_J explained by its per-phase means (eta squared).

  0.0 for a constant curve (nothing to explain). Grouping by ``offset mod P`` with J a
  multiple of P gives the DFT power at frequencies j/P, j = 1..P-1, over the total power.
  """
  accuracy_J = np.asarray(accuracy_J, dtype=np.float64)
  phases_J = np.asarray(phases_J)
  if phases_J.shape != accuracy_J.shape or accuracy_J.ndim != 1:
    _fail("phases_J", f"expected the shape of accuracy_J {accuracy_J.shape}, got {phases_J.shape}")
  centered_J = accuracy_J - accuracy_J.mean()
  total = float(np.sum(centered_J**2))
  if total <= 1e-24 * accuracy_J.size:
    return 0.0
  labels_G, index_J = _group_index(phases_J)
  return float(_between_ss_N(centered_J[None], index_J, labels_G.size)[0] / total)


def spectrum(accuracy_J, spacing: int = 1) -> tuple[np.ndarray, np.ndarray]:
  """One-sided power spectrum of the mean-removed accuracy curve.

  Args:
    accuracy_J: accuracy at J uniformly spaced offsets.
    spacing: tokens between consecutive offsets.
  Returns:
    (frequencies_F in cycles per token, power_F), DC bin dropped, F = J // 2. Power is scaled
    so that it sums to the curve's total sum of squares: the fraction at a set of bins is the
    share of variance at those frequencies.
  """
  accuracy_J = np.asarray(accuracy_J, dtype=np.float64)
  num_offsets = accuracy_J.size
  coefficients = np.fft.rfft(accuracy_J - accuracy_J.mean())
  power = np.abs(coefficients) ** 2 / num_offsets
  # Bins other than DC and Nyquist stand for a +f and a -f frequency of the full DFT.
  power[1:] *= 2.0
  if num_offsets % 2 == 0:
    power[-1] /= 2.0
  return np.fft.rfftfreq(num_offsets, d=spacing)[1:], power[1:]


PHASE_DEPENDENT = 0.5  # best-phase minus worst-phase accuracy of one haystack's needle


def phase_dependent_needles(correct_YxJ, offsets_J,
                            period: int) -> tuple[np.ndarray, np.ndarray]:
  """(haystacks_H, accuracy_HxP): the haystacks whose needle accuracy, by offset mod
  ``period``, spans >= PHASE_DEPENDENT, and their accuracy at each phase 0 .. period-1 (NaN
  for a phase no offset has).

  A period test pools every haystack; this says which carry the period: a blind spot in
  every needle, or a few needles found at some phases and missed at the others.
  """
  labels_G, accuracy_YxG = haystack_phase_accuracy(correct_YxJ,
                                                   phases_of_offsets(offsets_J, period))
  # a phase without trials in a haystack (NaN) is left out of its span
  spans_Y = np.nanmax(accuracy_YxG, axis=1) - np.nanmin(accuracy_YxG, axis=1)
  haystacks_H = np.flatnonzero(spans_Y >= PHASE_DEPENDENT)
  accuracy_HxP = np.full((haystacks_H.size, period), np.nan)
  accuracy_HxP[:, labels_G] = accuracy_YxG[haystacks_H]
  return haystacks_H, accuracy_HxP
