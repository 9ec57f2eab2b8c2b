"""The haystack-level phase test: is one phase weak for the needles in general?

The sweep's phase test (``period_tests``) shuffles the offset columns with one permutation
shared by every haystack: its unit is the offset, and a few haystacks whose needle is blind at
one phase already make the offset-mean curve periodic. This test takes the haystack as the
unit: each haystack's accuracy per phase (``offset mod M``) is relabelled by its own random
permutation of the M phases, so a haystack keeps its blind phase but not which one it is.
The statistic is the between-phase spread of the phase means averaged over haystacks (sum of
squared deviations from their mean). A small p-value says the haystacks' weak phases line up
("one phase is weak for all needles"), a large one that they do not ("a few needles are
phase-blind, each at its own phase"). One haystack alone can never be significant (p = 1).
"""

from __future__ import annotations

import numpy as np

from chunkformer.evaluation.stats.estimates import (
    _PERMUTATION_STREAM,
    _fail,
    _rng,
    as_correct_YxJ,
    as_offsets_J,
)

_BLOCK = 256  # permutations at once: bounds memory to ~Y*M*_BLOCK


def _spread_N(curves_NxM: np.ndarray) -> np.ndarray:
  centred = curves_NxM - curves_NxM.mean(axis=-1, keepdims=True)
  return (centred**2).sum(axis=-1)


def haystack_phase_test(correct_YxJ, offsets_J, chunk_size: int, *,
                        num_permutations: int = 2000, seed: int = 0) -> float:
  """Permutation p-value of the phase effect with haystacks as the unit (module docstring)."""
  correct = as_correct_YxJ(correct_YxJ)
  offsets = as_offsets_J(offsets_J, correct.shape[1])
  if not isinstance(chunk_size, (int, np.integer)) or chunk_size < 2:
    _fail("chunk_size", f"must be an int >= 2, got {chunk_size!r}")
  if num_permutations < 1:
    _fail("num_permutations", f"must be >= 1, got {num_permutations}")
  phases = np.mod(offsets, chunk_size)
  if len(np.unique(phases)) != chunk_size:
    _fail("offsets_J", f"do not cover every phase of M={chunk_size}")
  means_YxM = np.stack([correct[:, phases == g].mean(axis=1) for g in range(chunk_size)], 1)
  observed = _spread_N(means_YxM.mean(axis=0)[None])[0]
  rng = _rng(seed, _PERMUTATION_STREAM)
  rows = np.arange(means_YxM.shape[0])[None, :, None]
  null = []
  for start in range(0, num_permutations, _BLOCK):
    count = min(_BLOCK, num_permutations - start)
    labels_BxYxM = rng.permuted(np.broadcast_to(np.arange(chunk_size),
                                                (count, *means_YxM.shape)), axis=2)
    null.append(_spread_N(means_YxM[rows, labels_BxYxM].mean(axis=1)))
  null_N = np.concatenate(null)
  # Relabellings that give the same grouping differ only by round-off: count them as ties.
  tolerance = 1e-9 * max(float(observed), float(null_N.max())) + 1e-30
  return float((1 + np.count_nonzero(null_N >= observed - tolerance)) / (num_permutations + 1))
