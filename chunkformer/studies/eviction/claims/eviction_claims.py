"""Claims E1-E3: inference-time KV eviction and the periodic weak spot (docs/claims.md).

Read from the ``eviction_needles`` probe's correctness matrices (``eviction_data``); a group is
one policy at one depth on one model variant, judged per seed and seed-pooled, then by the one
seed rule (``stats.seed_rule``: at least min(2, n) seeds AND the pooled test); over groups the
common verdict of those that decide (``seed_rule.common_verdict``). A seed whose model misses
``eviction_data.MODEL_ACCURACY`` before eviction is undecided. Holm within each claim over its
seed-pooled tests; the per-seed tests stay at their own level (as for C1-C9).

- E1: fixed-block eviction (ChunkKV as published, whole chunks on a grid of L tokens from
  position 0) gives an accuracy period of exactly L: detected period = L and phase-test
  p < 0.01 at L (C1's test). Not periodic counts as failing only where eviction bites:
  accuracy within [0.02, 0.98].
- E2: content-chunked eviction (ChunkKV with delimiter chunks) removes it at equal budget:
  against the ChunkKV groups of the same variant, depth and budget setting (whole chunks
  keep up to L - 1 tokens fewer) that are periodic (E1's test, raw p) in the same seed
  (pooled: pooled), no period by the one "no period" standard
  (``standards.no_period``: p > 0.05 at each such L, no detected period) AND a smaller gap at
  each such L. Undecided without a periodic baseline, or when its accuracy is below 0.5 (a
  policy that keeps no needle has no period either).
- E1 and E2 also read the cut-chunk variant (``chunkkv_cut``) by the same tests, beside the
  verdict and never deciding it (``_beside``).
- E3: SnapKV retrieves more needles than StreamingLLM at equal budget: the paired sign-flip
  test over haystacks (``stats.sign_flip``); a seed holds when p < 0.05 with SnapKV ahead,
  fails when p < 0.05 with StreamingLLM ahead, else undecided.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence

from chunkformer import eviction
from chunkformer.evaluation.claims import grouped, standards
from chunkformer.evaluation.claims import rules as claim_rules
from chunkformer.evaluation.claims.grouped import Outcome, holm_of
from chunkformer.evaluation.records.claim import Claim
from chunkformer.studies.eviction.claims import eviction_data as data
from chunkformer.studies.eviction.stats.sign_flip import paired_rows, sign_flip_test

STATEMENTS = {
    "E1": "fixed-block eviction (ChunkKV, chunks of L tokens on a grid from position 0) gives "
          "an accuracy period of exactly L",
    "E2": "content-chunked eviction (ChunkKV with chunks closed by the delimiter rule) removes "
          "that period at equal budget",
    "E3": "SnapKV retrieves more needles than StreamingLLM at equal budget",
    # E4-E6 restate E1-E3 for the lookup test (``lookup_claims``, plan version 5)
    "E4": "fixed-block eviction (ChunkKV, chunks of L tokens on a grid from position 0) gives "
          "a lookup accuracy period of L",
    "E5": "content-chunked eviction (ChunkKV with chunks closed at every value token) removes "
          "that lookup period at equal budget",
    "E6": "SnapKV answers more lookups than StreamingLLM at equal budget",
}
BITES = (0.02, 0.98)  # E1: accuracy range in which a missing period counts against the claim
CURE_ACCURACY = standards.LEARNED_ACCURACY  # E2: below it a missing period says nothing
PAIRED_ALPHA = 0.05  # E3
JUDGE = grouped.Judge(STATEMENTS, "policy configurations", data.MODEL_ACCURACY,
                      "before eviction", "under eviction", BITES)


def no_data(claim_id: str, why: str) -> Claim:
  """``claim_id`` INCONCLUSIVE for lack of data, saying which."""
  return JUDGE.no_data(claim_id, why)


def combine(claim_id: str, per_group: Mapping[str, tuple[list[Outcome], Outcome]],
            in_force: claim_rules.Rules = claim_rules.CURRENT_RULES) -> Claim:
  """The seed rule per group (as the claim rules ``in_force`` say; default: the current
  ones), the common verdict over the policy configurations (``claims.grouped``)."""
  return JUDGE.combine(claim_id, per_group, in_force)


# --- E1 ----------------------------------------------------------------------------------


def _chunk(group: data.Group) -> int:
  return group.setting.chunk


def _periods(groups: Sequence[data.Group], evidence) -> dict[str, tuple[list[Outcome], Outcome]]:
  """E1's test of each grid group, per seed and pooled (Holm over ``groups``' pooled tests)."""
  return JUDGE.periods(groups, _chunk, evidence)


# The cut-chunk ChunkKV (``chunkkv_cut``) is judged by the same test beside ChunkKV as
# published and never decides: the claims name ChunkKV, which keeps whole chunks.
BESIDE = "chunkkv_cut (beside, not deciding)"


def _beside(claim: Claim, variant: Claim | None) -> Claim:
  """``claim`` with the cut-chunk variant's own reading added to its reason and numbers."""
  if variant is None:
    return claim
  return dataclasses.replace(
      claim, reason=f"{claim.reason}; beside it, not deciding, the cut-chunk variant "
      f"chunkkv_cut reads {variant.verdict} ({variant.seeds_agreeing} seeds): {variant.reason}",
      numbers={**claim.numbers, BESIDE: {"verdict": variant.verdict,
                                         "seeds_agreeing": variant.seeds_agreeing,
                                         "groups": dict(variant.numbers)}})


