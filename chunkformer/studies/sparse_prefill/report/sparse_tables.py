"""Report section of the sparse-prefill sweep: accuracy by needle phase per pattern and budget.

Formats ``claims.sparse_data.tables`` (every number computed there, from the stored matrices
pooled over seeds) and the verdicts of claims P1-P2: one table row per pattern (block, share of
causal pairs kept, accuracy; per block size B the max-min gap over offset mod B and its weakest
residue; for keep-all the share of cells equal to the dense sweep's), the accuracy per residue
with 95% Wilson intervals, and one figure per model variant and depth: a panel per pattern kind
and B, a line per budget (percentages).
"""

from __future__ import annotations

import os
from collections.abc import Sequence

import numpy as np
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from chunkformer.evaluation.records.claim import Claim
from chunkformer.evaluation.records.formatting import percent
from chunkformer.evaluation.report.sections import View
from chunkformer.studies.sparse_prefill.claims.sparse_data import PhaseRow, Tables

CLAIMS = ("P1", "P2")


def section(found: Tables | None, claims: Sequence[Claim], plots_dir: str,
            directory: str) -> str:
  """The markdown section ('' without sparse-prefill results); figures go to ``plots_dir``."""
  if found is None or not found.rows:
    return ""
  rows = found.rows
  sizes = sorted({m for r in rows for m in r.residues})
  lines = ["", "## Sparse prefill: accuracy by needle phase per pattern and budget", "",
           "The prompt prefilled sparsely (`sparse_needles`): the first answer token from the "
           "sparse attention, the rest decoded densely from the cache it wrote; accuracy in %, "
           "every seed's haystacks pooled; kept = share of the prompt's causal (query, key) "
           "pairs the index sets keep; gap = best - worst accuracy over the needle offset mod B "
           "(the block grid starts at position 0), weakest residue in brackets.", ""]
  for claim in (c for c in claims if c.id in CLAIMS):
    lines.append(f"- {claim.id} {claim.verdict} ({claim.seeds_agreeing} seeds): "
                 f"{claim.statement}")
  for (variant, depth), accuracy in found.dense.items():
    lines.append(f"- dense needle sweep ({variant}, {depth}): accuracy {percent(accuracy)}")
  lines += ["", "| model | depth | pattern | block | kept | seeds | accuracy | "
            + " | ".join(f"gap B={m}" for m in sizes) + " | = dense |",
            "|:--|:--|:--|--:|--:|--:|--:|" + "--:|" * len(sizes) + "--:|"]
  for r in rows:
    gaps = [f"{percent(r.residues[m].gap)} ({r.residues[m].worst_residue})" if m in r.residues
            else "-" for m in sizes]
    same = "-" if r.matches_dense is None else percent(r.matches_dense)
    lines.append(f"| {r.variant} | {r.depth} | {r.label} | {r.block} | {percent(r.kept)} | "
                 f"{r.seeds} | {percent(r.accuracy)} | " + " | ".join(gaps) + f" | {same} |")
  lines += ["", "Accuracy per residue of the offset mod B [95% Wilson interval]:", ""]
  for r in rows:
    for m, t in r.residues.items():
      cells = " ".join(f"{k}: {percent(a)} [{percent(lo)}, {percent(hi)}]" for k, (a, lo, hi) in
                       enumerate(zip(t.accuracy, t.low, t.high, strict=True)))
      lines.append(f"- {r.variant}, {r.depth}, {r.label}, B={m} (n = {t.total[0]} per "
                   f"residue): {cells}")
  for (variant, depth), path in plot_phase_grid(rows, plots_dir).items():
    relative = os.path.relpath(path, directory).replace(os.sep, "/")
    lines += ["", f"![accuracy by needle phase under sparse prefill, {variant}, {depth}]"
              f"({relative})"]
  return "\n".join(lines) + "\n"


def plot_phase_grid(rows: Sequence[PhaseRow], plots_dir: str) -> dict[tuple[str, str], str]:
  """One PNG per (model variant, depth): panels pattern kind x B, accuracy by residue per
  budget."""
  out = {}
  for key in dict.fromkeys((r.variant, r.depth) for r in rows):
    mine = [r for r in rows if (r.variant, r.depth) == key]
    kinds = list(dict.fromkeys(r.short for r in mine))
    sizes = sorted({m for r in mine for m in r.residues})
    figure = Figure(figsize=(3.2 * len(sizes) + 2.4, 2.2 * len(kinds)), dpi=100,
                    layout="constrained")
    FigureCanvasAgg(figure)
    axes = np.atleast_2d(figure.subplots(len(kinds), len(sizes), squeeze=False))
    for i, kind in enumerate(kinds):
      for j, m in enumerate(sizes):
        ax = axes[i, j]
        for k, r in enumerate(r for r in mine if r.short == kind and m in r.residues):
          ax.plot(range(m), 100 * np.asarray(r.residues[m].accuracy), "o-", ms=3, lw=1,
                  color=f"C{k % 10}", label=f"{r.label} ({percent(r.kept)} kept)")
        ax.set_ylim(-3, 103)
        ax.set_xticks(range(0, m, max(1, m // 8)))
        ax.set_title(f"{kind}, offset mod {m}", fontsize=9)
        if j == 0:
          ax.set_ylabel("accuracy %")
        if j == len(sizes) - 1:
          ax.legend(fontsize=6, loc="center left", bbox_to_anchor=(1.02, 0.5))
    name = f"sparse_prefill_phase_{key[0]}_{key[1]}.png"
    path = os.path.join(plots_dir, name)
    os.makedirs(plots_dir, exist_ok=True)
    figure.savefig(path, format="png")
    out[key] = path
  return out


def report_section(view: View) -> str:
  """The study's report hook: the section from the judged tables."""
  return section(view.tables, view.claims, view.plots_dir, view.directory)
