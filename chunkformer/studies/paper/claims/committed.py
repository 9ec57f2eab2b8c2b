"""A committed paper-protocol sweep opened for reading, without training or probing anything:
its records and claims as results.json stores them, its stored answers, and the report's
tables (``claims.main_table``) recomputed from those. The notebook ``the_papers_table``
draws the main table, the figures and the comparison with the paper from it.

The claims are read as stored: the ones the sweep's own claim rules decided, and, for a sweep
decided by older rules, the same claims under the current rules (``current_claims``), which
the verdict table shows beside wherever they differ.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Sequence

from chunkformer import workdir
from chunkformer.evaluation.claims import registry
from chunkformer.evaluation.claims import rules as claim_rules
from chunkformer.evaluation.records import correctness, results_file
from chunkformer.evaluation.records.claim import Claim, changed
from chunkformer.studies.paper.claims import main_table

# The paper's table, newest plan first: plan version 5, then version 4.
SWEEPS = ("paper_plan5", "paper_protocol")
# The claims a reader of the paper's table looks at first.
PAPER_CLAIMS = tuple(f"C{i}" for i in range(10, 22)) + ("E4", "E5", "E6")


@dataclasses.dataclass(frozen=True)
class Opened:
  directory: str
  results: results_file.SweepResults
  claims: tuple[Claim, ...]  # as the sweep's own rules decided them
  rules: str  # that rules version
  current: tuple[Claim, ...]  # under the current rules, where those are newer (else empty)
  current_rules: str | None
  tables: main_table.Tables


def results_root(start: str | None = None) -> str:
  """The repository's ``results/``: under ``start`` (default: the working directory) or its
  parent (a notebook runs in notebooks/); FileNotFoundError naming both."""
  start = os.path.abspath(start or os.getcwd())
  found = [os.path.join(d, "results") for d in (start, os.path.dirname(start))]
  for path in found:
    if os.path.isdir(path):
      return path
  raise FileNotFoundError(f"no results/ directory in {found[0]} or {found[1]}: run from a "
                          "checkout of the repository")


def newest(root: str, sweeps: Sequence[str] = SWEEPS) -> str:
  """The first of ``sweeps`` under ``root`` with a results.json (FileNotFoundError if none)."""
  for name in sweeps:
    path = os.path.join(root, name)
    if os.path.exists(os.path.join(path, workdir.SWEEP_RESULTS_FILE)):
      return path
  raise FileNotFoundError(f"none of {', '.join(sweeps)} under {root} has a "
                          f"{workdir.SWEEP_RESULTS_FILE}")


def open_sweep(directory: str) -> Opened:
  """``directory``'s committed sweep (module docstring)."""
  results = results_file.load(os.path.join(directory, workdir.SWEEP_RESULTS_FILE))
  rules = claim_rules.of_settings(results.settings)
  evidence = registry.Evidence(results.variants, {}, correctness.loader(directory),
                               rules=rules)
  return Opened(directory, results, tuple(results.claims), rules.version,
                tuple(results.current_claims or ()),
                results.current_rules if results.current_claims else None,
                main_table.tables(evidence))


def verdict_table(opened: Opened, ids: Sequence[str] = PAPER_CLAIMS) -> str:
  """The claims ``ids`` as a markdown table: verdict under the sweep's own rules, seeds
  agreeing, statement; for a sweep decided by older rules, a column of the current rules'
  verdict where it differs (blank where it is the same)."""
  moved = changed(opened.claims, opened.current) if opened.current else {}
  head = (f"Claims of `{os.path.basename(opened.directory)}`, decided by claim rules version "
          f"{opened.rules}")
  columns, align = ["claim", "verdict", "seeds agreeing", "statement"], [":--", ":--", "--:", ":--"]
  if moved:
    head += (f"; where the current rules (version {opened.current_rules}, changed after these "
             "results were seen) decide otherwise, their verdict beside")
    columns.insert(3, f"version {opened.current_rules}")
    align.insert(3, ":--")
  lines = [f"{head}:", "", f"| {' | '.join(columns)} |", f"|{'|'.join(align)}|"]
  for c in opened.claims:
    if c.id in ids:
      cells = [c.id, c.verdict, str(c.seeds_agreeing), c.statement]
      if moved:
        other = moved.get(c.id)
        cells.insert(3, "" if c.id not in moved else "-" if other is None else
                     f"{other.verdict} ({other.seeds_agreeing})")
      lines.append(f"| {' | '.join(cells)} |")
  return "\n".join(lines)
