"""Claims P1-P2: sparse prefill and the periodic weak spot (docs/claims.md).

Read from the ``sparse_needles`` probe's correctness matrices (``sparse_data``); a group is one
pattern at one depth on one model variant, judged per seed and seed-pooled, then by the one
seed rule (``stats.seed_rule``: at least min(2, n) seeds AND the pooled test); over groups the
common verdict of those that decide (``seed_rule.common_verdict``). A seed whose model misses
``sparse_data.MODEL_ACCURACY`` with a dense prefill is undecided. Holm within each claim over
its seed-pooled tests; the per-seed tests stay at their own level (as for E1-E3).

- P1: block-sparse prefill with blocks of B tokens gives an accuracy period of exactly B:
  detected period = B and phase-test p < 0.01 at B (E1's test). Not periodic counts as failing
  only where sparsity bites: accuracy within [0.02, 0.98].
- P2: vertical-slash prefill has no period at the block sizes (the B of the sweep's
  block-sparse patterns): the one "no period" standard (``standards.no_period``) at every B.
  Undecided when its accuracy is below 0.5 (E2's gate) or the sweep has no block-sparse B.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from chunkformer import sparse_prefill
from chunkformer.evaluation.claims import grouped, standards
from chunkformer.evaluation.claims.grouped import Outcome, holm_of
from chunkformer.evaluation.records.claim import Claim
from chunkformer.studies.sparse_prefill.claims import sparse_data as data

STATEMENTS = {
    "P1": "block-sparse prefill with blocks of B tokens gives an accuracy period of exactly B",
    "P2": "vertical-slash prefill has no period at the block sizes",
}
BITES = (0.02, 0.98)  # P1: accuracy range in which a missing period counts against the claim
FLAT_ACCURACY = standards.LEARNED_ACCURACY  # P2: below it a missing period says nothing
JUDGE = grouped.Judge(STATEMENTS, "pattern configurations", data.MODEL_ACCURACY,
                      "with a dense prefill", "under sparse prefill", BITES)


def _kept(group: data.Group) -> dict[str, float]:
  return {"kept_fraction": data.kept(group)}


# --- P1 ----------------------------------------------------------------------------------


def p1_claim(evidence) -> Claim:
  groups = data.of_kind(data.collect(evidence.records, evidence.matrices),
                        sparse_prefill.BlockSparse)
  if not groups:
    return JUDGE.no_data("P1", "no block-sparse pattern in the sweep's sparse_needles results")
  return JUDGE.combine("P1", JUDGE.periods(groups, data.block, evidence, rules=evidence.rules,
                                           extra=_kept), evidence.rules)


# --- P2 ----------------------------------------------------------------------------------


def _flat_outcome(found: grouped.Analysed | None, sizes: Sequence[int],
                  p_of: Callable[[int], float], gate: Outcome | None) -> Outcome:
  undecided, flat, numbers = JUDGE.flat_outcome(found, sizes, p_of, gate, FLAT_ACCURACY)
  return undecided or Outcome(flat, "" if flat else "periodic", numbers)


def p2_claim(evidence) -> Claim:
  groups = data.collect(evidence.records, evidence.matrices)
  lines = data.of_kind(groups, sparse_prefill.VerticalSlash)
  sizes = data.block_sizes(groups)
  if not lines:
    return JUDGE.no_data("P2", "no vertical-slash pattern in the sweep's sparse_needles results")
  if not sizes:
    return JUDGE.no_data("P2", "no block-sparse pattern in the sweep: no block size to test at")
  kw = grouped.resampling(evidence)
  pooled = {g.name: grouped.analyse(g.pooled(evidence.rules), sizes, **kw) for g in lines}
  adjusted = holm_of([((g.name, m), pooled[g.name].p_at[m]) for g in lines
                       if pooled[g.name] is not None for m in sizes])
  out = {}
  for g in lines:
    seeds = []
    for run in g.runs:
      found = grouped.analyse(run.matrix, sizes, **kw)
      seeds.append(_flat_outcome(found, sizes, lambda m, f=found: f.p_at[m], JUDGE.gate(run)))
    pool = _flat_outcome(pooled[g.name], sizes, lambda m, n=g.name: adjusted[(n, m)],
                         JUDGE.gate(g))
    pool.numbers.update(holm_family=len(adjusted), kept_fraction=data.kept(g))
    out[g.name] = (seeds, pool)
  return JUDGE.combine("P2", out, evidence.rules)
