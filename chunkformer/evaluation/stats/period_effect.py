"""Is accuracy by residue periodic, flat, or neither? A decision by effect size, gated by power.

On a ``residue_effect.ResidueMeans`` table (per residue a mean and its variance, the prompt as
the unit), for candidate periods P dividing the R residues (2 .. R / 2):

- **periodic with P**: (a) the phase effect at P is significant (chi-square with the
  variances under the null, Bonferroni over the candidates); (b) the P-periodic fit
  explains at least ``SHARE_MIN`` of the between-residue variance after the binomial-noise
  share is removed; (c) every proper divisor d > 1 of P is rejected by the nested test of
  P against d (p <= alpha); (d) the residue effect left within the phases is at most
  ``RESIDUAL_MAX`` (root mean square over residues, accuracy units: a size, not a p-value);
  (e) the residue effect is at least the flat bound ``flat_rms`` (a curve within the flat
  bound is flat whatever its shape).
  "Period P holds" for every P that passes. The detected period is the smallest P that
  holds, unless a multiple of it that holds refines it materially: the nested test rejects
  the smaller AND what the smaller leaves within its phases is at least the flat bound (not
  flat by the paper's standard; ``detected_period``). A 5-point residual can hide a pair of
  phases 10 points apart, which the finer period then names.
- **periodic with period S** (C10's reading, ``period_is``): the detected period is S (a
  divisor of S detected means the curve is that divisor's period to the stated sizes, and
  what S adds within its phases is flat by the paper's standard).
- **flat**: the one-sided 95% upper bound of the residue effect (root mean square, noise
  removed) is below ``flat_rms``, the effect of a dip of ``FLAT_DIP`` at one phase of 8
  (an equivalence test: calling a curve with that effect flat happens at most 5% of the time).
- **no period**: neither (a residue effect beyond the flat bound that no period explains).
- **undecided**: not periodic, and the power gate fails (``power_gate``): the unit's own
  accuracy and prompt count could not show the claim's smallest effect of interest, or it
  barely answers above chance, so its "flat" or "no period" would say nothing. A unit that
  passes (a)-(e) is periodic whatever the gate says: an effect seen at the stated sizes needs
  no power argument (the gate's outcome is still recorded).

Why each threshold: docs/claims.md, "Period by effect size".
"""

from __future__ import annotations

import dataclasses

import numpy as np
from scipy import stats as scipy_stats

from chunkformer.evaluation.stats import residue_effect
from chunkformer.evaluation.stats.estimates import _fail
from chunkformer.evaluation.stats.residue_effect import ResidueMeans

ALPHA = 0.05
SHARE_MIN = 0.9  # the P-periodic fit explains >= 90% of the noise-free residue variance
RESIDUAL_MAX = 0.05  # root mean square of the within-phase residue effect, <= 5 points
FLAT_DIP = 0.06  # the paper's "within about 6 points": one phase of 8 that much lower
PERIODIC_DIP = 0.20  # the smallest phase effect the paper calls periodic (gaps 18.7-19.2)
FLAT_PHASES = 8  # the flat bound's dip sits at one phase of the reference stride 8
POWER_MIN = 0.8

PERIODIC = "periodic"
FLAT = "flat"
NO_PERIOD = "no period"
UNDECIDED = "undecided"


def dip_rms(dip: float, phases: int) -> float:
  """Root mean square over residues of one phase of ``phases`` ``dip`` below the others."""
  return float(dip * np.sqrt(phases - 1) / phases)


FLAT_RMS = dip_rms(FLAT_DIP, FLAT_PHASES)  # 0.0198: 1.98 points


