"""Plots of the mechanism probes: the gate concentration plane and accuracy by phase under gate
cycling (formatting only; the numbers come from the probes' records)."""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

_MARKERS = {"k": ("o", "key gates"), "v": ("s", "value gates"), "kv": ("^", "shared K/V gates")}


def _save(figure: Figure, path) -> str:
  path = os.fspath(path)
  os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
  figure.savefig(path, format="png")
  return path


def plot_concentration_plane(path, gates: Sequence[Mapping[str, Any]], *, title: str = "") -> str:
  """Static (x) against per-window (y) effective number of offsets of every gate
  (``gate_concentration`` record's ``gates``), with the diagonal; both axes run from 1
  (one-hot) to W (uniform). Below the diagonal: concentrated per window, uniform on average."""
  figure = Figure(figsize=(4.2, 4.0), dpi=110, layout="constrained")
  FigureCanvasAgg(figure)
  axes = figure.subplots()
  width = max((g["window"] for g in gates), default=1)
  axes.plot([1, width], [1, width], "--", color="0.6", lw=1, label="static = per window")
  for stream, (marker, label) in _MARKERS.items():
    mine = [g for g in gates if g["stream"] == stream]
    if mine:
      axes.scatter([g["static"] for g in mine], [g["per_window"] for g in mine], marker=marker,
                   s=18, label=label, alpha=0.8)
  axes.set_xlim(0.9, width + 0.1)
  axes.set_ylim(0.9, width + 0.1)
  axes.set_xlabel("static: exp H(E[alpha])")
  axes.set_ylabel("per window: E[exp H(alpha)]")
  axes.set_title(title, fontsize=10)
  axes.legend(loc="upper left", fontsize=8)
  return _save(figure, path)


def plot_cycling(path, accuracy_by_delta: Mapping[int, Sequence[float]], *,
                 title: str = "") -> str:
  """Accuracy by phase after each gate cycle delta (0 = the model as trained)."""
  figure = Figure(figsize=(6.0, 3.0), dpi=110, layout="constrained")
  FigureCanvasAgg(figure)
  axes = figure.subplots()
  for i, (delta, acc) in enumerate(sorted(accuracy_by_delta.items())):
    acc = np.asarray(acc, np.float64)
    axes.plot(np.arange(acc.size), acc, "o-" if delta == 0 else ".--", color=f"C{i}", lw=1,
              label=f"delta = {delta:+d}" if delta else "as trained")
  axes.set_xlabel("phase t_K mod S")
  axes.set_ylabel("accuracy")
  axes.set_ylim(-0.02, 1.02)
  axes.set_title(title, fontsize=10)
  axes.legend(fontsize=7, ncol=2)
  return _save(figure, path)


def plot_knockout_map(path, heads: Sequence[Mapping[str, Any]], *, title: str = "") -> str:
  """Accuracy change (knocked out - clean) by residue for every (layer, KV head) of a
  ``head_knockout`` record's ``heads``: rows = heads, columns = residues, red = loss."""
  figure = Figure(figsize=(6.0, 1.0 + 0.25 * max(len(heads), 1)), dpi=110, layout="constrained")
  FigureCanvasAgg(figure)
  axes = figure.subplots()
  change = np.array([h["change"] for h in heads], np.float64).reshape(len(heads), -1)
  bound = max(float(np.abs(change).max()) if change.size else 0.0, 1e-6)
  image = axes.imshow(change, cmap="RdBu", vmin=-bound, vmax=bound, aspect="auto",
                      interpolation="nearest")
  axes.set_yticks(range(len(heads)), [f"L{h['layer']} H{h['kv_head']}" for h in heads],
                  fontsize=7)
  axes.set_xlabel("residue of the target key position")
  axes.set_title(title, fontsize=10)
  figure.colorbar(image, ax=axes, label="accuracy change")
  return _save(figure, path)
