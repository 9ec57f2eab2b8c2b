"""Holm's adjustment and the haystack-level phase test against hand-computed references."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from chunkformer.evaluation.stats.holm import holm
from chunkformer.evaluation.stats.period_tests import phase_permutation_test
from chunkformer.studies.needles.stats.haystack_test import haystack_phase_test


def test_holm_matches_the_step_down_by_hand():
  # sorted 0.01, 0.02, 0.03, 0.5 -> 4*0.01, max(3*0.02, .04), max(2*0.03, .06), max(.5, .06)
  np.testing.assert_allclose(holm([0.03, 0.01, 0.5, 0.02]), [0.06, 0.04, 0.5, 0.06])
  np.testing.assert_allclose(holm([0.3, 0.4]), [0.6, 0.6])  # monotone, capped below 1
  np.testing.assert_allclose(holm([0.9, 0.8]), [1.0, 1.0])
  assert holm([]).size == 0 and holm([0.2])[0] == 0.2
  with pytest.raises(ValueError, match="p_values"):
    holm([0.1, 1.5])


def _exact_p(means_YxM):
  """Every relabelling of every haystack enumerated: the exact permutation p-value."""
  def spread(m):
    curve = m.mean(axis=0)
    return ((curve - curve.mean())**2).sum()
  observed = spread(means_YxM)
  perms = list(itertools.permutations(range(means_YxM.shape[1])))
  null = [spread(np.stack([row[list(p)] for row, p in zip(means_YxM, ps, strict=True)]))
          for ps in itertools.product(perms, repeat=means_YxM.shape[0])]
  return np.mean(np.asarray(null) >= observed - 1e-12)


def test_haystack_test_matches_the_exact_enumeration_and_tells_scattered_from_aligned():
  offsets = np.arange(40, 52)  # 12 offsets, M = 3: phases 1, 2, 0, ...
  phases = offsets % 3
  rng = np.random.default_rng(0)
  correct = (rng.random((3, 12)) < 0.7).astype(float)
  means = np.stack([correct[:, phases == g].mean(1) for g in range(3)], 1)
  p = haystack_phase_test(correct, offsets, 3, num_permutations=4000, seed=1)
  assert p == pytest.approx(_exact_p(means), abs=0.03)  # 6^3 relabellings enumerated
  # Two of 8 haystacks blind at phase 2: the offset-mean curve dips at phase 2 (the offset
  # test calls it periodic), but two haystacks land on one phase by chance with probability
  # 1/3 (exact p). All 8 blind at phase 2: they line up (exact p = 3 / 3^8 = 4.6e-4).
  few = np.ones((8, 12))
  few[:2, phases == 2] = 0.0
  assert phase_permutation_test(few, phases, num_permutations=500) < 0.01
  assert haystack_phase_test(few, offsets, 3, num_permutations=6000) == pytest.approx(1 / 3,
                                                                                    abs=0.02)
  aligned = np.ones((8, 12))
  aligned[:, phases == 2] = 0.0
  assert haystack_phase_test(aligned, offsets, 3, num_permutations=500) < 0.01
  assert haystack_phase_test(aligned[:1], offsets, 3, num_permutations=50) == 1.0  # 1 haystack
  with pytest.raises(ValueError, match="chunk_size"):
    haystack_phase_test(aligned, offsets, 1)
