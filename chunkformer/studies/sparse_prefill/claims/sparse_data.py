"""What the sparse-prefill claims (P1-P2) read: each pattern's correctness matrices per model.

The ``sparse_needles`` probe stores, per unit, one record per pattern (``probes
.sparse_needles[<label>]``: the pattern's config dict, its block, the fraction of causal pairs
it keeps, per depth the accuracies and the name of its matrix) and the matrices themselves
(``DIR/correct/<unit>.npz`` as ``sparse_needles_<key>``). ``collect`` turns them into
``Group``s: one pattern at one depth on one model variant, with one ``Run`` per training seed;
a group's seed-pooled matrix stacks its seeds' haystack rows (``stats.seed_rule.pool_seeds``).
A matrix's statistics at the block sizes a claim reads come from the engine
(``claims.grouped.analyse``, shared with the eviction study); ``tables`` is what the report
shows (accuracy by residue mod B pooled over seeds, with Wilson intervals, and the keep-all
control against the plain needle sweep).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from chunkformer import sparse_prefill
from chunkformer.evaluation.claims import rules as claim_rules
from chunkformer.evaluation.claims import standards
from chunkformer.evaluation.records import correctness
from chunkformer.evaluation.records.variant import VariantRecord
from chunkformer.evaluation.stats.residue_accuracy import ResidueAccuracy, summarize
from chunkformer.evaluation.stats.seed_rule import pool_seeds

PROBE = "sparse_needles"
# The model must retrieve with a dense prefill: its held-out far accuracy (rows as in
# training) at least this, else its seed is undecided for every sparse-prefill claim.
MODEL_ACCURACY = 0.9
PLAIN = "needle"  # the plain needle sweep's matrices: ``needle_<depth>``


@dataclasses.dataclass(frozen=True)
class Run:
  """One pattern at one depth on one trained model (one seed)."""

  unit: str
  seed: int
  matrix: correctness.Matrix | None  # None: not stored
  plain: correctness.Matrix | None  # the dense needle sweep's matrix at this depth
  gate: float | None  # the model's held-out far accuracy with a dense prefill


@dataclasses.dataclass(frozen=True)
class Group:
  """One pattern (``label``) at one depth on one model variant, over its seeds."""

  variant: str
  label: str
  pattern: sparse_prefill.Pattern
  block: int
  kept: float  # mean fraction of causal pairs kept (first batch of each seed)
  depth: str
  runs: tuple[Run, ...]

  @property
  def name(self) -> str:
    return f"{self.variant}/{self.label}/{self.depth}"

  @property
  def gate(self) -> float | None:
    """The seeds' mean model accuracy (the pooled test's gate)."""
    found = [r.gate for r in self.runs]
    return None if None in found else float(np.mean(found))

  def pooled(self, rules: claim_rules.Rules | None = None) -> correctness.Matrix | None:
    """The seeds' haystack rows pooled as the claim rules say (default: stacked, as the
    report's descriptive tables read them); None when a matrix is missing or offsets differ."""
    return _stack([r.matrix for r in self.runs], rules)


def _stack(found: Sequence[correctness.Matrix | None],
           rules: claim_rules.Rules | None = None) -> correctness.Matrix | None:
  if not found or any(m is None for m in found) or any(
      not np.array_equal(m.offsets_J, found[0].offsets_J) for m in found):
    return None
  if len(found) == 1:
    return found[0]
  rows = [m.correct_YxJ for m in found]
  return correctness.Matrix(pool_seeds(rows) if rules is None else rules.pool(rows),
                            found[0].offsets_J)


def _pattern(spec: Mapping[str, Any], where: str) -> sparse_prefill.Pattern:
  spec = {k: v for k, v in dict(spec).items() if k != "block"}
  return sparse_prefill.from_dict(spec, field=where)


