"""Writes notebooks/*.ipynb from the cell sources below, outputs stripped.

  python scripts/make_notebooks.py           # (re)write the notebooks
  python scripts/make_notebooks.py --check   # exit 1 if a stored notebook differs from here
  python scripts/make_notebooks.py --script DIR   # also write each as a plain .py (debugging)

The notebooks are the product; this file keeps them reviewable as text and stored clean
(no outputs, no execution counts, stable cell ids). Logic lives in the library: cells only
call chunkformer/, kernels/ and configs/. CI executes them with CHUNKFORMER_FAST=1
(``pytest --nbmake notebooks``).
"""

from __future__ import annotations

import argparse
import os
import sys

import nbformat

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
NOTEBOOK_DIR = os.path.join(ROOT, "notebooks")
REPOSITORY = "chunkformer/chunkformer"


def colab_badge(name: str) -> str:
  url = f"https://colab.research.google.com/github/{REPOSITORY}/blob/main/notebooks/{name}.ipynb"
  return (f"[![Open In Colab](https://colab.research.google.com/assets/colab-badge.svg)]({url})"
          f"\n(or open `{url}`)")


def setup_cell(extra: str = "") -> str:
  """The first code cell: install in Colab, make a source checkout importable, else nothing."""
  return f'''# Setup. In Colab: install chunkformer from GitHub (about a minute). From a checkout
# of the repository (this notebook in notebooks/), import it from there. Else nothing to do.
import importlib.util
import os
import subprocess
import sys

if "google.colab" in sys.modules:
  subprocess.check_call([sys.executable, "-m", "pip", "install", "-q",
                         "git+https://github.com/{REPOSITORY}"]){extra}
elif importlib.util.find_spec("chunkformer") is None and os.path.isdir("../chunkformer"):
  sys.path.insert(0, os.path.abspath(".."))'''

# Colab's GPU runtime needs the CUDA build of the pinned jax for the kernels to run natively.
GPU_JAX = """
  import shutil
  if shutil.which("nvidia-smi"):  # a GPU runtime
    subprocess.check_call([sys.executable, "-m", "pip", "install", "-q",
                           "jax[cuda12]==0.10.2"])"""


QUICKSTART = [
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
from chunkformer.evaluation import plots, report, sweep_config, trained, variant_eval, verdicts
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
`variant_eval.evaluate` runs the sweep and the statistics of `chunkformer/evaluation/stats.py`:
bootstrap intervals, the permutation test of the phase effect and the detected period."""),
    ("code", """spec = sweep.needle_spec()
print(f"K = {spec.num_offsets} offsets x S = {spec.num_haystacks} haystacks per variant")
PLOTS = os.path.join(sweep.workdir, "notebook_plots", "quickstart")
records = [variant_eval.evaluate(trained.load(variant.workdir), variant, sweep, PLOTS)
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
display(Markdown(report.comparison_table(records)))
for line in verdicts.decide(records):
  if not line.startswith("NOT TESTED"):  # claims that need variants this notebook skips
    print("-", line)"""),
    ("markdown", """## Next

- `./run.sh demo` adds the cure (content-defined chunk boundaries) and writes a full report;
  `python eval.py --config configs/sweeps/study.py --workdir runs/study` runs the whole study
  (M = 2..12, RoPE off, mean pooling, overlap, staggered phases, dynamic chunks).
- `anatomy_of_a_weak_spot.ipynb` opens the fixed model up: slot gains, per-head phase
  preference and where the question's attention goes at a strong and at a weak phase.
- `kernels_tour.ipynb` shows the packed layout that dynamic chunks need and checks the
  Pallas kernels against their reference."""),
]

ANATOMY = [
    ("markdown", f"""
# Anatomy of a weak spot

{colab_badge("anatomy_of_a_weak_spot")}

A model with fixed chunks of `M = 4` retrieves a needle well at three phases out of four and
badly at the fourth (see `quickstart.ipynb`). This notebook opens the trained model up:

1. **slot gains**: how strongly each head's pooling weighs each slot (position inside the
   chunk), as learned (the slot bias) and as applied (slot bias plus content gate);
2. **per-head phase preference**: the weight centre of each head's pooling, early or late in
   the chunk;
3. **attention to the needle's entry** at a strong and at a weak phase: where the question
   token that must produce the value actually looks;
4. then the same for the **dynamic model** (learned, content-defined chunk boundaries at the
   same budget of 4 tokens per entry), with its boundaries drawn over a row, and
   content-defined boundaries over real code.

**Runtime on a CPU:** about a minute with the demo's trained models in `runs/demo/` (from
`./run.sh demo` or the quickstart); a missing model is trained first, 3 to 5 minutes each on
2 cores. With `CHUNKFORMER_FAST=1` (what CI runs) toy models, under a minute, numbers
meaningless."""),
    ("code", setup_cell()),
    ("markdown", """
