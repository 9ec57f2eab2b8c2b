"""Calibration by simulation of the sweep statistics on correctness matrices [Y haystacks,
J offsets]: the permutation tests of ``period_tests`` and the haystack bootstrap intervals of
``estimates``, on synthetic outcomes with a known truth, at a sweep's sizes.

A truth (``MatrixTruth``) gives each phase's accuracy (``offset mod len(phases)``), a linear
drift over the offsets, and how the answers of N seeds asked the same haystacks go together:
a probit haystack effect (sd ``tau``, a haystack easy or hard at every offset) and a probit
needle effect (sd ``needle_tau``, one haystack's needle at one offset), both shared by the
seeds, the marginal accuracy kept. That is what makes the seeds of a sweep agree: they read
the same haystacks. ``unit_stats`` computes once per simulated unit what the studies' rules
read (per seed and pooled: detected period, phase-test p at the claim's lengths; the gap and
mean intervals of the stacked rows and of the haystack means); the studies' calibration
modules turn those into decisions (their claims' rules live with them), and ``Rate`` is one
row of the report.

Why the pooled period test is computed once: the permutation tests shuffle offset columns
with the rows intact, so the stacked rows (``seed_rule.pool_seeds``) and the haystack means
(``shared_prompts.seed_means``) give the same column means and the same p-values; only the
bootstrap intervals, which resample rows, differ between the two poolings.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import numpy as np
from scipy import stats as scipy_stats

from chunkformer.evaluation.stats import estimates, period_tests
from chunkformer.evaluation.stats.seed_rule import pool_seeds
from chunkformer.evaluation.stats.shared_prompts import seed_means

TYPE_I, POWER, HOLDS, COVERAGE, REPORT = ("type-I error", "power", "holds under its truth",
                                          "coverage", "reported")
POWER_MIN = 0.8


@dataclasses.dataclass(frozen=True)
class MatrixTruth:
  name: str
  description: str
  phases: tuple[float, ...]  # accuracy per phase, offset mod len(phases)
  haystacks: int = 32
  offsets: int = 48
  seeds: int = 3
  tau: float = 0.0  # probit sd of the haystack effect shared by the seeds
  needle_tau: float = 0.0  # probit sd of the haystack-and-offset effect shared by the seeds
  drift: float = 0.0  # accuracy change from the first offset to the last (linear)

  def accuracy_J(self) -> np.ndarray:
    j = np.arange(self.offsets)
    p = np.asarray(self.phases, np.float64)[j % len(self.phases)]
    return np.clip(p + self.drift * (j / max(self.offsets - 1, 1) - 0.5), 1e-3, 1 - 1e-3)

  @property
  def gap(self) -> float:
    """The true max-min gap over ``offset mod len(phases)`` (without drift)."""
    return float(np.ptp(self.phases)) if len(self.phases) > 1 else 0.0

  @property
  def mean(self) -> float:
    return float(self.accuracy_J().mean())


def dip(mean: float, size: float, phases: int) -> tuple[float, ...]:
  """Phase accuracies with the last phase ``size`` below the others, averaging ``mean``."""
  out = np.full(phases, mean + size / phases)
  out[-1] -= size
  return tuple(float(x) for x in out)


def simulate(truth: MatrixTruth, rng: np.random.Generator) -> np.ndarray:
  """Outcomes [seeds, haystacks, offsets] (0/1) drawn under ``truth``."""
  return simulate_shared((truth,), rng)[0]


def simulate_shared(truths: Sequence[MatrixTruth], rng: np.random.Generator) -> list[np.ndarray]:
  """One outcome array per truth, [seeds, haystacks, offsets], on the SAME haystacks: one draw
  of the haystack and needle effects (scaled by the first truth's ``tau`` and
  ``needle_tau``) shared by every truth and seed, as two models (or two policies of one model)
  asked the same haystacks."""
  first = truths[0]
  shape = (first.haystacks, first.offsets)
  u_Yx1 = rng.normal(0.0, 1.0, (shape[0], 1))
  v_YxJ = rng.normal(0.0, 1.0, shape)
  out = []
  for t in truths:
    scale = np.sqrt(1 + first.tau**2 + first.needle_tau**2)
    z_YxJ = scipy_stats.norm.ppf(t.accuracy_J()) * scale + first.tau * u_Yx1 + (
        first.needle_tau * v_YxJ)
    p_YxJ = scipy_stats.norm.cdf(z_YxJ)
    out.append((rng.random((t.seeds, *shape)) < p_YxJ).astype(np.float64))
  return out


@dataclasses.dataclass(frozen=True)
class Test:
  """One matrix's period tests: the detected period and the phase-test p at each length."""

  detected: int | None
  p_at: dict[int, float]
  gap_at: dict[int, float]


