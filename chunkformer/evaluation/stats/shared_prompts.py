"""Seeds that answer the same haystacks: pool them with the haystack as the unit.

The needle and prefix studies ask every seed of a variant the same haystacks (row y of each
seed's correctness matrix [Y, J] is one haystack). ``seed_rule.pool_seeds`` stacks the seeds'
rows as more haystacks. For the permutation tests of ``period_tests`` that is harmless: they
shuffle the offset columns with the rows intact, and the column means (hence every phase
statistic) of the stacked matrix equal those of the per-haystack mean over seeds. The
bootstrap intervals of ``estimates`` resample rows, though, and read a haystack answered by
three seeds as three independent haystacks, so their intervals come out too narrow when the
seeds agree. ``seed_means`` gives the matrix with the haystack as the unit: each haystack's
outcome averaged over the seeds (fractions in [0, 1], which every statistic accepts).
"""

from __future__ import annotations

import numpy as np

from chunkformer.evaluation.stats.estimates import _fail


def seed_means(correct_NxYxJ) -> np.ndarray:
  """[N seeds, Y haystacks, J offsets] (or a list of [Y, J]) -> [Y, J]: each haystack's
  outcome at each offset averaged over the seeds, the haystack as the unit."""
  arrays = [np.asarray(x, np.float64) for x in correct_NxYxJ]
  if not arrays or any(x.ndim != 2 for x in arrays) or len({x.shape for x in arrays}) != 1:
    _fail("correct_NxYxJ", "expected seeds' [Y, J] matrices of one shape (the same haystacks "
                           f"and offsets), got {[x.shape for x in arrays]}")
  return np.mean(arrays, axis=0)


def seed_agreement(correct_NxYxJ) -> float:
  """The design effect of counting each seed's answer as a new haystack: the variance of a
  haystack's mean over seeds (over all haystacks and offsets) divided by what independent
  seeds would give, offset by offset (1: seeds independent; N: every seed answers alike).
  Haystacks differing in difficulty raise it above 1 even for independent seeds."""
  x = np.stack([np.asarray(a, np.float64) for a in correct_NxYxJ])
  n = x.shape[0]
  p_J = x.mean(axis=(0, 1))
  independent = float(np.mean(p_J * (1 - p_J))) / n
  if independent <= 0:
    return 1.0
  return float(np.mean(x.mean(axis=0).var(axis=0, ddof=1)) / independent)
