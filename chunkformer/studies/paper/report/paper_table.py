"""The summary's paper-style pieces for sweeps with lookup records: the main table (per row: val
loss, mean, worst and gap in both padding modes, the paper's published row beside each of
ours, labelled as the paper's scale), the main figure (accuracy by residue per row, the
paper's curve beside; first the paper's strides, full attention and the cures, then every row)
and one line per claim C10-C21 saying where our result agrees with the paper or differs from
it, and by how much, and for a cure what remains inside the chunk
(``records/paper_published.json``).

Rows are sweep variants; a row's seeds are pooled when the sweep is judged
(``claims.main_table``). Formatting only: every number comes from there, the claims or the
paper's published records.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from chunkformer.evaluation.records.claim import Claim
from chunkformer.evaluation.records.formatting import p_value, percent
from chunkformer.evaluation.report.sections import View
from chunkformer.evaluation.stats.residue_accuracy import ResidueAccuracy
from chunkformer.studies.paper.claims import cure_claims
from chunkformer.studies.paper.claims.lookup_shape import Shape
from chunkformer.studies.paper.claims.main_table import MODES, Row, Tables
from chunkformer.studies.paper.claims.paper_rows import POOLED
from chunkformer.studies.paper.records import published
from chunkformer.studies.paper.report import shape_tables


def _cells(table: ResidueAccuracy | None) -> list[str]:
  if table is None:
    return ["-"] * 3
  return [percent(table.mean), f"{percent(table.worst)} ({table.worst_residue})",
          percent(table.gap)]


def main_table(tables: Tables) -> list[str]:
  """The paper-style main table (empty without lookup records)."""
  if not tables.rows:
    return []
  lines = ["Lookup test, accuracy % by residue of the target key (mod 24), seeds pooled; worst "
           "(residue); gap = best - worst. Each row of ours is followed by the paper's "
           f"published row where it has one, labelled {published.SCALE_NOTE}.", "",
           "| row | seeds | val loss | prefix mean | prefix worst | prefix gap | in-seq mean | "
           "in-seq worst | in-seq gap |", "|:--|--:|--:|--:|--:|--:|--:|--:|--:|"]
  for row in tables.rows:
    loss = row.validation_loss
    cells = [c for mode in MODES for c in _cells(row.pooled[mode])]
    lines.append(f"| {row.variant} | {row.seeds} | {'-' if loss is None else f'{loss:.3f}'} | "
                 + " | ".join(cells) + " |")
    entry = row.paper
    if entry is not None:
      cells = []
      for m in MODES:
        theirs = published.lookup_row(entry, m)
        cells += (["-"] * 3 if theirs is None else
                  [f"{theirs['mean']:.1f}", f"{theirs['worst']:.1f}", f"{theirs['gap']:.1f}"])
      lines.append(f"| {published.ROW_LABEL}: {entry['name']} | - | {entry.get('loss', '-')} | "
                   + " | ".join(cells) + " |")
  return lines


def main_rows(tables: Tables) -> tuple[Row, ...]:
  """The main figure's rows: full attention, the plain geometry rows with one KV head (the
  paper's strides) and the cures, in the sweep's order."""
  cures = {row for _, rows, _ in cure_claims.CURES.values() for row in rows}
  return tuple(r for r in tables.rows if r.full or r.variant in cures or (
      r.geometry and r.variant.startswith("w") and r.variant.endswith("_1kv")))


def plot_residues(path: str, tables: Tables, shown: Sequence[Row] | None = None) -> str | None:
  """Prefix-padding accuracy by residue per row of ``shown`` (default: every row; seeds
  pooled, Wilson band), the paper's published curve dashed beside a row named after a paper
  run."""
  shown = tables.rows if shown is None else tuple(shown)
  if not shown:
    return None
  cols = min(4, len(shown))
  rows = -(-len(shown) // cols)
  fig = Figure(figsize=(3.2 * cols, 2.4 * rows))
  axes = fig.subplots(rows, cols, squeeze=False, sharey=True)
  for ax, row in zip(axes.flat, shown, strict=False):
    table = row.pooled["prefix"]
    if table is not None:
      r = np.arange(table.modulus)
      ax.fill_between(r, 100 * np.array(table.low), 100 * np.array(table.high), alpha=0.3)
      ax.plot(r, 100 * np.array(table.accuracy), marker=".", label=f"ours ({row.seeds} seeds)")
    theirs = None if row.paper is None else published.lookup_row(row.paper, "prefix")
    if theirs is not None:
      ax.plot(np.arange(len(theirs["acc"])), theirs["acc"], "--", color="gray", label="paper")
    ax.set_title(row.variant, fontsize=9)
    ax.set_ylim(0, 100)
    ax.legend(fontsize=6)
  for ax in list(axes.flat)[len(shown):]:
    ax.axis("off")
  fig.supxlabel("residue t_K mod 24 (prefix padding)")
  fig.supylabel("accuracy %")
  fig.tight_layout()
  os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
  FigureCanvasAgg(fig).print_figure(path, dpi=110)
  return path


def _pooled_numbers(claim: Claim, variant: str) -> Mapping[str, Any]:
  return claim.numbers.get(f"{variant} ({POOLED})") or {}


def _pooled_decision(claim: Claim, variant: str) -> Mapping[str, Any] | None:
  """The seed-pooled prefix decision of ``variant`` when the claim was judged by the period
  decision by effect size (claim rules >= 2: numbers[variant]["pooled"]), else None (rules 1
  store a detected period and a p-value under "<variant> (seeds pooled)")."""
  found = claim.numbers.get(variant)
  pooled = found.get("pooled") if isinstance(found, Mapping) else None
  return pooled.get("prefix") if isinstance(pooled, Mapping) else None


def _decided(decision: Mapping[str, Any], stride: int | None = None) -> str:
  """A period decision in words, with the stride it is judged against and its residue effect:
  "periodic 8 (S = 8, effect 14.3 points rms)", "flat (effect 0.4 points rms)"."""
  verdict = decision.get("verdict") or "-"
  words = f"periodic {decision['period']}" if verdict == "periodic" else verdict
  notes = ([] if stride is None else [f"S = {stride}"]) + (
      [] if decision.get("effect_rms") is None else
      [f"effect {100 * decision['effect_rms']:.1f} points rms"])
  return f"{words} ({', '.join(notes)})" if notes else words


def _c10(claim: Claim, rows: Sequence[Row]) -> str:
  parts = []
  for row in rows:
    entry, theirs_shape = row.paper, row.paper_shape
    if not row.geometry or entry is None or theirs_shape is None:
      continue
    ours = _pooled_numbers(claim, row.variant)
    decision = _pooled_decision(claim, row.variant)
    shape = row.shape.get("prefix")
    theirs = published.lookup_row(entry, "prefix")
    s = row.stride
    # The same shape numbers on both sides where the paper's data allow: the stride repeat and
    # lag S against the other lags; the weakest phase and the phases that work need intervals,
    # which the paper's curve (no prompt counts published) does not give.
    mine = ("" if shape is None else
            f"stride repeat {100 * shape.repeat:.1f} points (noise "
            f"{100 * shape.noise:.1f}, {'within' if shape.within_noise else 'beyond'} it), "
            f"lag S / other lags {shape.relative:.2f}, {_weakest(shape)}, "
            f"{len(shape.working)} of {s} phases work, ")
    if decision is None:
      found = f"detected period {ours.get('detected_period') or 'none'} (S = {s})"
      gap = ours.get("gap")
    else:  # the main table's seed-pooled gap, beside the decision that judged the row
      found, gap = _decided(decision, s), _prefix_gap(row)
    parts.append(f"{row.variant}: ours {found}, {mine}prefix gap {percent(gap)} points; paper "
                 f"stride repeat {theirs_shape.repeat:.1f} points, lag S / other lags "
                 f"{theirs_shape.relative:.2f}, lowest phase {theirs_shape.lowest} "
                 f"({theirs_shape.margin:.1f} points below the next, no interval), gap "
                 f"{theirs['gap']:.1f} (ours {_diff(gap, theirs['gap'])})")
  return "; ".join(parts) or "no row named after a paper run"


def _prefix_gap(row: Row) -> float | None:
  table = row.pooled["prefix"]
  return None if table is None else table.gap


def _weakest(shape: Shape) -> str:
  return (shape_tables.NO_WEAKEST if shape.weakest is None else
          f"weakest phase {shape.weakest}")


def _diff(ours: float | None, theirs: float | None) -> str:
  if ours is None or theirs is None:
    return "-"
  return f"{100 * ours - theirs:+.1f} points"


def _c12(claim: Claim, rows: Sequence[Row]) -> str:
  parts = []
  for row in rows:
    if row.ablation is None or row.paper is None:
      continue
    ours = _pooled_numbers(claim, row.variant)
    decision = _pooled_decision(claim, row.variant)
    theirs = published.lookup_row(row.paper, "prefix")
    if decision is None:
      found, gap = (f"p = {p_value(ours['p_value']) if 'p_value' in ours else '-'}",
                    ours.get("gap"))
    else:
      found, gap = _decided(decision), _prefix_gap(row)
    parts.append(f"{row.variant}: ours {found}, prefix gap {percent(gap)} vs the paper's "
                 f"{theirs['gap']:.1f} ({_diff(gap, theirs['gap'])})")
  return "; ".join(parts) or "no row named after a paper run"


def _c13(tables: Tables) -> str:
  a, b = (("-" if x is None else f"{x:.1f}")
          for x in (tables.worst_spread, tables.paper_worst_spread))
  return (f"among rows within 5 points in prefix mean, the worst residue differs by up to {a} "
          f"points in ours and {b} in the paper's published compressed rows (its three "
          "full-attention rows, `results/period_effect/published_full_attention.json`, are not "
          "in this count)")


_MECHANISM = ("the paper's published data hold no {what} values (only the knockout maps' "
              "shape, e.g. 28 x 24), so ours cannot be compared in numbers")


def _gap_of(tables: Tables, variant: str) -> float | None:
  row = next((r for r in tables.rows if r.variant == variant), None)
  return None if row is None else _prefix_gap(row)


def _stride_two() -> str:
  """The paper's one model with a stride of 2 (DeepSeek-V4.1-Flash, long needle at 128K)."""
  found = next((m for m in published.published()["niah"]["models"] if m["S"] == 2), None)
  if found is None:
    return "the paper publishes no stride-2 model"
  return (f"the paper's only stride-2 model ({found['name']}, long needle at 128K tokens, "
          f"residues mod 8) has a gap of {found['gap']:.1f} points, even residues above odd")


