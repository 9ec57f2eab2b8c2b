"""Cells of notebooks/anatomy_of_a_weak_spot.ipynb: why fixed chunks have a weak phase (slot gains,
phase preference, attention to the needle entry), then the dynamic model and code boundaries."""

from __future__ import annotations

from scripts.notebook_cells.common import colab_badge, setup_cell

CELLS = [
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
from chunkformer.evaluation.probes import attention_weights, needle_sweep, slot_gain, trained
from chunkformer.evaluation.report import plots
from chunkformer.evaluation.sweep import config as sweep_config
from chunkformer.evaluation.sweep.run import is_finished
from chunkformer.explainers import anatomy, attention_plots, layout_plots
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
FIXED, DYNAMIC = "fixed_m4_seed0", "dynamic_m4_seed0"  # the demo's units of seed 0
M = models[FIXED].config.model.attention.chunk_size
DATA = models[FIXED].config.data

# The needle shift sweep at the far depth: one needle moved over K offsets in S haystacks.
rows = needle_sweep.build(DATA, plan.needle_spec())[0]
QUERY = anatomy.answer_query(rows)  # the question token that must produce the value
print(f"needle sweep: {rows.shape[1]} offsets ({rows.offsets_J[0]}..{rows.offsets_J[-1]}) x "
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
    ("code", """gain_rows = plan.settings.probes["slot_gain"]["rows"]
gains = {name: anatomy.slot_gains(model, runs[name], gain_rows) for name, model in models.items()}
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
        label=f"{what}: needle at offset {rows.offsets_J[n % k]}, phase {probe.phase_N[n]} "
              f"({verdict})",
        weights=weights[n], ticks=attention_weights.entry_spans(token_entry[n, :, 0],
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
    ("markdown", """## 5. The paper's mechanism probes on the fixed model

The same probes a sweep runs by name (`sweep.probes.lookup`, `head_knockout`,
`gate_concentration`; `docs/paper_protocol.md`), here on the fixed model directly:

- the **position-matched lookup test**: every residue of the target key's position (mod `M`)
  gets prompts whose target positions have the same mean and variance, and the question sits at
  the same place, so a curve that still swings with the residue is the compressor's doing;
- the **knockout map**: for each (layer, KV head), the outputs of the query heads that read it
  are replaced at the final position by their mean over other prompts; red cells are residues
  whose accuracy that head carries;
- the **concentration plane**: every gate's effective number of slots, static (its average
  weights) against per window (averaged per chunk). A gate below the diagonal picks different
  slots in different chunks; one near (1, 1) always picks the same slot."""),
    ("code", """from chunkformer import studies
from chunkformer.evaluation.probes import instruments, lookup
from chunkformer.evaluation.probes.base import ProbeContext
from chunkformer.evaluation.report import figures
from chunkformer.studies.paper.probes import gate_concentration, head_knockout
from chunkformer.studies.paper.report import residue_tables

studies.install()  # the paper study's figures (knockout map, concentration plane) by kind
context = ProbeContext(models[FIXED], instruments.predictor(models[FIXED], 32), FIXED, (M,))
test = lookup.probe(context, modulus=M, paddings=("prefix",))
display(Markdown(residue_tables.section([(FIXED, test.record)])))
mechanisms = [head_knockout.probe(context, modulus=M),
              gate_concentration.probe(context, rows=8 if FAST else 32)]
for result in mechanisms:
  for image in figures.draw(result.figures, PLOTS).values():
    display(Image(filename=image))"""),
]