## 1. The models

The fixed `M = 4` model and the dynamic model of the demo sweep (`configs/sweeps/notebooks.py`;
variant configs `configs/kv_chunk.py` and `configs/kv_dynamic.py`). A finished run in
`runs/demo/<variant>` is loaded; a missing one is trained there, exactly as the demo would."""),
    ("code", """import os

import numpy as np
from IPython.display import Image, Markdown, display

from chunkformer import chunking, notebook, trainer
from chunkformer.config import AttentionConfig, DataConfig
from chunkformer.evaluation import (
  anatomy,
  attention_plots,
  attention_probe,
  layout_plots,
  needle_sweep,
  plots,
  slot_gain,
  sweep_config,
  trained,
)
from chunkformer.evaluation.sweep import is_finished
from configs.sweeps import notebooks

FAST = notebook.setup()  # CHUNKFORMER_FAST=1: toy sizes (CI)
plan = sweep_config.resolve(notebooks.get_config("anatomy,fast" if FAST else "anatomy"),
                            notebook.workdir("demo"))
PLOTS = os.path.join(plan.workdir, "notebook_plots", "anatomy")
models = {}
for variant in plan.variants:
  if is_finished(variant):
    print(f"{variant.name}: finished run found in {variant.workdir}")
  else:
    print(f"{variant.name}: training {variant.config.train.steps} steps in {variant.workdir}")
    trainer.train(variant.config, variant.workdir,
                  progress=notebook.progress_printer(variant.name))
  models[variant.name] = trained.load(variant.workdir)
FIXED, DYNAMIC = "fixed_m4", "dynamic_m4"
M = models[FIXED].config.model.attention.chunk_size
DATA = models[FIXED].config.data

# The needle shift sweep at the far depth: one needle moved over K offsets in S haystacks.
rows = needle_sweep.build(DATA, plan.needle_spec())[0]
QUERY = anatomy.answer_query(rows)  # the question token that must produce the value
print(f"needle sweep: {rows.shape[1]} offsets ({rows.offsets_K[0]}..{rows.offsets_K[-1]}) x "
      f"{rows.shape[0]} haystacks, answered at position {QUERY}")
runs = {name: anatomy.predictor(model, plan.settings.eval_batch_size, query=QUERY)
        for name, model in models.items()}"""),
    ("markdown", """
## 2. Slot gains

Gated pooling turns chunk `i` into entry `C_i = sum_j softmax_j(z_j + ape_j) * kv_j`, a softmax
over the chunk's `M` slots per channel: `z` is a content gate, `ape` the learned **slot bias**.
A *gain* is `M` times a slot's weight, so 1.0 is the uniform share. First the slot bias alone,
then the weights the model really applies on held-out rows (bias and gate together), averaged
over channels and complete chunks; rows are the key/value heads of each layer."""),
    ("code", """gains = {name: anatomy.slot_gains(model, runs[name], plan.settings.slot_gain_rows)
         for name, model in models.items()}
for key, what in (("bias_gain", "slot bias"), ("realised_gain", "realised")):
  for slots, grid in slot_gain.gain_grids(gains[FIXED], key).items():
    display(Image(filename=plots.plot_slot_gains(
        os.path.join(PLOTS, f"{FIXED}_{key}.png"), grid, value_label="gain (1 = uniform)",
        title=f"{FIXED}: {what}")))"""),
    ("markdown", """
