"""Pictures of where attention goes (weights from ``probes.attention_weights``), same conventions
as ``report.plots``: Agg-canvas figures, one PNG per function, the path returned."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from chunkformer.evaluation.report.plots import _figure, _floats, _save

_HIGHLIGHT_COLORS = ("C3", "C2", "C1", "C4")


def plot_entry_attention(path, panels: Sequence[Mapping[str, Any]], *, title: str = "",
                         ylabel: str = "attention weight") -> str:
  """Bars of one query's attention over the entries, one panel per case (e.g. a strong and a
  weak needle phase), with named entries highlighted.

  Args:
    panels: each a mapping with ``label`` (panel title), ``weights`` ([C] weight per entry),
      optional ``highlight`` (name -> entry index; indices outside [0, C) are ignored, names
      sharing an entry are joined) and optional ``ticks`` ([C] tick labels, e.g. chunk spans;
      trailing entries with an empty label, such as packed padding, are left out).
  """
  figure = _figure(7.5, 0.4 + 1.9 * len(panels))
  axes_list = np.atleast_1d(figure.subplots(len(panels), 1, squeeze=False)[:, 0])
  top = max([float(np.nanmax(_floats(p["weights"]))) for p in panels if len(p["weights"])]
            + [1e-3])
  for axes, panel in zip(axes_list, panels, strict=True):
    weights = _floats(panel["weights"])
    ticks = panel.get("ticks")
    if ticks is not None:
      used = [i for i, tick in enumerate(ticks) if str(tick)]
      weights = weights[:used[-1] + 1 if used else weights.size]
      ticks = list(ticks)[:weights.size]
    c = weights.size
    names: dict[int, list[str]] = {}
    for name, index in (panel.get("highlight") or {}).items():
      if 0 <= int(index) < c:
        names.setdefault(int(index), []).append(name)
    colors = ["0.6"] * c
    for i, (index, joined) in enumerate(sorted(names.items())):
      colors[index] = _HIGHLIGHT_COLORS[i % len(_HIGHLIGHT_COLORS)]
      axes.bar([index], [weights[index]], color=colors[index], label=" + ".join(joined))
    axes.bar(np.arange(c), weights, color=colors, width=0.8, zorder=0)
    if ticks is not None:
      step = max(1, c // 32)
      axes.set_xticks(np.arange(0, c, step), [str(x) for x in ticks[::step]], fontsize=6,
                      rotation=90)
    axes.set_xlim(-0.6, c - 0.4)
    axes.set_ylim(0.0, 1.05 * top)
    axes.set_ylabel(ylabel, fontsize=8)
    axes.set_title(panel.get("label", ""), fontsize=9)
    if names:
      axes.legend(loc="upper left", fontsize=7)
  axes_list[-1].set_xlabel("entry (chunk span)" if panels and panels[-1].get("ticks") is not None
                           else "entry")
  if title:
    figure.suptitle(title, fontsize=10)
  return _save(figure, path)


def plot_grouped_bars(path, groups: Sequence[Any], series: Mapping[str, Sequence[float]], *,
                      line: tuple[str, Sequence[float]] | None = None, title: str = "",
                      xlabel: str = "", ylabel: str = "") -> str:
  """Grouped bars (one colour per series, one group per x value) with an optional line over
  the groups, e.g. mean attention on the needle's entries per phase and accuracy as the line.
  """
  figure = _figure(max(4.0, 1.0 + 0.5 * len(groups) * max(1, len(series)) * 0.6), 3.0)
  axes = figure.subplots()
  x = np.arange(len(groups))
  width = 0.8 / max(1, len(series))
  for i, (name, values) in enumerate(series.items()):
    axes.bar(x + (i - (len(series) - 1) / 2) * width, _floats(values), width=width,
             color=f"C{i}", label=name)
  if line is not None:
    name, values = line
    axes.plot(x, _floats(values), "o-", color="k", ms=4, lw=1.2, label=name)
  axes.set_xticks(x, [str(g) for g in groups])
  axes.set_xlabel(xlabel)
  axes.set_ylabel(ylabel)
  axes.set_title(title, fontsize=10)
  axes.legend(loc="best", fontsize=7)
  return _save(figure, path)
