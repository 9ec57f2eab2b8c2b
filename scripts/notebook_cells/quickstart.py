"""Cells of notebooks/quickstart.ipynb: train M = 4 and full attention, sweep a needle, plot."""

from __future__ import annotations

from scripts.notebook_cells.common import colab_badge, setup_cell

CELLS = [
    ("markdown", f"""# chunkformer quickstart: a periodic blind spot

{colab_badge("quickstart")}

Chunked KV compression (DeepSeek-V4 style) pools every chunk of `M` tokens into one cache entry.
A fact whose key and value straddle a chunk boundary is pooled into two different entries, so
retrieval accuracy depends on the fact's position **modulo `M`**: a periodic blind spot.

This notebook trains a small model with fixed chunks of `M = 4` and its full-attention baseline
on synthetic key-value retrieval, moves one needle over consecutive offsets in many sampled
haystacks (the needle shift sweep), and plots accuracy against the offset.

**Runtime on a CPU:** about 5 minutes on 2 cores with the default settings, training the
demo's two models included; a rerun finds them finished under `runs/demo/` (shared with
`./run.sh demo`) and takes well under a minute. With `CHUNKFORMER_FAST=1` (what CI runs) the
same cells run at toy sizes in under a minute, and the numbers mean nothing."""),
    ("code", setup_cell()),
    ("markdown", """## 1. Two variants of the demo sweep

`configs/sweeps/notebooks.py` cuts the demo sweep (`configs/sweeps/demo.py`) down to what this
notebook needs. Both variants share the model and the task; only the attention differs."""),
    ("code", """import os

from IPython.display import Image, Markdown, display

from chunkformer import notebook, trainer
from chunkformer.studies.needles.claims import judgments
from chunkformer.evaluation.probes import trained
from chunkformer.evaluation.report import markdown, plots
from chunkformer.evaluation.sweep import config as sweep_config
from chunkformer.evaluation.sweep import unit
from configs.sweeps import notebooks

FAST = notebook.setup()  # CHUNKFORMER_FAST=1: toy sizes (CI)
sweep = sweep_config.resolve(notebooks.get_config("quickstart,fast" if FAST else "quickstart"),
                             notebook.workdir("demo"))
rows = []
for v in sweep.variants:
  attn = v.config.model.attention
  fixed = attn.kind == "fixed"
  rows.append([v.name, attn.kind, attn.chunk_size if fixed else "-",
               attn.window if fixed else "all", v.config.model.key_shift, v.config.train.steps])
display(Markdown(notebook.markdown_table(
    ["variant", "attention", "chunk size M", "raw window W", "key shift", "train steps"], rows)))
model, data = sweep.variants[0].config.model, sweep.variants[0].config.data
print(f"model: {model.num_layers} layers, width {model.d_model}, {model.num_heads} heads; task: "
      f"{data.num_pairs} one-token key-value pairs among {data.seq_len} tokens, "
      f"{data.num_queries} questions per training row; runs in {sweep.workdir}")"""),
    ("markdown", """## 2. Train

`trainer.train` resumes a run it finds in its directory and only evaluates a finished one, so
rerunning this cell is cheap. The full-attention baseline keeps its configured width-2 key
shift, which lets a small model learn retrieval quickly; the fixed model has none (the shift is
one of the cures)."""),
    ("code", """for variant in sweep.variants:
  print(f"{variant.name}: {variant.config.train.steps} steps in {variant.workdir}")
  final = trainer.train(variant.config, variant.workdir,
                        progress=notebook.progress_printer(variant.name))
  print(f"  held-out answer accuracy {final['heldout']['accuracy']:.3f}")"""),
    ("markdown", """## 3. The needle shift sweep

In each sampled haystack every token stays where it is except one needle, which moves through
`K` consecutive offsets far from its question (window starts are multiples of 4, so offset
index `k` has phase `k mod 4`). A needle counts as retrieved when its whole value is predicted.
`unit.evaluate` runs the sweep and the statistics of `chunkformer/evaluation/stats/`:
bootstrap intervals, the permutation test of the phase effect and the detected period."""),
    ("code", """spec = sweep.needle_spec()
print(f"K = {spec.num_offsets} offsets x S = {spec.num_haystacks} haystacks per variant")
PLOTS = os.path.join(sweep.workdir, "notebook_plots", "quickstart")
records = [unit.evaluate(trained.load(variant.workdir), variant, sweep, PLOTS)
           for variant in sweep.variants]
figure = plots.plot_variant_comparison(
    os.path.join(PLOTS, "accuracy_vs_offset.png"), {r.name: r.analysis for r in records},
    chunk_size=4, title="needle retrieval accuracy per offset (bands: chunks of M = 4)")
display(Image(filename=figure))"""),
    ("markdown", """
**What you should see:** the fixed `M = 4` curve dips once in every chunk (the alternating
grey and white bands), always at the same place, the chunk's last offset (phase 3): there the
needle's key is the last token of one chunk and its value the first token of the next, so no
single entry holds both. Its accuracy repeats with period exactly 4. The full-attention curve
stays flat near 1, with no dip anywhere: no period. (With `CHUNKFORMER_FAST=1` the toy models
barely train and both curves say nothing.)"""),
    ("markdown", """## 4. Accuracy per phase

Phase = offset mod 4. Intervals are 95% bootstrap intervals over haystacks; `p` is the
permutation test of "accuracy does not depend on the phase", `period` the smallest
significant period of the accuracy curve (family-wise over all candidate periods)."""),
    ("code", """display(Markdown(notebook.phase_table(records)))
display(Markdown(markdown.comparison_table(records)))
for line in judgments.decide(records):
  if not line.startswith("INCONCLUSIVE (no data)"):  # claims needing variants it skips
    print("-", line)"""),
    ("markdown", """## Next

- `./run.sh demo` adds the cure (content-defined chunk boundaries) and a second seed of each
  variant, and writes a report that decides C1, C2 and C8;
  `python eval.py --config configs/sweeps/study.py --workdir runs/study` runs the whole study
  (3 seeds of full / fixed M = 4 / router, 2 of M = 2, 8, delimiter and key shift; RoPE off,
  mean pooling; 2-token needles at M = 2, 4, 8; a byte-level code LM for the '=' probe).
- `anatomy_of_a_weak_spot.ipynb` opens the fixed model up: slot gains, per-head phase
  preference and where the question's attention goes at a strong and at a weak phase.
- `kernels_tour.ipynb` shows the packed layout that dynamic chunks need and checks the
  Pallas kernels against their reference."""),
]
