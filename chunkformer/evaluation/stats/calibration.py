"""Calibration by simulation: each deciding test's type-I error and power on synthetic
per-residue outcomes with a known truth, at the accuracies and prompt counts of the committed
sweeps (the paper protocol: 24 residues, 576 prompts per residue, 1-3 seeds answering the
same prompts, target positions matched in mean and variance only).

A truth (``Truth``) gives each phase's accuracy (its period is the number of phases), how many
seeds answer the same prompts and how strongly their answers go together (a probit prompt
effect of sd ``tau`` shared by the seeds, the marginal accuracy kept), and a smooth drift in
the target position (``drift`` times the cube of the position's z-score, which residue
groups matched in mean and variance still see differently through their skewness). A rule
(``RULES``) maps one simulated outcome array [seeds, prompts, residues] to True / False; a
check (``CHECKS``) names a truth, a rule, and whether the rate is a type-I error (bound:
alpha within Monte-Carlo error) or a power (bound: 0.8), or is only reported (today's rules).

``run`` returns one row per check; ``scripts/calibrate.py`` writes them to
``results/calibration/``; the test suite runs a small version. ``gate_floor_run`` compares the
power gate of claim rules 4 with that of rules 1-3 on the same truths and at the ceiling.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence

import numpy as np
from scipy import stats as scipy_stats

from chunkformer.evaluation.stats import matrix_calibration as mc
from chunkformer.evaluation.stats import period_effect, residue_effect, residue_period

RESIDUES = 24
PROMPTS = 576  # per residue, as the paper protocol's lookup probe
STRIDE = 8
CHANCE = 1 / 32
TAU = 1.0  # probit sd of the shared prompt effect: seed-to-seed phi ~0.2-0.3 at these means
TYPE_I, POWER, REPORT = "type-I error", "power", "reported"
POWER_MIN = 0.8


def dip(mean: float, size: float, phases: int = STRIDE) -> tuple[float, ...]:
  """Phase accuracies with one phase ``size`` below the others, averaging ``mean``."""
  out = np.full(phases, mean + size / phases)
  out[phases - 1] -= size
  return tuple(float(x) for x in out)


W8S8 = (0.122, 0.124, 0.999, 1.0, 0.097, 0.136, 0.140, 0.079)  # w8s8_1kv's phases, prefix
PERIOD_4 = (0.12, 0.12, 0.99, 0.10)  # a period dividing S = 8, at about the same mean
FULL_MEAN = 0.13  # the full-attention units' mean accuracy


@dataclasses.dataclass(frozen=True)
class Truth:
  name: str
  description: str
  phases: tuple[float, ...]  # accuracy per phase r mod len(phases)
  seeds: int = 1
  tau: float = 0.0
  drift: float = 0.0


TRUTHS = {t.name: t for t in (
    Truth("flat", "flat at 13% (the full-attention units)", (FULL_MEAN,)),
    Truth("flat_seeds", "flat at 13%, 3 seeds answering the same prompts, correlated",
          (FULL_MEAN,), seeds=3, tau=TAU),
    Truth("flat_drift", "flat at 13% plus a smooth position drift (0.08 z^3)", (FULL_MEAN,),
          drift=0.08),
    Truth("flat_bound", "a 6-point dip at one phase of 8 around 13% (the flat bound)",
          dip(FULL_MEAN, period_effect.FLAT_DIP)),
    Truth("period_s", "exactly period 8, w8s8_1kv's phases (mean 33%)", W8S8),
    Truth("period_s_seeds", "exactly period 8, 3 seeds sharing prompts, correlated", W8S8,
          seeds=3, tau=TAU),
    Truth("period_d", "exactly period 4 (a divisor of S = 8), mean 33%", PERIOD_4),
    Truth("period_s_drift", "period 8 plus a smooth position drift (0.08 z^3)", W8S8,
          drift=0.08),
    Truth("period_s_smallest", "a 20-point dip at one phase of 8 around 33% (the smallest "
          "periodic effect of interest)", dip(0.33, period_effect.PERIODIC_DIP)),
)}


def simulate(truth: Truth, rng: np.random.Generator, *, prompts: int = PROMPTS,
             residues: int = RESIDUES, positions_YxR: np.ndarray | None = None) -> np.ndarray:
  """Outcomes [seeds, prompts, residues] (0/1) drawn under ``truth``."""
  p_R = np.asarray(truth.phases)[np.arange(residues) % len(truth.phases)]
  p_YxR = np.broadcast_to(p_R, (prompts, residues)).astype(np.float64)
  if truth.drift:
    if positions_YxR is None:
      raise ValueError(f"truth {truth.name!r} drifts with position: give positions_YxR")
    t = np.asarray(positions_YxR, np.float64)
    z = (t - t.mean()) / t.std()
    p_YxR = p_YxR + truth.drift * z**3
  p_YxR = np.clip(p_YxR, 1e-3, 1 - 1e-3)
  if truth.tau:
    base = scipy_stats.norm.ppf(p_YxR) * np.sqrt(1 + truth.tau**2)
    shared = rng.normal(0.0, truth.tau, p_YxR.shape)
    p_SxYxR = np.broadcast_to(scipy_stats.norm.cdf(base + shared), (truth.seeds, *p_YxR.shape))
  else:
    p_SxYxR = np.broadcast_to(p_YxR, (truth.seeds, *p_YxR.shape))
  return (rng.random(p_SxYxR.shape) < p_SxYxR).astype(np.float64)


def _summed(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
  """Today's pooling: every seed's counts added as new prompts."""
  return x.sum(axis=(0, 1)), np.full(x.shape[2], x.shape[0] * x.shape[1])


def _phase_with_position(x, positions):
  table = residue_effect.from_prompts(x, positions_YxR=positions)
  return residue_effect.phase_p_value(table, STRIDE) <= period_effect.ALPHA


def _decide(x, positions=None, *, gate_dip=period_effect.PERIODIC_DIP):
  table = residue_effect.from_prompts(x, positions_YxR=positions)
  return period_effect.decide(table, gate=(gate_dip, STRIDE, CHANCE))


Rule = Callable[[np.ndarray, np.ndarray | None], bool]
_PERIODS = period_effect.candidate_periods(RESIDUES)


def _periodic_with(period: int, position: bool = False) -> Rule:
  def rule(x, positions):
    d = _decide(x, positions if position else None)
    return d.verdict == period_effect.PERIODIC and d.period == period
  return rule


RULES: dict[str, tuple[str, Rule]] = {
    "phase_prompt": ("phase effect at S = 8, prompt as unit (p <= 0.05)",
                     lambda x, _: residue_effect.phase_p_value(
                         residue_effect.from_prompts(x), STRIDE) <= period_effect.ALPHA),
    "phase_summed": ("phase effect at S = 8, seeds' counts summed (today's pooling)",
                     lambda x, _: residue_period.phase_p_value(*_summed(x), STRIDE)
                     <= period_effect.ALPHA),
    "today_any_period": ("today's period rule detects a period (summed counts)",
                         lambda x, _: residue_period.detect_period(*_summed(x), _PERIODS)[0]
                         is not None),
    "today_period_s": ("today's period rule detects period 8 (summed counts)",
                       lambda x, _: residue_period.detect_period(*_summed(x), _PERIODS)[0]
                       == STRIDE),
    "periodic_any": ("new decision: periodic with any period",
                     lambda x, _: _decide(x).verdict == period_effect.PERIODIC),
    "periodic_s": ("new decision: periodic with period 8", _periodic_with(STRIDE)),
    "periodic_d": ("new decision: periodic with period 4", _periodic_with(4)),
    "periodic_s_position": ("new decision with the position term: periodic with period 8",
                            _periodic_with(STRIDE, position=True)),
    "nested_s_vs_d": ("nested test of 8 against its divisor 4 rejects (p <= 0.05)",
                      lambda x, _: residue_effect.nested_p_value(
                          residue_effect.from_prompts(x), STRIDE, 4) <= period_effect.ALPHA),
    "flat": ("new decision: flat (gate at the 6-point dip)",
             lambda x, _: _decide(x, gate_dip=period_effect.FLAT_DIP).verdict
             == period_effect.FLAT),
    "flat_position": ("new decision with the position term: flat",
                      lambda x, positions: _decide(x, positions, gate_dip=period_effect.FLAT_DIP)
                      .verdict == period_effect.FLAT),
    "phase_prompt_position": ("phase effect at S = 8 with the position term (p <= 0.05)",
                              _phase_with_position),
}


@dataclasses.dataclass(frozen=True)
class Check:
  truth: str
  rule: str
  kind: str  # TYPE_I | POWER | REPORT


CHECKS = (
    Check("flat", "phase_prompt", TYPE_I),
    Check("flat", "periodic_any", TYPE_I),
    Check("flat", "flat", POWER),
    Check("flat_seeds", "phase_prompt", TYPE_I),
    Check("flat_seeds", "periodic_any", TYPE_I),
    Check("flat_seeds", "flat", POWER),
    Check("flat_seeds", "phase_summed", REPORT),
    Check("flat_seeds", "today_any_period", REPORT),
    Check("flat_drift", "phase_prompt_position", TYPE_I),
    Check("flat_drift", "flat_position", POWER),
    Check("flat_drift", "phase_prompt", REPORT),
    Check("flat_drift", "flat", REPORT),
    Check("flat_bound", "flat", TYPE_I),
    Check("flat_bound", "phase_prompt", POWER),
    Check("period_s", "periodic_s", POWER),
    Check("period_s", "today_period_s", REPORT),
    Check("period_s_seeds", "periodic_s", POWER),
    Check("period_s_seeds", "today_period_s", REPORT),
    Check("period_d", "periodic_s", TYPE_I),
    Check("period_d", "nested_s_vs_d", TYPE_I),
    Check("period_d", "periodic_d", POWER),
    Check("period_s_drift", "periodic_s_position", POWER),
    Check("period_s_drift", "periodic_s", REPORT),
    Check("period_s_drift", "today_period_s", REPORT),
    Check("period_s_smallest", "periodic_s", POWER),
)


@dataclasses.dataclass(frozen=True)
class Row:
  truth: str
  rule: str
  kind: str
  rate: float
  mc_error: float  # Monte-Carlo standard error of the rate
  bound: float | None  # alpha for a type-I error, 0.8 for a power, None when reported
  passes: bool | None  # None when only reported

  def record(self) -> dict:
    return dataclasses.asdict(self)


def _verdict(kind: str, rate: float, reps: int, alpha: float) -> tuple[float | None,
                                                                        bool | None]:
  if kind == TYPE_I:
    # Within Monte-Carlo error: at most alpha plus two standard errors of a rate of alpha.
    return alpha, bool(rate <= alpha + 2 * np.sqrt(alpha * (1 - alpha) / reps))
  if kind == POWER:
    return POWER_MIN, bool(rate >= POWER_MIN)
  return None, None


def truth_streams(names: Sequence[str], entropy) -> dict[str, np.random.Generator]:
  """One random stream per simulated truth, spawned from ``entropy`` (a seed, or a seed and
  a part number), so the rules judged on one truth read the same draws."""
  spawned = np.random.SeedSequence(entropy).spawn(len(names))
  return {name: np.random.default_rng(s) for name, s in zip(names, spawned, strict=True)}


def run(reps: int, *, seed: int = 0, positions_YxR: np.ndarray | None = None,
        checks: tuple[Check, ...] = CHECKS, prompts: int = PROMPTS) -> list[Row]:
  """One row per check: the rate over ``reps`` simulated units (one stream per truth, so a
  truth's rules read the same draws). ``positions_YxR``: the sweep's target positions, needed
  by truths with a drift (those checks are skipped without them)."""
  names = sorted({c.truth for c in checks})
  streams = truth_streams(names, seed)
  rows = []
  for name in names:
    truth = TRUTHS[name]
    mine = [c for c in checks if c.truth == name]
    if truth.drift and positions_YxR is None:
      continue
    rng = streams[name]
    hits = np.zeros(len(mine))
    for _ in range(reps):
      x = simulate(truth, rng, prompts=prompts, positions_YxR=positions_YxR)
      hits += [bool(RULES[c.rule][1](x, positions_YxR)) for c in mine]
    for c, h in zip(mine, hits, strict=True):
      rate = float(h / reps)
      bound, passes = _verdict(c.kind, rate, reps, period_effect.ALPHA)
      rows.append(Row(c.truth, c.rule, c.kind, rate,
                      float(np.sqrt(max(rate * (1 - rate), 1 / reps) / reps)), bound, passes))
  return rows


def seed_phi(truth: Truth, rng: np.random.Generator, prompts: int = PROMPTS) -> float:
  """The phi coefficient between two seeds' answers under ``truth`` (what ``tau`` means)."""
  x = simulate(dataclasses.replace(truth, seeds=2), rng, prompts=prompts)
  return float(np.corrcoef(x[0].ravel(), x[1].ravel())[0, 1])


# Claim rules 4 floored the power gate (``period_effect.unit_power``): at the calibrated truths
# it should change no decision, and at the ceiling it should turn "undecided" into "flat".
CEILING = Truth("ceiling", "99.9% at every residue, 3 seeds sharing prompts", (0.999,), seeds=3,
                tau=TAU)
ALL_CORRECT = Truth("all_correct", "every prompt answered at every residue by 3 seeds (plan 5's "
                    "stagger and stride-2 cures)", (1.0,), seeds=3)
GATES = ((period_effect.PERIODIC_DIP, STRIDE, CHANCE), (period_effect.FLAT_DIP, STRIDE, CHANCE))


def gate_floor_run(reps: int, *, seed: int = 0,
                   positions_YxR: np.ndarray | None = None) -> list[mc.Rate]:
  """Rows (``matrix_calibration.Rate``) comparing the floored power gate (claim rules >= 4)
  with the unfloored one (rules 1-3): per truth of ``TRUTHS`` the share of decisions (both
  gates: C10's 20-point dip and C11's 6-point dip at one phase of 8) that agree, reported; at
  ``CEILING`` and ``ALL_CORRECT`` (outcomes all 1: ``simulate`` clips accuracies at 99.9%) the
  share called flat under each, the floored one held to 95%."""
  truths = dict(TRUTHS, ceiling=CEILING, all_correct=ALL_CORRECT)
  streams = truth_streams(sorted(truths), (seed, 9))
  sizes = f"{RESIDUES} residues x {PROMPTS} prompts"
  rows = []
  for name in sorted(truths):
    truth = truths[name]
    if truth.drift and positions_YxR is None:
      continue
    same, flat_new, flat_old = [], [], []
    for _ in range(reps):
      x = (np.ones((truth.seeds, PROMPTS, RESIDUES)) if truth is ALL_CORRECT
           else simulate(truth, streams[name], positions_YxR=positions_YxR))
      table = residue_effect.from_prompts(x, positions_YxR=positions_YxR if truth.drift
                                          else None)
      for gate in GATES:
        new = period_effect.decide(table, gate=gate, floored_gate=True)
        old = period_effect.decide(table, gate=gate, floored_gate=False)
        same.append((new.verdict, new.period) == (old.verdict, old.period))
        if gate is GATES[0]:
          flat_new.append(new.verdict == period_effect.FLAT)
          flat_old.append(old.verdict == period_effect.FLAT)
    mean = float(np.mean(truth.phases))
    rows.append(mc.rate("gate floor", name, "the same decision under rules 3 and 4 (both "
                        "gates)", mc.REPORT, sizes, mean, same, None))
    if truth in (CEILING, ALL_CORRECT):
      rows.append(mc.rate("gate floor", name, "flat under rules 4 (20-point gate)", mc.HOLDS,
                          sizes, mean, flat_new, 0.95))
      rows.append(mc.rate("gate floor", name, "flat under rules 3 (20-point gate)", mc.REPORT,
                          sizes, mean, flat_old, None))
  return rows
