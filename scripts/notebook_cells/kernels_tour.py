"""Cells of notebooks/kernels_tour.ipynb: the packed entry layout of dynamic chunks and the
Pallas kernels checked against their reference (timed on a GPU or TPU runtime)."""

from __future__ import annotations

from scripts.notebook_cells.common import GPU_JAX, colab_badge, setup_cell

CELLS = [
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
from chunkformer.explainers import kernel_check, layout_plots

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
