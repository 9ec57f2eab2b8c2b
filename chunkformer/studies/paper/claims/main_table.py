"""The statistics the paper study's report shows, computed once when the sweep is judged: one
row per variant with lookup records (seeds pooled per padding mode), the shape of each row's
and each unit's curve against its noise (``claims.lookup_shape``; C10's comparison line sets
the row's beside the paper's), C13's worst-residue spreads, and the size trend (plan version
5: W8/S8 1 KV and full 1 KV at three model sizes; described, no claim).

The report (``report.paper_table``) formats these and the paper's published rows; it computes
nothing.
"""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from chunkformer.evaluation.records import correctness
from chunkformer.evaluation.records.variant import VariantRecord
from chunkformer.evaluation.stats import retrieval_gate
from chunkformer.evaluation.stats.residue_accuracy import ResidueAccuracy
from chunkformer.studies.paper.claims import effect_size, lookup_shape, regime_numbers
from chunkformer.studies.paper.claims import paper_rows as pr
from chunkformer.studies.paper.claims.lookup_shape import PublishedShape, Shape
from chunkformer.studies.paper.claims.regime_numbers import Regime
from chunkformer.studies.paper.records import published

MODES = ("prefix", "in_sequence")
MEAN_MATCH = 0.05  # C13: rows within this share of each other in mean are compared in worst


@dataclasses.dataclass(frozen=True)
class Row:
  """One variant of the table: its units pooled, and what C10 and C12 compare with the paper."""

  variant: str
  seeds: int
  validation_loss: float | None  # mean over the units that recorded one
  pooled: Mapping[str, ResidueAccuracy | None]  # padding -> seed-pooled residue table
  paper: Mapping[str, Any] | None  # the paper's run of the same name (``published.run_for``)
  stride: int | None
  geometry: bool  # C10's rows (``paper_rows.is_geometry``)
  ablation: str | None  # C12's kind, if any
  full: bool
  shape: Mapping[str, Shape | None] = dataclasses.field(default_factory=dict)  # by padding
  paper_shape: PublishedShape | None = None  # the paper's prefix curve (C10's rows)


@dataclasses.dataclass(frozen=True)
class SizeRow:
  """One model size of a row of the size trend (plan version 5, block C; described, no
  claim): its units of seeds ``TREND_SEEDS`` pooled, prefix padding."""

  row: str  # the row at size `cpu` (w8s8_1kv, full_1kv)
  size: str
  variant: str
  seeds: int
  prefix: ResidueAccuracy | None
  shape: Shape | None
  decision: str  # the period decision by effect size ("periodic 8", "flat", ...)
  # the prompts' best non-reading strategy (``pr.shortcut``), None where not recorded: a row
  # within the retrieval gate's margin of it has no phases that work, only noise around it
  shortcut: float | None = None

  @property
  def at_shortcut(self) -> bool:
    return (self.shortcut is not None and self.prefix is not None
            and retrieval_gate.within_margin(self.prefix.mean, self.shortcut))


@dataclasses.dataclass(frozen=True)
class Tables:
  rows: tuple[Row, ...] = ()
  units: Mapping[str, Mapping[str, Shape | None]] = dataclasses.field(
      default_factory=dict)  # unit -> padding -> the shape of its own curve
  # C13: the largest worst-residue difference between rows within MEAN_MATCH in prefix mean
  worst_spread: float | None = None  # ours, points
  paper_worst_spread: float | None = None  # the paper's published rows, points
  sizes: tuple[SizeRow, ...] = ()  # the size trend, where the sweep has size rows
  regime: Regime | None = None  # what the report's first lines state (``regime_numbers``)


def worst_spread(rows: Sequence[tuple[float, float]]) -> float | None:
  """The largest worst-residue difference between rows within 5 points of each other in mean
  (rows given as (mean, worst) in points)."""
  found = [abs(a[1] - b[1]) for a, b in itertools.combinations(rows, 2)
           if abs(a[0] - b[0]) <= 100 * MEAN_MATCH]
  return max(found) if found else None


