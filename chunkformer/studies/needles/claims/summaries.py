"""The statistics behind the report's claim tables, computed once by ``judge`` (never by the
report, which only formats these rows).

- ``seed_rows``: per variant with several seeds, far accuracy and max gap per seed, their
  Student-t interval across seeds (``seed_rule.seed_interval``) and the seed-pooled record
  (``pooling``: haystacks of every seed, bootstrap interval and period-test p).
- ``split_label_blocks`` (C5): per needle block (needle lengths and training steps), plain
  fixed models' accuracy per split label (none / partial / total, and the two partial kinds)
  per M, pooled over seeds (trial-weighted), with mean accuracy and gap over seeds. A record
  without the stored ``split_labels`` analysis (1-token needles, older sweeps) is labelled from
  its per-phase accuracy: with fixed chunks the split kind depends only on the phase offset
  mod M (``split_labels.phase_split_kinds``), weighted by the number of offsets in each phase.
- ``chunk_phase_rows`` (C8): dynamic models' weakest phase inside the actual chunk and how
  often each phase occurs among the far-depth trials (from the stored phases).
- ``shift_grid`` (C9): gap / mean accuracy over key shift width x needle block for fixed
  M = 4 models and the router on the same needles, and full attention with and without the
  shift (the control), seeds averaged; with the matrices, per seed how many far-depth
  haystacks carry the period (``estimates.phase_dependent_needles``), so a significant but
  small gap can be told apart as a rare, needle-specific blind spot or a general one.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple

import numpy as np

from chunkformer.evaluation.claims import seed_pooling
from chunkformer.evaluation.records import correctness
from chunkformer.evaluation.records.variant import VariantRecord
from chunkformer.evaluation.stats import split_labels
from chunkformer.evaluation.stats.estimates import Estimate, phase_dependent_needles
from chunkformer.evaluation.stats.seed_rule import seed_interval
from chunkformer.studies.needles.claims import judgments
from chunkformer.studies.needles.claims.step_size import c5_group_name

SHIFT_WIDTHS = (0, 2, 3, 4)
NEEDLE_LENGTHS = (1, 2, 3)
MAP_PERIOD = 4  # the shift map's models are M = 4 (or the router at 4, or full attention)
SPLIT_COLUMNS = ("none", "partial", "total", "key_cut", "value_cut")
Block = tuple[int, int, int | None]  # key tokens, value tokens, training steps (None: unmeasured)


@dataclasses.dataclass(frozen=True)
class SeedRow:
  variant: str
  far_per_seed: tuple[float | None, ...]
  gap_per_seed: tuple[float | None, ...]
  far_across: Estimate | None  # Student t across seeds; None with fewer than 2 known
  gap_across: Estimate | None
  pooled: VariantRecord | None  # the seed-pooled record; None when matrices are missing


def _across(values: Sequence[float | None]) -> Estimate | None:
  known = [v for v in values if v is not None]
  return seed_interval(known) if len(known) >= 2 else None


def seed_rows(records: Sequence[VariantRecord],
              pooled: Mapping[str, VariantRecord] | None) -> tuple[SeedRow, ...]:
  out = []
  for variant, runs in seed_pooling.by_variant(records).items():
    if len(runs) > 1:
      far = tuple(r.far_accuracy for r in runs)
      gap = tuple(r.analysis.phase.gap.value for r in runs)
      out.append(SeedRow(variant, far, gap, _across(far), _across(gap),
                         (pooled or {}).get(variant)))
  return tuple(out)


@dataclasses.dataclass(frozen=True)
class SplitLabelRow:
  chunk_size: int
  seeds: int
  from_phases: bool  # a seed without the stored analysis: labelled from per-phase accuracy
  kinds_by_phase: tuple[str, ...]
  accuracy: Mapping[str, float | None]  # SPLIT_COLUMNS, seeds pooled by trials
  mean_accuracy: float | None  # mean over seeds
  mean_gap: float | None


@dataclasses.dataclass(frozen=True)
class SplitLabelBlock:
  key_len: int
  value_len: int
  steps: int
  rows: tuple[SplitLabelRow, ...]

  @property
  def c5_group(self) -> str:
    """The key of this block's paired gap difference in C5's numbers."""
    return c5_group_name(self.key_len, self.value_len, self.steps)


def _phase_labels(r: VariantRecord) -> dict[str, dict[str, Any]]:
  """Accuracy and trials per kind and label, from the phase table (fixed chunks)."""
  m = r.chunk_size
  table = r.analysis.by_chunk_size[0].table
  kinds = split_labels.phase_split_kinds(m, r.setup.key_len, r.setup.value_len)
  counts = np.bincount(np.mod(np.asarray(r.analysis.offsets), m), minlength=m)
  trials = counts * r.analysis.num_haystacks
  out: dict[str, dict[str, Any]] = {}
  for phase, accuracy in zip(table.phases, table.accuracy.values, strict=True):
    if accuracy is None:
      continue
    kind = kinds[phase]
    for name in (kind, split_labels.COARSE[kind]):
      entry = out.setdefault(name, {"correct": 0.0, "trials": 0})
      entry["correct"] += accuracy * trials[phase]
      entry["trials"] += int(trials[phase])
  return {k: {"accuracy": v["correct"] / v["trials"], "trials": v["trials"]}
          for k, v in out.items() if v["trials"]}


def _labels(r: VariantRecord) -> tuple[dict[str, dict[str, Any]], bool]:
  """(name -> {"accuracy", "trials"} for kinds and labels, stored?)."""
  s = r.split_labels
  if s is None:
    return _phase_labels(r), False
  out = {k: v for k, v in s["by_kind"].items() if v["trials"]}
  out.update({k: v for k, v in s["by_label"].items() if v["trials"]})
  return out, True


def _pooled(entries: Sequence[dict[str, dict[str, Any]]], name: str) -> float | None:
  found = [e[name] for e in entries if name in e and e[name]["accuracy"] is not None]
  trials = sum(x["trials"] for x in found)
  return None if not trials else sum(x["accuracy"] * x["trials"] for x in found) / trials


def _mean(values: Sequence[float | None]) -> float | None:
  known = [v for v in values if v is not None]
  return np.mean(known) if known else None


def split_label_blocks(records: Sequence[VariantRecord]) -> tuple[SplitLabelBlock, ...]:
  groups: dict[tuple[int, int, int], dict[int, list[VariantRecord]]] = {}
  for r in records:
    if judgments.is_plain_fixed(r) and r.setup.task == "kv":
      groups.setdefault(judgments.needle_block(r), {}).setdefault(r.chunk_size, []).append(r)
  blocks = []
  for (key_len, value_len, steps), by_m in sorted(groups.items()):
    rows = []
    for m, runs in sorted(by_m.items()):
      found = [_labels(r) for r in runs]
      entries = [e for e, _ in found]
      rows.append(SplitLabelRow(
          m, len(runs), not all(stored for _, stored in found),
          tuple(split_labels.phase_split_kinds(m, key_len, value_len)),
          {name: _pooled(entries, name) for name in SPLIT_COLUMNS},
          _mean([r.far_accuracy for r in runs]), _mean([r.analysis.max_gap for r in runs])))
    blocks.append(SplitLabelBlock(key_len, value_len, steps, tuple(rows)))
  return tuple(blocks)


@dataclasses.dataclass(frozen=True)
class ChunkPhaseRow:
  record: VariantRecord
  weakest_accuracy: float  # accuracy at the weakest phase inside the actual chunk
  shares: Mapping[int, float] | None  # phase -> share of far-depth trials; None: no phases


def _phase_shares(r: VariantRecord, load: correctness.Loader | None) -> dict[int, float] | None:
  """Share of the far-depth trials in each phase inside the actual chunk (stored phases)."""
  matrix = correctness.far_matrix(r, load) if load is not None else None
  if matrix is None or matrix.phases_YxJ is None:
    return None
  phases, counts = np.unique(matrix.phases_YxJ, return_counts=True)
  return {int(p): float(c) / matrix.phases_YxJ.size for p, c in zip(phases, counts,
                                                                      strict=True)}


def chunk_phase_rows(records: Sequence[VariantRecord],
                     load: correctness.Loader | None) -> tuple[ChunkPhaseRow, ...]:
  out = []
  for r in records:
    if r.chunk_phase is not None:
      c = r.chunk_phase
      weakest = min((a, p) for a, p in zip(c.accuracy.values, c.phases, strict=True)
                    if a is not None)
      out.append(ChunkPhaseRow(r, weakest[0], _phase_shares(r, load)))
  return tuple(out)


_SHIFT_KINDS = ("fixed M=4", "router 4", "full")  # the shift map's models, in row order


class ShiftRow(NamedTuple):
  """A row of the shift map (``order`` sorts them: by model, plain key shifts, then delayed
  ones, then shifts of keys and queries; then width)."""

  kind: int  # index into _SHIFT_KINDS
  frozen_steps: int  # updates before the shift trains (train.shift_frozen_steps)
  width: int  # 0 = no shift
  queries: bool = False  # the queries carry the shift too (model.query_shift)

  @property
  def label(self) -> str:
    after = f" after step {self.frozen_steps}" if self.frozen_steps else ""
    on = " (keys and queries)" if self.queries else ""
    return f"{_SHIFT_KINDS[self.kind]}, shift {self.width}{on}{after}"

  def order(self) -> tuple[int, bool, bool, int, int]:
    return self.kind, self.queries, self.frozen_steps > 0, self.width, self.frozen_steps


def _shift_row_of(r: VariantRecord) -> ShiftRow | None:
  s = r.setup
  if s.task != "kv":
    return None
  shift = ((s.key_shift_frozen_steps, s.key_shift_width, s.query_shift) if s.key_shift
           else (0, 0, False))
  if s.attention == "full":
    return ShiftRow(2, *shift)
  if s.chunk_size != 4:
    return None
  if s.attention == "fixed" and s.rope and s.pooling == "gated" and not (
      s.overlap or s.stagger or s.random_phase):
    return ShiftRow(0, *shift)
  if s.attention == "dynamic" and s.chunking.startswith("dynamic/router"):
    return ShiftRow(1, *shift)
  return None


@dataclasses.dataclass(frozen=True)
class ShiftCell:
  seeds: int
  mean_gap: float | None  # over seeds
  mean_accuracy: float | None
  # per seed (seed order): (haystacks whose accuracy depends on the phase, haystacks), None
  # where a seed's matrix is missing; None for the whole cell without matrices
  phase_dependent: tuple[tuple[int, int] | None, ...] | None


@dataclasses.dataclass(frozen=True)
class ShiftGrid:
  rows: tuple[ShiftRow, ...]
  columns: tuple[Block, ...]
  cells: Mapping[tuple[ShiftRow, Block], ShiftCell]  # absent: no such record in the sweep


def _phase_dependent(r: VariantRecord, load: correctness.Loader) -> tuple[int, int] | None:
  matrix = correctness.far_matrix(r, load)
  if matrix is None:
    return None
  haystacks = phase_dependent_needles(matrix.correct_YxJ, matrix.offsets_J, MAP_PERIOD)[0]
  return int(haystacks.size), matrix.correct_YxJ.shape[0]


def shift_grid(records: Sequence[VariantRecord],
               load: correctness.Loader | None) -> ShiftGrid | None:
  """The shift map's rows (model, shift), columns (needle block) and cells; None when no
  record belongs to it."""
  cells: dict[tuple[ShiftRow, tuple[int, int, int]], list[VariantRecord]] = {}
  for r in records:
    row = _shift_row_of(r)
    if row is not None:
      cells.setdefault((row, judgments.needle_block(r)), []).append(r)
  if not cells:
    return None
  blocks = sorted({b for _, b in cells})
  shown = {(k, v) for k, v, _ in blocks}
  columns = sorted([*blocks, *((k, k, None) for k in NEEDLE_LENGTHS if (k, k) not in shown)],
                   key=lambda b: (b[0], b[1], b[2] or 0))
  # every plain fixed width of the map has a row, measured or not
  rows = sorted({row for row, _ in cells} | {ShiftRow(0, 0, w) for w in SHIFT_WIDTHS},
                key=ShiftRow.order)
  summary = {}
  for key, runs in cells.items():
    runs = sorted(runs, key=lambda r: r.setup.seed)
    summary[key] = ShiftCell(
        len(runs), _mean([r.analysis.max_gap for r in runs]),
        _mean([r.far_accuracy for r in runs]),
        None if load is None else tuple(_phase_dependent(r, load) for r in runs))
  return ShiftGrid(tuple(rows), tuple(columns), summary)


@dataclasses.dataclass(frozen=True)
class Tables:
  """The statistics the needle study's report tables show (``claim_tables``)."""

  seeds: tuple[SeedRow, ...] = ()
  split_labels: tuple[SplitLabelBlock, ...] = ()
  chunk_phases: tuple[ChunkPhaseRow, ...] = ()
  shift_grid: ShiftGrid | None = None
