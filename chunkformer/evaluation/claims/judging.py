"""The judging step of a sweep: records and stored matrices in; claims, verdict lines, the
seed-pooled records and the statistics of the report's tables out (``Judged``).

Everything here is recomputable from a sweep directory alone: the records (results.json), the
correctness matrices (``DIR/correct/``) and a language model's per-token loss rows
(``DIR/lm_loss/``), with the sweep's seed and resample counts. The sweep calls ``judge`` once
and hands the result to ``report``, which formats it and computes nothing: every number a
report shows is in ``Judged`` (the claims, the lines, or a study's ``tables``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

from chunkformer.evaluation.claims import plan_check, registry
from chunkformer.evaluation.claims import rules as claim_rules
from chunkformer.evaluation.records import correctness
from chunkformer.evaluation.records.claim import Claim
from chunkformer.evaluation.records.loss_rows import RowsLoader
from chunkformer.evaluation.records.variant import VariantRecord


@dataclasses.dataclass(frozen=True)
class Judged:
  claims: tuple[Claim, ...]
  verdicts: tuple[str, ...]  # the studies' verdict lines, then the lines the claims carry
  pooled: Mapping[str, VariantRecord]  # variant -> its seed-pooled record (``seed_pooling``)
  tables: Mapping[str, Any]  # study -> the statistics its report sections show
  evidence: registry.Evidence | None = None
  rules: claim_rules.Rules = claim_rules.CURRENT_RULES  # the deciding rules
  # Every claim under the current rules, when the deciding rules are older (else empty).
  current: tuple[Claim, ...] = ()


def judge(records: Sequence[VariantRecord], matrices: correctness.Loader | None, *,
          loss_rows: RowsLoader | None = None, seed: int = 0, num_resamples: int = 2000,
          num_permutations: int = 2000, plan: Mapping[str, Any] | None = None,
          rules: str = claim_rules.CURRENT) -> Judged:
  """Judges a sweep's records (module docstring); ``matrices`` reads a unit's correctness
  matrices (``correctness.loader``), ``loss_rows`` its loss rows (``loss_rows.loader``);
  ``plan``: the sweep's plan file as it is now (``provenance.file_state``), against which
  every unit's verdict lines are flagged (``plan_check``); ``rules``: the version of the
  claim rules that decides."""
  deciding = claim_rules.get(rules)
  kw = dict(seed=seed, num_resamples=num_resamples, num_permutations=num_permutations,
            plan_flags=plan_check.flags(records, plan), loss_rows=loss_rows)
  found = registry.evidence(records, matrices, rules=deciding, **kw)
  lines = [line for hooks in registry.JUDGING.values() if hooks.verdict_lines
           for line in hooks.verdict_lines(found)]
  claims = registry.decide_on(found)
  lines += [line for c in claims for line in c.numbers.get("lines", ())]
  tables = {study: hooks.tables(found) for study, hooks in registry.JUDGING.items()
            if hooks.tables}
  current = ()
  if deciding.version != claim_rules.CURRENT:
    current = tuple(registry.decide_on(registry.evidence(
        records, matrices, rules=claim_rules.CURRENT_RULES, **kw)))
  return Judged(tuple(claims), tuple(lines), found.pooled, tables, found, deciding, current)