### Per-head phase preference

A head's *preferred phase* is the centre of mass of its pooling weights over the slots:
`(M - 1) / 2` (1.5 for `M = 4`) is neutral, smaller means it listens to the start of each
chunk, larger to its end. Heads far from neutral, or far from each other, have specialised."""),
    ("code", """def phase_rows(name):
  for site in gains[name]["sites"]:
    bias = site["bias_preferred_phase"] or []
    realised = site["preferred_phase"] or [None] * len(bias)
    for head, (r, b) in enumerate(zip(realised, bias, strict=True)):
      yield [name, site["layer"], site["stream"], head, r, b]


display(Markdown(notebook.markdown_table(
    ["model", "layer", "stream", "kv head", "realised preferred phase", "slot-bias preferred"],
    [row for name in models for row in phase_rows(name)], digits=2)))"""),
    ("markdown", """
Small models trained on this task typically keep their gains within about 10% of uniform and
their preferred phases near neutral (check the numbers above for yours). The weak phase is then
not a slot the pooling ignores, consistent with the study's finding that the period survives
plain average pooling. The next section shows what it is instead."""),
    ("markdown", """
## 3. Attention to the needle's entry

The question token that must produce the value (the last key token of the question) cannot
see the needle's raw tokens, which lie far outside its window of `W` tokens: it can only reach
the needle through the compressed entries. For every sweep row we read, per layer, the weight
it puts on the entry that pooled the needle's key and on the one that pooled its value (the
same entry unless a chunk boundary falls between them), averaged over heads, and group the
rows by the needle's phase."""),
    ("code", """probes = {name: anatomy.needle_attention(model, runs[name], rows, M)
          for name, model in models.items()}


def attention_by_phase(name):
  probe = probes[name]
  phases, accuracy = anatomy.group_means(probe.correct_N, probe.phase_N)
  series = {}
  for layer, reading in probe.by_layer.items():
    for part in ("key_entry", "value_entry"):
      series[f"layer {layer}: {part.replace('_', ' ')}"] = anatomy.group_means(
          reading[part].mean(axis=1), probe.phase_N, phases)[1]
  xlabel = ("needle phase (offset mod M)" if name == FIXED
            else "needle phase inside the chunk it landed in")
  return attention_plots.plot_grouped_bars(
      os.path.join(PLOTS, f"{name}_needle_attention.png"), phases, series,
      line=("retrieval accuracy", accuracy), xlabel=xlabel,
      ylabel="attention (head mean) / accuracy",
      title=f"{name}: the question's attention to the needle's entries")


display(Image(filename=attention_by_phase(FIXED)))"""),
    ("markdown", """
One haystack, two needle positions: one whose key and value were pooled into one entry, and
one cut by a chunk boundary (key at the end of one chunk, value at the start of the next: for
the fixed model its weak phase `M - 1`). Bars: the question's attention over all entries, in
the layer where it looks at the needle most, averaged over heads; the needle's entries are
coloured."""),
    ("code", """def example(name):
  probe = probes[name]
  k = rows.shape[1]
  split = np.asarray(probe.by_layer[0]["split"])
  # The first needle cut between key and value, and one kept whole in the same haystack.
  cut = np.flatnonzero(split)
  haystack = int(cut[0]) // k if cut.size else 0
  whole = [n for n in range(haystack * k, (haystack + 1) * k) if not split[n]]
  picks = ([(whole[0], "key and value in one entry")] if whole else [])
  picks += [(int(cut[0]), "key and value in two entries")] if cut.size else []
  layer = max(probe.by_layer, key=lambda l: probe.by_layer[l]["key_entry"].mean())
  reading = probe.by_layer[layer]
  token_entry = probe.outputs[f"token_entry/{layer}"]
  weights = probe.outputs[f"attn_entries/{layer}"][:, 0].mean(axis=1)  # N x C, head mean
  panels = []
  for n, what in picks:
    verdict = "retrieved" if probe.correct_N[n] else "missed"
    panels.append(dict(
        label=f"{what}: needle at offset {rows.offsets_K[n % k]}, phase {probe.phase_N[n]} "
              f"({verdict})",
        weights=weights[n], ticks=attention_probe.entry_spans(token_entry[n, :, 0],
                                                              weights.shape[1]),
        highlight={"needle key": reading["key_entry_index"][n],
                   "needle value": reading["value_entry_index"][n]}))
  if not cut.size:
    print(f"{name}: no needle of the sweep was cut between its key and its value")
  return attention_plots.plot_entry_attention(
      os.path.join(PLOTS, f"{name}_needle_example.png"), panels,
      ylabel="attention (head mean)",
      title=f"{name}, layer {layer}: the question's attention over the entries")


display(Image(filename=example(FIXED)))"""),
    ("markdown", """
**What to look for (default settings):** at every phase the question finds the entry whose
content matches its key, and it weighs that entry about equally at the strong and the weak
phase. At a strong phase that entry also holds the value, and the answer comes out. At the
weak phase the matching entry (the key's chunk) holds no value, while the entry that does (the
next chunk) carries no trace of the key, so it gets almost no weight, and the answer is
usually missed. The blind spot is the chunk boundary between key and value, not a slot the
model fails to read. (With `CHUNKFORMER_FAST=1` the toy models have learned nothing.)"""),
    ("markdown", """
## 4. The same for the dynamic model

Its chunks end where a learned router (H-Net style, held near 4 tokens per entry by a ratio
loss, at most `max_chunk` tokens) decides from the content. Its slot-bias table has
`max_chunk` rows; the first `M` are the slots of a chunk of the target length. Dynamic layers
pool inside the packed kernel and report no realised weights, so only the slot-bias view
exists. A needle's phase is now its offset inside the chunk it actually landed in."""),
    ("code", """for slots, grid in slot_gain.gain_grids(gains[DYNAMIC], "bias_gain").items():
  display(Image(filename=plots.plot_slot_gains(
      os.path.join(PLOTS, f"{DYNAMIC}_bias_gain.png"), grid, value_label="gain (1 = uniform)",
      title=f"{DYNAMIC}: slot bias")))
display(Image(filename=attention_by_phase(DYNAMIC)))
display(Image(filename=example(DYNAMIC)))
for name in (FIXED, DYNAMIC):
  split = probes[name].by_layer[0]["split"]
  _, (whole, cut) = anatomy.group_means(probes[name].correct_N, split, (False, True))
  print(f"{name}: {split.mean():.0%} of the sweep's needles cut between key and value; "
        f"accuracy {whole:.2f} when not cut, {cut:.2f} when cut (nan: no such needle)")"""),
    ("markdown", """
Read the last lines together with the plots: a content-defined chunker can learn to keep a key
and its value in one chunk (the row below shows where this router puts its boundaries), which
takes away what made the fixed model's weak phase weak; wherever a boundary still falls
between them (for instance where `max_chunk` forces one), the same failure appears.

### Its boundaries

First on one sweep row, the router's chunks against the fixed grid (`^` BOS, `.` filler,
letters the key and value symbols, `?` the question). Then on real code: the router above reads
the kv alphabet only, so over a snippet of the standard library we draw the boundaries of the
content-defined rule of the same `dynamic` kind (`boundary="delimiter"`: a chunk may close after
a space or a newline, 2 to 8 bytes, about 4 bytes per entry on the stdlib) next to fixed chunks
of 4, before and after prepending `==`. The fixed grid re-cuts the whole snippet; the
content-defined boundaries stay on the same characters."""),
    ("code", """n = 0  # haystack 0, first offset
labels = notebook.token_labels(rows.rows["inputs"][n], DATA)
grid = chunking.fixed_end_flags(rows.rows["positions"][n], M)
display(Image(filename=layout_plots.plot_chunks(
    os.path.join(PLOTS, "kv_row_boundaries.png"),
    {f"fixed M={M}": (labels, np.asarray(grid)),
     "learned router": (labels, probes[DYNAMIC].outputs["ends"][n])},
    title="one sweep row: fixed chunks and the dynamic model's chunks", columns=48)))

snippet = notebook.stdlib_snippet("calendar.py")
rule = AttentionConfig(kind="dynamic", boundary="delimiter", delimiters="10,32", chunk_size=4,
                       min_chunk=2, max_chunk=8)
fixed = AttentionConfig(kind="dynamic", boundary="fixed", chunk_size=M)
code_rows = {}
for chunker, attn in ((f"fixed M={M}", fixed), ("delimiter rule", rule)):
  for prefix in (b"", b"=="):
    tokens = np.frombuffer(prefix + snippet, np.uint8)
    label = chunker + (" after '=='" if prefix else "")
    code_rows[label] = (notebook.token_labels(tokens, DataConfig(task="code")),
                        anatomy.rule_end_flags(attn, tokens))
display(Image(filename=layout_plots.plot_chunks(
    os.path.join(PLOTS, "code_boundaries.png"), code_rows, columns=64,
    title="calendar.isleap: a 2-byte prefix re-cuts fixed chunks, not content-defined ones")))"""),
]

