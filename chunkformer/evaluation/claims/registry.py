"""``CLAIMS``: every claim a sweep is judged on, id -> one function of the ``Evidence``.

A claim function returns one ``records.claim.Claim`` (its verdict one of the seed rule's
words, its reason and the numbers it rests on); the registry's order is the order of
results.json's ``claims`` and of the report's claim table. C10-C16 (the paper's protocol:
``paper_claims``, ``mechanism_claims``) are judged from the probes' records by their own rules
and carry their verdict lines in ``numbers["lines"]``. C1-C4 and C7-C9 are decided per
trained model by ``judgments`` and over seeds by the seed rule (``combine.from_judgments``);
C5 and C6 by their tests on the stored data (``step_size``, ``slot_preference``) where the
data allow, else from the judgments as well.

Adding a claim: write its function (``Evidence`` -> ``Claim``) and add one line below; ``judge``
then writes it to results.json and the report (``tests/test_registries.py`` does this with a
toy claim).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence

from chunkformer.evaluation.claims import (
    combine,
    eviction,
    judgments,
    mechanism_claims,
    multiplicity,
    paper_claims,
    pooling,
    slot_preference,
    step_size,
)
from chunkformer.evaluation.records import correctness
from chunkformer.evaluation.records.claim import Claim
from chunkformer.evaluation.records.variant import VariantRecord


@dataclasses.dataclass(frozen=True)
class Evidence:
  """What a claim may rest on: the records, their seed-pooled records and judgments, the
  stored matrices and the sweep's resampling settings.

  ``records`` (and everything judged from them) are the needle and prefix models C1-C9 ask
  about; ``paper_records`` every record, which C10-C16 read through the probes' records. A
  lookup model (primary probe "lookup", the paper protocol's) is judged by C10-C16 only: its
  test and gates are those of the protocol (docs/claims.md), not the needle study's."""

  records: tuple[VariantRecord, ...]
  pooled: Mapping[str, VariantRecord]  # variant -> seed-pooled record (``pooling``)
  judgments: tuple[judgments.Judgment, ...]  # per trained model (``judgments.judge``)
  pooled_judgments: tuple[judgments.Judgment, ...] | None  # per seed-pooled record
  matrices: correctness.Loader | None  # unit -> its correctness matrices
  # record name -> its tests as its claim reads them (Holm, haystack level; ``multiplicity``)
  adjusted: Mapping[str, judgments.Adjusted] = dataclasses.field(default_factory=dict)
  seed: int = 0
  num_resamples: int = 2000
  num_permutations: int = 2000
  # unit -> why its verdicts are flagged: trained under another plan or none (``plan_check``)
  plan_flags: Mapping[str, str] = dataclasses.field(default_factory=dict)
  paper_records: tuple[VariantRecord, ...] = ()


ClaimFunction = Callable[[Evidence], Claim]
LOOKUP = "lookup"  # a record's primary probe when its model was trained on the lookup task


def _from_judgments(claim_id: str) -> ClaimFunction:
  """The claim decided by the verdict lines' judgments and the seed rule."""
  return lambda e: combine.from_judgments(claim_id, e.judgments, e.pooled_judgments)


def _by_haystack(found: Sequence[judgments.Judgment] | None):
  """The judgments with the haystack-level test deciding where they carry one."""
  if found is None:
    return None
  return tuple(dataclasses.replace(j, holds=j.numbers["holds_haystack"])
               if "holds_haystack" in j.numbers else j for j in found)


def _cure(claim_id: str) -> ClaimFunction:
  """A cure claim by the seed rule, with its verdict under the haystack-level test beside."""
  def decide(e: Evidence) -> Claim:
    claim = combine.from_judgments(claim_id, e.judgments, e.pooled_judgments)
    if not any("holds_haystack" in j.numbers for j in e.judgments if j.claim == claim_id):
      return claim
    other = combine.from_judgments(claim_id, _by_haystack(e.judgments),
                                   _by_haystack(e.pooled_judgments))
    note = (f"under the haystack-level test (phase labels shuffled within each haystack; "
            f"reported beside, the offset-level test decides): {other.verdict}, "
            f"{other.seeds_agreeing} seeds")
    numbers = dict(claim.numbers, haystack_level={"verdict": other.verdict,
                                                  "seeds_agreeing": other.seeds_agreeing})
    return dataclasses.replace(claim, reason=f"{claim.reason}; {note}", numbers=numbers)
  return decide


def _step_size(e: Evidence) -> Claim:
  """C5 from the paired gap difference of the stored matrices, else from the judgments."""
  return (step_size.c5_claim(e.records, e.matrices, seed=e.seed, num_resamples=e.num_resamples)
          or combine.from_judgments("C5", e.judgments, e.pooled_judgments))


def _slot_preference(e: Evidence) -> Claim:
  """C6 from the slot-gain null, else INCONCLUSIVE with the measured spreads."""
  return (slot_preference.c6_claim(e.records, seed=e.seed, num_permutations=e.num_permutations)
          or slot_preference.slot_gain_claim(e.records))


def _paper(function) -> ClaimFunction:
  """A claim of the paper's protocol (C10-C16), judged from the probes' records."""
  return lambda e: function(e.paper_records, seed=e.seed, num_permutations=e.num_permutations,
                            flags=e.plan_flags)


CLAIMS: dict[str, ClaimFunction] = {
    "C1": _from_judgments("C1"),  # fixed chunks of step M: period exactly M
    "C2": _from_judgments("C2"),  # full attention: no period
    "C3": _from_judgments("C3"),  # RoPE off: still periodic
    "C4": _from_judgments("C4"),  # uniform pooling: still periodic
    "C5": _step_size,  # a smaller step hurts less
    "C6": _slot_preference,  # heads prefer early or late phases
    "C7": _from_judgments("C7"),  # the code models' prefix probe shows the period
    "C8": _cure("C8"),  # dynamic chunks remove the blind spot
    "C9": _cure("C9"),  # a key token shift removes it
    "C10": _paper(paper_claims.c10),  # lookup period = S for S in 4, 6, 8, 12
    "C11": _paper(paper_claims.c11),  # full attention flat on the lookup test
    "C12": _paper(paper_claims.c12),  # no RoPE and uniform averaging stay periodic
    "C13": _paper(paper_claims.c13),  # mean accuracy hides the effect
    "C14": _paper(mechanism_claims.c14),  # knockouts: phase-specialised heads, not in full
    "C15": _paper(mechanism_claims.c15),  # concentrated gates line up with knockout phases
    "C16": _paper(mechanism_claims.c16),  # cycling moves the weak phases, boundary stays
    "E1": eviction.e1_claim,  # fixed-block eviction (ChunkKV): period = its block length
    "E2": eviction.e2_claim,  # content-chunked eviction removes it at equal budget
    "E3": eviction.e3_claim,  # SnapKV vs StreamingLLM at equal budget
}


def evidence(records: Sequence[VariantRecord], matrices: correctness.Loader | None, *,
             pooled: Mapping[str, VariantRecord] | None = None, seed: int = 0,
             num_resamples: int = 2000, num_permutations: int = 2000,
             plan_flags: Mapping[str, str] | None = None) -> Evidence:
  """The evidence of a sweep; ``pooled`` computed from ``matrices`` when not given."""
  every = tuple(records)
  records = [r for r in every if r.primary_probe != LOOKUP]
  resampling = dict(seed=seed, num_resamples=num_resamples, num_permutations=num_permutations)
  if pooled is None:
    pooled = pooling.pooled_records(records, matrices, **resampling)
  pooled = {name: r for name, r in pooled.items() if r.primary_probe != LOOKUP}
  adjusted = multiplicity.adjusted_tests(records, pooled, matrices, seed=seed,
                                         num_permutations=num_permutations)
  pooled_judgments = (tuple(judgments.judge(list(pooled.values()), adjusted)) if pooled
                      else None)
  return Evidence(tuple(records), pooled, tuple(judgments.judge(records, adjusted)),
                  pooled_judgments, matrices, adjusted, **resampling,
                  plan_flags=dict(plan_flags or {}), paper_records=every)


def decide(records: Sequence[VariantRecord], matrices: correctness.Loader | None = None,
           **kwargs) -> list[Claim]:
  """Every claim of ``CLAIMS`` in its order (kwargs: ``evidence``'s)."""
  return decide_on(evidence(records, matrices, **kwargs))


def decide_on(found: Evidence) -> list[Claim]:
  """Every claim of ``CLAIMS`` in its order, on evidence already gathered."""
  return [claim(found) for claim in CLAIMS.values()]
