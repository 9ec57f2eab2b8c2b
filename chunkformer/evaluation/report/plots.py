"""PNG figures of a periodicity sweep.

Figures are built on ``matplotlib.figure.Figure`` directly and saved through the Agg canvas:
no pyplot global state and no backend switch, so importing this module inside a notebook or a
training job changes nothing. Every function writes one file (parent folders created) and
returns its path.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence

import numpy as np
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from chunkformer.config import ConfigError
from chunkformer.evaluation.stats.analysis_types import Analysis

_DPI = 110
_BAND_COLOR = "0.93"
# Alternate chunk backgrounds beyond this many chunks would be a grey blur: skip them.
_MAX_BANDS = 200


def _figure(width: float, height: float) -> Figure:
  figure = Figure(figsize=(width, height), dpi=_DPI, layout="constrained")
  FigureCanvasAgg(figure)
  return figure


def _save(figure: Figure, path: str | os.PathLike) -> str:
  path = os.fspath(path)
  os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
  figure.savefig(path, format="png")
  return path


def _chunk_bands(axes, offsets_J: np.ndarray, chunk_size: int | None, origin: int) -> None:
  """Grey background on every other chunk of ``chunk_size`` tokens starting at ``origin``."""
  if not chunk_size or offsets_J.size == 0:
    return
  first = origin + ((int(offsets_J.min()) - origin) // chunk_size) * chunk_size
  starts = np.arange(first, int(offsets_J.max()) + 1, chunk_size)
  if starts.size > _MAX_BANDS:
    return
  for start in starts:
    if ((start - origin) // chunk_size) % 2 == 0:
      axes.axvspan(start - 0.5, start + chunk_size - 0.5, color=_BAND_COLOR, lw=0, zorder=0)


def plot_accuracy_vs_offset(path, offsets_J, accuracy_J, low_J=None, high_J=None, *,
                            chunk_size: int | None = None, chunk_origin: int = 0,
                            title: str = "", ylabel: str = "accuracy") -> str:
  """Accuracy per needle offset with its bootstrap band on alternating chunk backgrounds.

  Args:
    offsets_J, accuracy_J: the curve; low_J/high_J: optional interval bounds.
    chunk_size: M; every other chunk [origin + iM, origin + (i+1)M) is shaded, so a weak
      phase shows as a dip at the same place in each band.
  """
  offsets_J = np.asarray(offsets_J)
  figure = _figure(7.0, 3.0)
  axes = figure.subplots()
  _chunk_bands(axes, offsets_J, chunk_size, chunk_origin)
  if low_J is not None and high_J is not None:
    axes.fill_between(offsets_J, _floats(low_J), _floats(high_J), color="C0", alpha=0.25, lw=0,
                      label="95% bootstrap")
  axes.plot(offsets_J, _floats(accuracy_J), "o-", color="C0", ms=3, lw=1, label="mean")
  axes.set_xlabel("needle offset (tokens)" + (f"; bands = chunks of M={chunk_size}"
                                               if chunk_size else ""))
  axes.set_ylabel(ylabel)
  axes.set_ylim(-0.02, 1.02)
  axes.set_xlim(offsets_J.min() - 0.5, offsets_J.max() + 0.5)
  axes.set_title(title, fontsize=10)
  axes.legend(loc="best", fontsize=8)
  return _save(figure, path)


def plot_phase_accuracy(path, phases_G, accuracy_G, low_G=None, high_G=None, *, title: str = "",
                        xlabel: str = "phase (offset mod M)", ylabel: str = "accuracy") -> str:
  """Bars of accuracy per phase with interval error bars; the weakest phase is highlighted."""
  phases_G = np.asarray(phases_G)
  accuracy_G = _floats(accuracy_G)
  colors = ["C0"] * accuracy_G.size
  if accuracy_G.size:
    colors[int(np.nanargmin(accuracy_G))] = "C3"
  errors = None
  if low_G is not None and high_G is not None:
    errors = np.stack([accuracy_G - _floats(low_G), _floats(high_G) - accuracy_G])
    errors = np.nan_to_num(np.maximum(errors, 0.0))
  figure = _figure(max(3.5, min(9.0, 0.3 * phases_G.size + 2.0)), 2.8)
  axes = figure.subplots()
  positions = np.arange(phases_G.size)
  axes.bar(positions, accuracy_G, yerr=errors, color=colors, capsize=2, width=0.8)
  step = max(1, phases_G.size // 16)
  axes.set_xticks(positions[::step], [str(p) for p in phases_G[::step]])
  axes.set_xlabel(xlabel)
  axes.set_ylabel(ylabel)
  axes.set_ylim(0.0, 1.05)
  axes.set_title(title, fontsize=10)
  return _save(figure, path)


def plot_spectrum(path, frequencies_F, power_F, *, chunk_sizes: Sequence[int] = (),
                  title: str = "") -> str:
  """Power per frequency of the mean-removed accuracy curve, with k/M harmonics marked.

  A single weak phase of period M puts power on every multiple of 1/M, which is why the
  periodic share sums over all of them.
  """
  frequencies_F = _floats(frequencies_F)
  power_F = _floats(power_F)
  figure = _figure(7.0, 2.8)
  axes = figure.subplots()
  total = np.nansum(power_F)
  share_F = power_F / total if total > 0 else power_F
  axes.vlines(frequencies_F, 0.0, share_F, color="k", lw=1.5, zorder=3)
  nyquist = float(np.max(frequencies_F)) if frequencies_F.size else 0.5
  # Harmonics of different M coincide (1/4 is also 2/8): a row of markers per M near the top
  # keeps every M visible, faint lines carry them down to the spectrum.
  marker_axes = axes.get_xaxis_transform()
  sizes = [m for m in chunk_sizes if m >= 2]
  for i, size in enumerate(sizes):
    harmonics = np.arange(1, size) / size
    harmonics = harmonics[harmonics <= nyquist + 1e-12]
    color = f"C{i + 1}"
    axes.vlines(harmonics, 0.0, 1.0, transform=marker_axes, color=color, ls=":", lw=0.8,
                alpha=0.6, zorder=1)
    axes.plot(harmonics, np.full(harmonics.size, 0.96 - 0.06 * i), "v", color=color, ms=5,
              transform=marker_axes, label=f"k/M, M={size}", zorder=4, clip_on=False)
  # Headroom so that the marker rows sit above the tallest bar.
  top = float(np.nanmax(share_F)) if share_F.size and np.nanmax(share_F) > 0 else 1.0
  axes.set_ylim(0.0, top / max(0.3, 0.9 - 0.06 * len(sizes)))
  axes.set_xlabel("frequency (cycles per token)")
  axes.set_ylabel("fraction of variance")
  axes.set_xlim(0.0, nyquist * 1.03)
  axes.set_title(title, fontsize=10)
  if sizes:
    axes.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=8, frameon=False)
  return _save(figure, path)


def plot_slot_gains(path, gains, *, title: str = "", value_label: str = "slot gain") -> str:
  """Heat map of slot gain factors: heads (rows) x slots (columns), one panel per layer.

  Args:
    gains: [L, H, M] (layers x heads x slots) or [M, H] (slots x heads).
  """
  gains = np.asarray(gains, dtype=np.float64)
  if gains.ndim == 2:
    gains_LxHxM = gains.T[None]
  elif gains.ndim == 3:
    gains_LxHxM = gains
  else:
    raise ConfigError(f"argument 'gains': expected [L, H, M] or [M, H], got shape {gains.shape}")
  num_layers, num_heads, num_slots = gains_LxHxM.shape
  figure = _figure(min(10.0, 2.0 + 0.35 * num_slots),
                   min(14.0, 0.8 + num_layers * (0.6 + 0.25 * num_heads)))
  panels = np.atleast_1d(figure.subplots(num_layers, 1, squeeze=False)[:, 0])
  low, high = np.nanmin(gains_LxHxM), np.nanmax(gains_LxHxM)
  annotate = num_heads * num_slots <= 64
  for layer, axes in enumerate(panels):
    image = axes.imshow(gains_LxHxM[layer], aspect="auto", cmap="viridis", vmin=low, vmax=high)
    axes.set_ylabel(f"layer {layer}\nhead" if num_layers > 1 else "head")
    axes.set_yticks(range(num_heads))
    axes.set_xticks(range(0, num_slots, max(1, num_slots // 16)))
    if annotate:
      middle = (low + high) / 2
      for (head, slot), value in np.ndenumerate(gains_LxHxM[layer]):
        axes.text(slot, head, f"{value:.2f}", ha="center", va="center", fontsize=6,
                  color="k" if value > middle else "w")
  panels[-1].set_xlabel("slot (phase inside the chunk)")
  figure.colorbar(image, ax=list(panels), label=value_label, shrink=0.9)
  if title:
    figure.suptitle(title, fontsize=10)
  return _save(figure, path)


def plot_variant_comparison(path, curves: Mapping[str, Analysis], *,
                            chunk_size: int | None = None, chunk_origin: int = 0,
                            title: str = "") -> str:
  """Several variants' accuracy-vs-offset curves overlaid.

  Args:
    curves: variant name -> its analysis (offsets and accuracy per offset with band).
    chunk_size: shade alternating chunks of this size (the fixed baseline's M).
  """
  figure = _figure(7.5, 3.4)
  axes = figure.subplots()
  all_offsets = np.concatenate([np.asarray(c.offsets) for c in curves.values()] or [[0]])
  _chunk_bands(axes, all_offsets, chunk_size, chunk_origin)
  for i, (name, curve) in enumerate(curves.items()):
    offsets_J = np.asarray(curve.offsets)
    color = f"C{i % 10}"
    band = curve.accuracy_by_offset
    axes.fill_between(offsets_J, _floats(band.low), _floats(band.high), color=color, alpha=0.15,
                      lw=0)
    axes.plot(offsets_J, _floats(band.values), "o-", color=color, ms=2.5, lw=1, label=name)
  axes.set_xlabel("needle offset (tokens)")
  axes.set_ylabel("accuracy")
  axes.set_ylim(-0.02, 1.02)
  axes.set_title(title, fontsize=10)
  axes.legend(loc="lower right", fontsize=7, ncol=2)
  return _save(figure, path)


def plot_grouped_phases(path, curves: Mapping[str, tuple], *, ylabel: str,
                        xlabel: str = "phase", title: str = "") -> str:
  """Grouped bars per phase, one colour per series, with interval error bars.

  Args:
    curves: series name -> (values_G, low_G, high_G) over the same phases 0..G-1.
  """
  figure = _figure(7.0, 3.2)
  axes = figure.subplots()
  width = 0.8 / max(len(curves), 1)
  for i, (name, (values, low, high)) in enumerate(curves.items()):
    values = _floats(values)
    errors = np.nan_to_num(np.maximum(np.stack([values - _floats(low), _floats(high) - values]),
                                      0.0))
    positions = np.arange(values.size) + (i - (len(curves) - 1) / 2) * width
    axes.bar(positions, values, width=width, yerr=errors, capsize=2, color=f"C{i % 10}",
             label=name)
  phases = max((len(v[0]) for v in curves.values()), default=0)
  axes.set_xticks(np.arange(phases), [str(p) for p in range(phases)])
  axes.axhline(0.0, color="0.4", lw=0.8)
  axes.set_xlabel(xlabel)
  axes.set_ylabel(ylabel)
  axes.set_title(title, fontsize=10)
  axes.legend(fontsize=7, ncol=2)
  return _save(figure, path)


def write_analysis_plots(analysis: Analysis, directory, name: str) -> dict[str, str]:
  """The standard figures of one ``analyze`` result; returns caption -> PNG path.

  Writes ``{name}_offsets.png``, ``{name}_phases.png`` and, when the result has a spectrum,
  ``{name}_spectrum.png`` into ``directory``.
  """
  size = analysis.chunk_size
  xlabel = ("phase (offset mod M)" if analysis.phase_source == "offset mod M"
            else "phase inside the actual chunk")
  by_offset, by_phase = analysis.accuracy_by_offset, analysis.phase.accuracy
  paths = {
      "accuracy vs offset": plot_accuracy_vs_offset(
          os.path.join(directory, f"{name}_offsets.png"), analysis.offsets, by_offset.values,
          by_offset.low, by_offset.high, chunk_size=size,
          title=f"{name}: accuracy per needle offset"),
      "accuracy per phase": plot_phase_accuracy(
          os.path.join(directory, f"{name}_phases.png"), analysis.phase.phases,
          by_phase.values, by_phase.low, by_phase.high, xlabel=xlabel,
          title=f"{name}: accuracy per phase (M={size})"),
  }
  if analysis.spectrum is not None:
    sizes = [t.chunk_size for t in analysis.by_chunk_size]
    paths["spectrum"] = plot_spectrum(
        os.path.join(directory, f"{name}_spectrum.png"), analysis.spectrum.frequencies,
        analysis.spectrum.power, chunk_sizes=sizes,
        title=f"{name}: spectrum of accuracy over offsets")
  return paths


def _floats(values) -> np.ndarray:
  """float64 array; None (JSON for NaN) becomes NaN."""
  return np.array([np.nan if v is None else v for v in np.ravel(values)], dtype=np.float64)
