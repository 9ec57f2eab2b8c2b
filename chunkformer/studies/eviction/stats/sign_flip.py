"""Paired comparison of two policies on the same needles: a sign-flip permutation test.

Two eviction policies answered the SAME rows (the same haystacks, needle offsets and trained
model), so each haystack y gives one paired difference d_y = mean over its offsets of
(correct under A - correct under B). Under the null "A and B retrieve equally" the sign of
each haystack's difference is exchangeable, so the test flips the signs of the d_y at random
(one independent sign per haystack) and compares |mean d| with the null's. The unit is the
haystack, not the needle: offsets of one haystack share its difficulty and are not independent
trials. Training seeds scored on the same haystacks are averaged per haystack first
(``paired_rows``), so a haystack counts once however many seeds saw it.

p = (1 + #{|null mean| >= |observed mean|}) / (1 + R), two-sided; an all-zero difference
gives p = 1. Calibration (simulated with this module: 400 null data sets of Y = 32 haystacks
whose accuracy, drawn uniformly in [0.3, 0.95], both policies share, J = 40 offsets,
R = 2000): p <= 0.05 in 0.043 of them.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

import numpy as np

from chunkformer.evaluation.stats.estimates import _PERMUTATION_STREAM, _fail, _rng, as_correct_YxJ

_BLOCK = 512  # sign vectors drawn at once: bounds memory to ~Y*_BLOCK


class PairedDifference(NamedTuple):
  mean_a: float  # accuracy of A over every needle
  mean_b: float
  difference: float  # mean over haystacks of d_y = accuracy A - accuracy B
  p_value: float  # two-sided sign-flip p-value
  num_haystacks: int


def paired_rows(a_NxYxJ: Sequence, b_NxYxJ: Sequence) -> tuple[np.ndarray, np.ndarray]:
  """Per haystack, A's and B's accuracy averaged over seeds and offsets: two [Y] vectors.

  ``a_NxYxJ``/``b_NxYxJ``: one [Y, J] matrix per seed (seed n of A paired with seed n of B,
  row y of every seed the same haystack)."""
  a = [as_correct_YxJ(x) for x in a_NxYxJ]
  b = [as_correct_YxJ(x) for x in b_NxYxJ]
  if not a or len(a) != len(b):
    _fail("a_NxYxJ", f"need one matrix per seed for both policies, got {len(a)} and {len(b)}")
  shapes = {x.shape for x in a + b}
  if len(shapes) != 1:
    _fail("a_NxYxJ", f"paired matrices must share one shape [Y, J], got {sorted(shapes)}")
  return (np.mean([x.mean(axis=1) for x in a], axis=0),
          np.mean([x.mean(axis=1) for x in b], axis=0))


def sign_flip_test(a_Y, b_Y, *, num_permutations: int = 2000, seed: int = 0) -> PairedDifference:
  """The paired difference of per-haystack accuracies ``a_Y - b_Y`` and its sign-flip
  p-value (module docstring)."""
  a, b = np.asarray(a_Y, np.float64).ravel(), np.asarray(b_Y, np.float64).ravel()
  if a.size == 0 or a.shape != b.shape:
    _fail("a_Y", f"need paired per-haystack values of one length, got {a.shape} and {b.shape}")
  if num_permutations < 1:
    _fail("num_permutations", f"must be >= 1, got {num_permutations}")
  d = a - b
  observed = abs(float(d.mean()))
  if not np.any(d):
    return PairedDifference(float(a.mean()), float(b.mean()), 0.0, 1.0, int(d.size))
  rng = _rng(seed, _PERMUTATION_STREAM)
  exceed = 0
  tolerance = 1e-12 * float(np.abs(d).max())
  for start in range(0, num_permutations, _BLOCK):
    count = min(_BLOCK, num_permutations - start)
    signs_RxY = rng.choice(np.array([-1.0, 1.0]), size=(count, d.size))
    exceed += int(np.count_nonzero(np.abs(signs_RxY @ d / d.size) >= observed - tolerance))
  return PairedDifference(float(a.mean()), float(b.mean()), float(d.mean()),
                          float((1 + exceed) / (1 + num_permutations)), int(d.size))