KERNELS_TOUR = [
    ("markdown", f"""# A tour of the segment-packed kernels

{colab_badge("kernels_tour")}

Dynamic chunks have variable lengths, but hardware wants fixed shapes. `kernels/` stores the
compressed entries of a row **packed**: a buffer of static capacity, entries in order of the
position where their chunk ends, padding after them. This notebook draws that layout for a
row of real code split into two documents, shows the per-query visibility ranges the kernels
use to skip blocks, checks the Pallas kernels (GPU/Triton and TPU/Mosaic versions, run in
interpret mode on a CPU) against the pure-JAX reference, outputs and gradients, and, on a GPU
or TPU runtime, times them.

**Runtime on a CPU:** about a minute (interpret-mode compiles dominate), the same with
`CHUNKFORMER_FAST=1`. On a Colab GPU runtime the timing cell adds about a minute."""),
    ("code", setup_cell(extra=GPU_JAX)),
    ("markdown", """## 1. A dynamic row and its packed layout

The row: the first bytes of `calendar.isleap` from the standard library, as two documents
(the `def` line, then the docstring), so one row holds two documents as in packed training.
Chunk ends come from the content-defined delimiter rule (`chunking.delimiter_proposals`: a
chunk may close after a space or a newline) under chunk lengths 2..8 (`enforce_lengths`).
`chunking.packed_layout` (which calls `kernels.chunk_structure`) maps them to the buffer."""),
    ("code", """import os

import jax
import jax.numpy as jnp
import numpy as np
from IPython.display import Image, Markdown, display

import kernels
from chunkformer import chunking, notebook
from chunkformer.config import DataConfig
from chunkformer.evaluation import kernel_check, layout_plots

FAST = notebook.setup()  # CHUNKFORMER_FAST=1 (CI): the same cells, nothing here is large
PLOTS = notebook.workdir("kernels_tour")  # runs/kernels_tour (fast mode: a temporary one)

text = notebook.stdlib_snippet("calendar.py")[:48]
first_line = text.index(b"\\n") + 1
tokens = jnp.asarray(np.frombuffer(text, np.uint8)[None].astype(np.int32))
segment_ids = jnp.asarray((np.arange(len(text)) >= first_line)[None].astype(np.int32))
ends = chunking.enforce_lengths(chunking.delimiter_proposals(tokens, (ord("\\n"), ord(" "))),
                                segment_ids, min_chunk=2, max_chunk=8)
capacity = chunking.entry_capacity(len(text), min_chunk=2)  # no closed chunk is ever dropped
layout = chunking.packed_layout(ends, segment_ids, capacity)
labels = notebook.token_labels(np.asarray(tokens[0]), DataConfig(task="code"))
WINDOW = 4
display(Image(filename=layout_plots.plot_packed_layout(
    os.path.join(PLOTS, "packed_layout.png"), labels, ends[0], segment_ids[0],
    capacity=capacity, window=WINDOW)))
rows = []
for c in range(int(layout.num_entries_B[0])):
  first, last = int(layout.entry_starts_BxC[0, c]), int(layout.entry_ends_BxC[0, c])
  rows.append([c, int(layout.entry_segment_ids_BxC[0, c]), f"{first}..{last}",
               "`" + "".join(labels[first:last + 1]) + "`"])
display(Markdown(notebook.markdown_table(["entry", "document", "tokens", "text"], rows)))
print(f"{int(layout.num_entries_B[0])} entries in a buffer of {capacity}; the rest is padding "
      f"(end = PAD_END = {kernels.PAD_END}, never visible)")"""),
    ("markdown", """
Grey tokens belong to a chunk that never closes (the end of a document): they make no
entry, exactly as during decoding, where nobody knows that a document is about to end. Bottom:
query `t` attends in one softmax to the raw keys of its window (left) and to the entries whose
chunk ended at or before `t` in its own document (right).

## 2. Visibility ranges

Because entries are ordered by end and a document is one contiguous run, the entries a query
may see form one contiguous range `[start(t), stop(t))` (`kernels.visible_entry_range`), and
both bounds only grow with `t` (start jumps at a document start). A block of queries
`[t0, t1]` therefore needs entries `[start(t0), stop(t1))` only: the kernels skip every other
entry block. Below, the ranges are checked against the dense rule (`end <= t`, same document)."""),
    ("code", """start, stop = kernels.visible_entry_range(layout.entry_ends_BxC,
                                         layout.entry_segment_ids_BxC, segment_ids)
dense = np.asarray(layout.visibility_BxTxC(segment_ids))[0]  # T x C
in_range = np.arange(capacity)[None, :] >= np.asarray(start)[0][:, None]
in_range &= np.arange(capacity)[None, :] < np.asarray(stop)[0][:, None]
assert (in_range == dense).all(), "visible ranges disagree with the visibility rule"
assert (np.diff(np.asarray(start)[0]) >= 0).all() and (np.diff(np.asarray(stop)[0]) >= 0).all()
display(Markdown(notebook.markdown_table(
    ["query t", "token", "document", "visible entries [start, stop)"],
    [[t, f"`{labels[t]}`", int(segment_ids[0, t]), f"[{int(start[0, t])}, {int(stop[0, t])})"]
     for t in range(0, len(text), 4)])))"""),
    ("markdown", """## 3. Kernels against the reference

Each op has one public function with an `implementation=` switch: `"xla"` (the pure-JAX
reference, default on CPU), `"pallas_gpu"` (Triton) and `"pallas_tpu"` (Mosaic); `interpret=True`
runs the Pallas code on a CPU. Every Pallas path carries a `custom_vjp`, so gradients are
compared too. Small block sizes make the kernels really skip blocks on this short row."""),
    ("code", """case = kernel_check.attention_case(ends, segment_ids, capacity=capacity, heads=4,
                                   kv_heads=2, head_dim=16)
small_blocks = {
    "pallas_gpu": kernels.AttentionBlockSizes(block_q=16, block_k=16, block_c=16,
                                              block_q_bwd=16, block_k_bwd=16, block_c_bwd=16),
    "pallas_tpu": kernels.AttentionBlockSizes(block_q=8, block_k=16, block_c=8),
}
pool_blocks = {"pallas_gpu": kernels.PoolBlockSizes(block_t=16, block_n=16),
               "pallas_tpu": kernels.PoolBlockSizes(block_t=8, block_n=128)}
with kernel_check.fast_compiles():
  checks = (kernel_check.check_chunk_attention(case, window=WINDOW, block_sizes=small_blocks)
            + kernel_check.check_segment_pool(case, capacity=capacity, block_sizes=pool_blocks))
for op in ("chunk_attention", "segment_pool"):
  records = [r for r in checks if r["op"] == op]
  columns = [c for c in records[0] if c not in ("op", "implementation", "interpret")]
  display(Markdown(f"**{op}**: largest |kernel - reference| of the output and each gradient\\n\\n"
                   + notebook.markdown_table(
      ["implementation", "mode", *columns],
      [[r["implementation"], "interpret" if r["interpret"] else "native",
        *(f"{r[c]:.1e}" for c in columns)] for r in records])))
worst = max(v for r in checks for k, v in r.items() if isinstance(v, float))
assert worst < 1e-4, f"a kernel disagrees with the reference by {worst:.2e}"
print(f"every kernel matches the reference (largest difference {worst:.1e})")"""),
    ("markdown", """## 4. Speed (GPU or TPU runtime only)

Interpret mode says nothing about speed. On a GPU (Colab: Runtime > Change runtime type) or a
TPU runtime this cell times the native kernel against the XLA reference on a long row:
`T = 8192` tokens, 16 query heads sharing one key/value head of 128 (MQA, as DeepSeek-V4),
window 128, random chunk ends about 4 tokens apart, bfloat16. `bench/kernels.py` in the
repository is the full benchmark."""),
    ("code", """backend = jax.default_backend()
if backend in kernel_check.NATIVE:
  length = 8192
  rng = np.random.default_rng(0)
  big_ends = jnp.asarray(rng.random((1, length)) < 0.25)
  big = kernel_check.attention_case(big_ends, jnp.zeros((1, length), jnp.int32),
                                    capacity=length // 2, heads=16, kv_heads=1, head_dim=128,
                                    dtype=jnp.bfloat16)
  timings = kernel_check.time_chunk_attention(
      big, window=128, implementations=("xla", kernel_check.NATIVE[backend]))
  display(Markdown(notebook.markdown_table(
      ["implementation", "forward (ms)", "forward + backward (ms)"],
      [[r["implementation"], 1e3 * r["forward_s"], 1e3 * r["forward_backward_s"]]
       for r in timings], digits=2)))
else:
  print(f"backend {backend!r}: no native Pallas kernel to time here (interpret mode measures "
        "nothing); switch to a GPU or TPU runtime to see the timings")"""),
]


