"""The summary's paper-style pieces for sweeps with lookup records: the main table (per row: val
loss, mean, worst and gap in both padding modes, the paper's published row beside each of
ours, labelled as the paper's scale), the main figure (accuracy by residue per row, the
paper's curve beside) and one line per claim C10-C16 saying where our result agrees with the
paper or differs from it, and by how much (``records/paper_published.json``).

Rows are sweep variants; a row's seeds are pooled by summing their counts per residue
(``claims.paper_rows.pooled_mode``). Formatting only: the claims are judged elsewhere.
"""

from __future__ import annotations

import itertools
import os
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from chunkformer.evaluation.records.claim import Claim
from chunkformer.evaluation.records.formatting import p_value
from chunkformer.evaluation.records.variant import VariantRecord
from chunkformer.evaluation.report.sections import View
from chunkformer.evaluation.stats.residue_accuracy import ResidueAccuracy
from chunkformer.studies.paper.claims import paper_rows as pr
from chunkformer.studies.paper.records import published

MODES = {"prefix": "prefix", "in_sequence": "in-sequence"}


def lookup_rows(records: Sequence[VariantRecord]) -> dict[str, list[VariantRecord]]:
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


def _cells(table: ResidueAccuracy | None) -> list[str]:
  if table is None:
    return ["-"] * 3
  return [pr.pct(table.mean), f"{pr.pct(table.worst)} ({table.worst_residue})",
          pr.pct(table.gap)]


def main_table(records: Sequence[VariantRecord]) -> list[str]:
  """The paper-style main table (empty without lookup records)."""
  found = lookup_rows(records)
  if not found:
    return []
  lines = ["Lookup test, accuracy % by residue of the target key (mod 24), seeds pooled; worst "
           "(residue); gap = best - worst. Each row of ours is followed by the paper's "
           f"published row where it has one, labelled {published.SCALE_NOTE}.", "",
           "| row | seeds | val loss | prefix mean | prefix worst | prefix gap | in-seq mean | "
           "in-seq worst | in-seq gap |", "|:--|--:|--:|--:|--:|--:|--:|--:|--:|"]
  for variant, units in found.items():
    loss = _loss(units)
    cells = [c for mode in MODES for c in _cells(pr.pooled_mode(units, mode))]
    lines.append(f"| {variant} | {len(units)} | {'-' if loss is None else f'{loss:.3f}'} | "
                 + " | ".join(cells) + " |")
    entry = published.run_for(variant)
    if entry is not None:
      theirs = {m: published.lookup_row(entry, m) for m in MODES}
      cells = []
      for m in MODES:
        row = theirs[m]
        cells += (["-"] * 3 if row is None else
                  [f"{row['mean']:.1f}", f"{row['worst']:.1f}", f"{row['gap']:.1f}"])
      lines.append(f"| {published.SCALE_NOTE}: {entry['name']} | - | {entry.get('loss', '-')} | "
                   + " | ".join(cells) + " |")
  return lines


