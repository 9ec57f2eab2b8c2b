"""A needle analysis names a weakest phase only when its band lies below every other phase's."""

import numpy as np

from chunkformer.evaluation.stats import periodicity as stats
from chunkformer.evaluation.stats.analysis_types import Curve, Interval, PhaseTable


def _table(values, low, high) -> PhaseTable:
  return PhaseTable((0, 1, 2, 3), Curve.of(values, low, high), int(np.argmin(values)),
                    Interval.of(0.5, 0.4, 0.6), 0.001)


def test_a_lowest_phase_inside_the_next_ones_band_is_not_a_single_weakest_phase():
  close = _table([0.10, 0.12, 0.99, 1.0], [0.05, 0.07, 0.97, 0.98], [0.15, 0.17, 1.0, 1.0])
  assert not close.weakest_separated
  assert close.weakest_text() == "no single weakest phase (lowest 0)"
  assert close.weakest_label() == "(0)"
  clear = _table([0.10, 0.60, 0.99, 1.0], [0.05, 0.50, 0.97, 0.98], [0.15, 0.70, 1.0, 1.0])
  assert clear.weakest_separated and clear.weakest_text() == "weakest phase 0"
  assert clear.weakest_label() == "0"


def test_the_analysis_separates_a_clear_blind_phase_and_not_two_equal_ones():
  rng = np.random.default_rng(0)
  offsets = np.arange(40, 72)
  one = (rng.random((64, offsets.size)) < np.where(offsets % 4 == 1, 0.1, 0.95)).astype(float)
  two = (rng.random((64, offsets.size)) < np.where(offsets % 4 < 2, 0.1, 0.95)).astype(float)
  two[:, offsets % 4 == 1] = two[:, offsets % 4 == 0]  # two blind phases answered alike
  kw = dict(num_resamples=200, num_permutations=200, seed=0)
  assert stats.analyze(one, offsets, [4], **kw).phase.weakest_text() == "weakest phase 1"
  assert not stats.analyze(two, offsets, [4], **kw).phase.weakest_separated