def collect(records: Sequence[VariantRecord],
            load: correctness.Loader | None) -> list[Group]:
  """Every (variant, pattern, depth) group of the records' sparse_needles results, in the
  records' order then the probe's; runs in seed order."""
  runs: dict[tuple[str, str, str], list[Run]] = {}
  meta: dict[tuple[str, str, str], tuple[sparse_prefill.Pattern, int]] = {}
  kept: dict[tuple[str, str, str], list[float]] = {}
  for record in records:
    found = (record.probes or {}).get(PROBE)
    if not found:
      continue
    stored = (load(record.name) if load is not None else None) or {}
    gate = standards.gate_accuracy(record)[0]
    for label, entry in found.items():
      pattern = _pattern(entry["pattern"], f"{record.name}: probes.{PROBE}.{label}.pattern")
      for depth, values in entry["depths"].items():
        key = (record.setup.variant, label, depth)
        matrix = stored.get(f"{PROBE}_{values['matrix']}") if "matrix" in values else None
        plain = stored.get(f"{PLAIN}_{depth}")
        runs.setdefault(key, []).append(Run(record.name, record.setup.seed, matrix, plain, gate))
        meta.setdefault(key, (pattern, int(entry["block"])))
        kept.setdefault(key, []).append(float(entry["kept_fraction"]))
  return [Group(v, label, *meta[(v, label, depth)], float(np.mean(kept[(v, label, depth)])),
                depth, tuple(sorted(found, key=lambda r: r.seed)))
          for (v, label, depth), found in runs.items()]


def of_kind(groups: Sequence[Group], kind: type) -> list[Group]:
  """The groups whose pattern is exactly of class ``kind`` (BlockSparse, VerticalSlash, ...)."""
  return [g for g in groups if type(g.pattern) is kind]


@dataclasses.dataclass(frozen=True)
class PhaseRow:
  """The report's row of one group: accuracy pooled over its seeds, and per block size B the
  accuracy by residue of the needle offset mod B with Wilson intervals."""

  variant: str
  label: str
  kind: str  # the pattern's name (block_sparse, vertical_slash, a_shape, keep_all)
  short: str  # the name with its block: "block_sparse B=8" (figure legends)
  block: int
  kept: float
  depth: str
  seeds: int
  accuracy: float
  residues: Mapping[int, ResidueAccuracy]  # B -> accuracy by offset mod B
  # keep-all only: the share of (haystack, offset) cells equal to the dense needle sweep's
  matches_dense: float | None = None


@dataclasses.dataclass(frozen=True)
class Tables:
  """What the report's section shows (every number computed here, not in the report)."""

  rows: tuple[PhaseRow, ...]
  dense: Mapping[tuple[str, str], float]  # (variant, depth) -> the dense sweep's accuracy


def block_sizes(groups: Sequence[Group]) -> list[int]:
  """The B of the groups' block-sparse patterns (the residues P2 reads)."""
  return sorted({g.block for g in of_kind(groups, sparse_prefill.BlockSparse)})


def _matches(g: Group) -> float | None:
  pairs = [(r.matrix, r.plain) for r in g.runs]
  if any(a is None or b is None or a.correct_YxJ.shape != b.correct_YxJ.shape
         for a, b in pairs):
    return None
  return float(np.mean([a.correct_YxJ == b.correct_YxJ for a, b in pairs]))


def tables(records: Sequence[VariantRecord], load: correctness.Loader | None) -> Tables:
  """A row per group with stored matrices (every seed's), in the probe's order, and the dense
  needle sweep's pooled accuracy per (variant, depth)."""
  groups = collect(records, load)
  sizes = sorted({*block_sizes(groups), *(g.block for g in groups)})
  rows, dense = [], {}
  for g in groups:
    matrix = g.pooled()
    if matrix is None:
      continue
    outcomes = matrix.correct_YxJ.ravel()
    offsets = np.broadcast_to(matrix.offsets_J, matrix.correct_YxJ.shape).ravel()
    # only the B whose residues the offsets cover equally often (J a multiple of B)
    residues = {m: summarize(outcomes, offsets % m, m, None) for m in sizes
                if matrix.offsets_J.size % m == 0}
    match = _matches(g) if isinstance(g.pattern, sparse_prefill.KeepAll) else None
    rows.append(PhaseRow(g.variant, g.label, g.pattern.name, f"{g.pattern.name} B={g.block}",
                         g.block, g.kept, g.depth, len(g.runs), float(outcomes.mean()),
                         residues, match))
    plain = _stack([r.plain for r in g.runs])
    if plain is not None:
      dense.setdefault((g.variant, g.depth), float(plain.correct_YxJ.mean()))
  return Tables(tuple(rows), dense)
