"""Descriptions of a residue curve that say something beyond noise: the stride repeat against
its noise expectation and against other lags, the weakest phase only when it is separated,
and the phases that work.

All read a ``residue_effect.ResidueMeans`` (per residue a mean and the variance of that mean,
the prompt as the unit); the residue axis is circular (R residues of t mod R, R a multiple of
every stride read), so lag L pairs residue r with (r + L) mod R.
"""

from __future__ import annotations

import dataclasses

import numpy as np
from scipy import stats as scipy_stats

from chunkformer.evaluation.stats.estimates import _fail
from chunkformer.evaluation.stats.residue_effect import ResidueMeans

WORKS_MIN = 0.5  # a phase works when its accuracy's 95% lower bound is at least this
CONFIDENCE = 0.95


def lag_repeat(accuracy_R, lag: int) -> float:
  """mean_r |A(r) - A((r + lag) mod R)| (accuracy units)."""
  a = np.asarray(accuracy_R, np.float64)
  return float(np.mean(np.abs(a - np.roll(a, -lag))))


@dataclasses.dataclass(frozen=True)
class StrideRepeat:
  stride: int
  repeat: float  # mean |A(r) - A(r + S)|
  noise: float  # its expectation under exact periodicity (binomial noise only)
  other_lags: float  # mean over lags 1 .. R - 1 that are not multiples of S
  relative: float  # repeat / other_lags: near 0 periodic with S, near 1 no structure at S

  def record(self) -> dict:
    return dataclasses.asdict(self)


def stride_repeat(table: ResidueMeans, stride: int) -> StrideRepeat:
  """The stride repeat beside what exact periodicity plus noise gives (E|N(0, v_r + v_r+S)|
  = sqrt(2 / pi) sd) and beside the other lags."""
  r = table.residues
  if stride < 1 or r % stride or stride >= r:
    _fail("stride", f"{stride} must divide the {r} residues and be smaller")
  a, v = table.accuracy, table.variance
  noise = float(np.mean(np.sqrt(2 / np.pi) * np.sqrt(v + np.roll(v, -stride))))
  others = [lag_repeat(a, lag) for lag in range(1, r) if lag % stride]
  other = float(np.mean(others))
  repeat = lag_repeat(a, stride)
  return StrideRepeat(stride, repeat, noise, other, repeat / other if other > 0 else float("nan"))


def lag_ratio(accuracy_R, stride: int) -> tuple[float, float]:
  """(mean |A(r) - A(r + S)|, that over the mean at the lags that are not multiples of S)
  of a curve without variances (e.g. a published one)."""
  a = np.asarray(accuracy_R, np.float64)
  if stride < 1 or a.size % stride or stride >= a.size:
    _fail("stride", f"{stride} must divide the {a.size} residues and be smaller")
  other = float(np.mean([lag_repeat(a, lag) for lag in range(1, a.size) if lag % stride]))
  repeat = lag_repeat(a, stride)
  return repeat, repeat / other if other > 0 else float("nan")


def noise_upper(table: ResidueMeans, stride: int, *, confidence: float = CONFIDENCE,
                draws: int = 4000, seed: int = 0) -> float:
  """The ``confidence`` quantile of the stride repeat under exact periodicity: each residue
  off its phase's value by N(0, v_r) alone. A repeat at or below it is within noise. Drawn
  (fixed seed): the pairs r, r + S share residues, so the mean of |differences| has no
  simple closed-form quantile."""
  rng = np.random.default_rng(seed)
  e_NxR = rng.standard_normal((draws, table.residues)) * np.sqrt(table.variance)
  repeats_N = np.mean(np.abs(e_NxR - np.roll(e_NxR, -stride, axis=1)), axis=1)
  return float(np.quantile(repeats_N, confidence))


def phase_means(table: ResidueMeans, stride: int) -> tuple[np.ndarray, np.ndarray]:
  """(mean accuracy per phase r mod S, the variance of each), unweighted over residues."""
  if stride < 1 or table.residues % stride:
    _fail("stride", f"{stride} does not divide the {table.residues} residues")
  groups = np.arange(table.residues) % stride
  size = table.residues // stride
  means = np.bincount(groups, table.accuracy) / size
  return means, np.bincount(groups, table.variance) / size**2


@dataclasses.dataclass(frozen=True)
class WeakestPhase:
  phase: int | None  # None: not separated from the next weakest
  lowest: int  # the phase with the lowest accuracy, separated or not
  margin: float  # next weakest minus weakest
  half_width: float  # half-width of the margin's two-sided interval

  def record(self) -> dict:
    return dataclasses.asdict(self)


def weakest_phase(table: ResidueMeans, stride: int, *,
                  confidence: float = CONFIDENCE) -> WeakestPhase:
  """The weakest phase of ``stride``, named only when the next weakest lies above it by more
  than the interval of their difference."""
  means, variances = phase_means(table, stride)
  order = np.argsort(means, kind="stable")
  low, nxt = int(order[0]), int(order[1])
  z = float(scipy_stats.norm.ppf(0.5 + confidence / 2))
  margin = float(means[nxt] - means[low])
  half = z * float(np.sqrt(variances[low] + variances[nxt]))
  return WeakestPhase(low if margin > half else None, low, margin, half)


def working_phases(table: ResidueMeans, stride: int, *, works_min: float = WORKS_MIN,
                   confidence: float = CONFIDENCE) -> tuple[int, ...]:
  """The phases of ``stride`` whose accuracy's lower bound (one-sided at ``confidence``) is
  at least ``works_min``: the phases where the model answers."""
  means, variances = phase_means(table, stride)
  z = float(scipy_stats.norm.ppf(confidence))
  return tuple(int(p) for p in np.flatnonzero(means - z * np.sqrt(variances) >= works_min))
