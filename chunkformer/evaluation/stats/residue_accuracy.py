"""Accuracy by residue of the target position: the typed result of the position-matched tests.

Per residue r = t_K mod M: accuracy A(r) with its two-sided 95% Wilson interval (the closed
form of scipy's ``binomtest(...).proportion_ci(method="wilson")``, no continuity correction, as
the paper reports); the mean over residues, the worst and best residue, gap = best - worst, and the
stride-repeat check mean_r |A(r) - A(r + S)| over r = 0 .. M - S - 1 (small when the pattern
repeats with the stride S; None unless S divides M and S < M). Accuracies are fractions in
[0, 1]; tables show percentage points.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

import numpy as np
from scipy import stats as scipy_stats

CONFIDENCE = 0.95


def wilson(correct: int, total: int, confidence: float = CONFIDENCE) -> tuple[float, float]:
  """The Wilson score interval of ``correct`` successes in ``total`` trials, in closed form
  (what scipy's ``binomtest(...).proportion_ci(method="wilson")`` computes, without its
  p-value: a sweep's seed-pooled tables take hundreds of intervals)."""
  if total <= 0:
    raise ValueError(f"a Wilson interval needs >= 1 trial, got {total}")
  z = float(scipy_stats.norm.ppf(0.5 + confidence / 2))
  p, n = correct / total, float(total)
  denominator = 1 + z * z / n
  centre = (p + z * z / (2 * n)) / denominator
  half = z * np.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / denominator
  return float(max(0.0, centre - half)), float(min(1.0, centre + half))


@dataclasses.dataclass(frozen=True)
class ResidueAccuracy:
  modulus: int
  stride: int | None
  correct: tuple[int, ...]  # per residue 0 .. M - 1
  total: tuple[int, ...]
  accuracy: tuple[float, ...]
  low: tuple[float, ...]  # 95% Wilson interval
  high: tuple[float, ...]
  mean: float  # mean over residues of A(r)
  worst: float
  worst_residue: int
  best: float
  best_residue: int
  gap: float  # best - worst
  stride_repeat: float | None  # mean |A(r) - A(r + S)|

  @classmethod
  def from_record(cls, record: Mapping[str, Any]) -> ResidueAccuracy:
    fields = {f.name for f in dataclasses.fields(cls)}
    return cls(**{k: tuple(v) if isinstance(v, list) else v
                  for k, v in record.items() if k in fields})


def stride_repeat(accuracy: np.ndarray, stride: int | None) -> float | None:
  """mean over r = 0 .. M - S - 1 of |A(r) - A(r + S)|; None unless S divides M, S < M."""
  m = accuracy.size
  if not stride or stride >= m or m % stride:
    return None
  return float(np.mean(np.abs(accuracy[:m - stride] - accuracy[stride:])))


def summarize(correct_N: np.ndarray, residues_N: np.ndarray, modulus: int,
              stride: int | None) -> ResidueAccuracy:
  """The residue table of N scored prompts (bool or 0/1 outcomes, residue of each)."""
  correct_N = np.asarray(correct_N, np.float64)
  residues_N = np.asarray(residues_N)
  if correct_N.shape != residues_N.shape or correct_N.ndim != 1:
    raise ValueError(f"outcomes {correct_N.shape} and residues {residues_N.shape} must be one "
                     f"value per prompt")
  k = np.array([correct_N[residues_N == r].sum() for r in range(modulus)])
  n = np.array([np.sum(residues_N == r) for r in range(modulus)])
  if np.any(n == 0):
    raise ValueError(f"residues {np.flatnonzero(n == 0).tolist()} of {modulus} have no prompt")
  acc = k / n
  intervals = [wilson(int(a), int(b)) for a, b in zip(k, n, strict=True)]
  worst, best = int(np.argmin(acc)), int(np.argmax(acc))
  return ResidueAccuracy(
      modulus, stride, tuple(int(x) for x in k), tuple(int(x) for x in n),
      tuple(float(a) for a in acc), tuple(lo for lo, _ in intervals),
      tuple(hi for _, hi in intervals), float(acc.mean()), float(acc[worst]), worst,
      float(acc[best]), best, float(acc[best] - acc[worst]), stride_repeat(acc, stride))


def from_counts(correct_R, total_R, stride: int | None) -> ResidueAccuracy:
  """The residue table of counts per residue (e.g. several seeds' counts summed)."""
  k = np.asarray(correct_R, np.int64).ravel()
  n = np.asarray(total_R, np.int64).ravel()
  if k.shape != n.shape or np.any(n <= 0) or np.any(k < 0) or np.any(k > n):
    raise ValueError(f"counts per residue: correct {k.tolist()} of total {n.tolist()} must "
                     "be 0 <= correct <= total, total >= 1")
  residues = np.repeat(np.arange(k.size), n)
  outcomes = np.concatenate([np.arange(t) < c for c, t in zip(k, n, strict=True)])
  return summarize(outcomes, residues, int(k.size), stride)


def by_residue(outcomes_N: np.ndarray, residues_N: np.ndarray, modulus: int) -> np.ndarray:
  """outcomes_YxJ: prompts in residue order reshaped to [per residue, residue] (the
  correctness matrix layout, offsets_J = residues)."""
  order = np.argsort(residues_N, kind="stable")
  return np.asarray(outcomes_N)[order].reshape(modulus, -1).T
