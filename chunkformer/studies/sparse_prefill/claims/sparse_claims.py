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

from collections.abc import Callable, Mapping, Sequence

from chunkformer import sparse_prefill
from chunkformer.evaluation.claims import grouped, standards
from chunkformer.evaluation.claims import rules as claim_rules
from chunkformer.evaluation.claims.grouped import Outcome, holm_of
from chunkformer.evaluation.records.claim import Claim
from chunkformer.evaluation.records.formatting import number
from chunkformer.studies.sparse_prefill.claims import sparse_data as data

STATEMENTS = {
    "P1": "block-sparse prefill with blocks of B tokens gives an accuracy period of exactly B",
    "P2": "vertical-slash prefill has no period at the block sizes",
}
BITES = (0.02, 0.98)  # P1: accuracy range in which a missing period counts against the claim
FLAT_ACCURACY = standards.LEARNED_ACCURACY  # P2: below it a missing period says nothing


def _resampling(evidence) -> dict[str, int]:
  return dict(seed=evidence.seed, num_resamples=evidence.num_resamples,
              num_permutations=evidence.num_permutations)


def _no_data(claim_id: str, why: str) -> Claim:
  return grouped.no_data(claim_id, STATEMENTS[claim_id], why)


def _gate(run_or_group) -> Outcome | None:
  gate = run_or_group.gate
  if gate is None or gate < data.MODEL_ACCURACY:
    return Outcome(None, f"model accuracy with a dense prefill {number(gate)} < "
                   f"{data.MODEL_ACCURACY}", {"model_accuracy": gate})
  return None


def _combine(claim_id: str, per_group: Mapping[str, tuple[list[Outcome], Outcome]],
             in_force: claim_rules.Rules) -> Claim:
  """The seed rule per group, the common verdict over groups (``claims.grouped``)."""
  return grouped.combine(claim_id, STATEMENTS[claim_id], per_group, in_force,
                         "pattern configurations")


# --- P1 ----------------------------------------------------------------------------------


def _period_outcome(found: grouped.Analysed | None, block: int, p: float | None,
                    gate: Outcome | None) -> Outcome:
  if gate is not None:
    return gate
  if found is None:
    return Outcome(None, "correctness matrix not stored", {})
  p = found.p_at[block] if p is None else p
  periodic = found.detected_period == block and p < standards.PERIOD_ALPHA
  numbers = dict(found.numbers(), p_judged=p)
  if periodic:
    return Outcome(True, "", numbers)
  if found.num_offsets < 3 * block:  # the period scan cannot name B
    return Outcome(None, f"{found.num_offsets} offsets hold fewer than 3 periods of {block}",
                   numbers)
  low, high = BITES
  if not low <= found.accuracy <= high:
    return Outcome(None, f"accuracy under sparse prefill {found.accuracy:.3f} outside "
                   f"[{low}, {high}]: no phase can show", numbers)
  return Outcome(False, "", numbers)


def p1_claim(evidence) -> Claim:
  groups = data.of_kind(data.collect(evidence.records, evidence.matrices),
                        sparse_prefill.BlockSparse)
  if not groups:
    return _no_data("P1", "no block-sparse pattern in the sweep's sparse_needles results")
  kw = _resampling(evidence)
  per_seed = {g.name: [grouped.analyse(r.matrix, [g.block], **kw) for r in g.runs] for g in groups}
  pooled = {g.name: grouped.analyse(g.pooled(evidence.rules), [g.block], **kw) for g in groups}
  adjusted = holm_of([(g.name, pooled[g.name].p_at[g.block]) for g in groups
                       if pooled[g.name] is not None])
  out = {}
  for g in groups:
    seeds = [_period_outcome(a, g.block, None, _gate(r))
             for r, a in zip(g.runs, per_seed[g.name], strict=True)]
    p = adjusted.get(g.name)
    pool = _period_outcome(pooled[g.name], g.block, p, _gate(g))
    pool.numbers.update(p_value_holm=p, holm_family=len(adjusted), kept_fraction=g.kept)
    out[g.name] = (seeds, pool)
  return _combine("P1", out, evidence.rules)


# --- P2 ----------------------------------------------------------------------------------


def _flat_outcome(found: grouped.Analysed | None, sizes: Sequence[int],
                  p_of: Callable[[int], float], gate: Outcome | None) -> Outcome:
  if gate is not None:
    return gate
  if found is None:
    return Outcome(None, "correctness matrix not stored", {})
  numbers = found.numbers()
  if found.accuracy < FLAT_ACCURACY:
    return Outcome(None, f"accuracy under sparse prefill {found.accuracy:.3f} < "
                   f"{FLAT_ACCURACY}", numbers)
  p_judged = {m: p_of(m) for m in sizes}
  flat = all(standards.no_period(p, found.detected_period) for p in p_judged.values())
  numbers.update(p_judged={str(m): p for m, p in p_judged.items()})
  return Outcome(flat, "" if flat else "periodic", numbers)


def p2_claim(evidence) -> Claim:
  groups = data.collect(evidence.records, evidence.matrices)
  lines = data.of_kind(groups, sparse_prefill.VerticalSlash)
  sizes = data.block_sizes(groups)
  if not lines:
    return _no_data("P2", "no vertical-slash pattern in the sweep's sparse_needles results")
  if not sizes:
    return _no_data("P2", "no block-sparse pattern in the sweep: no block size to test at")
  kw = _resampling(evidence)
  pooled = {g.name: grouped.analyse(g.pooled(evidence.rules), sizes, **kw) for g in lines}
  adjusted = holm_of([((g.name, m), pooled[g.name].p_at[m]) for g in lines
                       if pooled[g.name] is not None for m in sizes])
  out = {}
  for g in lines:
    seeds = []
    for run in g.runs:
      found = grouped.analyse(run.matrix, sizes, **kw)
      seeds.append(_flat_outcome(found, sizes, lambda m, f=found: f.p_at[m], _gate(run)))
    pool = _flat_outcome(pooled[g.name], sizes, lambda m, n=g.name: adjusted[(n, m)],
                         _gate(g))
    pool.numbers.update(holm_family=len(adjusted), kept_fraction=g.kept)
    out[g.name] = (seeds, pool)
  return _combine("P2", out, evidence.rules)
