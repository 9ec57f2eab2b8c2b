"""Report section of the sparse-prefill sweep: accuracy by needle phase per pattern and budget.

Formats ``claims.sparse_data.tables`` (every number computed there, from the stored matrices
pooled over seeds) and the verdicts of claims P1-P2 through the engine's section
(``evaluation.report.policy_tables``): one table row per pattern (block, share of causal pairs
kept, accuracy; per block size B the max-min gap over offset mod B and its weakest residue;
for keep-all the share of cells equal to the dense sweep's), the accuracy per residue with 95%
Wilson intervals, and one figure per model variant and depth: a panel per pattern kind and B,
a line per budget (percentages).
"""

from __future__ import annotations

from collections.abc import Sequence

from chunkformer.evaluation.records.claim import Claim
from chunkformer.evaluation.records.formatting import percent
from chunkformer.evaluation.report import policy_tables
from chunkformer.evaluation.report.policy_tables import Column, Line
from chunkformer.evaluation.report.sections import View
from chunkformer.studies.sparse_prefill.claims.sparse_data import Tables

CLAIMS = ("P1", "P2")
INTRO = ("The prompt prefilled sparsely (`sparse_needles`): the first answer token from the "
         "sparse attention, the rest decoded densely from the cache it wrote; accuracy in %, "
         "every seed's haystacks pooled; kept = share of the prompt's causal (query, key) "
         "pairs the index sets keep; gap = best - worst accuracy over the needle offset mod B "
         "(the block grid starts at position 0), weakest residue in brackets.")

SECTION = policy_tables.Section(
    title="## Sparse prefill: accuracy by needle phase per pattern and budget", intro=INTRO,
    claims=CLAIMS, letter="B",
    before=(Column("pattern", ":--", lambda r: r.label),
            Column("block", "--:", lambda r: str(r.block)),
            Column("kept", "--:", lambda r: percent(r.kept))),
    after=(Column("= dense", "--:",
                  lambda r: "-" if r.matches_dense is None else percent(r.matches_dense)),),
    under="under sparse prefill",
    grid=policy_tables.Grid(
        prefix="sparse_prefill_phase", panel=lambda r: r.short,
        title=lambda kind, m: f"{kind}, offset mod {m}",
        line=lambda r, k, _: Line("o-", k, f"{r.label} ({percent(r.kept)} kept)"),
        width=2.4, height=2.2, legend_per_panel=True))


def section(found: Tables | None, claims: Sequence[Claim], plots_dir: str,
            directory: str) -> str:
  """The markdown section ('' without sparse-prefill results); figures go to ``plots_dir``."""
  if found is None:
    return ""
  dense = [f"- dense needle sweep ({variant}, {depth}): accuracy {percent(accuracy)}"
           for (variant, depth), accuracy in found.dense.items()]
  return policy_tables.section(SECTION, found.rows, claims, dense, plots_dir, directory)


def report_section(view: View) -> str:
  """The study's report hook: the section from the judged tables."""
  return section(view.tables, view.claims, view.plots_dir, view.directory)