NOTEBOOKS = {
    "quickstart": QUICKSTART,
    "anatomy_of_a_weak_spot": ANATOMY,
    "kernels_tour": KERNELS_TOUR,
}


def build(name: str) -> nbformat.NotebookNode:
  """The notebook ``name`` with stripped outputs and deterministic cell ids."""
  nb = nbformat.v4.new_notebook()
  nb.metadata = {
      "kernelspec": {"name": "python3", "display_name": "Python 3", "language": "python"},
      "language_info": {"name": "python"},
      "colab": {"provenance": []},
  }
  for i, (kind, source) in enumerate(NOTEBOOKS[name]):
    make = nbformat.v4.new_markdown_cell if kind == "markdown" else nbformat.v4.new_code_cell
    cell = make(source.strip("\n"))
    cell.id = f"{name}-{i:02d}"
    nb.cells.append(cell)
  nbformat.validate(nb)
  return nb


def as_script(name: str) -> str:
  """The code cells as one python file (markdown as comments), for debugging outside Jupyter."""
  parts = []
  for kind, source in NOTEBOOKS[name]:
    if kind == "code":
      parts.append(source.strip("\n"))
    else:
      parts.append("\n".join("# " + line for line in source.strip("\n").splitlines()))
  return "\n\n".join(parts) + "\n"


def main() -> int:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--check", action="store_true", help="compare instead of writing")
  parser.add_argument("--script", help="also write <name>.py files into this directory")
  args = parser.parse_args()
  stale = []
  for name in NOTEBOOKS:
    path = os.path.join(NOTEBOOK_DIR, f"{name}.ipynb")
    text = nbformat.writes(build(name)) + "\n"
    if args.check:
      with open(path, encoding="utf-8") as f:
        if f.read() != text:
          stale.append(path)
      continue
    os.makedirs(NOTEBOOK_DIR, exist_ok=True)
    with open(path, "w", encoding="utf-8") as f:
      f.write(text)
    if args.script:
      os.makedirs(args.script, exist_ok=True)
      with open(os.path.join(args.script, f"{name}.py"), "w", encoding="utf-8") as f:
        f.write(as_script(name))
  if stale:
    print("stale notebooks (run python scripts/make_notebooks.py):", *stale, sep="\n  ")
    return 1
  return 0


if __name__ == "__main__":
  sys.exit(main())
