"""Evaluation of periodicity sweeps: statistics, figures and the markdown report.

- ``stats``: bootstrap intervals, per-phase accuracy, periodic share, spectrum, permutation
  tests, period detection and ``analyze`` (a typed ``records.Analysis``).
- ``records``, ``variant_record``, ``claims``, ``results_file``: the typed sweep records
  (frozen dataclasses with their results.json form, ``to_json``/``from_json``).
- ``plots``: PNG figures (matplotlib, Agg canvas; imported on demand, not here).
- ``report``: the comparison table (console and markdown) and the report file.
"""

from chunkformer.evaluation.report import comparison_table, render_report, write_report
from chunkformer.evaluation.stats import (
    analyze,
    bootstrap_mean_accuracy,
    bootstrap_offset_accuracy,
    detect_period,
    offset_gap,
    period_scan,
    periodic_share,
    phase_accuracy,
    phase_permutation_test,
    phases_of_offsets,
    spectrum,
)

__all__ = [
    "analyze",
    "bootstrap_mean_accuracy",
    "bootstrap_offset_accuracy",
    "comparison_table",
    "detect_period",
    "offset_gap",
    "period_scan",
    "periodic_share",
    "phase_accuracy",
    "phase_permutation_test",
    "phases_of_offsets",
    "render_report",
    "spectrum",
    "write_report",
]