def e1_claim(evidence) -> Claim:
  found = data.collect(evidence.records, evidence.matrices)
  groups = data.of_kind(found, eviction.ChunkKV)
  if not groups:
    return no_data("E1", "no ChunkKV policy in the sweep's eviction_needles results")
  cut = data.of_kind(found, eviction.ChunkKVCut)
  return _beside(combine("E1", _periods(groups, evidence), evidence.rules),
                 combine("E1", _periods(cut, evidence), evidence.rules) if cut else None)


# --- E2 ----------------------------------------------------------------------------------


def _cure_outcome(found: grouped.Analysed | None, baselines: Mapping[int, grouped.Analysed],
                  p_of: Callable[[int], float], gate: Outcome | None) -> Outcome:
  """Content chunks against the periodic fixed grids ``baselines`` (L -> their analysis)."""
  undecided, flat, numbers = JUDGE.flat_outcome(
      found, list(baselines), p_of, gate, CURE_ACCURACY,
      dict(periodic_baselines=sorted(baselines)),
      "" if baselines else "no periodic fixed-block baseline at this budget")
  if undecided is not None:
    return undecided
  smaller = all(found.gap_at[m] is not None and b.gap_at[m] is not None
                and found.gap_at[m] < b.gap_at[m] for m, b in baselines.items())
  numbers.update(baseline_gap={str(m): b.gap_at[m] for m, b in baselines.items()})
  why = "" if flat and smaller else ("still periodic" if not flat else "gap not smaller")
  return Outcome(flat and smaller, why, numbers)


def _periodic(found: grouped.Analysed | None, length: int) -> bool:
  return (found is not None and found.detected_period == length
          and found.p_at[length] < standards.PERIOD_ALPHA)


def _cures(cures: Sequence[data.Group], grids: Sequence[data.Group],
           evidence) -> dict[str, tuple[list[Outcome], Outcome]]:
  """E2's test of each content group against the ``grids`` at its budget setting."""
  kw = grouped.resampling(evidence)
  bases = {c.name: [g for g in grids if data.same_budget_setting(g, c)] for c in cures}
  lengths = {c.name: sorted({_chunk(g) for g in bases[c.name]}) for c in cures}
  base_seed = {g.name: {r.seed: grouped.analyse(r.matrix, [_chunk(g)], **kw) for r in g.runs}
               for g in grids}
  base_pool = {g.name: grouped.analyse(g.pooled(), [_chunk(g)], **kw) for g in grids}
  pooled = {c.name: grouped.analyse(c.pooled(), lengths[c.name], **kw) for c in cures}
  adjusted = holm_of([((c.name, m), pooled[c.name].p_at[m]) for c in cures
                       if pooled[c.name] is not None for m in lengths[c.name]])
  out = {}
  for c in cures:
    if not lengths[c.name]:
      none = Outcome(None, "no ChunkKV policy at equal budget", {})
      out[c.name] = ([none] * len(c.runs), none)
      continue
    seeds = []
    for run in c.runs:
      found = grouped.analyse(run.matrix, lengths[c.name], **kw)
      periodic = {_chunk(g): base_seed[g.name][run.seed] for g in bases[c.name]
                  if _periodic(base_seed[g.name].get(run.seed), _chunk(g))}
      seeds.append(_cure_outcome(found, periodic, lambda m, f=found: f.p_at[m], JUDGE.gate(run)))
    periodic = {_chunk(g): base_pool[g.name] for g in bases[c.name]
                if _periodic(base_pool[g.name], _chunk(g))}
    pool = _cure_outcome(pooled[c.name], periodic, lambda m, n=c.name: adjusted[(n, m)],
                         JUDGE.gate(c))
    pool.numbers.update(holm_family=len(adjusted))
    out[c.name] = (seeds, pool)
  return out


