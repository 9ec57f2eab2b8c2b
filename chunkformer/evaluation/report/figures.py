"""Draws the figures the probes describe (``probes.base.Figure``) into a sweep's plots folder.

``KINDS`` maps a figure's kind to its drawing function, called as
``function(path, *figure.args, **figure.options)``; kind "analysis" draws the standard set
of an analysis (``plots.write_analysis_plots``: accuracy by offset, by phase, spectrum). The
studies add the kinds their probes draw (``sections.register``).
"""

from __future__ import annotations

import os
from collections.abc import Sequence

from chunkformer.evaluation.probes.base import Figure
from chunkformer.evaluation.report import plots, probe_plots

KINDS = {
    "phase_accuracy": plots.plot_phase_accuracy,
    "prefix_probe": probe_plots.plot_prefix_probe,
    "slot_gains": plots.plot_slot_gains,
}


def draw(figures: Sequence[Figure], directory: str) -> dict[str, str]:
  """caption -> PNG path of each figure, in order."""
  images = {}
  for figure in figures:
    if figure.kind == "analysis":
      images.update(plots.write_analysis_plots(*figure.args, directory, **figure.options))
    elif figure.kind in KINDS:
      images[figure.caption] = KINDS[figure.kind](os.path.join(directory, figure.file),
                                                  *figure.args, **figure.options)
    else:
      raise ValueError(f"figure {figure.caption!r}: no drawing for kind {figure.kind!r}; known: "
                       f"analysis, {', '.join(KINDS)}")
  return images
