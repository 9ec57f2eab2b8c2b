"""The lookup curves' shape as the paper study describes it (``claims.lookup_shape``,
``report.shape_tables``): the stride repeat against its noise and against other lags, the weakest
phase only when separated, the phases that work; and the committed report's counts of working
phases recomputed from the stored answers by hand."""

from __future__ import annotations

import json
import os
import re

import numpy as np
import pytest
from scipy import stats as scipy_stats

from chunkformer.evaluation.stats import residue_effect
from chunkformer.studies.paper.claims import lookup_shape
from chunkformer.studies.paper.report import shape_tables

R, N = 24, 576
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SWEEP = os.path.join(ROOT, "results", "paper_protocol")
W8S8 = [0.122, 0.124, 0.999, 1.0, 0.097, 0.136, 0.140, 0.079]  # w8s8_1kv's phases, prefix


def _drawn(truth_R, seed: int) -> residue_effect.ResidueMeans:
  k = np.random.default_rng(seed).binomial(N, truth_R)
  return residue_effect.from_counts(k, np.full(R, N))


def _expected(truth_R) -> residue_effect.ResidueMeans:
  a = np.asarray(truth_R, np.float64)
  return residue_effect.from_counts(np.round(a * N), np.full(R, N))


def _periodic(phases):
  return np.asarray(phases, np.float64)[np.arange(R) % len(phases)]


def test_an_exact_period_with_binomial_noise_repeats_within_noise_at_a_small_lag_ratio():
  shape = lookup_shape.describe(_drawn(_periodic(W8S8), seed=3), 8)
  assert shape.repeat > 0.005  # noise alone gives the repeat its 1-2 points
  assert shape.within_noise and shape_tables.repeat_cell(shape).endswith("(within noise)")
  assert shape.relative < 0.1  # lag 8 against lags 1-7, 9-15, 17-23: far apart
  # The 95% point holds its level: ~5% of exactly periodic draws fall beyond it.
  beyond = [not lookup_shape.describe(_drawn(_periodic(W8S8), seed=s), 8).within_noise
            for s in range(200)]
  assert 0.01 <= np.mean(beyond) <= 0.10


def test_a_pattern_that_differs_within_a_phase_repeats_beyond_noise():
  truth = _periodic(W8S8)
  truth[[10, 11]] -= 0.15  # the working phases fall along the row: 100, 85, 70%
  truth[[18, 19]] -= 0.30
  shape = lookup_shape.describe(_expected(truth), 8)
  assert not shape.within_noise  # 5.0 points against a 95% point of 2.0
  assert shape.relative < 0.2  # still far below the other lags: a drift on a period


def test_a_flat_row_has_a_lag_ratio_near_one_and_works_nowhere():
  ratios = [lookup_shape.describe(_drawn(np.full(R, 0.13), seed=s), 8).relative
            for s in range(20)]
  assert 0.85 <= np.mean(ratios) <= 1.15
  shape = lookup_shape.describe(_drawn(np.full(R, 0.13), seed=0), 8)
  assert shape.working == () and shape_tables.working_cell(shape) == "0 of 8"
  assert shape_tables.weakest_cell(shape) == shape_tables.NO_WEAKEST


def test_the_weakest_phase_is_named_only_when_separated_from_the_next_failing_one():
  # Phases 4 and 7 at 9.7 and 7.9% (one seed, 1728 prompts per phase: the interval of their
  # difference is 1.96 sqrt(v4 + v7) = 1.9 points): not separated.
  close = lookup_shape.describe(_expected(_periodic(W8S8)), 8)
  half = 1.96 * np.sqrt((0.097 * 0.903 + 0.079 * 0.921) / (3 * N))
  assert close.margin_half_width == pytest.approx(half, rel=0.02)
  assert close.weakest is None and close.lowest == 7
  assert shape_tables.weakest_cell(close) == "no single weakest phase"
  clear = lookup_shape.describe(_expected(_periodic([*W8S8[:7], 0.02])), 8)
  # 56 and 12 of 576 (9.7 and 2.1%): 7.6 points apart, the interval +-1.6
  assert clear.weakest == 7 and clear.margin == pytest.approx(44 / 576)
  assert shape_tables.weakest_cell(clear) == "7 (next 7.6 points above, interval ±1.6)"