def lookup_units(records: Sequence[VariantRecord]) -> dict[str, list[VariantRecord]]:
  """variant -> its units with a lookup record, in the sweep's order."""
  out: dict[str, list[VariantRecord]] = {}
  for r in records:
    if pr.lookup_modes(r) is not None:
      out.setdefault(r.setup.variant, []).append(r)
  return out


def _loss(units: Sequence[VariantRecord]) -> float | None:
  found = [((u.probes or {})["lookup"]).get("validation_loss") for u in units]
  found = [x for x in found if x is not None]
  return float(np.mean(found)) if found else None


def _row(variant: str, units: Sequence[VariantRecord], load: correctness.Loader | None) -> Row:
  setup = units[0].setup
  pooled = {mode: pr.pooled_mode(units, mode) for mode in MODES}
  entry = published.run_for(variant)
  modulus = next((t.modulus for t in pooled.values() if t is not None), None)
  row = Row(variant, len(units), _loss(units), pooled, entry, units[0].chunk_size,
            pr.is_geometry(setup), pr.ablation_kind(setup), pr.is_full(setup),
            lookup_shape.shapes(units, load, modulus))
  if not row.geometry or entry is None:
    return row
  theirs = published.lookup_row(entry, "prefix")
  return dataclasses.replace(row, paper_shape=lookup_shape.published(theirs["acc"], row.stride))


# The size trend (results/paper_plan5/PLAN.md, section 4): these rows at the sizes of
# ``configs/paper/runs.SIZES`` (named size_<size>_<row>) and at size `cpu` (the row itself),
# each on the seeds every size has.
TREND_ROWS = ("w8s8_1kv", "full_1kv")
TREND_SIZES = ("small", "cpu", "large")
TREND_SEEDS = (0, 1)


def size_trend(found: Mapping[str, Sequence[VariantRecord]], load: correctness.Loader | None,
               rules) -> tuple[SizeRow, ...]:
  """The trend's rows (empty unless the sweep has a size_ row of ``TREND_ROWS``)."""
  if not any(f"size_{size}_{row}" in found for row in TREND_ROWS for size in TREND_SIZES):
    return ()
  out = []
  for row in TREND_ROWS:
    for size in TREND_SIZES:
      variant = row if size == "cpu" else f"size_{size}_{row}"
      units = [u for u in found.get(variant, ()) if u.setup.seed in TREND_SEEDS]
      if not units:
        continue
      prefix = pr.pooled_mode(units, "prefix")
      modulus = None if prefix is None else prefix.modulus
      stride = effect_size.stride_of(units[0].setup)
      decision = effect_size.decide_units(load, [u.name for u in units], "prefix", stride,
                                          rules, pr.shortcut(units[0], "prefix"))
      out.append(SizeRow(row, size, variant, len(units), prefix,
                         lookup_shape.shapes(units, load, modulus)["prefix"],
                         effect_size.describe(decision), pr.shortcut(units[0], "prefix")))
  return tuple(out)


def tables(e) -> Tables:
  """The judging hook (``claims.registry.Judging.tables``)."""
  found = lookup_units(e.records)
  rows = tuple(_row(v, units, e.matrices) for v, units in found.items())
  if not rows:
    return Tables(regime=regime_numbers.regime(e.records))
  ours = [(100 * t.mean, 100 * t.worst) for row in rows
          if (t := row.pooled["prefix"]) is not None]
  theirs = [(r["pp"]["mean"][0], r["pp"]["worst"]) for r in published.published()["runs"]]
  return Tables(rows, lookup_shape.by_unit(found, e.matrices), worst_spread(ours),
                worst_spread(theirs), size_trend(found, e.matrices, e.rules),
                regime_numbers.regime(e.records))
