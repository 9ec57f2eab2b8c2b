"""The report section of a sweep under an inference-time setting: accuracy by needle phase.

Formats a study's phase rows (``claims.policy_groups.PhaseRow``, every number computed by the
judge) and its claims' verdicts: one table row per setting (the study's own columns around
the seeds, the accuracy and, per length L, the max-min gap over offset mod L with its weakest
residue), the accuracy per residue with 95% Wilson intervals, and one figure per model variant
and depth (``plot_grid``): a panel per row key of the study's (a budget, a pattern kind) and
L, a line per setting (percentages). What differs between studies is passed in as values
(``Section``, ``Column``, ``Grid``).
"""

from __future__ import annotations

import dataclasses
import os
import re
from collections.abc import Callable, Hashable, Sequence

import numpy as np
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from chunkformer.evaluation.claims.policy_groups import PhaseRow
from chunkformer.evaluation.records.claim import Claim
from chunkformer.evaluation.records.formatting import percent


@dataclasses.dataclass(frozen=True)
class Column:
  """A study's own column of the phase table."""

  header: str
  align: str  # the markdown alignment: ":--" or "--:"
  cell: Callable[[PhaseRow], str]


@dataclasses.dataclass(frozen=True)
class Line:
  """How one row is drawn in a panel: matplotlib's format string, colour number and label."""

  style: str
  colour: int
  label: str


@dataclasses.dataclass(frozen=True)
class Grid:
  """A study's phase figures: one PNG per (model variant, depth), ``<prefix>_<variant>_<depth>
  .png``, a panel per value of ``panel`` (in the rows' order) and L."""

  prefix: str
  panel: Callable[[PhaseRow], Hashable]  # the panel row a table row is drawn in
  title: Callable[[Hashable, int], str]  # a panel's title from its key and L
  line: Callable[[PhaseRow, int, Sequence[str]], Line]  # the row, its index in the panel,
  # every ``short`` of the figure's rows in order
  width: float  # inches beside the panels (legend)
  height: float  # inches per panel row
  legend_per_panel: bool  # a legend right of each row's last panel, else one for the figure


@dataclasses.dataclass(frozen=True)
class Section:
  """A study's section: its title, the paragraph under it, its claims, its columns."""

  title: str
  intro: str
  claims: tuple[str, ...]  # the claim ids whose verdicts it lists
  letter: str  # the length's letter: "L", "B"
  before: tuple[Column, ...]  # the columns between the depth and the seeds
  after: tuple[Column, ...]  # the columns after the gaps
  under: str  # the figures' caption: "accuracy by needle phase <under>, variant, depth"
  grid: Grid


def section(spec: Section, rows: Sequence[PhaseRow], claims: Sequence[Claim],
            notes: Sequence[str], plots_dir: str, directory: str) -> str:
  """The markdown section ('' without rows); ``notes``: lines listed after the verdicts;
  figures go to ``plots_dir``."""
  if not rows:
    return ""
  lengths = sorted({m for r in rows for m in r.residues})
  lines = ["", spec.title, "", spec.intro, ""]
  for claim in (c for c in claims if c.id in spec.claims):
    lines.append(f"- {claim.id} {claim.verdict} ({claim.seeds_agreeing} seeds): "
                 f"{claim.statement}")
  lines += list(notes)
  gaps = [f"gap {spec.letter}={m}" for m in lengths]
  lines += ["", _cells(["model", "depth", *(c.header for c in spec.before), "seeds",
                        "accuracy"], gaps, [c.header for c in spec.after]),
            "|:--|:--|" + "".join(f"{c.align}|" for c in spec.before) + "--:|--:|"
            + "--:|" * len(lengths) + "".join(f"{c.align}|" for c in spec.after)]
  for r in rows:
    gaps = [f"{percent(r.residues[m].gap)} ({r.residues[m].worst_residue})" if m in r.residues
            else "-" for m in lengths]
    lines.append(_cells([r.variant, r.depth, *(c.cell(r) for c in spec.before), str(r.seeds),
                         percent(r.accuracy)], gaps, [c.cell(r) for c in spec.after]))
  lines += ["", f"Accuracy per residue of the offset mod {spec.letter} [95% Wilson interval]:",
            ""]
  for r in rows:
    for m, t in r.residues.items():
      cells = " ".join(f"{k}: {percent(a)} [{percent(lo)}, {percent(hi)}]" for k, (a, lo, hi) in
                       enumerate(zip(t.accuracy, t.low, t.high, strict=True)))
      lines.append(f"- {r.variant}, {r.depth}, {r.label}, {spec.letter}={m} (n = {t.total[0]} "
                   f"per residue): {cells}")
  for (variant, depth), path in plot_grid(spec.grid, rows, plots_dir).items():
    relative = os.path.relpath(path, directory).replace(os.sep, "/")
    lines += ["", f"![accuracy by needle phase {spec.under}, {variant}, {depth}]({relative})"]
  return "\n".join(lines) + "\n"


def _cells(first: Sequence[str], gaps: Sequence[str], after: Sequence[str]) -> str:
  return ("| " + " | ".join(first) + " | " + " | ".join(gaps)
          + "".join(f" | {c}" for c in after) + " |")


def plot_grid(grid: Grid, rows: Sequence[PhaseRow], plots_dir: str
              ) -> dict[tuple[str, str], str]:
  """One PNG per (model variant, depth): panels (panel key x L), accuracy by residue per row."""
  out = {}
  for key in dict.fromkeys((r.variant, r.depth) for r in rows):
    mine = [r for r in rows if (r.variant, r.depth) == key]
    panels = list(dict.fromkeys(grid.panel(r) for r in mine))
    lengths = sorted({m for r in mine for m in r.residues})
    kinds = list(dict.fromkeys(r.short for r in mine))
    figure = Figure(figsize=(3.2 * len(lengths) + grid.width, grid.height * len(panels)),
                    dpi=100, layout="constrained")
    FigureCanvasAgg(figure)
    axes = np.atleast_2d(figure.subplots(len(panels), len(lengths), squeeze=False))
    for i, panel in enumerate(panels):
      for j, m in enumerate(lengths):
        ax = axes[i, j]
        for k, r in enumerate(r for r in mine if grid.panel(r) == panel and m in r.residues):
          line = grid.line(r, k, kinds)
          ax.plot(range(m), 100 * np.asarray(r.residues[m].accuracy), line.style, ms=3, lw=1,
                  color=f"C{line.colour % 10}", label=line.label)
        ax.set_ylim(-3, 103)
        ax.set_xticks(range(0, m, max(1, m // 8)))
        ax.set_title(grid.title(panel, m), fontsize=9)
        if j == 0:
          ax.set_ylabel("accuracy %")
        if grid.legend_per_panel and j == len(lengths) - 1:
          ax.legend(fontsize=6, loc="center left", bbox_to_anchor=(1.02, 0.5))
    if not grid.legend_per_panel:
      handles, names = axes[0, 0].get_legend_handles_labels()
      figure.legend(handles, names, loc="outside right upper", fontsize=7)
    # a depth may name a padding ("lookup, prefix"): file names keep [A-Za-z0-9_.-]
    name = re.sub(r"[^A-Za-z0-9_.-]+", "_", f"{grid.prefix}_{key[0]}_{key[1]}") + ".png"
    path = os.path.join(plots_dir, name)
    os.makedirs(plots_dir, exist_ok=True)
    figure.savefig(path, format="png")
    out[key] = path
  return out
