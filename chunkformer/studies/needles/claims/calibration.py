"""Calibration by simulation of the needle study's deciding tests (C1, C2, C5) and of its
intervals, at the committed needle sweeps' sizes and accuracies.

Sizes: 32 haystacks x 48 offsets x 3 seeds asked the same haystacks (``results/study``,
``results/strides``; the demo has 48 x 16). Accuracies and effects are those of the committed
units: full attention 0.95-1.0 (and 0.5 for a barely learned one), fixed M = 4 at 0.90 with a
0.39 gap, M = 2 at 0.67 with 0.65, M = 8 at 0.88 with 0.6, S = 12 at 0.88 with 0.68, and the
smallest C1 effect found (fixed_m4_kv3: 0.98, gap 0.04). Every truth shares a probit haystack
effect (``TAU``) and needle effect (``NEEDLE_TAU``) between its seeds, except the one named
``independent``.

Rules, as the claims decide (``judgments``, ``standards``, ``seed_rule``):
- C1 per seed: detected period = M AND phase-test p < 0.01 at M; pooled: the same on the
  stacked rows (raw p: Holm over the claim's family only raises it, so a type-I error of the
  raw test bounds the adjusted one); the seed rule: >= 2 of 3 seeds AND the pooled test.
- C2 ("no period", one standard): p > 0.05 at M AND no detected period; per seed and by the
  seed rule (the accuracy gate left aside: it reads the held-out run, not these matrices).
- Intervals: the 95% gap interval over ``offset mod M`` and the mean-accuracy interval, from
  the stacked rows (``pool_seeds``) and from the haystack means (``seed_means``).
- C5: ``paired_gap.gap_difference`` of an M = 2 and an M = 4 model asked the same haystacks
  (3 seeds each; haystacks and seeds resampled jointly): REPRODUCED when the 95% interval
  lies below 0.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from chunkformer.evaluation.claims.standards import NULL_ALPHA, PERIOD_ALPHA, no_period
from chunkformer.evaluation.stats import matrix_calibration as mc
from chunkformer.evaluation.stats.calibration import truth_streams
from chunkformer.evaluation.stats.matrix_calibration import MatrixTruth, dip
from chunkformer.evaluation.stats.seed_rule import REPRODUCED, pool_seeds, seed_agreement
from chunkformer.studies.needles.stats import paired_gap

TAU = 1.0  # probit sd of the haystack effect the seeds share
NEEDLE_TAU = 0.5  # probit sd of the haystack-and-offset effect the seeds share
SHARED = dict(tau=TAU, needle_tau=NEEDLE_TAU)

# (truth, the chunk size M the claim tests)
TRUTHS: dict[str, tuple[MatrixTruth, int]] = {t.name: (t, m) for t, m in (
    (MatrixTruth("flat", "flat at 0.95 (full attention)", (0.95,), **SHARED), 4),
    (MatrixTruth("flat_half", "flat at 0.5 (a barely learned full model)", (0.5,), **SHARED), 4),
    (MatrixTruth("flat_drift", "flat at 0.9, falling 0.2 from the first offset to the last",
                 (0.9,), drift=-0.2, **SHARED), 4),
    (MatrixTruth("period_m4", "period 4: one phase 0.39 below the rest, mean 0.90 (fixed_m4)",
                 dip(0.90, 0.39, 4), **SHARED), 4),
    (MatrixTruth("period_m4_independent", "as period_m4, seeds independent (no shared "
                 "effects)", dip(0.90, 0.39, 4)), 4),
    (MatrixTruth("period_m4_small", "period 4: one phase 0.04 below, mean 0.98 (fixed_m4_kv3, "
                 "the smallest committed C1 effect)", dip(0.98, 0.04, 4), **SHARED), 4),
    (MatrixTruth("period_m2", "period 2: gap 0.65, mean 0.67 (fixed_m2)", dip(0.67, 0.65, 2),
                 **SHARED), 2),
    (MatrixTruth("period_m8", "period 8: one phase 0.6 below, mean 0.88 (fixed_m8)",
                 dip(0.88, 0.6, 8), **SHARED), 8),
    (MatrixTruth("period_m12", "period 12: one phase 0.68 below, mean 0.88 (fixed_s12)",
                 dip(0.88, 0.68, 12), **SHARED), 12),
    (MatrixTruth("period_d2_of_m4", "period 2 (a divisor of M = 4): gap 0.3, mean 0.75",
                 dip(0.75, 0.3, 2), **SHARED), 4),
    (MatrixTruth("period_d4_of_m8", "period 4 (a divisor of M = 8): gap 0.39, mean 0.90",
                 dip(0.90, 0.39, 4), **SHARED), 8),
    (MatrixTruth("period_m4_drift", "period_m4 falling 0.2 from the first offset to the last",
                 dip(0.90, 0.39, 4), drift=-0.2, **SHARED), 4),
)}
PERIODIC = {"period_m4", "period_m4_independent", "period_m4_small", "period_m2", "period_m8",
            "period_m12", "period_m4_drift"}
COVERAGE = {"period_m4", "period_m4_independent", "flat_half"}


def _period_m(test: mc.Test, m: int) -> bool:
  return test.detected == m and test.p_at[m] < PERIOD_ALPHA


def _no_period(test: mc.Test, m: int) -> bool:
  return no_period(test.p_at[m], test.detected)


def _rule(seeds: list[bool], pooled: bool) -> bool:
  return seed_agreement(seeds, pooled, min_agree=min(2, len(seeds))).verdict == REPRODUCED


def sizes(t: MatrixTruth) -> str:
  return f"{t.haystacks} haystacks x {t.offsets} offsets x {t.seeds} seeds"


def unit(truth: MatrixTruth, m: int, rng: np.random.Generator, *, num_permutations: int,
         num_resamples: int) -> dict[str, bool]:
  """Every decision of one simulated unit under ``truth`` (keys as in ``_ROWS``)."""
  x = mc.simulate(truth, rng)
  seeds = [mc.period_test(s, [m], num_permutations=num_permutations) for s in x]
  pooled = mc.period_test(pool_seeds(x), [m], num_permutations=num_permutations)
  out = {"c1_seed": _period_m(seeds[0], m), "c1_pooled": _period_m(pooled, m),
         "c1_rule": _rule([_period_m(s, m) for s in seeds], _period_m(pooled, m)),
         "c2_seed": _no_period(seeds[0], m),
         "c2_rule": _rule([_no_period(s, m) for s in seeds], _no_period(pooled, m)),
         "any_seed": seeds[0].detected is not None}
  if truth.name in COVERAGE:
    out.update(mc.interval_coverage(x, truth, m, num_resamples=num_resamples))
  return out


# (decision key, claim, words, kind for a flat / periodic / divisor truth, bound)
_ROWS = (
    ("c1_seed", "C1", "period = M (one seed: detected period M and p < 0.01)"),
    ("c1_pooled", "C1", "period = M (stacked rows of 3 seeds, raw p)"),
    ("c1_rule", "C1", "period = M by the seed rule (2 of 3 seeds and the pooled test)"),
    ("c2_seed", "C2", "no period (one seed: p > 0.05 at M and no detected period)"),
    ("c2_rule", "C2", "no period by the seed rule"),
    ("any_seed", "-", "some period detected (one seed)"),
    ("gap_stacked", "intervals", "95% gap interval covers the true gap, stacked rows"),
    ("gap_seed_means", "intervals", "95% gap interval covers the true gap, haystack means"),
    ("mean_stacked", "intervals", "95% mean interval covers the true mean, stacked rows"),
    ("mean_seed_means", "intervals", "95% mean interval covers the true mean, haystack means"),
)


def _kind(key: str, name: str) -> tuple[str, float | None]:
  periodic = name in PERIODIC
  if key.startswith("c1"):
    return (mc.POWER, None) if periodic else (mc.TYPE_I, PERIOD_ALPHA)
  if key.startswith("c2"):
    # Two tests at 0.05 (the phase test and the family-wise scan): a flat truth fails the
    # standard at most 2 x 0.05 of the time by Bonferroni.
    return (mc.HOLDS, 1 - 2 * NULL_ALPHA) if name.startswith("flat") else (mc.REPORT, None)
  if key.startswith("gap") and TRUTHS[name][0].gap == 0:
    # a max-min gap is biased up and its basic interval covers a true 0 about 0.8 of the time
    # (``estimates.phase_accuracy``): shown, not held to 0.95
    return mc.REPORT, None
  if key.startswith(("gap", "mean")):
    return mc.COVERAGE, 0.95
  return mc.REPORT, None


def run(reps: int, *, seed: int = 0, names: tuple[str, ...] | None = None,
        num_permutations: int = 2000, num_resamples: int = 2000) -> list[mc.Rate]:
  """C1, C2 and interval rows for every truth in ``names`` (all by default)."""
  rows = []
  names = tuple(TRUTHS) if names is None else names
  streams = truth_streams(names, seed)
  for name in names:
    truth, m = TRUTHS[name]
    rng = streams[name]
    found = [unit(truth, m, rng, num_permutations=num_permutations,
                  num_resamples=num_resamples) for _ in range(reps)]
    for key, claim, words in _ROWS:
      if key not in found[0]:
        continue
      kind, bound = _kind(key, name)
      rows.append(mc.rate(claim, name, f"{words}; M = {m}", kind, sizes(truth), truth.mean,
                          [f[key] for f in found], bound))
  return rows


# --- C5: the paired gap difference ----------------------------------------------------------

# (name, M = 2 truth, M = 4 truth, what it is)
C5_TRUTHS = {
    "equal_gaps": (dip(0.75, 0.3, 2), dip(0.75, 0.3, 4), "both gaps 0.3, mean 0.75"),
    "both_flat": ((0.75,), (0.75,), "both flat at 0.75 (gaps 0)"),
    "study_effect": (dip(0.74, 0.024, 2), dip(0.29, 0.33, 4), "gap(M=2) 0.024 at 0.74, "
                     "gap(M=4) 0.33 at 0.29 (the study's 2/2-token needles at 4000 steps)"),
    "half_effect": (dip(0.6, 0.1, 2), dip(0.6, 0.25, 4), "gaps 0.10 vs 0.25 at 0.6"),
}


def c5_unit(a: MatrixTruth, b: MatrixTruth, rng: np.random.Generator, *,
            num_resamples: int) -> dict[str, bool]:
  xa, xb = mc.simulate_shared((a, b), rng)
  offsets = np.arange(a.offsets)
  d = paired_gap.gap_difference(xa, offsets % 2, xb, offsets % 4,
                                num_resamples=num_resamples).difference
  truth = a.gap - b.gap
  return {"covers": bool(d.low <= truth <= d.high), "excludes_zero": d.high < 0 or d.low > 0,
          "reproduced": d.high < 0}


def c5_run(reps: int, *, seed: int = 0, names: tuple[str, ...] | None = None,
           num_resamples: int = 2000) -> list[mc.Rate]:
  names = tuple(C5_TRUTHS) if names is None else names
  streams = truth_streams(names, [seed, 5])
  rows = []
  for name in names:
    pa, pb, words = C5_TRUTHS[name]
    a = MatrixTruth(f"{name}_m2", words, pa, **SHARED)
    b = MatrixTruth(f"{name}_m4", words, pb, **SHARED)
    rng = streams[name]
    found = [c5_unit(a, b, rng, num_resamples=num_resamples) for _ in range(reps)]
    null = a.gap - b.gap >= -1e-9  # equal gaps up to round-off are the null's boundary
    checks: list[tuple[str, str, str, float | None]] = [
        ("covers", "95% interval covers the true difference", mc.COVERAGE, 0.95),
        ("reproduced", "REPRODUCED (interval below 0)",
         mc.TYPE_I if null else mc.POWER, 0.025 if null else None)]
    if null:
      checks.append(("excludes_zero", "interval excludes 0 (either side)", mc.TYPE_I, 0.05))
    for key, text, kind, bound in checks:
      rows.append(mc.rate("C5", name, f"{text}; true difference {a.gap - b.gap:+.3f}", kind,
                          "M = 2 and M = 4 models, " + sizes(a), (a.mean + b.mean) / 2,
                          [f[key] for f in found], bound))
  return rows


RUNNERS: dict[str, Callable[..., list[mc.Rate]]] = {"needles": run, "c5": c5_run}
