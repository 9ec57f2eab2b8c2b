"""Calibration by simulation of the eviction claims' tests (E1-E3) at the eviction sweep's
sizes: 32 haystacks x 40 offsets x 3 seeds asked the same haystacks, chunk lengths L = 4, 8,
10, accuracies 0.01-0.94 (``results/eviction/report.md``).

Truths (``stats.matrix_calibration``; haystack and needle effects shared by the seeds, and by
the two policies E3 compares): flat at the content-chunked and SnapKV accuracies; the
committed ChunkKV groups' accuracy by offset mod L (their report table, pooled over seeds) as
exact periods; a period of 4 tested at L = 8; a residual period under content chunks.

Rules, as ``eviction_claims`` decides:
- E1: detected period = L AND p < 0.01 at L, per seed, pooled (stacked rows; for a power the
  pooled p is multiplied by the claim's 9 groups, Holm's largest factor, so the power shown
  is a lower bound; for a type-I error the raw p, an upper bound), and the seed rule.
- E2's standard: no period at every L of the sweep (p > 0.05 at L = 4, 8 and 10, AND no
  detected period), per seed and by the seed rule.
- E3: the sign-flip test of per-haystack accuracy differences (``sign_flip``), per seed and
  pooled (each haystack's difference averaged over the seeds): p < 0.05 with SnapKV ahead.
"""

from __future__ import annotations

import numpy as np

from chunkformer.evaluation.claims.standards import NULL_ALPHA, PERIOD_ALPHA, no_period
from chunkformer.evaluation.stats import matrix_calibration as mc
from chunkformer.evaluation.stats.calibration import truth_streams
from chunkformer.evaluation.stats.matrix_calibration import MatrixTruth
from chunkformer.evaluation.stats.seed_rule import REPRODUCED, pool_seeds, seed_agreement
from chunkformer.studies.eviction.claims.eviction_claims import PAIRED_ALPHA
from chunkformer.studies.eviction.stats.sign_flip import paired_rows, sign_flip_test

LENGTHS = (4, 8, 10)
E1_FAMILY = 9  # the committed sweep's ChunkKV groups: 3 budgets x 3 chunk lengths
SHARED = dict(offsets=40, tau=1.0, needle_tau=0.5)


def _pct(*values: float) -> tuple[float, ...]:
  return tuple(v / 100 for v in values)


# (truth, the L it is tested at)
TRUTHS: dict[str, tuple[MatrixTruth, int]] = {t.name: (t, m) for t, m in (
    (MatrixTruth("flat_0.13", "flat at 0.13 (content chunks, budget 16)", (0.13,), **SHARED), 8),
    (MatrixTruth("flat_0.42", "flat at 0.42 (content chunks, budget 32)", (0.42,), **SHARED), 8),
    (MatrixTruth("flat_0.92", "flat at 0.92 (content chunks, budget 64)", (0.92,), **SHARED), 8),
    (MatrixTruth("chunk4_b16", "ChunkKV L = 4, budget 16: 20, 7, 20, 21%",
                 _pct(20.3, 7.1, 19.8, 20.5), **SHARED), 4),
    (MatrixTruth("chunk8_b16", "ChunkKV L = 8, budget 16 (mean 11%)",
                 _pct(16.9, 19.2, 17.7, 14.6, 6.2, 0.0, 4.6, 10.8), **SHARED), 8),
    (MatrixTruth("chunk10_b16", "ChunkKV L = 10, budget 16 (mean 9%)",
                 _pct(13.5, 17.4, 16.7, 16.4, 13.3, 0.5, 0.0, 0.0, 3.6, 6.8), **SHARED), 10),
    (MatrixTruth("chunk4_b32", "ChunkKV L = 4, budget 32: 50, 35, 49, 51%",
                 _pct(50.4, 35.2, 48.6, 50.5), **SHARED), 4),
    (MatrixTruth("chunk8_b64", "ChunkKV L = 8, budget 64: one phase 71%, the rest 88-93%",
                 _pct(92.1, 92.7, 92.1, 91.2, 89.6, 71.0, 88.3, 91.5), **SHARED), 8),
    (MatrixTruth("period4_at_l8", "period 4 tested at L = 8: 20, 7, 20, 21%",
                 _pct(20.3, 7.1, 19.8, 20.5), **SHARED), 8),
    (MatrixTruth("residual_l8", "content chunks keeping a quarter of ChunkKV L = 8's dip at "
                 "budget 32 (one phase 10 points below, mean 42%)",
                 mc.dip(0.42, 0.10, 8), **SHARED), 8),
)}
PERIODIC = {"chunk4_b16", "chunk8_b16", "chunk10_b16", "chunk4_b32", "chunk8_b64"}


def _period(test: mc.Test, m: int, factor: int = 1) -> bool:
  return test.detected == m and test.p_at[m] * factor < PERIOD_ALPHA


def _flat(test: mc.Test) -> bool:
  return all(no_period(test.p_at[m], test.detected) for m in LENGTHS)


def _rule(seeds: list[bool], pooled: bool) -> bool:
  return seed_agreement(seeds, pooled, min_agree=2).verdict == REPRODUCED


def sizes(t: MatrixTruth) -> str:
  return f"{t.haystacks} haystacks x {t.offsets} offsets x {t.seeds} seeds"


