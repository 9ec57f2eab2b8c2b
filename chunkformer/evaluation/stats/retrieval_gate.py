"""The retrieval gate: has a unit learned the lookup, or does it answer by a shortcut?

A lookup prompt can be scored without reading the target key's record (elimination among the
undemonstrated records, the last record, ...; ``data/lookup_shortcuts.py``); the best such
strategy's accuracy is the design's baseline b. A unit has learned the lookup in a padding
only when its mean accuracy beats b + ``MARGIN`` with the prompt as the unit: the one-sided
(1 - ``ALPHA``) lower bound of its mean over prompts (seeds that answered the same prompts
averaged per prompt first, ``shared_prompts``) lies above b + margin. Below the gate a unit
decides no claim that needs a learned control (C11, C13, a cure's reference) and no period
claim in either direction (claim rules 5); ``results/calibration/retrieval_gate.json`` gives the
gate's type-I error at the boundary and its power beyond it at the sweeps' prompt counts.
"""

from __future__ import annotations

import dataclasses

import numpy as np
from scipy import stats as scipy_stats

MARGIN = 0.10  # points above the shortcut a unit must clear to count as retrieving
ALPHA = 0.01  # one-sided level of the lower bound
CEILING = 0.99  # a unit at or above it decides no period claim (no room for a dip)


@dataclasses.dataclass(frozen=True)
class GateResult:
  learned: bool
  mean: float  # the unit's accuracy over prompts
  baseline: float  # the best non-reading strategy's accuracy on the same design
  lower: float  # one-sided (1 - alpha) lower bound of the mean
  margin: float
  prompts: int

  @property
  def reason(self) -> str:
    """Why the unit did not learn ('' when it did)."""
    if self.learned:
      return ""
    return (f"did not learn: mean {100 * self.mean:.1f}% (lower bound {100 * self.lower:.1f}%) "
            f"does not clear the shortcut {100 * self.baseline:.1f}% + {100 * self.margin:.0f} "
            f"points")

  def record(self) -> dict:
    return dataclasses.asdict(self)


def lower_bound(outcomes: np.ndarray, alpha: float = ALPHA) -> float:
  """One-sided (1 - alpha) lower bound of the mean of ``outcomes`` (one value in [0, 1] per
  prompt): the normal bound on the prompts' mean, its standard deviation floored at that of
  one error in the sample so that a unit at 100% still gets a finite margin."""
  x = np.asarray(outcomes, np.float64).reshape(-1)
  n = x.size
  sd = max(float(np.std(x, ddof=1)) if n > 1 else 0.0, np.sqrt((n - 1) / n ** 2))
  return float(np.mean(x) - scipy_stats.norm.ppf(1 - alpha) * sd / np.sqrt(n))


def gate(outcomes: np.ndarray, baseline: float, *, margin: float = MARGIN,
         alpha: float = ALPHA) -> GateResult:
  """The gate on one unit (or seeds pooled per prompt) in one padding: ``outcomes`` holds each
  prompt's outcome (any shape; e.g. the prompts x residues matrix)."""
  x = np.asarray(outcomes, np.float64)
  low = lower_bound(x, alpha)
  return GateResult(bool(low > baseline + margin), float(np.mean(x)), float(baseline), low,
                    margin, int(x.size))


def within_margin(mean: float, baseline: float, margin: float = MARGIN) -> bool:
  """The gate's point reading, for tables that show means only: a mean less than ``margin``
  above the shortcut (the gate itself also needs the lower bound to clear it)."""
  return mean < baseline + margin


def at_floor_or_ceiling(mean: float, baseline: float, ceiling: float = CEILING) -> str:
  """'' when a unit's mean leaves room for a period to show, else why not: at or above the
  ceiling, or at or below the shortcut's baseline."""
  if mean >= ceiling:
    return f"at ceiling (mean {100 * mean:.1f}% >= {100 * ceiling:.0f}%)"
  if mean <= baseline:
    return f"at the floor (mean {100 * mean:.1f}% <= the shortcut's {100 * baseline:.1f}%)"
  return ""


def simulate(baseline: float, truth: float, *, prompts: int, seeds: int = 1,
             seed_agreement: float = 0.5, reps: int = 2000, margin: float = MARGIN,
             alpha: float = ALPHA, rng: np.random.Generator) -> float:
  """The share of ``reps`` simulated units (``seeds`` seeds answering the same ``prompts``
  prompts, averaged per prompt) that the gate calls learned, when every unit's true accuracy
  is ``truth``. Prompts differ in difficulty: prompt i is answered with probability p_i, a
  Beta with mean ``truth`` whose spread makes two seeds' outcomes correlate by about
  ``seed_agreement`` (the intra-prompt correlation), and seeds draw independently given p_i."""
  rho = float(np.clip(seed_agreement, 1e-6, 1 - 1e-6))
  k = (1 - rho) / rho  # Beta(a, b) with a + b = k has intra-class correlation 1 / (k + 1)
  a, b = truth * k, (1 - truth) * k
  hits = 0
  for _ in range(reps):
    p = rng.beta(a, b, prompts) if 0 < truth < 1 else np.full(prompts, truth)
    outcomes = (rng.random((seeds, prompts)) < p).mean(axis=0)
    hits += gate(outcomes, baseline, margin=margin, alpha=alpha).learned
  return hits / reps


# The designs the gate is calibrated on: (name, the best shortcut's accuracy, prompts per unit
# and padding). Plan version 5's prefix lookup (16 records, 14 demonstrations: the last
# undemonstrated record's value scores 61.6%) and the retrieval design (32 records with
# distinct values, 8 demonstrations: 4.9% in-sequence, the higher of its two paddings).
DESIGNS = (("plan 5 (16 records, 14 demonstrations)", 0.616, 24 * 576),
           ("retrieval design (32 records, distinct values, 8 demonstrations)", 0.049, 24 * 576))
# (truth name, accuracy above the baseline, what is counted, kind of rate)
TRUTHS = (("the shortcut itself", 0.0, "TYPE_I"), ("the gate's boundary", MARGIN, "TYPE_I"),
          ("2 points past the boundary", MARGIN + 0.02, "POWER"),
          ("5 points past the boundary", MARGIN + 0.05, "POWER"))


def calibration_run(reps: int, *, seed: int = 0, seed_counts: tuple[int, ...] = (1, 3)):
  """Type-I error and power of the gate (``matrix_calibration.Rate`` rows) on ``DESIGNS``
  with 1 seed and 3 seeds averaged per prompt, under ``TRUTHS``."""
  from chunkformer.evaluation.stats import matrix_calibration as mc

  rng = np.random.default_rng(seed)
  rows = []
  for design, baseline, prompts in DESIGNS:
    for seeds in seed_counts:
      for truth, above, kind in TRUTHS:
        accuracy = baseline + above
        hits = [simulate(baseline, accuracy, prompts=prompts, seeds=seeds, reps=1, rng=rng) > 0
                for _ in range(reps)]
        rows.append(mc.rate("retrieval gate", f"{design}: {truth}", "called learned",
                            getattr(mc, kind), f"{prompts} prompts x {seeds} seed(s)", accuracy,
                            hits, ALPHA if kind == "TYPE_I" else None))
  return rows
