"""The shape of the lookup curves against their noise (``claims.lookup_shape``, computed when
the sweep is judged): per row (seeds pooled), then per unit, in sections after the summary.
Formatting only."""

from __future__ import annotations

from collections.abc import Mapping

from chunkformer.evaluation.report.sections import View
from chunkformer.studies.paper.claims.lookup_shape import WORKS_MIN, Shape
from chunkformer.studies.paper.claims.main_table import MODES, Tables

NO_WEAKEST = "no single weakest phase"

EXPLAINED = (
    "Stride repeat: mean |A(r) - A(r + S)| over the 24 residues (circular), beside what exact "
    "periodicity plus the curve's own noise gives (its expectation, and the 95% point above "
    "which the repeat is beyond noise); alone it cannot tell a periodic curve from a flat one. "
    "Lag S / other lags: the repeat over the mean at the lags that are not multiples of S "
    "(near 0: the curve repeats with S; near 1: lag S is like any other). Weakest phase (of "
    "r mod S): named only when the next lowest phase lies above it by more than the 95% "
    "interval of their difference, else \"" + NO_WEAKEST + "\". Phases that work: phases of "
    f"S whose accuracy (mean over their residues) has a one-sided 95% lower bound of at least "
    f"{100 * WORKS_MIN:.0f}%. The prompt is the unit (a row's seeds answered the same prompts: "
    "each prompt's mean over its seeds is one observation); full attention has no stride and "
    "is read at the phases of 8.")


def repeat_cell(s: Shape) -> str:
  return f"{100 * s.repeat:.1f} ({'within' if s.within_noise else 'beyond'} noise)"


def noise_cell(s: Shape) -> str:
  return f"{100 * s.noise:.1f} (95%: {100 * s.noise_upper:.1f})"


def weakest_cell(s: Shape) -> str:
  if s.weakest is None:
    return NO_WEAKEST
  return (f"{s.weakest} (next {100 * s.margin:.1f} points above, interval "
          f"±{100 * s.margin_half_width:.1f})")


def working_cell(s: Shape) -> str:
  listed = f" ({', '.join(map(str, s.working))})" if s.working else ""
  return f"{len(s.working)} of {s.stride}{listed}"


def _rows(named: Mapping[str, Mapping[str, Shape | None]]) -> list[str]:
  counted = any(s is not None and s.source != "prompts" for by in named.values()
                for s in by.values())
  lines = (["A curve marked (counts) has no stored answers: its seeds' counts per residue are "
            "summed, each answer read as a prompt of its own.", ""] if counted else [])
  lines += ["| curve | padding | S | stride repeat (points) | noise: expected (95%) | "
           "lag S / other lags | weakest phase | phases that work |",
           "|:--|:--|--:|--:|--:|--:|:--|:--|"]
  for name, by_padding in named.items():
    for mode in MODES:
      s = by_padding.get(mode)
      if s is None:
        continue
      source = "" if s.source == "prompts" else " (counts)"
      lines.append(f"| {name}{source} | {mode} | {s.stride} | {repeat_cell(s)} | "
                   f"{noise_cell(s)} | {s.relative:.2f} | {weakest_cell(s)} | "
                   f"{working_cell(s)} |")
  return lines


def row_table(tables: Tables) -> list[str]:
  """The per-row shape table (empty without a row that has one)."""
  named = {row.variant: row.shape for row in tables.rows if any(row.shape.values())}
  if not named:
    return []
  return ["## Shape of the lookup curves (rows, seeds pooled)", "", EXPLAINED, "",
          *_rows(named)]


def section(view: View) -> str:
  """The shape sections after the summary: per row, then per unit (empty without lookup
  records)."""
  tables = view.tables
  if tables is None:
    return ""
  lines = row_table(tables)
  if any(any(s.values()) for s in tables.units.values()):
    lines += ["", "## Shape of each unit's lookup curve", "",
              "As the row table above, per unit (one seed each).", "", *_rows(tables.units)]
  return "\n".join(["", *lines]) if lines else ""