def unit(truth: MatrixTruth, m: int, rng: np.random.Generator, *,
         num_permutations: int) -> dict[str, bool]:
  x = mc.simulate(truth, rng)
  seeds = [mc.period_test(s, LENGTHS, num_permutations=num_permutations) for s in x]
  pooled = mc.period_test(pool_seeds(x), LENGTHS, num_permutations=num_permutations)
  factor = E1_FAMILY if truth.name in PERIODIC else 1
  return {"e1_seed": _period(seeds[0], m), "e1_pooled": _period(pooled, m, factor),
          "e1_rule": _rule([_period(s, m) for s in seeds], _period(pooled, m, factor)),
          "e2_seed": _flat(seeds[0]), "e2_rule": _rule([_flat(s) for s in seeds], _flat(pooled))}


_ROWS = (
    ("e1_seed", "E1", "period = L (one seed: detected period L and p < 0.01)"),
    ("e1_pooled", "E1", "period = L (stacked rows of 3 seeds)"),
    ("e1_rule", "E1", "period = L by the seed rule"),
    ("e2_seed", "E2", "no period at L = 4, 8, 10 (one seed)"),
    ("e2_rule", "E2", "no period at L = 4, 8, 10 by the seed rule"),
)


def _kind(key: str, name: str) -> tuple[str, float | None]:
  if key.startswith("e1") and name == "residual_l8":
    return mc.REPORT, None  # a true period of 8: E1 finding it is right; E2's truth
  if key.startswith("e1"):
    return (mc.POWER, None) if name in PERIODIC else (mc.TYPE_I, PERIOD_ALPHA)
  if name.startswith("flat"):
    # four tests at 0.05 (three lengths and the scan): at most 4 x 0.05 by Bonferroni
    return mc.HOLDS, 1 - 4 * NULL_ALPHA
  return mc.REPORT, None


def run(reps: int, *, seed: int = 0, names: tuple[str, ...] | None = None,
        num_permutations: int = 2000) -> list[mc.Rate]:
  names = tuple(TRUTHS) if names is None else names
  streams = truth_streams(names, [seed, 1])
  rows = []
  for name in names:
    truth, m = TRUTHS[name]
    rng = streams[name]
    found = [unit(truth, m, rng, num_permutations=num_permutations) for _ in range(reps)]
    for key, claim, words in _ROWS:
      kind, bound = _kind(key, name)
      text = f"{words}; L = {m}" if claim == "E1" else words
      if key == "e1_pooled" and name in PERIODIC:
        text += f", p x {E1_FAMILY} (Holm's largest factor)"
      rows.append(mc.rate(claim, name, text, kind, sizes(truth), truth.mean,
                          [f[key] for f in found], bound))
  return rows


# --- E3: SnapKV against StreamingLLM ------------------------------------------------------

# (SnapKV's accuracy, StreamingLLM's): the null at four accuracies, two effects, the smallest
# committed one (budget 16: 18.4% vs 1.3%)
E3_FAMILY = 3  # the committed sweep's pairs (3 budgets): Holm's largest factor for a power
E3_TRUTHS = {
    "null_0.01": (0.01, 0.01), "null_0.2": (0.2, 0.2), "null_0.6": (0.6, 0.6),
    "null_0.93": (0.93, 0.93), "ahead_5pt": (0.2, 0.15), "ahead_10pt": (0.2, 0.1),
    "committed_b16": (0.184, 0.013),
}


def e3_unit(a: float, b: float, rng: np.random.Generator, *,
            num_permutations: int) -> dict[str, bool]:
  xa, xb = mc.simulate_shared((MatrixTruth("a", "", (a,), **SHARED),
                               MatrixTruth("b", "", (b,), **SHARED)), rng)
  one = sign_flip_test(*paired_rows([xa[0]], [xb[0]]), num_permutations=num_permutations)
  pooled = sign_flip_test(*paired_rows(list(xa), list(xb)), num_permutations=num_permutations)
  return {"seed": one.p_value < PAIRED_ALPHA, "pooled": pooled.p_value < PAIRED_ALPHA,
          "seed_ahead": one.p_value < PAIRED_ALPHA and one.difference > 0,
          "pooled_ahead": pooled.p_value * E3_FAMILY < PAIRED_ALPHA and pooled.difference > 0}


def e3_run(reps: int, *, seed: int = 0, num_permutations: int = 2000) -> list[mc.Rate]:
  names = tuple(E3_TRUTHS)
  streams = truth_streams(names, [seed, 3])
  rows = []
  for name in names:
    a, b = E3_TRUTHS[name]
    rng = streams[name]
    found = [e3_unit(a, b, rng, num_permutations=num_permutations) for _ in range(reps)]
    size = "32 haystacks x 40 offsets x 3 seeds, two policies"
    words = f"SnapKV {a:.3f} vs StreamingLLM {b:.3f}"
    if a == b:
      checks = (("seed", "p < 0.05 either way (one seed)", mc.TYPE_I, PAIRED_ALPHA),
                ("pooled", "p < 0.05 either way (seeds averaged per haystack)", mc.TYPE_I,
                 PAIRED_ALPHA))
    else:  # the claim states no effect size: the committed effect decides, smaller ones shown
      kind = mc.POWER if name.startswith("committed") else mc.REPORT
      checks = (("seed_ahead", "p < 0.05, SnapKV ahead (one seed)", kind, None),
                ("pooled_ahead", f"p x {E3_FAMILY} < 0.05, SnapKV ahead (seeds averaged per "
                 "haystack)", kind, None))
    for key, text, kind, bound in checks:
      rows.append(mc.rate("E3", name, f"{text}; {words}", kind, size, (a + b) / 2,
                          [f[key] for f in found], bound))
  return rows