def cure_line(claim: Claim, tables: Tables) -> str:
  """A cure's line: per row its verdict, prefix gap beside its reference's, what remains
  inside the chunk; the paper tested no cure under its protocol but a stride of 2."""
  _, rows, reference = cure_claims.CURES[claim.id]
  ref_gap = _gap_of(tables, reference)
  parts = []
  for row in rows:
    found = claim.numbers.get(row)
    if not isinstance(found, Mapping):
      continue
    parts.append(f"{row}: {found['verdict']}, prefix gap {percent(_gap_of(tables, row))} "
                 f"points against {percent(ref_gap)} for {reference}; {found['inside_chunk']}")
  paper = (_stride_two() if claim.id == "C21" else
           "the paper tested no such cure (its cure is DeepSeek-V4.1's stride of 2, C21)")
  return "; ".join(parts + [paper]) if parts else f"no cure row with stored answers; {paper}"


def comparison_lines(claims: Sequence[Claim], tables: Tables) -> list[str]:
  """One line per claim C10-C21: ours against the paper's published numbers."""
  by_id = {c.id: c for c in claims}
  if not tables.rows or "C10" not in by_id:
    return []
  text = {
      "C10": _c10(by_id["C10"], tables.rows),
      "C11": "the paper's published data hold no full-attention row (its text: within about 6 "
             "points); ours: " + "; ".join(
                 f"{row.variant}: prefix gap {percent(t.gap)} points" for row in tables.rows
                 if row.full and (t := row.pooled["prefix"]) is not None),
      "C12": _c12(by_id["C12"], tables.rows),
      "C13": _c13(tables),
      "C14": _MECHANISM.format(what="knockout"),
      "C15": _MECHANISM.format(what="gate concentration or knockout"),
      "C16": _MECHANISM.format(what="gate cycling"),
      **{cid: cure_line(by_id[cid], tables) for cid in cure_claims.CURES if cid in by_id},
  }
  return [f"- **{cid}** ({by_id[cid].verdict} here) against the paper: {line}"
          for cid, line in text.items() if cid in by_id]


