"""PNG figure of the prefix-padding probe: accuracy against the prefix length N.

Kept apart from ``plots`` (whose axes speak of needle offsets); built the same way, on a bare
``Figure`` with the Agg canvas, so importing it changes no global matplotlib state.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence

import numpy as np
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure


def _floats(values) -> np.ndarray:
  return np.array([np.nan if v is None else v for v in np.ravel(values)], dtype=np.float64)


def plot_prefix_probe(path, prefixes_J: Sequence[int], accuracy_J, low_J=None, high_J=None, *,
                      chunk_size: int | None = None,
                      extra: Mapping[str, Sequence[float]] | None = None,
                      title: str = "") -> str:
  """Accuracy vs N with its interval; every other block of M prefix lengths shaded.

  Args:
    prefixes_J: N values; accuracy_J and the optional bounds: one value per N.
    chunk_size: M; N and N + M put the content at the same phase, so a periodic curve repeats
      from one shaded band to the next.
    extra: further curves (name -> values per N), e.g. code byte accuracy or the boundary
      agreement of a dynamic model.
  Returns:
    ``path`` (parent folders created).
  """
  prefixes_J = np.asarray(prefixes_J)
  figure = Figure(figsize=(7.0, 3.0), dpi=110, layout="constrained")
  FigureCanvasAgg(figure)
  axes = figure.subplots()
  if chunk_size:
    for start in range(0, int(prefixes_J.max()) + 1, 2 * chunk_size):
      axes.axvspan(start - 0.5, start + chunk_size - 0.5, color="0.93", lw=0, zorder=0)
  if low_J is not None and high_J is not None:
    axes.fill_between(prefixes_J, _floats(low_J), _floats(high_J), color="C0", alpha=0.25, lw=0,
                      label="95% bootstrap")
  axes.plot(prefixes_J, _floats(accuracy_J), "o-", color="C0", ms=3, lw=1,
            label="needle accuracy")
  for i, (name, values) in enumerate((extra or {}).items()):
    axes.plot(prefixes_J, _floats(values), "s--", color=f"C{i + 1}", ms=2.5, lw=1, label=name)
  axes.set_xlabel("prefix length N (filler tokens before the prompt)"
                  + (f"; bands = M={chunk_size}" if chunk_size else ""))
  axes.set_ylabel("accuracy")
  axes.set_ylim(-0.02, 1.02)
  axes.set_xlim(prefixes_J.min() - 0.5, prefixes_J.max() + 0.5)
  axes.set_title(title, fontsize=10)
  axes.legend(loc="lower right", fontsize=8)
  path = os.fspath(path)
  os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
  figure.savefig(path, format="png")
  return path
