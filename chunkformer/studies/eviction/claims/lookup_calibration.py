"""Calibration by simulation of E4-E6 (``lookup_claims``) at plan version 5's sizes: the
lookup under eviction, 8 residues of the target position x 128 prompts per residue x 3 seeds
answering the same prompts, the target positions of the shifted design (1-96), the tests
exactly as the claims run them (``lookup_claims.decide``, ``lookup_claims.mcnemar``, the
sign-flip test), before any of the plan's units were probed.

Truths (``stats.matrix_calibration``: a probit prompt effect of sd 1 shared by the seeds and,
for E6, by the two policies): flat at 30% and 60%; the smallest periodic effect of interest
(a 20-point dip at one phase of L around 45%) at L = 4 and 8, and 30 points at L = 8; a
period of 4 tested at L = 8.
E4 counts "period L detected" (per seed, and by the seed rule: 2 seeds agreeing and the
pooled decision); E5's standard counts "not periodic" (flat or no period, the gate passed),
which must hold under a flat truth and must not under a periodic one; E6 counts p < 0.05
(McNemar per seed, the sign-flip test over prompts pooled) under equal accuracies, and
"SnapKV ahead" under a difference.
"""

from __future__ import annotations

import numpy as np

from chunkformer.data.matched_positions import shifted_positions
from chunkformer.evaluation.records import correctness
from chunkformer.evaluation.stats import matrix_calibration as mc
from chunkformer.evaluation.stats import period_effect
from chunkformer.evaluation.stats.calibration import truth_streams
from chunkformer.evaluation.stats.matrix_calibration import MatrixTruth
from chunkformer.evaluation.stats.seed_rule import REPRODUCED, seed_agreement
from chunkformer.studies.eviction.claims import lookup_claims
from chunkformer.studies.eviction.claims.eviction_claims import PAIRED_ALPHA
from chunkformer.studies.eviction.stats.sign_flip import sign_flip_test

RESIDUES, PROMPTS, SEEDS = 8, 128, 3
POSITIONS_YxR = shifted_positions(RESIDUES, PROMPTS, 1, 96).T  # plan 5's shifted positions
SHARED = dict(haystacks=PROMPTS, offsets=RESIDUES, seeds=SEEDS, tau=1.0)
SIZES = f"{PROMPTS} prompts x {RESIDUES} residues x {SEEDS} seeds"
DIP = period_effect.PERIODIC_DIP

# name -> (truth, the L it is tested at)
TRUTHS: dict[str, tuple[MatrixTruth, int]] = {t.name: (t, m) for t, m in (
    (MatrixTruth("flat_0.30", "flat at 30%", (0.30,), **SHARED), 4),
    (MatrixTruth("flat_0.60", "flat at 60%", (0.60,), **SHARED), 8),
    (MatrixTruth("dip4_0.45", "a 20-point dip at one phase of 4 around 45%",
                 mc.dip(0.45, DIP, 4), **SHARED), 4),
    (MatrixTruth("dip8_0.45", "a 20-point dip at one phase of 8 around 45%",
                 mc.dip(0.45, DIP, 8), **SHARED), 8),
    (MatrixTruth("dip8_30pt", "a 30-point dip at one phase of 8 around 45%",
                 mc.dip(0.45, 0.30, 8), **SHARED), 8),
    (MatrixTruth("period4_at_l8", "the dip of 4 tested at L = 8", mc.dip(0.45, DIP, 4),
                 **SHARED), 8),
)}


def _matrices(x_SxYxR: np.ndarray) -> list[correctness.Matrix]:
  return [correctness.Matrix(x, np.arange(RESIDUES), positions_YxJ=POSITIONS_YxR)
          for x in x_SxYxR]


def _rule(seeds: list[bool | None], pooled: bool | None) -> bool:
  return seed_agreement(seeds, pooled, min_agree=2).verdict == REPRODUCED


def _not_periodic(d: period_effect.PeriodDecision | None) -> bool | None:
  """E5's standard on one decision: flat or no period holds, periodic fails, else None."""
  if d is None or d.verdict == period_effect.UNDECIDED:
    return None
  return d.verdict != period_effect.PERIODIC


