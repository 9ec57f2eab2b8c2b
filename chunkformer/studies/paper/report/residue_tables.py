"""Report tables of the position-matched tests (``lookup``, ``long_needle`` probe records):
one summary row per unit and padding mode, the accuracy per residue with its 95% Wilson
interval, and the paper's published row beside a unit named after a paper run (formatting
only; percentages). The records' own stride repeat (mean |A(r) - A(r + S)|) is not shown: on
its own it is noise-sized; the lookup curves' shape against their noise is
``report.shape_tables``."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from chunkformer.evaluation.records.formatting import percent
from chunkformer.evaluation.records.residue_test import ResidueTest
from chunkformer.evaluation.records.variant import VariantRecord
from chunkformer.studies.paper.records import published


def section(results: Sequence[tuple[str, Mapping[str, Any]]]) -> str:
  """Markdown for (unit, probe record) pairs of the lookup and long needle probes."""
  if not results:
    return ""
  lines = ["", "## Position-matched tests (accuracy % by residue of the target key position)",
           "", "A unit named after a paper run is followed by its published row, labelled "
           f"{published.SCALE_NOTE}.", "",
           "| variant | test | padding | val loss | mean | worst (residue) | gap |",
           "|:--|:--|:--|--:|--:|--:|--:|"]
  curves = []
  for unit, record in results:
    test = ResidueTest.from_record(record)
    loss = "-" if test.validation_loss is None else f"{test.validation_loss:.3f}"
    for mode, t in test.modes.items():
      lines.append(f"| {unit} | {test.test} | {mode} | {loss} | {percent(t.mean)} | "
                   f"{percent(t.worst)} ({t.worst_residue}) | {percent(t.gap)} |")
      cells = " ".join(f"{r}: {percent(a)} [{percent(lo)}, {percent(hi)}]" for r, (a, lo, hi) in
                       enumerate(zip(t.accuracy, t.low, t.high, strict=True)))
      curves.append(f"- {unit}, {test.test}, {mode} (n = {t.total[0]} per residue, mod "
                    f"{t.modulus}): {cells}")
      entry = published.run_for(unit) if test.test == "lookup" else None
      row = None if entry is None else published.lookup_row(entry, mode)
      if row is not None:
        lines.append(f"| {published.ROW_LABEL}: {entry['name']} | lookup | {mode} | "
                     f"{row['loss'] if row['loss'] is not None else '-'} | {row['mean']:.1f} | "
                     f"{row['worst']:.1f} | {row['gap']:.1f} |")
        curves.append(f"- {published.ROW_LABEL}: {entry['name']}, {mode} (mod 24): "
                      + " ".join(f"{r}: {a:.1f}" for r, a in enumerate(row["acc"])))
  return "\n".join(lines + ["", "Accuracy per residue [95% Wilson interval]:", ""] + curves)


RESIDUE_TESTS = ("lookup", "long_needle")  # the probes whose records this section shows


def probe_section(records: Sequence[VariantRecord]) -> str:
  """The section of every record's position-matched tests, in record order."""
  return section([(r.name, value) for r in records for name, value in (r.probes or {}).items()
                  if value is not None and name in RESIDUE_TESTS])
