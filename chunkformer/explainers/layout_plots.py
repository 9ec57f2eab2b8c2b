"""Pictures of chunk layouts: boundaries over text, and the segment-packed entry buffer.

Same conventions as ``report.plots``: figures built on ``matplotlib.figure.Figure`` with the Agg
canvas (no pyplot state), one PNG per function, the path returned. The layout itself always
comes from the library (``kernels.chunk_structure``, ``kernels.visible_entry_range``), never
recomputed here.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import jax.numpy as jnp
import numpy as np
from matplotlib import colormaps
from matplotlib.patches import Rectangle

import kernels
from chunkformer.evaluation.report.plots import _figure, _save

_CHUNK_COLORS = ("#cfe2f3", "#fce5cd")  # alternating chunk backgrounds
_OPEN_COLOR = "0.88"  # tokens of a chunk that never closes (no entry)
_ENTRY_CMAP = "tab20"


def chunk_index(ends_T: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
  """(chunk_T, closed_T): index of each token's chunk and whether that chunk ever closes."""
  ends_T = np.asarray(ends_T, bool)
  chunk_T = np.cumsum(ends_T) - ends_T
  last = np.flatnonzero(ends_T)
  closed_T = np.arange(ends_T.size) <= (last[-1] if last.size else -1)
  return chunk_T, closed_T


def plot_chunks(path, rows: Mapping[str, tuple[Sequence[str], np.ndarray]], *,
                title: str = "", columns: int = 48) -> str:
  """Strips of tokens, one per labelled chunking: chunks in alternating colours, a bar after
  every chunk end, tokens of the open (never closed) chunk grey. Rows wrap every ``columns``.

  Args:
    rows: label -> (token_labels_T, ends_T): one short string per token (a character) and
      the end flags of that chunking. Rows may differ in length (e.g. a shifted copy).
  """
  lines = [(label, start, labels[start:start + columns], np.asarray(ends, bool),
            start == 0) for label, (labels, ends) in rows.items()
           for start in range(0, max(len(labels), 1), columns)]
  width = min(max(len(labels) for labels, _ in rows.values()), columns)
  figure = _figure(1.6 + 0.17 * width, 0.45 + 0.32 * len(lines) + 0.15 * len(rows))
  axes = figure.subplots()
  y = 0.0
  for label, start, labels, ends, first in lines:
    if first and y:
      y += 0.5  # a gap between chunkings
    chunk, closed = chunk_index(ends)
    for i, text in enumerate(labels):
      t = start + i
      color = _CHUNK_COLORS[chunk[t] % 2] if closed[t] else _OPEN_COLOR
      axes.add_patch(Rectangle((i, -y - 0.9), 1.0, 0.8, facecolor=color, lw=0))
      axes.text(i + 0.5, -y - 0.5, text, ha="center", va="center", fontsize=8,
                family="monospace")
      if ends[t]:
        axes.plot([i + 1, i + 1], [-y - 0.95, -y + 0.05], color="k", lw=1.4)
    if first:
      axes.text(-0.4, -y - 0.5, label, ha="right", va="center", fontsize=8)
    y += 1.0
  axes.set_xlim(-0.2, width + 0.2)
  axes.set_ylim(-y - 0.1, 0.2)
  axes.set_axis_off()
  if title:
    axes.set_title(title, fontsize=10)
  return _save(figure, path)


