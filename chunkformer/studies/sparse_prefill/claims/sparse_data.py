"""What the sparse-prefill claims (P1-P2) read: each pattern's correctness matrices per model.

The ``sparse_needles`` probe stores, per unit, one record per pattern (``probes
.sparse_needles[<label>]``: the pattern's config dict, its block, the fraction of causal pairs
it keeps, per depth the accuracies and the name of its matrix) and the matrices themselves
(``DIR/correct/<unit>.npz`` as ``sparse_needles_<key>``). ``collect`` turns them into the
engine's groups (``claims.policy_groups``: one pattern at one depth on one model variant, with
one run per training seed; ``Group.setting`` is the pattern, ``block`` and ``kept`` read its
records); a group's seed-pooled matrix stacks its seeds' haystack rows
(``stats.seed_rule.pool_seeds``). A matrix's statistics at the block sizes a claim reads come
from the engine (``claims.grouped.analyse``, shared with the eviction study); ``tables`` is
what the report shows (accuracy by residue mod B pooled over seeds, with Wilson intervals, and
the keep-all control against the plain needle sweep).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from chunkformer import sparse_prefill
from chunkformer.evaluation.claims import policy_groups
from chunkformer.evaluation.claims.policy_groups import Group
from chunkformer.evaluation.records import correctness
from chunkformer.evaluation.records.variant import VariantRecord

PROBE = "sparse_needles"
# The model must retrieve with a dense prefill: its held-out far accuracy (rows as in
# training) at least this, else its seed is undecided for every sparse-prefill claim.
MODEL_ACCURACY = 0.9


def _pattern(spec: Mapping[str, Any], where: str) -> sparse_prefill.Pattern:
  spec = {k: v for k, v in dict(spec).items() if k != "block"}
  return sparse_prefill.from_dict(spec, field=where)


READING = policy_groups.Reading(PROBE, "pattern", _pattern)
of_kind = policy_groups.of_kind  # the groups whose pattern is exactly of one class


def block(group: Group) -> int:
  """The pattern's block in tokens (the first unit's record)."""
  return int(group.entries[0]["block"])


def kept(group: Group) -> float:
  """The mean fraction of causal pairs kept (first batch of each seed)."""
  return float(np.mean([float(e["kept_fraction"]) for e in group.entries]))


def collect(records: Sequence[VariantRecord],
            load: correctness.Loader | None) -> list[Group]:
  """Every (variant, pattern, depth) group of the records' sparse_needles results, in the
  records' order then the probe's; runs in seed order."""
  return policy_groups.collect(READING, records, load)


@dataclasses.dataclass(frozen=True)
class PhaseRow(policy_groups.PhaseRow):
  """The report's row of one group (``policy_groups.PhaseRow``) with its block and the share
  of causal pairs it keeps."""

  block: int = 0
  kept: float = 0.0
  # keep-all only: the share of (haystack, offset) cells equal to the dense needle sweep's
  matches_dense: float | None = None


@dataclasses.dataclass(frozen=True)
class Tables:
  """What the report's section shows (every number computed here, not in the report)."""

  rows: tuple[PhaseRow, ...]
  dense: Mapping[tuple[str, str], float]  # (variant, depth) -> the dense sweep's accuracy


def block_sizes(groups: Sequence[Group]) -> list[int]:
  """The B of the groups' block-sparse patterns (the residues P2 reads)."""
  return sorted({block(g) for g in of_kind(groups, sparse_prefill.BlockSparse)})


def _matches(g: Group) -> float | None:
  pairs = [(r.matrix, r.plain) for r in g.runs]
  if any(a is None or b is None or a.correct_YxJ.shape != b.correct_YxJ.shape
         for a, b in pairs):
    return None
  return float(np.mean([a.correct_YxJ == b.correct_YxJ for a, b in pairs]))


def _row(g: Group, **common) -> PhaseRow:
  match = _matches(g) if isinstance(g.setting, sparse_prefill.KeepAll) else None
  return PhaseRow(kind=g.setting.name, short=f"{g.setting.name} B={block(g)}", **common,
                  block=block(g), kept=kept(g), matches_dense=match)


def tables(records: Sequence[VariantRecord], load: correctness.Loader | None) -> Tables:
  """A row per group with stored matrices (every seed's), in the probe's order, and the dense
  needle sweep's pooled accuracy per (variant, depth)."""
  groups = collect(records, load)
  sizes = sorted({*block_sizes(groups), *(block(g) for g in groups)})
  dense = {}
  for g in groups:
    plain = policy_groups.stack([r.plain for r in g.runs])
    if g.pooled() is not None and plain is not None:
      dense.setdefault((g.variant, g.depth), float(plain.correct_YxJ.mean()))
  return Tables(tuple(policy_groups.phase_rows(groups, sizes, _row)), dense)
