"""Report section of the eviction sweep: accuracy by needle phase per policy and budget.

Formats ``claims.eviction_data.phase_rows`` and ``claims.lookup_claims.phase_rows`` (every
number computed there, from the stored matrices pooled over seeds) and the verdicts of claims
E1-E6 through the engine's section (``evaluation.report.policy_tables``): one table row per
policy and budget (accuracy; per chunk length L the max-min gap over offset mod L and its
weakest residue), the accuracy per residue with 95% Wilson intervals, and one figure per model
variant and depth: a panel per budget given and L, a line per policy (percentages).
"""

from __future__ import annotations

from collections.abc import Sequence

from chunkformer.evaluation.records.claim import Claim
from chunkformer.evaluation.report import policy_tables
from chunkformer.evaluation.report.policy_tables import Column, Line
from chunkformer.evaluation.report.sections import View
from chunkformer.studies.eviction.claims.eviction_data import PhaseRow

CLAIMS = ("E1", "E2", "E3", "E4", "E5", "E6")
# line styles of the chunked policies in the figures (the others dashed with squares)
STYLES = {"chunkkv": "o-", "chunkkv_cut": "^:", "content_chunkkv": "o-"}
INTRO = ("The cache pruned once after the prompt (`eviction_needles`; for the lookup rows, "
         "`eviction_lookup`, at the record region's end, the depth column naming the "
         "padding), the answer decoded from what was kept; accuracy in %, every seed's "
         "haystacks (lookup: prompts) pooled; gap = best - worst accuracy over the needle "
         "offset (lookup: the target key's position) mod L (ChunkKV's grid starts at position "
         "0), weakest residue in brackets. Budget in tokens kept (ChunkKV as published rounds "
         "the budget it is given, in its label, down to whole chunks).")


def _budget(row: PhaseRow) -> str:
  return "/".join(str(b) for b in row.budget)


SECTION = policy_tables.Section(
    title="## KV eviction: accuracy by needle phase per policy and budget", intro=INTRO,
    claims=CLAIMS, letter="L",
    before=(Column("budget", "--:", _budget), Column("policy", ":--", lambda r: r.label)),
    after=(), under="under eviction",
    grid=policy_tables.Grid(
        prefix="eviction_phase", panel=lambda r: r.given,
        title=lambda budget, m: f"budget {budget}, offset mod {m}",
        line=lambda r, _, kinds: Line(STYLES.get(r.kind, "s--"), kinds.index(r.short), r.short),
        width=1.6, height=2.4, legend_per_panel=False))


def section(rows: Sequence[PhaseRow], claims: Sequence[Claim], plots_dir: str,
            directory: str) -> str:
  """The markdown section ('' without eviction results); figures go to ``plots_dir``."""
  return policy_tables.section(SECTION, rows, claims, (), plots_dir, directory)


def report_section(view: View) -> str:
  """The study's report hook: the section from the judged phase rows."""
  return section(view.tables, view.claims, view.plots_dir, view.directory)