def size_table(tables: Tables) -> list[str]:
  """The size trend (described, no claim; empty without size rows)."""
  if not tables.sizes:
    return []
  lines = ["### How the regime changes with size (described, no claim)", "",
           "Lookup test, prefix padding, the seeds every size has pooled (the prompt as the "
           "unit); accuracy %; phases that work: one-sided 95% lower bound >= 50% (of S, or of "
           "8 for full attention; '-' for a row less than 10 points above the best strategy "
           "that never reads the target's record, whose phases are noise around that "
           "shortcut); the period decision by effect size.", "",
           "| row | size | seeds | mean | worst (residue) | gap | phases that work | "
           "period decision |", "|:--|:--|--:|--:|--:|--:|--:|:--|"]
  for r in tables.sizes:
    mean, worst, gap = _cells(r.prefix)
    works = ("-" if r.shape is None or r.at_shortcut
             else f"{len(r.shape.working)} of {r.shape.stride}")
    lines.append(f"| {r.row} | {r.size} ({r.variant}) | {r.seeds} | {mean} | {worst} | {gap} | "
                 f"{works} | {r.decision} |")
  return lines


def overview(view: View) -> dict[str, str]:
  """The report's first figures: the lookup curves of the paper's strides, full attention
  and the cures (where the sweep has more rows than those), then of every row (none without
  lookup records)."""
  out = {}
  focus = main_rows(view.tables)
  if focus and len(focus) < len(view.tables.rows):
    path = plot_residues(os.path.join(view.plots_dir, "lookup_main.png"), view.tables, focus)
    out["lookup accuracy by residue mod 24: the paper's strides (1 KV), full attention and the "
        "cures (prefix padding; the paper's curve dashed)"] = path
  residues = plot_residues(os.path.join(view.plots_dir, "lookup_residues.png"), view.tables)
  if residues is not None:
    out["lookup accuracy by residue mod 24 per row (prefix padding; the paper's curve "
        "dashed)"] = residues
  return out


def summary(view: View) -> list[str]:
  """The summary's paper-style table and the per-claim comparison with the paper."""
  table = main_table(view.tables)
  if not table:
    return []
  lines = ["### Main table (the paper's columns)", "", *table]
  sizes = size_table(view.tables)
  if sizes:
    lines += ["", *sizes]
  compared = comparison_lines(view.claims, view.tables)
  if compared:
    lines += ["", "Where our small-scale results agree with the paper or differ, per claim:",
              "", *compared]
  return lines
