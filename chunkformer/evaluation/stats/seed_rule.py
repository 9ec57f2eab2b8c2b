"""Verdicts over training seeds: how many seeds agree, the seed-pooled test, intervals.

Rule (fixed before the study's data; docs/claims.md): a claim is REPRODUCED when it holds in at
least ``min_agree`` of the n seeds (2 of 3 by default) AND the seed-pooled test agrees; NOT
REPRODUCED when it holds in fewer seeds AND the pooled test does not hold either; otherwise
(the seeds and the pooled test disagree, or fewer than ``min_agree`` seeds exist) INCONCLUSIVE
with the reason. With 2 seeds and the default, both must hold.

Pooling: a sweep's haystack rows of every seed stacked as more haystacks (``pool_seeds``), so
that the pooled statistics and permutation tests are those of ``stats`` on N*S rows.
Intervals across seeds (``seed_interval``): Student-t over the per-seed values, which is wide
with 2 or 3 seeds, as it should be.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence

import numpy as np
from scipy import stats as scipy_stats

from chunkformer.evaluation.stats.estimates import Estimate, _fail

# The verdict words of every claim, report and table (defined here only: the seed rule is the
# lowest place that decides one).
REPRODUCED = "REPRODUCED"
NOT_REPRODUCED = "NOT REPRODUCED"
INCONCLUSIVE = "INCONCLUSIVE"
VERDICTS = (REPRODUCED, NOT_REPRODUCED, INCONCLUSIVE)


@dataclasses.dataclass(frozen=True)
class SeedAgreement:
  """The combined verdict of per-seed results and the seed-pooled test."""

  holds: int  # seeds in which the claim holds
  seeds: int  # seeds tested
  min_agree: int
  pooled_holds: bool | None  # None: the pooled test is undecided
  verdict: str  # REPRODUCED | NOT REPRODUCED | INCONCLUSIVE
  reason: str  # one clause; empty when the seeds and the pooled test agree
  fails: int = 0  # seeds in which the claim fails (the rest hold or are undecided)

  @property
  def count(self) -> str:
    """'2/3': seeds in which the claim holds out of seeds tested."""
    return f"{self.holds}/{self.seeds}"

  @property
  def agreeing_seeds(self) -> int:
    """Seeds agreeing with the verdict (failing ones for NOT REPRODUCED)."""
    return self.fails if self.verdict == NOT_REPRODUCED else self.holds

  @property
  def agreeing(self) -> str:
    """'2/3': seeds agreeing with the verdict out of seeds tested."""
    return f"{self.agreeing_seeds}/{self.seeds}"

  def record(self) -> dict:
    return {"seeds_agreeing": self.count, "holds": self.holds, "seeds": self.seeds,
            "fails": self.fails, "min_agree": self.min_agree,
            "pooled_holds": self.pooled_holds,
            "verdict": self.verdict, "reason": self.reason}


def seed_agreement(holds_per_seed: Sequence[bool | None], pooled_holds: bool | None, *,
                   min_agree: int = 2) -> SeedAgreement:
  """The verdict of a claim from its per-seed outcomes and the pooled test (module rule).

  A seed's outcome may be None (undecided, e.g. the task not learned): it counts neither way,
  so NOT REPRODUCED needs the claim to fail in enough seeds that the undecided ones could not
  make up ``min_agree``. A pooled outcome of None (the pooled test undecided) leaves the claim
  INCONCLUSIVE.
  """
  flags = [None if h is None else bool(h) for h in holds_per_seed]
  if min_agree < 1:
    _fail("min_agree", f"must be >= 1, got {min_agree}")
  holds, seeds = sum(f is True for f in flags), len(flags)
  undecided = sum(f is None for f in flags)
  pooled = None if pooled_holds is None else bool(pooled_holds)
  open_note = f"; {undecided} seed(s) undecided" if undecided else ""
  if seeds < min_agree:
    verdict, reason = INCONCLUSIVE, f"only {seeds} seed(s) tested; the rule needs {min_agree}"
  elif pooled is None:
    verdict, reason = INCONCLUSIVE, f"the seed-pooled test is undecided{open_note}"
  elif holds >= min_agree and pooled:
    verdict, reason = REPRODUCED, ""
  elif holds + undecided < min_agree and not pooled:
    verdict, reason = NOT_REPRODUCED, ""
  elif pooled:
    verdict = INCONCLUSIVE
    reason = (f"the seed-pooled test holds but only {holds}/{seeds} seeds (need "
              f"{min_agree}){open_note}")
  elif holds >= min_agree:
    verdict = INCONCLUSIVE
    reason = f"{holds}/{seeds} seeds hold but the seed-pooled test does not"
  else:
    verdict = INCONCLUSIVE
    reason = (f"the seed-pooled test does not hold and {holds}/{seeds} seeds do, but "
              f"{undecided} seed(s) are undecided")
  return SeedAgreement(holds, seeds, min_agree, pooled, verdict, reason,
                       sum(f is False for f in flags))


def pool_seeds(correct_NxYxJ) -> np.ndarray:
  """[N, Y, J] outcomes (or a list of [Y_n, J]) as one [sum Y_n, J] matrix of haystack rows."""
  if isinstance(correct_NxYxJ, np.ndarray):
    arrays = list(correct_NxYxJ) if correct_NxYxJ.ndim == 3 else [correct_NxYxJ]
  else:
    arrays = [np.asarray(x, np.float64) for x in correct_NxYxJ]
  if not arrays or any(np.ndim(x) != 2 for x in arrays):
    _fail("correct_NxYxJ", "expected [N, Y, J] or a non-empty list of [Y, J] matrices")
  if len({np.shape(x)[1] for x in arrays}) != 1:
    _fail("correct_NxYxJ", f"seeds have different offsets: {[np.shape(x) for x in arrays]}")
  return np.concatenate([np.asarray(x, np.float64) for x in arrays], axis=0)


def seed_interval(values_N, confidence: float = 0.95) -> Estimate:
  """Mean over seeds with a Student-t interval (low and high None for one seed: no spread)."""
  values = np.asarray(values_N, np.float64).ravel()
  if values.size == 0 or not np.all(np.isfinite(values)):
    _fail("values_N", f"expected one or more finite per-seed values, got {values_N!r}")
  if not 0.0 < confidence < 1.0:
    _fail("confidence", f"must lie in (0, 1), got {confidence}")
  mean = float(values.mean())
  if values.size == 1:
    return Estimate(mean, None, None)
  half = float(scipy_stats.t.ppf(0.5 + confidence / 2, values.size - 1)
               * values.std(ddof=1) / np.sqrt(values.size))
  return Estimate(mean, mean - half, mean + half)


def common_verdict(verdicts: Mapping[str, str], what: str) -> tuple[str, str]:
  """One verdict over several parts (variants, needle lengths): the common verdict of the
  parts that decide it (the undecided ones noted), INCONCLUSIVE when they disagree or none
  decides. Returns (verdict, note); the note is empty when every part agrees."""
  decided = {name: v for name, v in verdicts.items() if v != INCONCLUSIVE}
  found = sorted(set(decided.values()))
  if len(found) == 1:
    undecided = len(verdicts) - len(decided)
    return found[0], (f"{undecided} of the {len(verdicts)} {what} undecided" if undecided
                      else "")
  if not found:
    return INCONCLUSIVE, f"none of the {what} decides it"
  return INCONCLUSIVE, f"the {what} disagree (" + ", ".join(
      f"{name}: {v}" for name, v in sorted(decided.items())) + ")"
