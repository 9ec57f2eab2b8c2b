"""Statistics on arrays (numpy/scipy only; nothing here reads files or runs a model).

``analyze`` (periodicity.py) gives the typed ``analysis.Analysis`` of one correctness matrix;
estimates.py (intervals, phase accuracy, share, spectrum), period_tests.py (permutation test,
period scan), seed_rule.py (the seed rule and the verdict words), paired_gap.py, slot_null.py,
split_labels.py and loss_phase.py are the tests the claims use.
"""

from chunkformer.evaluation.stats.periodicity import analyze

__all__ = ["analyze"]