def plot_residues(path: str, records: Sequence[VariantRecord]) -> str | None:
  """The main figure: prefix-padding accuracy by residue per row (seeds pooled, Wilson band),
  the paper's published curve dashed beside a row named after a paper run."""
  found = lookup_rows(records)
  if not found:
    return None
  cols = min(4, len(found))
  rows = -(-len(found) // cols)
  fig = Figure(figsize=(3.2 * cols, 2.4 * rows))
  axes = fig.subplots(rows, cols, squeeze=False, sharey=True)
  for ax, (variant, units) in zip(axes.flat, found.items(), strict=False):
    table = pr.pooled_mode(units, "prefix")
    if table is not None:
      r = np.arange(table.modulus)
      ax.fill_between(r, 100 * np.array(table.low), 100 * np.array(table.high), alpha=0.3)
      ax.plot(r, 100 * np.array(table.accuracy), marker=".", label=f"ours ({len(units)} seeds)")
    entry = published.run_for(variant)
    row = None if entry is None else published.lookup_row(entry, "prefix")
    if row is not None:
      ax.plot(np.arange(len(row["acc"])), row["acc"], "--", color="gray", label="paper")
    ax.set_title(variant, fontsize=9)
    ax.set_ylim(0, 100)
    ax.legend(fontsize=6)
  for ax in list(axes.flat)[len(found):]:
    ax.axis("off")
  fig.supxlabel("residue t_K mod 24 (prefix padding)")
  fig.supylabel("accuracy %")
  fig.tight_layout()
  os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
  FigureCanvasAgg(fig).print_figure(path, dpi=110)
  return path


def _pooled_numbers(claim: Claim, variant: str) -> Mapping[str, Any]:
  return claim.numbers.get(f"{variant} ({pr.POOLED})") or {}


def _stride_repeat(acc: Sequence[float], stride: int) -> float:
  a = np.asarray(acc, np.float64)
  return float(np.mean(np.abs(a[:-stride] - a[stride:])))


def _c10(claim: Claim, found: Mapping[str, list[VariantRecord]]) -> str:
  parts = []
  for variant, units in found.items():
    entry = published.run_for(variant)
    if not pr.is_geometry(units[0].setup) or entry is None:
      continue
    ours = _pooled_numbers(claim, variant)
    table = pr.pooled_mode(units, "prefix")
    row = published.lookup_row(entry, "prefix")
    s = units[0].chunk_size
    # The same two shape numbers for both sides: where the weak phase sits, and how closely
    # the curve repeats one stride on (mean |A(r) - A(r + S)|, points).
    mine = ("" if table is None else
            f"weakest residue mod S {table.worst_residue % s}, stride repeat "
            f"{_stride_repeat(100 * np.asarray(table.accuracy), s):.1f} points, ")
    parts.append(f"{variant}: ours detected period {ours.get('detected_period') or 'none'} "
                 f"(S = {s}), {mine}prefix gap {pr.pct(ours.get('gap'))} points; paper "
                 f"weakest residue mod S {entry['pp'].get('argmin_mod_S')}, stride repeat "
                 f"{_stride_repeat(row['acc'], s):.1f} points, gap {row['gap']:.1f} "
                 f"(ours {_diff(ours.get('gap'), row['gap'])})")
  return "; ".join(parts) or "no row named after a paper run"


def _diff(ours: float | None, theirs: float | None) -> str:
  if ours is None or theirs is None:
    return "-"
  return f"{100 * ours - theirs:+.1f} points"


def _c12(claim: Claim, found: Mapping[str, list[VariantRecord]]) -> str:
  parts = []
  for variant, units in found.items():
    entry = published.run_for(variant)
    if pr.ablation_kind(units[0].setup) is None or entry is None:
      continue
    ours = _pooled_numbers(claim, variant)
    row = published.lookup_row(entry, "prefix")
    parts.append(f"{variant}: ours p = {p_value(ours['p_value']) if 'p_value' in ours else '-'}"
                 f", prefix gap {pr.pct(ours.get('gap'))} vs the paper's {row['gap']:.1f} "
                 f"({_diff(ours.get('gap'), row['gap'])})")
  return "; ".join(parts) or "no row named after a paper run"


def _spread(rows: Sequence[tuple[float, float]]) -> float | None:
  """The largest worst-residue difference between rows within 5 points of each other in mean
  (points; rows given as (mean, worst) in points)."""
  found = [abs(a[1] - b[1]) for a, b in itertools.combinations(rows, 2)
           if abs(a[0] - b[0]) <= 100 * 0.05]
  return max(found) if found else None


def _c13(found: Mapping[str, list[VariantRecord]]) -> str:
  theirs = [(r["pp"]["mean"][0], r["pp"]["worst"]) for r in published.published()["runs"]]
  ours = [(100 * t.mean, 100 * t.worst) for units in found.values()
          if (t := pr.pooled_mode(units, "prefix")) is not None]
  a, b = (("-" if x is None else f"{x:.1f}") for x in (_spread(ours), _spread(theirs)))
  return (f"among rows within 5 points in prefix mean, the worst residue differs by up to {a} "
          f"points in ours and {b} in the paper's published rows (the paper publishes no "
          "full-attention row)")


_MECHANISM = ("the paper's published data hold no {what} values (only the knockout maps' "
              "shape, e.g. 28 x 24), so ours cannot be compared in numbers")


def comparison_lines(claims: Sequence[Claim], records: Sequence[VariantRecord]) -> list[str]:
  """One line per claim C10-C16: ours against the paper's published numbers."""
  found = lookup_rows(records)
  by_id = {c.id: c for c in claims}
  if not found or "C10" not in by_id:
    return []
  text = {
      "C10": _c10(by_id["C10"], found),
      "C11": "the paper's published data hold no full-attention row (its text: within about 6 "
             "points); ours: " + "; ".join(
                 f"{v}: prefix gap {pr.pct(t.gap)} points" for v, units in found.items()
                 if pr.is_full(units[0].setup)
                 and (t := pr.pooled_mode(units, "prefix")) is not None),
      "C12": _c12(by_id["C12"], found),
      "C13": _c13(found),
      "C14": _MECHANISM.format(what="knockout"),
      "C15": _MECHANISM.format(what="gate concentration or knockout"),
      "C16": _MECHANISM.format(what="gate cycling"),
  }
  return [f"- **{cid}** ({by_id[cid].verdict} here) against the paper: {line}"
          for cid, line in text.items() if cid in by_id]


def overview(view: View) -> dict[str, str]:
  """The report's first figure: the lookup curves per row (none without lookup records)."""
  residues = plot_residues(os.path.join(view.plots_dir, "lookup_residues.png"), view.records)
  if residues is None:
    return {}
  return {"lookup accuracy by residue mod 24 per row (prefix padding; the paper's curve "
          "dashed)": residues}


def summary(view: View) -> list[str]:
  """The summary's paper-style table and the per-claim comparison with the paper."""
  table = main_table(view.records)
  if not table:
    return []
  lines = ["### Main table (the paper's columns)", "", *table]
  compared = comparison_lines(view.claims, view.records)
  if compared:
    lines += ["", "Where our small-scale results agree with the paper or differ, per claim:",
              "", *compared]
  return lines