def unit(truth: MatrixTruth, length: int, rng: np.random.Generator) -> dict[str, bool]:
  found = _matrices(mc.simulate(truth, rng))
  seeds = [lookup_claims.decide([m], length) for m in found]
  pooled = lookup_claims.decide(found, length)
  e4 = [period_effect.period_is(d, length) for d in seeds]
  e5 = [_not_periodic(d) for d in seeds]
  return {"e4_seed": e4[0] is True,
          "e4_rule": _rule(e4, period_effect.period_is(pooled, length)),
          "e5_seed": e5[0] is True, "e5_rule": _rule(e5, _not_periodic(pooled))}


_ROWS = (
    ("e4_seed", "E4", "period L detected (one seed)"),
    ("e4_rule", "E4", "period L detected by the seed rule"),
    ("e5_seed", "E5", "not periodic, gate passed (one seed)"),
    ("e5_rule", "E5", "not periodic, gate passed, by the seed rule"),
)


def _kind(key: str, name: str) -> tuple[str, float | None]:
  periodic = name.startswith("dip")
  if key.startswith("e4"):
    return (mc.POWER, None) if periodic else (mc.TYPE_I, period_effect.ALPHA)
  if periodic or name == "period4_at_l8":  # "removed" while a period is there
    return mc.TYPE_I, period_effect.ALPHA
  return mc.HOLDS, 1 - period_effect.ALPHA


def run(reps: int, *, seed: int = 0) -> list[mc.Rate]:
  """E4's and E5's rows, one per (truth, decision counted)."""
  names = tuple(TRUTHS)
  streams = truth_streams(names, [seed, 4])
  rows = []
  for name in names:
    truth, m = TRUTHS[name]
    found = [unit(truth, m, streams[name]) for _ in range(reps)]
    for key, claim, words in _ROWS:
      kind, bound = _kind(key, name)
      rows.append(mc.rate(claim, name, f"{words}; L = {m}", kind, SIZES, truth.mean,
                          [f[key] for f in found], bound))
  return rows


# --- E6 -----------------------------------------------------------------------------------

E6_TRUTHS = {"null_0.2": (0.2, 0.2), "null_0.5": (0.5, 0.5), "ahead_5pt": (0.45, 0.40),
             "ahead_10pt": (0.45, 0.35)}


def e6_unit(a: float, b: float, rng: np.random.Generator, *,
            num_permutations: int) -> dict[str, bool]:
  xa, xb = mc.simulate_shared((MatrixTruth("a", "", (a,), **SHARED),
                               MatrixTruth("b", "", (b,), **SHARED)), rng)
  only_a, only_b, p = lookup_claims.mcnemar(xa[0], xb[0])
  pooled = sign_flip_test(xa.mean(axis=0).ravel(), xb.mean(axis=0).ravel(),
                          num_permutations=num_permutations, seed=int(rng.integers(2**31)))
  return {"seed": p < PAIRED_ALPHA, "pooled": pooled.p_value < PAIRED_ALPHA,
          "seed_ahead": p < PAIRED_ALPHA and only_a > only_b,
          "pooled_ahead": pooled.p_value < PAIRED_ALPHA and pooled.difference > 0}


def e6_run(reps: int, *, seed: int = 0, num_permutations: int | None = None
           ) -> list[mc.Rate]:
  """E6's rows; ``num_permutations`` None: the claim's own ``E6_FLIPS``."""
  num_permutations = num_permutations or lookup_claims.E6_FLIPS
  names = tuple(E6_TRUTHS)
  streams = truth_streams(names, [seed, 6])
  rows = []
  for name in names:
    a, b = E6_TRUTHS[name]
    found = [e6_unit(a, b, streams[name], num_permutations=num_permutations)
             for _ in range(reps)]
    words = f"SnapKV {a:.2f} vs StreamingLLM {b:.2f}"
    if a == b:
      checks = (("seed", "McNemar p < 0.05 either way (one seed)", mc.TYPE_I, PAIRED_ALPHA),
                ("pooled", "sign-flip p < 0.05 either way (seeds averaged per prompt)",
                 mc.TYPE_I, PAIRED_ALPHA))
    else:  # the claim states no effect size: 10 points must be found, 5 are shown
      kind = mc.POWER if name == "ahead_10pt" else mc.REPORT
      checks = (("seed_ahead", "McNemar p < 0.05, SnapKV ahead (one seed)", kind, None),
                ("pooled_ahead", "sign-flip p < 0.05, SnapKV ahead (seeds averaged per "
                 "prompt)", kind, None))
    for key, text, kind, bound in checks:
      rows.append(mc.rate("E6", name, f"{text}; {words}", kind, f"{SIZES}, two policies",
                          (a + b) / 2, [f[key] for f in found], bound))
  return rows
