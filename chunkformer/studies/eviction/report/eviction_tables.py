"""Report section of the eviction sweep: accuracy by needle phase per policy and budget.

Formats ``claims.eviction_data.phase_rows`` and ``claims.lookup_claims.phase_rows`` (every
number computed there, from the stored matrices pooled over seeds) and the verdicts of claims
E1-E6: one table row per policy and
budget (accuracy; per chunk length L the max-min gap over offset mod L and its weakest
residue), the accuracy per residue with 95% Wilson intervals, and one figure per model
variant and depth: a panel per budget given and L, a line per policy (percentages).
"""

from __future__ import annotations

import os
import re
from collections.abc import Sequence

import numpy as np
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from chunkformer.evaluation.records.claim import Claim
from chunkformer.evaluation.records.formatting import percent
from chunkformer.evaluation.report.sections import View
from chunkformer.studies.eviction.claims.eviction_data import PhaseRow

CLAIMS = ("E1", "E2", "E3", "E4", "E5", "E6")
# line styles of the chunked policies in the figures (the others dashed with squares)
STYLES = {"chunkkv": "o-", "chunkkv_cut": "^:", "content_chunkkv": "o-"}


def _budget(row: PhaseRow) -> str:
  return "/".join(str(b) for b in row.budget)


def section(rows: Sequence[PhaseRow], claims: Sequence[Claim], plots_dir: str,
            directory: str) -> str:
  """The markdown section ('' without eviction results); figures go to ``plots_dir``."""
  if not rows:
    return ""
  lengths = sorted({m for r in rows for m in r.residues})
  lines = ["", "## KV eviction: accuracy by needle phase per policy and budget", "",
           "The cache pruned once after the prompt (`eviction_needles`; for the lookup rows, "
           "`eviction_lookup`, at the record region's end, the depth column naming the "
           "padding), the answer decoded from what was kept; accuracy in %, every seed's "
           "haystacks (lookup: prompts) pooled; gap = best - worst accuracy over the needle "
           "offset (lookup: the target key's position) mod L (ChunkKV's grid starts at position "
           "0), weakest residue in brackets. Budget in tokens kept (ChunkKV as published rounds "
           "the budget it is given, in its label, down to whole chunks).", ""]
  for claim in (c for c in claims if c.id in CLAIMS):
    lines.append(f"- {claim.id} {claim.verdict} ({claim.seeds_agreeing} seeds): "
                 f"{claim.statement}")
  lines += ["", "| model | depth | budget | policy | seeds | accuracy | "
            + " | ".join(f"gap L={m}" for m in lengths) + " |",
            "|:--|:--|--:|:--|--:|--:|" + "--:|" * len(lengths)]
  for r in rows:
    gaps = [f"{percent(r.residues[m].gap)} ({r.residues[m].worst_residue})" if m in r.residues
            else "-" for m in lengths]
    lines.append(f"| {r.variant} | {r.depth} | {_budget(r)} | {r.label} | {r.seeds} | "
                 f"{percent(r.accuracy)} | " + " | ".join(gaps) + " |")
  lines += ["", "Accuracy per residue of the offset mod L [95% Wilson interval]:", ""]
  for r in rows:
    for m, t in r.residues.items():
      cells = " ".join(f"{k}: {percent(a)} [{percent(lo)}, {percent(hi)}]" for k, (a, lo, hi) in
                       enumerate(zip(t.accuracy, t.low, t.high, strict=True)))
      lines.append(f"- {r.variant}, {r.depth}, {r.label}, L={m} (n = {t.total[0]} per "
                   f"residue): {cells}")
  for (variant, depth), path in plot_phase_grid(rows, plots_dir).items():
    relative = os.path.relpath(path, directory).replace(os.sep, "/")
    lines += ["", f"![accuracy by needle phase under eviction, {variant}, {depth}]({relative})"]
  return "\n".join(lines) + "\n"


def plot_phase_grid(rows: Sequence[PhaseRow], plots_dir: str) -> dict[tuple[str, str], str]:
  """One PNG per (model variant, depth): panels budget x L, accuracy by residue per policy."""
  out = {}
  for key in dict.fromkeys((r.variant, r.depth) for r in rows):
    mine = [r for r in rows if (r.variant, r.depth) == key]
    budgets = list(dict.fromkeys(r.given for r in mine))
    lengths = sorted({m for r in mine for m in r.residues})
    kinds = list(dict.fromkeys(r.short for r in mine))
    figure = Figure(figsize=(3.2 * len(lengths) + 1.6, 2.4 * len(budgets)), dpi=100,
                    layout="constrained")
    FigureCanvasAgg(figure)
    axes = np.atleast_2d(figure.subplots(len(budgets), len(lengths), squeeze=False))
    for i, budget in enumerate(budgets):
      for j, m in enumerate(lengths):
        ax = axes[i, j]
        for r in (r for r in mine if r.given == budget and m in r.residues):
          style = STYLES.get(r.kind, "s--")
          ax.plot(range(m), 100 * np.asarray(r.residues[m].accuracy), style, ms=3, lw=1,
                  color=f"C{kinds.index(r.short) % 10}", label=r.short)
        ax.set_ylim(-3, 103)
        ax.set_xticks(range(m))
        ax.set_title(f"budget {budget}, offset mod {m}", fontsize=9)
        if j == 0:
          ax.set_ylabel("accuracy %")
    handles, names = axes[0, 0].get_legend_handles_labels()
    figure.legend(handles, names, loc="outside right upper", fontsize=7)
    # a lookup row's depth names its padding ("lookup, prefix"): file names keep [A-Za-z0-9_.-]
    name = re.sub(r"[^A-Za-z0-9_.-]+", "_", f"eviction_phase_{key[0]}_{key[1]}") + ".png"
    path = os.path.join(plots_dir, name)
    os.makedirs(plots_dir, exist_ok=True)
    figure.savefig(path, format="png")
    out[key] = path
  return out


def report_section(view: View) -> str:
  """The study's report hook: the section from the judged phase rows."""
  return section(view.tables, view.claims, view.plots_dir, view.directory)