def e2_claim(evidence) -> Claim:
  groups = data.collect(evidence.records, evidence.matrices)
  cures = data.of_kind(groups, eviction.ContentChunkKV)
  if not cures:
    return no_data("E2", "no content-chunked ChunkKV policy in the sweep's eviction_needles "
                    "results")
  cut = data.of_kind(groups, eviction.ChunkKVCut)
  published = data.of_kind(groups, eviction.ChunkKV)
  return _beside(combine("E2", _cures(cures, published, evidence), evidence.rules),
                 combine("E2", _cures(cures, cut, evidence), evidence.rules) if cut else None)


# --- E3 ----------------------------------------------------------------------------------


def _paired_outcome(a: Sequence, b: Sequence, gate: Outcome | None, *, seed: int,
                    num_permutations: int, adjust: Callable[[float], float] | None = None
                    ) -> tuple[Outcome, float | None]:
  """(the judgment, its raw p) of SnapKV's matrices ``a`` against StreamingLLM's ``b``."""
  if gate is not None:
    return gate, None
  if any(m is None for m in (*a, *b)):
    return Outcome(None, "correctness matrix not stored", {}), None
  test = sign_flip_test(*paired_rows([m.correct_YxJ for m in a], [m.correct_YxJ for m in b]),
                        num_permutations=num_permutations, seed=seed)
  p = test.p_value if adjust is None else adjust(test.p_value)
  numbers = {"snapkv_accuracy": test.mean_a, "streaming_llm_accuracy": test.mean_b,
             "difference": test.difference, "p_value": test.p_value, "p_judged": p,
             "haystacks": test.num_haystacks}
  if p >= PAIRED_ALPHA:
    return Outcome(None, f"no significant difference (p = {p:.3g})", numbers), test.p_value
  return Outcome(test.difference > 0, "", numbers), test.p_value


def e3_claim(evidence) -> Claim:
  groups = data.collect(evidence.records, evidence.matrices)
  pairs = [(a, b) for a in data.of_kind(groups, eviction.SnapKV)
           for b in data.of_kind(groups, eviction.StreamingLLM) if data.same_setting(a, b)]
  if not pairs:
    return no_data("E3", "no SnapKV and StreamingLLM policies at the same budget in the "
                    "sweep's eviction_needles results")
  kw = dict(seed=evidence.seed, num_permutations=evidence.num_permutations)
  raw = {}
  for a, b in pairs:
    common = [s for s in a.seeds if s in b.seeds]
    ra = [r.matrix for r in a.runs if r.seed in common]
    rb = [r.matrix for r in b.runs if r.seed in common]
    raw[(a.name, b.name)] = _paired_outcome(ra, rb, JUDGE.gate(a) or JUDGE.gate(b), **kw)[1]
  adjusted = holm_of([(k, p) for k, p in raw.items() if p is not None])
  out = {}
  for a, b in pairs:
    by_seed = {r.seed: r for r in b.runs}
    seeds = [_paired_outcome([r.matrix], [by_seed[r.seed].matrix], JUDGE.gate(r) or
                             JUDGE.gate(by_seed[r.seed]), **kw)[0]
             for r in a.runs if r.seed in by_seed]
    key = (a.name, b.name)
    common = [r for r in a.runs if r.seed in by_seed]
    pool = _paired_outcome([r.matrix for r in common],
                           [by_seed[r.seed].matrix for r in common], JUDGE.gate(a) or JUDGE.gate(b),
                           adjust=lambda p, k=key: adjusted[k], **kw)[0]
    pool.numbers.update(holm_family=len(adjusted))
    out[f"{a.name} vs {b.label}"] = (seeds, pool)
  return combine("E3", out, evidence.rules)
