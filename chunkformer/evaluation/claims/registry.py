"""``CLAIMS``: every claim a sweep is judged on, id -> one function of the ``Evidence``.

The engine holds no claim of its own: each study registers its claims and its judging hooks
(``register``) when the studies are installed (``chunkformer.studies.install``). A claim
function returns one ``records.claim.Claim`` (its verdict one of the seed rule's words, its
reason and the numbers it rests on); the registry's order is the order of results.json's
``claims`` and of the report's claim table.

A study's ``Judging`` hooks run once per judgment: ``prepare`` derives what its claims share
from the engine's evidence (kept in ``Evidence.prepared[study]``), ``verdict_lines`` gives the
lines it adds before the claims' own, ``tables`` the statistics its report sections show
(``Judged.tables[study]``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from chunkformer.evaluation.claims import rules as claim_rules
from chunkformer.evaluation.claims import seed_pooling
from chunkformer.evaluation.records import correctness
from chunkformer.evaluation.records.claim import Claim
from chunkformer.evaluation.records.loss_rows import RowsLoader
from chunkformer.evaluation.records.variant import VariantRecord


@dataclasses.dataclass(frozen=True)
class Evidence:
  """What a claim may rest on: every record of the sweep, their seed-pooled records, the
  stored matrices and loss rows, the resampling settings, the plan flags, the claim rules it
  is judged under (``claims.rules``), and what each study's ``prepare`` derived from these
  (``prepared[study]``)."""

  records: tuple[VariantRecord, ...]
  pooled: Mapping[str, VariantRecord]  # variant -> seed-pooled record (``seed_pooling``)
  matrices: correctness.Loader | None  # unit -> its correctness matrices
  seed: int = 0
  num_resamples: int = 2000
  num_permutations: int = 2000
  # unit -> why its verdicts are flagged: trained under another plan or none (``plan_check``)
  plan_flags: Mapping[str, str] = dataclasses.field(default_factory=dict)
  loss_rows: RowsLoader | None = None  # unit -> its per-token loss rows
  prepared: Mapping[str, Any] = dataclasses.field(default_factory=dict)
  rules: claim_rules.Rules = claim_rules.CURRENT_RULES

  @property
  def resampling(self) -> dict[str, int]:
    return dict(seed=self.seed, num_resamples=self.num_resamples,
                num_permutations=self.num_permutations)


ClaimFunction = Callable[[Evidence], Claim]


@dataclasses.dataclass(frozen=True)
class Judging:
  """A study's hooks into the judging step (module docstring)."""

  prepare: Callable[[Evidence], Any] | None = None
  verdict_lines: Callable[[Evidence], Sequence[str]] | None = None
  tables: Callable[[Evidence], Any] | None = None


CLAIMS: dict[str, ClaimFunction] = {}
JUDGING: dict[str, Judging] = {}  # study -> its hooks, in the order the studies are installed


def register(study: str, claims: Mapping[str, ClaimFunction], judging: Judging) -> None:
  """Adds a study's claims (an id taken by another study is refused) and judging hooks."""
  for claim_id, function in claims.items():
    if CLAIMS.get(claim_id, function) is not function:
      raise ValueError(f"claim {claim_id!r} of study {study!r} is registered already")
    CLAIMS[claim_id] = function
  JUDGING[study] = judging


def evidence(records: Sequence[VariantRecord], matrices: correctness.Loader | None, *,
             pooled: Mapping[str, VariantRecord] | None = None, seed: int = 0,
             num_resamples: int = 2000, num_permutations: int = 2000,
             plan_flags: Mapping[str, str] | None = None,
             loss_rows: RowsLoader | None = None,
             rules: claim_rules.Rules = claim_rules.CURRENT_RULES) -> Evidence:
  """The evidence of a sweep under ``rules`` (default: the current ones), each installed
  study's part prepared; ``pooled`` computed from ``matrices`` when not given."""
  resampling = dict(seed=seed, num_resamples=num_resamples, num_permutations=num_permutations)
  if pooled is None:
    pooled = seed_pooling.pooled_records(records, matrices, rules=rules, **resampling)
  base = Evidence(tuple(records), dict(pooled), matrices, **resampling,
                  plan_flags=dict(plan_flags or {}), loss_rows=loss_rows, rules=rules)
  prepared = {}
  for study, hooks in JUDGING.items():
    if hooks.prepare is not None:
      prepared[study] = hooks.prepare(dataclasses.replace(base, prepared=dict(prepared)))
  return dataclasses.replace(base, prepared=prepared)


def decide(records: Sequence[VariantRecord], matrices: correctness.Loader | None = None,
           **kwargs) -> list[Claim]:
  """Every claim of ``CLAIMS`` in its order (kwargs: ``evidence``'s)."""
  return decide_on(evidence(records, matrices, **kwargs))


def decide_on(found: Evidence) -> list[Claim]:
  """Every claim of ``CLAIMS`` in its order, on evidence already gathered."""
  return [claim(found) for claim in CLAIMS.values()]