def candidate_periods(residues: int) -> tuple[int, ...]:
  """Divisors of the residue count from 2 to R / 2 (mod 24: 2, 3, 4, 6, 8, 12)."""
  return tuple(p for p in range(2, residues // 2 + 1) if residues % p == 0)


@dataclasses.dataclass(frozen=True)
class PeriodFit:
  """The five conditions of 'periodic with P' at one candidate P."""

  period: int
  phase_p_value: float  # Bonferroni-adjusted over the candidates
  share: float  # noise-corrected periodic share (nan: no residue effect after noise)
  divisor_p_values: dict[int, float]  # nested test of P against each proper divisor d > 1
  residual_rms: float
  passes: bool

  def record(self) -> dict:
    return {"period": self.period, "phase_p_value": self.phase_p_value,
            "share": None if np.isnan(self.share) else self.share,
            "divisor_p_values": {str(d): p for d, p in self.divisor_p_values.items()},
            "residual_rms": self.residual_rms, "passes": self.passes}


@dataclasses.dataclass(frozen=True)
class PeriodDecision:
  verdict: str  # PERIODIC | FLAT | NO_PERIOD | UNDECIDED
  period: int | None  # the detected period (PERIODIC only)
  reason: str  # why, with the numbers; empty for a plain PERIODIC / FLAT
  effect_rms: float
  effect_upper: float  # 95% upper bound of effect_rms (nan when a period passes)
  flat_rms: float
  power: float  # the gate's power (nan when no gate was asked for)
  fits: tuple[PeriodFit, ...]

  def fit(self, period: int) -> PeriodFit | None:
    return next((f for f in self.fits if f.period == period), None)

  def record(self) -> dict:
    return {"verdict": self.verdict, "period": self.period, "reason": self.reason,
            "effect_rms": self.effect_rms,
            "effect_upper": None if np.isnan(self.effect_upper) else self.effect_upper,
            "flat_rms": self.flat_rms,
            "power": None if np.isnan(self.power) else self.power,
            "fits": [f.record() for f in self.fits]}


def fit_period(table: ResidueMeans, period: int, *, candidates: int = 1, alpha: float = ALPHA,
               share_min: float = SHARE_MIN, residual_max: float = RESIDUAL_MAX,
               flat_rms: float = FLAT_RMS) -> PeriodFit:
  """The five conditions at ``period`` (``candidates``: the Bonferroni factor of (a))."""
  phase = min(1.0, candidates * residue_effect.phase_p_value(table, period))
  divisors = {d: residue_effect.nested_p_value(table, period, d)
              for d in range(2, period) if period % d == 0}
  share = residue_effect.periodic_share(table, period)
  residual = residue_effect.residual_rms(table, period)
  passes = (phase <= alpha and not np.isnan(share) and share >= share_min
            and all(p <= alpha for p in divisors.values()) and residual <= residual_max
            and residue_effect.effect_rms(table) >= flat_rms)
  return PeriodFit(period, phase, share, divisors, residual, bool(passes))


def dip_power(variance: float, dip: float, phases: int, residues: int, *,
              alpha: float = ALPHA) -> float:
  """Power of the phase-effect test at ``phases`` (chi-square, phases - 1 degrees of freedom)
  against one phase ``dip`` below the others, every residue mean with ``variance``."""
  if not 0 < variance or residues % phases:
    _fail("variance", f"need variance > 0 and phases dividing residues, got {variance}, "
                      f"{phases} of {residues}")
  noncentrality = residues * dip_rms(dip, phases) ** 2 / variance
  critical = scipy_stats.chi2.isf(alpha, phases - 1)
  return float(scipy_stats.ncx2.sf(critical, phases - 1, noncentrality))


def unit_power(table: ResidueMeans, dip: float, phases: int, *, alpha: float = ALPHA,
               floored: bool = True) -> float:
  """``dip_power`` at the unit's own mean accuracy and prompt count: the binomial variance
  of its mean over its prompts and seeds (floored as the table's variances are), times its
  design effect (>= 1: seeds that share prompts count as fewer than their answers).
  ``floored=False``: claim rules 1-3, whose unfloored design effect gave a unit at 100% a
  power near alpha (``ResidueMeans.design_effect_at``)."""
  prompts = float(np.mean(table.prompts)) * table.seeds
  if floored:
    variance = float(residue_effect.binomial_variance(table.mean, prompts))
  else:
    p = min(max(table.mean, 1e-6), 1 - 1e-6)
    variance = p * (1 - p) / prompts
  variance *= max(1.0, table.design_effect_at(floored=floored))
  return dip_power(variance, dip, phases, table.residues, alpha=alpha)


def power_gate(table: ResidueMeans, *, dip: float, phases: int, chance: float,
               power_min: float = POWER_MIN, alpha: float = ALPHA,
               floored: bool = True) -> tuple[float, str]:
  """(power, reason): the reason is empty when the unit may decide (power >= ``power_min``
  for the dip AND mean - chance > dip), else says which half failed, with its numbers."""
  power = unit_power(table, dip, phases, alpha=alpha, floored=floored)
  if power < power_min:
    return power, (f"power {power:.2f} < {power_min} for a {100 * dip:.0f}-point dip at one "
                   f"phase of {phases} (mean {100 * table.mean:.1f}%, "
                   f"{int(np.mean(table.prompts))} prompts per residue x {table.seeds} seeds, "
                   f"design effect {table.design_effect_at(floored=floored):.2f})")
  if table.mean - chance <= dip:
    return power, (f"mean {100 * table.mean:.1f}% is within {100 * dip:.0f} points of chance "
                   f"({100 * chance:.1f}%)")
  return power, ""


def detected_period(table: ResidueMeans, passing: list[PeriodFit], *, alpha: float = ALPHA,
                    flat_rms: float = FLAT_RMS) -> int:
  """The smallest passing period, replaced by the smallest passing multiple of it that refines
  it materially: the nested test rejects the smaller AND the residue effect left within the
  smaller's phases is at least the flat bound (what is left is not flat by the paper's
  standard); repeated from the new period. A multiple that only adds a significant 1-2
  points (8 beside 4 with 576 prompts per residue) leaves the smaller period detected."""
  by_period = {f.period: f for f in passing}
  period = min(by_period)
  while by_period[period].residual_rms >= flat_rms:
    finer = [p for p in sorted(by_period) if p > period and p % period == 0
             and by_period[p].divisor_p_values.get(period, 1.0) <= alpha]
    if not finer:
      break
    period = finer[0]
  return period


def decide(table: ResidueMeans, *, periods: tuple[int, ...] | None = None,
           gate: tuple[float, int, float] | None = None, alpha: float = ALPHA,
           share_min: float = SHARE_MIN, residual_max: float = RESIDUAL_MAX,
           flat_rms: float = FLAT_RMS, floored_gate: bool = True) -> PeriodDecision:
  """The decision of the module docstring.

  Args:
    table: per-residue means and variances (``residue_effect``).
    periods: the candidates; None: ``candidate_periods(R)``.
    gate: (dip, phases, chance) of the power gate (``power_gate``); None: no gate.
    floored_gate: the gate's binomial variance and design effect floored as the table's
      variances are (claim rules >= 4; False: rules 1-3, ``unit_power``).
  """
  periods = candidate_periods(table.residues) if periods is None else tuple(periods)
  fits = tuple(fit_period(table, p, candidates=len(periods), alpha=alpha, share_min=share_min,
                          residual_max=residual_max, flat_rms=flat_rms)
               for p in sorted(periods))
  effect = residue_effect.effect_rms(table)
  power, gate_reason = (float("nan"), "")
  if gate is not None:
    dip, phases, chance = gate
    power, gate_reason = power_gate(table, dip=dip, phases=phases, chance=chance, alpha=alpha,
                                    floored=floored_gate)
  passing = [f for f in fits if f.passes]
  # The bound decides only when no period passes (and is slow for a large effect): nan else.
  upper = float("nan") if passing else residue_effect.effect_upper_bound(table, 1 - alpha)
  numbers = (f"residue effect {100 * effect:.2f} points rms (95% upper bound "
             f"{100 * upper:.2f}; flat bound {100 * flat_rms:.2f})")
  if passing:
    verdict, reason = PERIODIC, ""
    period = detected_period(table, passing, alpha=alpha, flat_rms=flat_rms)
  elif gate_reason:
    alone = FLAT if upper < flat_rms else NO_PERIOD
    verdict, period = UNDECIDED, None
    reason = f"{gate_reason} (by effect size alone: {alone})"
  elif upper < flat_rms:
    verdict, period, reason = FLAT, None, ""
  else:
    verdict, period = NO_PERIOD, None
    reason = f"{numbers}; no period passes: " + "; ".join(_why_not(f, alpha, share_min,
                                                                   residual_max) for f in fits)
  return PeriodDecision(verdict, period, reason, effect, upper, flat_rms, power, fits)


def _why_not(fit: PeriodFit, alpha: float, share_min: float, residual_max: float) -> str:
  parts = []
  if fit.phase_p_value > alpha:
    parts.append(f"phase p {fit.phase_p_value:.2g}")
  if np.isnan(fit.share) or fit.share < share_min:
    parts.append(f"share {fit.share:.3f}")
  failed = [d for d, p in fit.divisor_p_values.items() if p > alpha]
  if failed:
    parts.append(f"divisors {failed} not rejected")
  if fit.residual_rms > residual_max:
    parts.append(f"residual {100 * fit.residual_rms:.1f} points")
  return f"P={fit.period}: " + (", ".join(parts) or "effect below the flat bound")


def period_is(decision: PeriodDecision, stride: int) -> bool | None:
  """C10's reading: True when the detected period is ``stride``; False when the decision is
  another period, flat or no period; None when undecided."""
  if decision.verdict == UNDECIDED:
    return None
  return decision.verdict == PERIODIC and decision.period == stride
