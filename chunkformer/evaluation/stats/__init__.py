"""Statistics on arrays (numpy/scipy only; nothing here reads files or runs a model).

``analyze`` (periodicity.py) gives the typed ``analysis.Analysis`` of one correctness matrix;
estimates.py (intervals, phase accuracy, share, spectrum), period_tests.py (permutation test,
period scan), seed_rule.py (the seed rule and the verdict words), paired_gap.py, slot_null.py,
split_labels.py and loss_phase.py are the tests the claims use.
"""

from chunkformer.evaluation.stats.periodicity import (
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
    "detect_period",
    "offset_gap",
    "period_scan",
    "periodic_share",
    "phase_accuracy",
    "phase_permutation_test",
    "phases_of_offsets",
    "spectrum",
]