def plot_packed_layout(path, labels_T: Sequence[str], ends_T, segment_ids_T, *, capacity: int,
                       window: int, title: str = "") -> str:
  """The segment-packed layout of one row (docs/design.md section 4), in three panels.

  Top: the tokens, coloured by the entry that pools them (grey: open chunks, which make no
  entry), documents separated by a thick line. Middle: the packed buffer of ``capacity``
  entries in order of their end (hatched: padding, end PAD_END, never visible). Bottom: what
  each query t sees: raw keys in its window (left) and entries (right), with the contiguous
  entry range ``kernels.visible_entry_range`` gives (dark lines) around the visible cells.
  """
  ends = jnp.asarray(np.asarray(ends_T, bool)[None])
  seg = jnp.asarray(np.asarray(segment_ids_T, np.int32)[None])
  entry_of_token, _, entry_ends, entry_seg, entry_starts, num_entries = (
      np.asarray(x)[0] for x in kernels.chunk_structure(ends, seg, capacity))
  start, stop = (np.asarray(x)[0] for x in kernels.visible_entry_range(
      jnp.asarray(entry_ends[None]), jnp.asarray(entry_seg[None]), seg))
  t, c = len(labels_T), capacity
  seg_T = np.asarray(segment_ids_T)
  cmap = colormaps[_ENTRY_CMAP]
  color = lambda e: cmap(int(e) % cmap.N)

  figure = _figure(max(6.0, 0.16 * (t + c) + 1.5), 2.4 + 0.09 * t)
  grid = figure.add_gridspec(3, 2, height_ratios=(0.9, 0.9, max(3.0, 0.09 * t)),
                             width_ratios=(t, c))
  tokens_axes = figure.add_subplot(grid[0, :])
  for i, text in enumerate(labels_T):
    owned = entry_of_token[i] < c
    tokens_axes.add_patch(Rectangle((i, 0), 1, 1, lw=0,
                                    facecolor=color(entry_of_token[i]) if owned else _OPEN_COLOR))
    tokens_axes.text(i + 0.5, 0.5, text, ha="center", va="center", fontsize=7,
                     family="monospace")
    if i and seg_T[i] != seg_T[i - 1]:
      tokens_axes.axvline(i, color="k", lw=2.5)
  tokens_axes.set_xlim(0, t)
  tokens_axes.set_ylim(0, 1)
  tokens_axes.set_yticks([])
  tokens_axes.set_xticks(range(0, t, max(1, t // 16)))
  tokens_axes.set_title(title or f"{int(num_entries)} closed chunks -> packed entries",
                        fontsize=10)
  tokens_axes.set_ylabel("tokens", fontsize=8)

  buffer_axes = figure.add_subplot(grid[1, :])
  for e in range(c):
    valid = entry_ends[e] != kernels.PAD_END
    buffer_axes.add_patch(Rectangle((e, 0), 1, 1, ec="0.4", lw=0.5,
                                    facecolor=color(e) if valid else "white",
                                    hatch=None if valid else "///"))
    buffer_axes.text(e + 0.5, 0.5, f"{entry_starts[e]}-{entry_ends[e]}" if valid else "pad",
                     ha="center", va="center", fontsize=6, rotation=90)
  buffer_axes.set_xlim(0, c)
  buffer_axes.set_ylim(0, 1)
  buffer_axes.set_yticks([])
  buffer_axes.set_xticks(range(0, c, max(1, c // 16)))
  buffer_axes.set_ylabel("entries", fontsize=8)

  query = np.arange(t)
  raw_axes = figure.add_subplot(grid[2, 0])
  delta = query[:, None] - query[None, :]
  raw = (delta >= 0) & (delta < window) & (seg_T[:, None] == seg_T[None, :])
  raw_axes.imshow(raw, cmap="Greys", vmin=0, vmax=1.6, aspect="auto", interpolation="nearest")
  raw_axes.set_xlabel(f"raw key (window W={window})", fontsize=8)
  raw_axes.set_ylabel("query t", fontsize=8)
  entry_axes = figure.add_subplot(grid[2, 1], sharey=raw_axes)
  visible = np.asarray(kernels.entry_visibility_BxTxC(
      jnp.asarray(entry_ends[None]), jnp.asarray(entry_seg[None]), seg))[0]
  shade = np.ones((t, c, 4))
  for e in range(c):
    shade[visible[:, e], e] = color(e)
  entry_axes.imshow(shade, aspect="auto", interpolation="nearest")
  entry_axes.step(start - 0.5, query, where="mid", color="k", lw=1)
  entry_axes.step(stop - 0.5, query, where="mid", color="k", lw=1)
  entry_axes.set_xlim(-0.5, c - 0.5)
  entry_axes.set_xlabel("entry c (lines: visible range)", fontsize=8)
  entry_axes.tick_params(labelleft=False)
  return _save(figure, path)
