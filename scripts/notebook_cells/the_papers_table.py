"""Cells of notebooks/the_papers_table.ipynb: the committed paper-protocol sweep opened (no
training, no probing): the claims' verdicts, the paper-style main table with the published
rows beside ours, the main figures, the size trend and one line per claim against the
paper."""

from __future__ import annotations

from scripts.notebook_cells.common import REPOSITORY, colab_badge, setup_cell

# In Colab the results come with a clone of the repository (pip installs the code only).
CLONE = f"""
  if not os.path.isdir("results"):
    subprocess.check_call(["git", "clone", "-q", "--depth", "1",
                           "https://github.com/{REPOSITORY}", "checkout"])
    os.chdir("checkout")"""

CELLS = [
    ("markdown", f"""
# The paper's table, from the committed results

{colab_badge("the_papers_table")}

The paper (arXiv 2609.36322) trains Qwen3-0.6B-sized models with chunk-compressed attention and
finds that lookup accuracy swings with the target key's position modulo the stride S. This
framework reruns its protocol at CPU size (`results/paper_plan5/PLAN.md`: every run of the
paper on 3 seeds, the cures, three model sizes) and decides each claim by the rules written
before the runs (`docs/claims.md`). This notebook opens the newest committed sweep of that
table (`results/paper_plan5`, else plan version 4's `results/paper_protocol`) and draws, from
its stored records and answers only:

1. what the units were trained on and whether its full-attention controls retrieve (plan 5's
   answer by elimination: see the first lines), then each claim's verdict (C10-C16 the
   paper's, C17-C21 the cures, E4-E6 eviction on the lookup);
2. the paper-style main table, the paper's published row under each of ours;
3. the main figure: accuracy by residue for the paper's strides, full attention and the cures,
   then every row;
4. the size trend, where the sweep has it, and one line per claim on where our scale agrees
   with the paper or differs, and by how much.

**Runtime on a CPU:** seconds; nothing trains. `CHUNKFORMER_FAST=1` (what CI runs) changes
nothing here: the notebook only reads committed files."""),
    ("code", setup_cell(CLONE)),
    ("markdown", """
## 1. The sweep and its verdicts"""),
    ("code", """import os
import tempfile

from IPython.display import Image, Markdown, display

from chunkformer import notebook
from chunkformer.studies.paper.claims import committed
from chunkformer.studies.paper.report import paper_table, regime

notebook.setup()
sweep = committed.open_sweep(committed.newest(committed.results_root()))
print(f"{sweep.directory}: {len(sweep.results.variants)} units, {len(sweep.tables.rows)} rows, "
      f"run by `{sweep.results.command}`")
display(Markdown(regime.of_committed(sweep)))  # what the units are; do the controls retrieve?
display(Markdown(committed.verdict_table(sweep)))"""),
    ("markdown", """
## 2. The main table

Accuracy in % by residue of the target key's position mod 24, seeds pooled; the paper's row
(a 0.6B model trained on 100B tokens: another scale) under each of ours that it has."""),
    ("code", """display(Markdown("\\n".join(paper_table.main_table(sweep.tables))))"""),
    ("markdown", """
## 3. The figures

First the paper's strides with one KV head, full attention and the cures; then every row. The
band is the 95% Wilson interval of the pooled seeds, the dashed grey line the paper's curve."""),
    ("code", """PLOTS = tempfile.mkdtemp(prefix="papers_table_")
focus = paper_table.main_rows(sweep.tables)
for name, rows in (("main", focus), ("every_row", sweep.tables.rows)):
  path = paper_table.plot_residues(os.path.join(PLOTS, f"{name}.png"), sweep.tables, rows)
  if path is not None:
    display(Image(path))"""),
    ("markdown", """
## 4. Size, and the comparison with the paper

The size trend is described, not claimed (plan version 5: W8/S8 1 KV and full attention at
three sizes, two seeds each); it shows only where the sweep has the size rows. Then one line
per claim: our numbers beside the paper's."""),
    ("code", """sizes = paper_table.size_table(sweep.tables)
display(Markdown("\\n".join(sizes) if sizes else "This sweep has no size rows."))
display(Markdown("\\n".join(paper_table.comparison_lines(sweep.claims, sweep.tables))))"""),
]
