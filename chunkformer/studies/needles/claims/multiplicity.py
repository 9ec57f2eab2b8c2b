"""The phase tests as the claims read them: Holm within each claim, the haystack-level test
beside the offset-level one (``judgments.Adjusted`` per record name).

Holm's family of a claim (``stats.holm``): the phase tests of its seed-pooled records, one per
variant (a variant with one seed is its own pooled record): the far-depth p-value at M, and
for the cures (C8, C9) also the all-depths one. The seed rule needs the pooled test to agree
with the seeds, so a claim can only be carried by a false pooled test if one of these passes
by chance: Holm bounds that at the claim's level. The per-seed tests stay at their own level
(they are the replications the seed rule counts; with the sweep's 2000 permutations a p-value
cannot fall below 1/2001, so Holm over every seed's test would fail C1 whatever the data).
C5 (intervals) and C6 (Bonferroni over its sites) correct on their own.

The haystack-level test (``stats.haystack_test``) of each cure, per seed and seed-pooled, from
the stored correctness matrices: the far depth and all depths pooled, at the cure's M.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

from chunkformer.evaluation.claims import rules as claim_rules
from chunkformer.evaluation.claims import seed_pooling
from chunkformer.evaluation.records import correctness
from chunkformer.evaluation.records.variant import VariantRecord
from chunkformer.evaluation.stats.holm import holm
from chunkformer.studies.needles.claims import judgments
from chunkformer.studies.needles.stats.haystack_test import haystack_phase_test


def holm_families(pooled: Mapping[str, VariantRecord]
                  ) -> dict[str, list[tuple[str, str, float]]]:
  """claim -> its family: (record name, "far" or "all_depths", raw p-value)."""
  families: dict[str, list[tuple[str, str, float]]] = {}
  for r in pooled.values():
    claim = judgments.claim_of(r)
    if claim is None or r.analysis.p_value is None:
      continue
    family = families.setdefault(claim, [])
    family.append((r.name, "far", r.analysis.p_value))
    if judgments.is_cure(r) and r.all_depths is not None:
      family.append((r.name, "all_depths", r.all_depths.p_value))
  return families


def _haystack(runs: Sequence[VariantRecord], load: correctness.Loader, *, seed: int,
              num_permutations: int, rules: claim_rules.Rules
              ) -> tuple[float | None, float | None]:
  """The haystack-level p-values (far, all depths) of the runs' rows pooled as the claim
  rules say (the current ones: each haystack's outcome averaged over the seeds)."""
  loaded = [load(r.name) for r in runs]
  name = runs[0].primary_matrix_name
  if name is None or any(m is None or name not in m for m in loaded):
    return None, None
  far = [m[name] for m in loaded]
  if any(not np.array_equal(m.offsets_J, far[0].offsets_J) for m in far):
    return None, None
  offsets, size = far[0].offsets_J, runs[0].chunk_size
  kw = dict(num_permutations=num_permutations, seed=seed)
  p_far = haystack_phase_test(rules.pool([m.correct_YxJ for m in far]), offsets, size, **kw)
  rows = seed_pooling.all_depth_rows(loaded, seed_pooling.needle_depths(runs[0], loaded))
  p_all = None if rows is None else haystack_phase_test(rules.pool(rows), offsets, size, **kw)
  return p_far, p_all


def adjusted_tests(records: Sequence[VariantRecord], pooled: Mapping[str, VariantRecord],
                   load: correctness.Loader | None, *, seed: int = 0,
                   num_permutations: int = 2000,
                   rules: claim_rules.Rules = claim_rules.CURRENT_RULES
                   ) -> dict[str, judgments.Adjusted]:
  """record name -> ``judgments.Adjusted`` (module docstring), for the records and their
  seed-pooled records."""
  holm_of: dict[tuple[str, str], tuple[float, int]] = {}
  for family in holm_families(pooled).values():
    for (name, which, _), q in zip(family, holm([p for *_, p in family]), strict=True):
      holm_of[(name, which)] = (float(q), len(family))
  haystack: dict[str, tuple[float | None, float | None]] = {}
  if load is not None:
    groups = seed_pooling.by_variant(records)
    for r in records:
      if judgments.is_cure(r) and r.primary_probe == "needle":
        haystack[r.name] = _haystack([r], load, seed=seed, num_permutations=num_permutations,
                                    rules=rules)
    for variant, p in pooled.items():
      if judgments.is_cure(p) and p.name not in haystack:
        haystack[p.name] = _haystack(groups[variant], load, seed=seed,
                                     num_permutations=num_permutations, rules=rules)
  out = {}
  for name in {n for n, _ in holm_of} | set(haystack):
    far, every = holm_of.get((name, "far")), holm_of.get((name, "all_depths"))
    h_far, h_all = haystack.get(name, (None, None))
    out[name] = judgments.Adjusted(
        far=None if far is None else far[0], all_depths=None if every is None else every[0],
        family=0 if far is None else far[1], haystack_far=h_far, haystack_all_depths=h_all)
  return out
