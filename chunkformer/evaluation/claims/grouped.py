"""Claims judged per group of seeds, for the studies that judge a setting (an eviction policy,
a sparse-prefill pattern) at one depth on one model variant: each group's seeds and its
seed-pooled test give ``Outcome``s, the one seed rule (``stats.seed_rule``) decides the group,
the common verdict over the groups that decide is the claim's (``combine``); Holm within a
claim over its pooled tests (``holm_of``); a correctness matrix's period statistics at the
lengths a claim reads (``analyse``).

``Judge`` holds what such a study passes in as values (its claims' statements, its gate's
threshold and words, where its setting bites) and applies them: the model-accuracy gate, the
"period of exactly L" test of each group per seed and pooled with Holm over the pooled tests
(``Judge.periods``), the "no period at these lengths" test (``Judge.flat_outcome``), no
data, and the seed rule with the common verdict (``Judge.combine``). The groups are
``claims.policy_groups``'.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from chunkformer.evaluation.claims import rules as claim_rules
from chunkformer.evaluation.claims import standards
from chunkformer.evaluation.claims.policy_groups import Group
from chunkformer.evaluation.records import correctness
from chunkformer.evaluation.records.claim import Claim
from chunkformer.evaluation.records.formatting import number
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


def resampling(evidence) -> dict[str, int]:
  """The evidence's seed and resample counts, as ``analyse`` takes them."""
  return dict(seed=evidence.seed, num_resamples=evidence.num_resamples,
              num_permutations=evidence.num_permutations)


@dataclasses.dataclass(frozen=True)
class Judge:
  """A study's claims on groups of one setting (module docstring), its specifics as values."""

  statements: Mapping[str, str]  # claim id -> statement
  what: str  # what the groups are, for the common verdict's note: "policy configurations"
  model_accuracy: float  # a seed whose model is below it with no setting applied is undecided
  gate_words: str  # how the gate's model accuracy is measured: "before eviction"
  under: str  # how the setting's accuracy is named: "under eviction"
  bites: tuple[float, float] = (0.02, 0.98)  # accuracy range in which a missing period fails

  def no_data(self, claim_id: str, why: str) -> Claim:
    """``claim_id`` INCONCLUSIVE for lack of data, saying which."""
    return no_data(claim_id, self.statements[claim_id], why)

  def combine(self, claim_id: str, per_group: Mapping[str, tuple[Sequence[Outcome], Outcome]],
              in_force: claim_rules.Rules = claim_rules.CURRENT_RULES) -> Claim:
    """The seed rule per group (as the claim rules ``in_force`` say; default: the current
    ones), the common verdict over the groups."""
    return combine(claim_id, self.statements[claim_id], per_group, in_force, self.what)

  def gate(self, run_or_group) -> Outcome | None:
    """Undecided when the model (a run's, or a group's mean) misses ``model_accuracy``."""
    gate = run_or_group.gate
    if gate is None or gate < self.model_accuracy:
      return Outcome(None, f"model accuracy {self.gate_words} {number(gate)} < "
                     f"{self.model_accuracy}", {"model_accuracy": gate})
    return None

  def period_outcome(self, found: Analysed | None, length: int, p: float | None,
                     gate: Outcome | None) -> Outcome:
    """Holds on a detected period of exactly ``length`` with phase-test p (``p``, else the
    raw one) below ``standards.PERIOD_ALPHA``; fails without one only where the setting
    bites (accuracy within ``bites``) and the offsets hold 3 periods of ``length``."""
    if gate is not None:
      return gate
    if found is None:
      return Outcome(None, "correctness matrix not stored", {})
    p = found.p_at[length] if p is None else p
    periodic = found.detected_period == length and p < standards.PERIOD_ALPHA
    numbers = dict(found.numbers(), p_judged=p)
    if periodic:
      return Outcome(True, "", numbers)
    if found.num_offsets < 3 * length:  # the period scan cannot name the length
      return Outcome(None, f"{found.num_offsets} offsets hold fewer than 3 periods of {length}",
                     numbers)
    low, high = self.bites
    if not low <= found.accuracy <= high:
      return Outcome(None, f"accuracy {self.under} {found.accuracy:.3f} outside "
                     f"[{low}, {high}]: no phase can show", numbers)
    return Outcome(False, "", numbers)

  def periods(self, groups: Sequence[Group], length_of: Callable[[Group], int], evidence, *,
              rules: claim_rules.Rules | None = None,
              extra: Callable[[Group], Mapping[str, Any]] | None = None
              ) -> dict[str, tuple[list[Outcome], Outcome]]:
    """The period test of each group at its length, per seed and on the seeds pooled
    (``Group.pooled(rules)``), Holm over the groups' pooled tests; ``extra``: numbers the
    pooled outcome adds."""
    kw = resampling(evidence)
    per_seed = {g.name: [analyse(r.matrix, [length_of(g)], **kw) for r in g.runs]
                for g in groups}
    pooled = {g.name: analyse(g.pooled(rules), [length_of(g)], **kw) for g in groups}
    adjusted = holm_of([(g.name, pooled[g.name].p_at[length_of(g)]) for g in groups
                         if pooled[g.name] is not None])
    out = {}
    for g in groups:
      seeds = [self.period_outcome(a, length_of(g), None, self.gate(r))
               for r, a in zip(g.runs, per_seed[g.name], strict=True)]
      p = adjusted.get(g.name)
      pool = self.period_outcome(pooled[g.name], length_of(g), p, self.gate(g))
      pool.numbers.update(p_value_holm=p, holm_family=len(adjusted),
                          **(extra(g) if extra is not None else {}))
      out[g.name] = (seeds, pool)
    return out

  def flat_outcome(self, found: Analysed | None, lengths: Sequence[int],
                   p_of: Callable[[int], float], gate: Outcome | None, floor: float,
                   numbers: Mapping[str, Any] | None = None,
                   missing: str = "") -> tuple[Outcome | None, bool, dict[str, Any]]:
    """The "no period" test (``standards.no_period``) at each of ``lengths``, ``p_of`` giving
    the p judged: (an undecided outcome or None, whether no length is periodic, the numbers
    with ``p_judged``). Undecided by the gate, without a matrix, with ``missing`` (a reason
    there is nothing to test against) or with accuracy below ``floor`` (a setting that keeps
    no needle has no period either)."""
    if gate is not None:
      return gate, False, {}
    if found is None:
      return Outcome(None, "correctness matrix not stored", {}), False, {}
    numbers = dict(found.numbers(), **(numbers or {}))
    if missing:
      return Outcome(None, missing, numbers), False, numbers
    if found.accuracy < floor:
      return Outcome(None, f"accuracy {self.under} {found.accuracy:.3f} < {floor}",
                     numbers), False, numbers
    p_judged = {m: p_of(m) for m in lengths}
    flat = all(standards.no_period(p, found.detected_period) for p in p_judged.values())
    numbers.update(p_judged={str(m): p for m, p in p_judged.items()})
    return None, flat, numbers
