"""Claims judged per group of seeds, for the studies that judge a setting (an eviction policy,
a sparse-prefill pattern) at one depth on one model variant: each group's seeds and its
seed-pooled test give ``Outcome``s, the one seed rule (``stats.seed_rule``) decides the group,
the common verdict over the groups that decide is the claim's (``combine``); Holm within a
claim over its pooled tests (``holm_of``); a correctness matrix's period statistics at the
lengths a claim reads (``analyse``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from chunkformer.evaluation.claims import rules as claim_rules
from chunkformer.evaluation.records import correctness
from chunkformer.evaluation.records.claim import Claim
from chunkformer.evaluation.stats import periodicity
from chunkformer.evaluation.stats.holm import holm
from chunkformer.evaluation.stats.seed_rule import (
  INCONCLUSIVE,
  SeedAgreement,
  common_verdict,
  seed_agreement,
)


@dataclasses.dataclass(frozen=True)
class Outcome:
  """One judgment of one group: per seed or seed-pooled (``holds`` None: undecided)."""

  holds: bool | None
  reason: str
  numbers: dict[str, Any]


def no_data(claim_id: str, statement: str, why: str) -> Claim:
  """``claim_id`` INCONCLUSIVE for lack of data, saying which."""
  return Claim(claim_id, statement, INCONCLUSIVE, why, {}, "0/0")


def combine(claim_id: str, statement: str,
            per_group: Mapping[str, tuple[Sequence[Outcome], Outcome]],
            in_force: claim_rules.Rules, what: str) -> Claim:
  """The seed rule per group (as the claim rules ``in_force`` say), the common verdict over
  the groups (``what`` they are, for the note: "policy configurations"), the claim's record."""
  rules: dict[str, SeedAgreement] = {}
  numbers: dict[str, Any] = {}
  for name, (seeds, pooled) in per_group.items():
    rules[name] = seed_agreement([o.holds for o in seeds], pooled.holds,
                                 min_agree=in_force.min_agree(len(seeds)))
    numbers[name] = {"seeds": [dict(o.numbers, holds=o.holds, reason=o.reason) for o in seeds],
                     "pooled": dict(pooled.numbers, holds=pooled.holds, reason=pooled.reason),
                     "seed_rule": rules[name].record()}
  verdict, note = common_verdict({n: r.verdict for n, r in rules.items()}, what)
  counted = [r for r in rules.values() if verdict == INCONCLUSIVE or r.verdict == verdict]
  agree = sum(r.holds if verdict == INCONCLUSIVE else r.agreeing_seeds for r in counted)
  summary = "; ".join(
      f"{n}: {r.verdict}, holds in {r.count} seeds, pooled "
      f"{'undecided' if r.pooled_holds is None else 'holds' if r.pooled_holds else 'fails'}"
      + (f" ({r.reason})" if r.reason else "")
      + (f" [pooled: {per_group[n][1].reason}]" if per_group[n][1].reason else "")
      for n, r in rules.items())
  reason = "; ".join(x for x in (note, summary) if x)
  return Claim(claim_id, statement, verdict, reason, numbers,
               f"{agree}/{sum(r.seeds for r in counted)}")


def holm_of(family: Sequence[tuple[Any, float]]) -> dict[Any, float]:
  """key -> Holm-adjusted p over the family (key, raw p)."""
  return {key: float(q) for (key, _), q in zip(family, holm([p for _, p in family]),
                                                strict=True)}


@dataclasses.dataclass(frozen=True)
class Analysed:
  """A matrix's statistics at the lengths a claim reads (chunk lengths L, block sizes B)."""

  accuracy: float
  num_offsets: int  # J: periods up to J // 3 are candidates of the period scan
  detected_period: int | None
  p_at: Mapping[int, float]  # length -> phase-test p-value of offset mod length
  gap_at: Mapping[int, float | None]  # length -> max-min accuracy over offset mod length
  weakest_at: Mapping[int, int]  # length -> weakest phase

  def numbers(self) -> dict[str, Any]:
    return {"accuracy": self.accuracy, "detected_period": self.detected_period,
            "p_value": {str(k): v for k, v in self.p_at.items()},
            "gap": {str(k): v for k, v in self.gap_at.items()},
            "weakest_phase": {str(k): v for k, v in self.weakest_at.items()}}


def analyse(matrix: correctness.Matrix | None, lengths: Sequence[int], *, seed: int,
            num_resamples: int, num_permutations: int) -> Analysed | None:
  """The statistics of ``matrix`` at each length (``stats.periodicity``; None without a
  matrix or lengths)."""
  if matrix is None or not lengths:
    return None
  a = periodicity.analyze(matrix.correct_YxJ, matrix.offsets_J, list(lengths), seed=seed,
                          num_resamples=num_resamples, num_permutations=num_permutations)
  tests = {t.chunk_size: t for t in a.by_chunk_size}
  return Analysed(float(np.mean(matrix.correct_YxJ)), int(matrix.offsets_J.size),
                  a.detected_period,
                  {m: float(t.p_value) for m, t in tests.items()},
                  {m: t.table.gap.value for m, t in tests.items()},
                  {m: int(t.table.weakest_phase) for m, t in tests.items()})
