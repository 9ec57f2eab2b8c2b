"""Target positions grouped by residue with exactly equal mean and variance in every group.

The position-matched tests group prompts by the residue r = t mod M of a target position t and
compare accuracy between groups. Position itself changes accuracy (distance to the query, how
much text precedes), so every group must see the same distribution of t in its first two
moments: the same mean and the same variance, exactly, not only in expectation.

Group r holds N positions t = r + M q (q integer). Equal sums and equal sums of squares over
all groups are integer conditions: writing N = M n, the sum is M s for one integer s with
Sum q_r = s - n r, and the sum of squares is M^2 K with
Sum q_r^2 = K + (n r^2 - 2 r s) / M, which must be an integer of the parity of Sum q_r
(q^2 and q have the same parity). ``group_step(M)`` is the smallest n for which some s, K
satisfy these for every r; N must be a multiple of M times it (M = 24 needs N = 576 k; M = 8
needs 64 k; M = 4 needs 16 k). Positions start spread evenly over [lo, hi] and are then moved
by unit steps that fix the sum, then by pair steps (a, b) -> (a - 1, b + 1) and their reverse,
which keep the sum and change Sum q^2 by an even amount, until the sum of squares is right.
"""

from __future__ import annotations

import math

import numpy as np


def _conditions_hold(modulus: int, n: int, s: int, k_parity: int) -> bool:
  for r in range(modulus):
    num = n * r * r - 2 * r * s
    if num % modulus:
      return False
    if (k_parity + num // modulus - (s - n * r)) % 2:
      return False
  return True


def _admissible(modulus: int, n: int) -> list[tuple[int, int]]:
  """(s mod 2M, K mod 2) pairs that make every group's integer conditions hold."""
  return [(s, k) for s in range(2 * modulus) for k in (0, 1)
          if _conditions_hold(modulus, n, s, k)]


def group_step(modulus: int) -> int:
  """Smallest n such that groups of N = n * modulus positions can match exactly."""
  if modulus < 1:
    raise ValueError(f"modulus must be >= 1, got {modulus}")
  n = 1
  while not _admissible(modulus, n):
    n += 1
  return n


def smallest_group(modulus: int) -> int:
  """The smallest number of positions per residue group that can match exactly."""
  return modulus * group_step(modulus)


def check_group_size(modulus: int, per_residue: int, field: str) -> None:
  """ValueError naming ``field`` unless ``per_residue`` positions per group can match."""
  step = smallest_group(modulus)
  if per_residue < step or per_residue % step:
    raise ValueError(f"{field}: {per_residue} prompts per residue cannot match mean and variance "
                     f"exactly for modulus {modulus}; use a multiple of {step}")


def _q_bounds(r: int, modulus: int, lo: int, hi: int) -> tuple[int, int]:
  return math.ceil((lo - r) / modulus), math.floor((hi - r) / modulus)


def _fix_sum(q: np.ndarray, want: int, qlo: int, qhi: int) -> np.ndarray:
  q = np.sort(q)
  diff = want - int(q.sum())
  step = 1 if diff > 0 else -1
  # Move evenly spaced elements so that the shape of the spread is kept.
  while diff:
    movable = np.flatnonzero((q + step >= qlo) & (q + step <= qhi))
    if movable.size == 0:
      raise ValueError("position range too narrow to match the group sums")
    take = movable[np.linspace(0, movable.size - 1, min(abs(diff), movable.size)).astype(int)]
    take = np.unique(take)
    q[take] += step
    diff -= step * take.size
  return q


def _pair_move(counts: np.ndarray, diff: int,
               overshoot: bool = False) -> tuple[int, int, int] | None:
  """(a, b, change): the pair move that changes the sum of squares by ``change`` towards
  ``diff`` without passing it (with ``overshoot``: the finest move, which may pass it): spread
  (a, b) -> (a - 1, b + 1) adds 2 (b - a) + 2, gather (a, b) -> (a + 1, b - 1) removes
  2 (b - a) - 2; the closest pair first (the finest step), then the most crowded one."""
  size = counts.size
  if diff > 0:
    for d in range(size):
      if 2 * d + 2 > diff and not overshoot:
        return None
      a = np.arange(1, size - 1 - d)
      ok = a[(counts[a] >= (2 if d == 0 else 1)) & (counts[a + d] >= 1)]
      if ok.size:
        a = int(ok[np.argmax(counts[ok] + counts[ok + d])])
        return a, a + d, 2 * d + 2
    return None
  for d in range(2, size):
    if 2 * d - 2 > -diff and not overshoot:
      return None
    a = np.arange(0, size - d)
    ok = a[(counts[a] >= 1) & (counts[a + d] >= 1)]
    if ok.size:
      a = int(ok[np.argmin(counts[ok + 1] + counts[ok + d - 1])])
      return a, a + d, -(2 * d - 2)
  return None


def _fix_squares(q: np.ndarray, want: int, qlo: int, qhi: int) -> np.ndarray:
  counts = np.bincount(q - qlo, minlength=qhi - qlo + 1).astype(np.int64)
  values = np.arange(qlo, qhi + 1)
  diff = want - int(np.sum(counts * values * values))
  if diff % 2:
    raise AssertionError("sum of squares of the wrong parity")  # excluded by group_step
  overshoots = 0
  while diff:
    move = _pair_move(counts, diff)
    if move is None and overshoots < counts.size:
      # No move fits inside diff (e.g. +2 needs two positions in one bin): pass it with the
      # finest move there is and come back from the other side.
      move, overshoots = _pair_move(counts, diff, overshoot=True), overshoots + 1
    if move is None:
      raise ValueError("position range too narrow to match the group variances")
    a, b, change = move
    step = 1 if change > 0 else -1
    counts[a] -= 1
    counts[b] -= 1
    counts[a - step] += 1
    counts[b + step] += 1
    diff -= change
  return np.repeat(values, counts)


def matched_positions(modulus: int, per_residue: int, lo: int, hi: int) -> np.ndarray:
  """positions_MxN (int64): row r holds N positions in [lo, hi], all = r mod ``modulus``,
  every row with the same sum and the same sum of squares (hence mean and variance).

  Deterministic; callers shuffle. Raises ValueError for a group size that cannot match
  (``check_group_size``) or a range narrower than three periods.
  """
  check_group_size(modulus, per_residue, "prompts_per_residue")
  if hi - lo + 1 < 3 * modulus:
    raise ValueError(f"target positions [{lo}, {hi}] span fewer than 3 periods of {modulus}")
  m, big_n = modulus, per_residue
  n = big_n // m
  admissible = _admissible(m, n)
  # Start: N evenly spread positions of [lo, hi] rounded onto each residue's grid.
  spread = lo + (np.arange(big_n) + 0.5) * (hi - lo) / big_n
  start = []
  for r in range(m):
    qlo, qhi = _q_bounds(r, m, lo, hi)
    start.append(np.clip(np.round((spread - r) / m).astype(np.int64), qlo, qhi))
  sums = [int(np.sum(r + m * q)) for r, q in enumerate(start)]
  variance = float(np.mean([np.var(r + m * q) for r, q in enumerate(start)]))
  # The common targets: admissible values nearest to the groups' average sums.
  s0 = round(np.mean(sums) / m)
  best = None
  for s in range(s0 - 2 * m, s0 + 2 * m + 1):
    for s_mod, k_parity in admissible:
      if s % (2 * m) == s_mod and (best is None or abs(s - s0) < abs(best[0] - s0)):
        best = (s, k_parity)
  s, k_parity = best
  mean = m * s / big_n  # the common mean; the common variance is the groups' average
  k = round(big_n * (mean**2 + variance) / m**2)
  k += (k - k_parity) % 2
  out = np.empty((m, big_n), np.int64)
  for r in range(m):
    qlo, qhi = _q_bounds(r, m, lo, hi)
    q = _fix_sum(start[r], s - n * r, qlo, qhi)
    q = _fix_squares(q, k + (n * r * r - 2 * r * s) // m, qlo, qhi)
    out[r] = r + m * q
  return out


def shifted_positions(modulus: int, per_residue: int, lo: int, hi: int) -> np.ndarray:
  """positions_MxN (int64): row r is one multiset of multiples of ``modulus`` shifted by r,
  so every residue group has the same distribution of positions up to that shift (every
  central moment equal, not only the variance; the mean of row r is row 0's plus r). The
  base multiset spreads ``per_residue`` multiples of the modulus evenly over the range that
  keeps every shifted row inside [lo, hi]. Deterministic; callers shuffle. A period test on
  such groups reads the position with a term of degree >= 1 (the shift is linear in r).
  """
  if modulus < 1 or per_residue < 1:
    raise ValueError(f"modulus and per_residue must be >= 1, got {modulus}, {per_residue}")
  qlo, qhi = math.ceil(lo / modulus), math.floor((hi - modulus + 1) / modulus)
  if qhi - qlo + 1 < 3:
    raise ValueError(f"target positions [{lo}, {hi}] hold fewer than 3 shifted periods of "
                     f"{modulus}")
  q = np.floor(qlo + (np.arange(per_residue) + 0.5) * (qhi - qlo + 1) / per_residue)
  base = modulus * q.astype(np.int64)
  return base[None, :] + np.arange(modulus, dtype=np.int64)[:, None]