def period_test(correct_YxJ: np.ndarray, lengths: Sequence[int], *,
                num_permutations: int = 2000, seed: int = 0, alpha: float = 0.05,
                tolerance: float = 0.1) -> Test:
  """What ``periodicity.analyze`` gives a claim (detected period, p at each length, phase
  gap), without its bootstrap intervals; the same permutations as the sweep at ``seed``."""
  offsets = np.arange(correct_YxJ.shape[1])
  scan = period_tests.period_scan(correct_YxJ, offsets, num_permutations=num_permutations,
                                  seed=seed)
  detected = period_tests.detect_period(scan, alpha=alpha, tolerance=tolerance)
  p_at, gap_at = {}, {}
  curve = correct_YxJ.mean(axis=0)
  for m in lengths:
    hit = np.flatnonzero(scan.periods == m)
    p_at[m] = (float(scan.p_values[hit[0]]) if hit.size else period_tests.phase_permutation_test(
        correct_YxJ, offsets % m, num_permutations=num_permutations, seed=seed))
    phase_means = np.bincount(offsets % m, weights=curve) / np.bincount(offsets % m)
    gap_at[m] = float(np.ptp(phase_means))
  return Test(detected, p_at, gap_at)


def covers(estimate: estimates.Estimate, truth: float) -> bool:
  return bool(estimate.low <= truth <= estimate.high)


def interval_coverage(x_NxYxJ: np.ndarray, truth: MatrixTruth, length: int, *,
                      num_resamples: int = 2000, seed: int = 0) -> dict[str, bool]:
  """Whether the 95% gap interval (over ``offset mod length``) and the mean-accuracy interval
  cover the truth, from the stacked rows and from the haystack means."""
  phases = np.arange(truth.offsets) % length
  out = {}
  for name, x in (("stacked", pool_seeds(x_NxYxJ)), ("seed_means", seed_means(x_NxYxJ))):
    kw = dict(num_resamples=num_resamples, seed=seed)
    out[f"gap_{name}"] = covers(estimates.phase_accuracy(x, phases, **kw).gap, truth.gap)
    out[f"mean_{name}"] = covers(estimates.bootstrap_mean_accuracy(x, **kw), truth.mean)
  return out


@dataclasses.dataclass(frozen=True)
class Rate:
  """One row of the report: a decision's rate over simulated units under one truth."""

  test: str  # the claim or test ("C1", "E3", ...)
  truth: str
  rule: str  # what is counted, in words
  kind: str  # TYPE_I | POWER | HOLDS | COVERAGE | REPORT
  sizes: str  # e.g. "32 haystacks x 48 offsets x 3 seeds"
  accuracy: float
  units: int
  rate: float
  mc_error: float
  bound: float | None
  passes: bool | None

  def record(self) -> dict:
    return dataclasses.asdict(self)


def judge(kind: str, rate: float, units: int, bound: float | None) -> bool | None:
  """Whether ``rate`` meets its bound: a type-I error at most the bound plus two Monte-Carlo
  standard errors of a rate equal to it; a power at least 0.8; a coverage or a "holds" rate
  at least its bound minus two such errors; None for a reported rate."""
  if bound is None or kind == REPORT:
    return None
  slack = 2 * np.sqrt(bound * (1 - bound) / units)
  if kind == TYPE_I:
    return bool(rate <= bound + slack)
  if kind == POWER:
    return bool(rate >= bound)
  return bool(rate >= bound - slack)


def rate(test: str, truth: str, rule: str, kind: str, sizes: str, accuracy: float,
         hits: Sequence[bool], bound: float | None) -> Rate:
  """The row of ``hits`` (one decision per simulated unit)."""
  units = len(hits)
  r = float(np.mean(hits)) if units else float("nan")
  bound = POWER_MIN if kind == POWER and bound is None else bound
  return Rate(test, truth, rule, kind, sizes, float(accuracy), units, r,
              float(np.sqrt(max(r * (1 - r), 1 / max(units, 1)) / max(units, 1))), bound,
              judge(kind, r, units, bound))
