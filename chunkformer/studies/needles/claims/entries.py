"""The needle study's claims C1-C9 as registry entries, and its judging hooks.

C1-C4 and C7-C9 are decided per trained model by ``judgments`` and over seeds by the seed rule
(``combine.from_judgments``); C5 and C6 by their tests on the stored data (``step_size``,
``slot_preference``) where the data allow, else from the judgments as well. Each claim's reason
carries the plan flags of the units its judgments rest on (``plan_check``).

The study judges the needle and prefix models only: a lookup model (primary probe "lookup",
the paper protocol's) is judged by the paper study's rules (docs/claims.md).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence

from chunkformer.evaluation.claims import plan_check
from chunkformer.evaluation.claims.registry import ClaimFunction, Evidence, Judging
from chunkformer.evaluation.records.claim import Claim
from chunkformer.evaluation.records.variant import VariantRecord
from chunkformer.studies.needles.claims import (
  combine,
  judgments,
  multiplicity,
  slot_preference,
  step_size,
  summaries,
)

STUDY = "needles"
LOOKUP = "lookup"  # a record's primary probe when its model was trained on the lookup task


@dataclasses.dataclass(frozen=True)
class NeedleEvidence:
  """The needle and prefix models of a sweep, judged once for all of C1-C9."""

  records: tuple[VariantRecord, ...]
  pooled: Mapping[str, VariantRecord]  # variant -> seed-pooled record
  judgments: tuple[judgments.Judgment, ...]  # per trained model (``judgments.judge``)
  pooled_judgments: tuple[judgments.Judgment, ...] | None  # per seed-pooled record
  # record name -> its tests as its claim reads them (Holm, haystack level; ``multiplicity``)
  adjusted: Mapping[str, judgments.Adjusted]


def prepare(e: Evidence) -> NeedleEvidence:
  records = [r for r in e.records if r.primary_probe != LOOKUP]
  pooled = {name: r for name, r in e.pooled.items() if r.primary_probe != LOOKUP}
  adjusted = multiplicity.adjusted_tests(records, pooled, e.matrices, seed=e.seed,
                                         num_permutations=e.num_permutations, rules=e.rules)
  pooled_judgments = (tuple(judgments.judge(list(pooled.values()), adjusted)) if pooled
                      else None)
  return NeedleEvidence(tuple(records), pooled, tuple(judgments.judge(records, adjusted)),
                        pooled_judgments, adjusted)


def of(e: Evidence) -> NeedleEvidence:
  """The study's part of the evidence (prepared here when the evidence was built by hand)."""
  return e.prepared[STUDY] if STUDY in e.prepared else prepare(e)


def verdict_lines(e: Evidence) -> list[str]:
  """One line per trained model and seed-pooled record, with its plan flags."""
  n = of(e)
  return plan_check.flag_lines(n.judgments, n.pooled_judgments, e.records, e.plan_flags)


def tables(e: Evidence) -> summaries.Tables:
  return summaries.Tables(summaries.seed_rows(e.records, e.pooled),
                          summaries.split_label_blocks(e.records),
                          summaries.chunk_phase_rows(e.records, e.matrices),
                          summaries.shift_grid(e.records, e.matrices))


def _flagged(decide: ClaimFunction) -> ClaimFunction:
  """The claim with the plan flags of the units its judgments rest on."""
  def claim(e: Evidence) -> Claim:
    found = decide(e)
    return plan_check.flag_claims([found], of(e).judgments, e.records, e.plan_flags)[0]
  return claim


def _from_judgments(claim_id: str) -> ClaimFunction:
  """The claim decided by the verdict lines' judgments and the seed rule."""
  return lambda e: combine.from_judgments(claim_id, of(e).judgments, of(e).pooled_judgments,
                                          e.rules)


def _by_haystack(found: Sequence[judgments.Judgment] | None):
  """The judgments with the haystack-level test deciding where they carry one."""
  if found is None:
    return None
  return tuple(dataclasses.replace(j, holds=j.numbers["holds_haystack"])
               if "holds_haystack" in j.numbers else j for j in found)


def _cure(claim_id: str) -> ClaimFunction:
  """A cure claim by the seed rule, with its verdict under the haystack-level test beside."""
  def decide(e: Evidence) -> Claim:
    n = of(e)
    claim = combine.from_judgments(claim_id, n.judgments, n.pooled_judgments, e.rules)
    if not any("holds_haystack" in j.numbers for j in n.judgments if j.claim == claim_id):
      return claim
    other = combine.from_judgments(claim_id, _by_haystack(n.judgments),
                                   _by_haystack(n.pooled_judgments), e.rules)
    note = (f"under the haystack-level test (phase labels shuffled within each haystack; "
            f"reported beside, the offset-level test decides): {other.verdict}, "
            f"{other.seeds_agreeing} seeds")
    numbers = dict(claim.numbers, haystack_level={"verdict": other.verdict,
                                                  "seeds_agreeing": other.seeds_agreeing})
    return dataclasses.replace(claim, reason=f"{claim.reason}; {note}", numbers=numbers)
  return decide


def _step_size(e: Evidence) -> Claim:
  """C5 from the paired gap difference of the stored matrices, else from the judgments."""
  n = of(e)
  return (step_size.c5_claim(n.records, e.matrices, seed=e.seed, num_resamples=e.num_resamples,
                             rules=e.rules)
          or combine.from_judgments("C5", n.judgments, n.pooled_judgments, e.rules))


def _slot_preference(e: Evidence) -> Claim:
  """C6 from the slot-gain null, else INCONCLUSIVE with the measured spreads."""
  n = of(e)
  return (slot_preference.c6_claim(n.records, seed=e.seed, num_permutations=e.num_permutations,
                                   rules=e.rules)
          or slot_preference.slot_gain_claim(n.records))


CLAIMS: dict[str, ClaimFunction] = {claim_id: _flagged(decide) for claim_id, decide in {
    "C1": _from_judgments("C1"),  # fixed chunks of step M: period exactly M
    "C2": _from_judgments("C2"),  # full attention: no period
    "C3": _from_judgments("C3"),  # RoPE off: still periodic
    "C4": _from_judgments("C4"),  # uniform pooling: still periodic
    "C5": _step_size,  # a smaller step hurts less
    "C6": _slot_preference,  # heads prefer early or late phases
    "C7": _from_judgments("C7"),  # the code models' prefix probe shows the period
    "C8": _cure("C8"),  # dynamic chunks remove the blind spot
    "C9": _cure("C9"),  # a key token shift removes it
}.items()}

JUDGING = Judging(prepare=prepare, verdict_lines=verdict_lines, tables=tables)
