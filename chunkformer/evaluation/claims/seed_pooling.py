"""Seed-pooled records: a variant's seeds judged as one model, the pooled half of the seed rule.

The seed rule for a claim over training seeds (``stats.seed_rule``): it holds when it holds in
at least 2 of the seeds AND the seed-pooled test agrees. The pooled test of a variant is the
same test as for one seed, on the seeds' matrices pooled as the claim rules say
(``rules.Rules.pool``: under the current rules each haystack's outcome averaged over the
seeds, the haystack as the unit, since every seed answers the same haystacks; under version 1
the rows stacked as more haystacks): the primary probe's matrix (far needle depth, or the
prefix probe), all depths pooled, and for dynamic models the phases inside the actual chunk
(which need one row per answer, so they stay stacked). The
correctness matrices (``DIR/correct/<unit>.npz``) are the data, so a merge or a recomputation
from results.json gives the same pooled record.

``pooled_records`` returns one record per variant: the seed-pooled one when the variant has
several seeds with matrices, the record itself when it has one seed (its own test is the
pooled test), and none when several seeds lack matrices (no pooled test can be made). The
pooled record keeps the first seed's setup with the unit name ``<variant> (N seeds pooled)``;
its held-out metrics are the seeds' mean (what the accuracy gates read); other fields that are
not recomputed from matrices (slot gains, split labels, per-depth analyses, and the
all-depths analysis where the seeds were asked different offsets at a depth) are dropped so
nothing in it mixes one seed's value with the pooled statistics.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence

import numpy as np

from chunkformer.evaluation import stats
from chunkformer.evaluation.claims import rules as claim_rules
from chunkformer.evaluation.records import correctness
from chunkformer.evaluation.records.variant import VariantRecord
from chunkformer.evaluation.stats.seed_rule import pool_seeds

Loader = correctness.Loader
POOLED_SUFFIX = "seeds pooled"


def pooled_name(variant: str, num_seeds: int) -> str:
  return f"{variant} ({num_seeds} {POOLED_SUFFIX})"


def by_variant(records: Sequence[VariantRecord]) -> dict[str, list[VariantRecord]]:
  """Records grouped by variant (the seeds of one variant), seeds ascending."""
  groups: dict[str, list[VariantRecord]] = {}
  for r in records:
    groups.setdefault(r.setup.variant, []).append(r)
  return {v: sorted(rs, key=lambda r: r.setup.seed) for v, rs in groups.items()}


def _same_offsets(matrices: Sequence[correctness.Matrix]) -> bool:
  return all(np.array_equal(m.offsets_J, matrices[0].offsets_J) for m in matrices)


def pool(runs: Sequence[VariantRecord], load: Loader, *, seed: int = 0,
         num_resamples: int = 2000, num_permutations: int = 2000,
         rules: claim_rules.Rules = claim_rules.CURRENT_RULES) -> VariantRecord | None:
  """One variant's seeds as one record (module docstring); None without comparable matrices."""
  name = runs[0].primary_matrix_name
  loaded = [load(r.name) for r in runs]
  if name is None or any(m is None or name not in m for m in loaded):
    return None
  primary = [m[name] for m in loaded]
  if not _same_offsets(primary):
    return None  # the seeds were not asked the same offsets: no pooled haystack rows
  first = runs[0]
  offsets = primary[0].offsets_J
  sizes = [t.chunk_size for t in first.analysis.by_chunk_size]
  kw = dict(seed=seed, num_resamples=num_resamples, num_permutations=num_permutations)
  pooled = rules.pool([m.correct_YxJ for m in primary])
  fields: dict = dict(analysis=stats.analyze(pooled, offsets, sizes, **kw), slot_gain=None,
                      slot_gain_init=None, split_labels=None, heldout=_mean_heldout(runs),
                      images={},
                      token_accuracy_by_offset=None, eval_wall_s=None, train_wall_s=None,
                      lm_phase_loss=None, depths=None, all_depths=None)
  if first.primary_probe == "needle":
    depths = needle_depths(first, loaded)
    rows = all_depth_rows(loaded, depths)
    if rows is not None:
      fields["all_depths"] = stats.analyze(rules.pool(rows), offsets, sizes, **kw).nested()
    near = max(depths, key=lambda d: _depth(first, d))
    fields["near_accuracy"] = float(rules.pool([m[near].correct_YxJ for m in loaded]).mean())
    if first.chunk_phase is not None and all(m.phases_YxJ is not None for m in primary):
      # Each answer has its own phase inside its chunk: the rows stay one per answer.
      phases = np.concatenate([m.phases_YxJ for m in primary])
      stacked = pool_seeds([m.correct_YxJ for m in primary])
      fields["chunk_phase"] = stats.analyze(stacked, offsets, sizes, phases=phases, **kw).phase
  setup = dataclasses.replace(first.setup, name=pooled_name(first.setup.variant, len(runs)))
  return dataclasses.replace(first, setup=setup, **fields)


def needle_depths(record: VariantRecord,
                  loaded: Sequence[Mapping[str, correctness.Matrix]]) -> list[str]:
  """The needle matrices' names, far to near: the order in which a unit stacks its depths for
  its own all-depths test."""
  names = {k for m in loaded for k in m if k.startswith(correctness.NEEDLE)}
  return sorted(names, key=lambda d: (_depth(record, d), d))


def all_depth_rows(loaded: Sequence[Mapping[str, correctness.Matrix]],
                   depths: Sequence[str]) -> list[np.ndarray] | None:
  """Per seed, its depths' rows stacked far to near (the unit's all-depths rows); None unless
  every seed has every depth and the seeds were asked the same offsets depth by depth.

  Each depth has its own offsets (the needle sits elsewhere in the haystack), so the seeds
  must agree depth by depth, not the depths with each other; phases are read from the far
  depth's offsets, as the unit reads them (offset index j has phase j mod M at every depth)."""
  if not depths or not all(set(depths) <= set(m) for m in loaded):
    return None
  if not all(_same_offsets([m[d] for m in loaded]) for d in depths):
    return None
  return [np.concatenate([m[d].correct_YxJ for d in depths]) for m in loaded]


def _mean_heldout(runs: Sequence[VariantRecord]) -> dict[str, float] | None:
  """The seeds' held-out metrics averaged (the accuracy gates read them); None unless every
  seed has them."""
  if any(not r.heldout for r in runs):
    return None
  keys = set.intersection(*(set(r.heldout) for r in runs))
  return {k: float(np.mean([r.heldout[k] for r in runs])) for k in sorted(keys)}


def _depth(record: VariantRecord, matrix_name: str) -> float:
  """The depth (0 far ... 1 near) of ``needle_<depth name>`` from the record's depths."""
  depth_name = matrix_name.removeprefix(correctness.NEEDLE)
  for d in record.depths or ():
    if d.depth_name == depth_name:
      return d.depth
  return 0.0


def pooled_records(records: Sequence[VariantRecord], load: Loader | None, *, seed: int = 0,
                   num_resamples: int = 2000, num_permutations: int = 2000,
                   rules: claim_rules.Rules = claim_rules.CURRENT_RULES
                   ) -> dict[str, VariantRecord]:
  """variant -> its seed-pooled record (module docstring); variants without one are absent."""
  out = {}
  for variant, runs in by_variant(records).items():
    if len(runs) == 1:
      out[variant] = runs[0]
    elif load is not None:
      pooled = pool(runs, load, seed=seed, num_resamples=num_resamples,
                    num_permutations=num_permutations, rules=rules)
      if pooled is not None:
        out[variant] = pooled
  return out
