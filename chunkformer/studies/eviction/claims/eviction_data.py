"""What the eviction claims (E1-E3) read: each policy's correctness matrices per trained model.

The ``eviction_needles`` probe stores, per unit, one record per policy (``probes
.eviction_needles[<label>]``: the policy's config dict, its budget in tokens, per depth the
accuracies and the name of its matrix) and the matrices themselves (``DIR/correct/<unit>.npz``
as ``eviction_needles_<key>``). ``collect`` turns them into ``Group``s: one policy at one
depth on one model variant, with one ``Run`` per training seed. A group's seed-pooled matrix
stacks its seeds' haystack rows (``stats.seed_rule.pool_seeds``), as the study's seed-pooled
records do (a matrix's statistics at the chunk lengths a claim reads:
``claims.grouped.analyse``). ``phase_rows`` gives the report's table (accuracy by residue mod
L, pooled over seeds, with Wilson intervals).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from chunkformer import eviction
from chunkformer.evaluation.claims import standards
from chunkformer.evaluation.records import correctness
from chunkformer.evaluation.records.variant import VariantRecord
from chunkformer.evaluation.stats.residue_accuracy import ResidueAccuracy, summarize
from chunkformer.evaluation.stats.seed_rule import pool_seeds

PROBE = "eviction_needles"
# The model must retrieve before anything is evicted: its held-out far accuracy (rows as in
# training) at least this, else its seed is undecided for every eviction claim.
MODEL_ACCURACY = 0.9


@dataclasses.dataclass(frozen=True)
class Run:
  """One policy at one depth on one trained model (one seed)."""

  unit: str
  seed: int
  matrix: correctness.Matrix | None  # None: not stored
  gate: float | None  # the model's held-out far accuracy before eviction

  @property
  def learned(self) -> bool:
    return self.gate is not None and self.gate >= MODEL_ACCURACY


@dataclasses.dataclass(frozen=True)
class Group:
  """One policy (``label``) at one depth on one model variant, over its seeds."""

  variant: str
  label: str
  policy: eviction.Policy
  budget: tuple[int, ...]  # the budget in tokens for each prompt length the probe used
  depth: str
  runs: tuple[Run, ...]

  @property
  def name(self) -> str:
    return f"{self.variant}/{eviction.short_label(self.label)}/{self.depth}"

  @property
  def seeds(self) -> tuple[int, ...]:
    return tuple(r.seed for r in self.runs)

  @property
  def gate(self) -> float | None:
    """The seeds' mean model accuracy (the pooled test's gate, as ``pooling`` takes it)."""
    found = [r.gate for r in self.runs]
    return None if None in found else float(np.mean(found))

  def pooled(self) -> correctness.Matrix | None:
    """Every seed's haystack rows stacked; None when a matrix is missing or offsets differ."""
    found = [r.matrix for r in self.runs]
    if not found or any(m is None for m in found) or any(
        not np.array_equal(m.offsets_J, found[0].offsets_J) for m in found):
      return None
    if len(found) == 1:
      return found[0]
    return correctness.Matrix(pool_seeds([m.correct_YxJ for m in found]), found[0].offsets_J)


def same_setting(a: Group, b: Group) -> bool:
  """Two groups a comparison pairs: one model variant, one depth, one budget in tokens."""
  return a.variant == b.variant and a.depth == b.depth and a.budget == b.budget


def same_budget_setting(a: Group, b: Group) -> bool:
  """One model variant, one depth, one budget as the policies were given it: E2's pairing,
  since ChunkKV as published rounds its budget down to whole chunks (up to L - 1 tokens fewer
  than a policy that fills the same budget exactly)."""
  return a.variant == b.variant and a.depth == b.depth and a.policy.budget == b.policy.budget


def _policy(spec: Mapping[str, Any], where: str) -> eviction.Policy:
  return eviction.from_dict(dict(spec), field=where)


def collect(records: Sequence[VariantRecord],
            load: correctness.Loader | None) -> list[Group]:
  """Every (variant, policy, depth) group of the records' eviction_needles results, in the
  records' order then the probe's; runs in seed order."""
  runs: dict[tuple[str, str, str], list[Run]] = {}
  meta: dict[tuple[str, str, str], tuple[eviction.Policy, tuple[int, ...]]] = {}
  for record in records:
    found = (record.probes or {}).get(PROBE)
    if not found:
      continue
    stored = (load(record.name) if load is not None else None) or {}
    gate = standards.gate_accuracy(record)[0]
    for label, entry in found.items():
      policy = _policy(entry["policy"], f"{record.name}: probes.{PROBE}.{label}.policy")
      budget = tuple(int(b) for b in entry["budget_tokens"])
      for depth, values in entry["depths"].items():
        key = (record.setup.variant, label, depth)
        matrix = stored.get(f"{PROBE}_{values['matrix']}") if "matrix" in values else None
        runs.setdefault(key, []).append(Run(record.name, record.setup.seed, matrix, gate))
        meta.setdefault(key, (policy, budget))
  return [Group(v, label, *meta[(v, label, depth)], depth,
                tuple(sorted(found, key=lambda r: r.seed)))
          for (v, label, depth), found in runs.items()]


def of_kind(groups: Sequence[Group], kind: type) -> list[Group]:
  """The groups whose policy is exactly of class ``kind`` (ChunkKV, ContentChunkKV, ...)."""
  return [g for g in groups if type(g.policy) is kind]


@dataclasses.dataclass(frozen=True)
class PhaseRow:
  """The report's row of one group: accuracy pooled over its seeds, and per chunk length L the
  accuracy by residue of the needle offset mod L with Wilson intervals."""

  variant: str
  label: str
  kind: str  # the policy's name (snapkv, chunkkv, ...)
  short: str  # the name with its chunk length: "chunkkv L=4" (figure legends)
  budget: tuple[int, ...]  # tokens kept
  given: int | float  # the budget the policy was given (whole-chunk ChunkKV keeps fewer)
  depth: str
  seeds: int
  accuracy: float
  residues: Mapping[int, ResidueAccuracy]  # L -> accuracy by offset mod L


def phase_rows(records: Sequence[VariantRecord], load: correctness.Loader | None,
               lengths: Sequence[int] = (4, 8, 10)) -> list[PhaseRow]:
  """A row per group with stored matrices (every seed's), by the budget given, then in the
  probe's order."""
  rows = []
  for g in collect(records, load):
    matrix = g.pooled()
    if matrix is None:
      continue
    outcomes = matrix.correct_YxJ.ravel()
    offsets = np.broadcast_to(matrix.offsets_J, matrix.correct_YxJ.shape).ravel()
    # only the L whose residues the offsets cover equally often (J a multiple of L)
    residues = {m: summarize(outcomes, offsets % m, m, None) for m in lengths
                if matrix.offsets_J.size % m == 0}
    short = g.policy.name + (f" L={g.policy.chunk}" if isinstance(g.policy, eviction.ChunkKV)
                             else "")
    rows.append(PhaseRow(g.variant, g.label, g.policy.name, short, g.budget, g.policy.budget,
                         g.depth, len(g.runs), float(outcomes.mean()), residues))
  return sorted(rows, key=lambda r: (r.variant, r.depth, r.given))