def test_w8s8_1kv_works_at_two_of_its_eight_phases():
  shape = lookup_shape.describe(_expected(_periodic(W8S8)), 8)
  assert shape.working == (2, 3) and shape_tables.working_cell(shape) == "2 of 8 (2, 3)"


def test_the_published_curve_gets_no_interval_only_its_lowest_phase_and_lag_ratio():
  curve = 100 * _periodic(W8S8)
  found = lookup_shape.published(curve, 8)
  assert (found.lowest, found.repeat, found.relative) == (7, 0.0, 0.0)
  assert found.margin == pytest.approx(1.8)


def _working(means_P, variances_P) -> tuple[int, ...]:
  """Phases whose one-sided 95% normal lower bound is >= 50%, by hand."""
  low = np.asarray(means_P) - scipy_stats.norm.ppf(0.95) * np.sqrt(variances_P)
  return tuple(int(p) for p in np.flatnonzero(low >= 0.5))


def _by_hand(answers_SxYxR: np.ndarray, stride: int) -> tuple[int, ...]:
  """Each prompt's mean over the seeds is one observation; a phase's accuracy is the mean of
  its residues' means, its variance the sum of theirs over the residue count squared."""
  m_YxR = answers_SxYxR.mean(axis=0)
  means_R = m_YxR.mean(axis=0)
  variances_R = m_YxR.var(axis=0, ddof=1) / m_YxR.shape[0]
  groups = np.arange(means_R.size) % stride
  k = means_R.size // stride
  return _working(np.bincount(groups, means_R) / k, np.bincount(groups, variances_R) / k**2)


def _stored() -> tuple[dict[str, list[str]], dict[str, int], dict[str, np.ndarray]]:
  with open(os.path.join(SWEEP, "results.json")) as f:
    variants = json.load(f)["variants"]
  rows, strides = {}, {}
  for v in variants:
    if (v.get("probes") or {}).get("lookup"):
      rows.setdefault(v["variant"], []).append(v["name"])
      strides[v["variant"]] = v["chunk_size"] or 8  # full attention: the phases of 8
  answers = {}
  for names in rows.values():
    for name in names:
      with np.load(os.path.join(SWEEP, "correct", name + ".npz")) as z:
        for padding in ("prefix", "in_sequence"):
          answers[name, padding] = z[f"lookup_{padding}.correct_YxJ"].astype(np.float64)
  return rows, strides, answers


CELL = re.compile(r"^\| (\S+) \| (prefix|in_sequence) \| (\d+) \|.* \| (\d+) of (\d+)"
                  r"(?: \(([\d, ]+)\))? \|$")


def test_every_phases_that_work_count_in_the_committed_report_is_what_the_answers_give():
  rows, strides, answers = _stored()
  units = {u: row for row, names in rows.items() for u in names}
  with open(os.path.join(SWEEP, "report.md"), encoding="utf-8") as f:
    text = f.read()
  checked = 0
  for line in text.splitlines():
    found = CELL.match(line)
    if not found:
      continue
    name, padding, stride, count, of, listed = found.groups()
    members = rows.get(name) or [name]
    s = strides[units[members[0]]]
    assert int(stride) == int(of) == s, line
    expected = _by_hand(np.stack([answers[u, padding] for u in members]), s)
    assert int(count) == len(expected), line
    got = tuple(int(p) for p in listed.split(", ")) if listed else ()
    assert got == expected, line
    checked += 1
  assert checked == 2 * (len(rows) + len(units))  # every row and unit, both paddings
  # C10's line quotes the prefix count of each row it compares.
  c10 = next(line for line in text.splitlines() if line.startswith("- **C10**"))
  quoted = re.findall(r"(\w+): ours detected period .*? (\d+) of (\d+) phases work", c10)
  assert quoted
  for row, count, _ in quoted:
    members = np.stack([answers[u, "prefix"] for u in rows[row]])
    assert int(count) == len(_by_hand(members, strides[row])), row
