"""The calibration by simulation of the matrix tests, small: why a haystack answered by three
seeds must count once in a bootstrap interval (the stacked rows undercover), and that the
deciding tests keep their type-I error and power at the committed sweeps' sizes."""

import dataclasses

import numpy as np
import pytest

from chunkformer.evaluation.stats import matrix_calibration as mc
from chunkformer.evaluation.stats import period_tests
from chunkformer.evaluation.stats.seed_rule import pool_seeds
from chunkformer.evaluation.stats.shared_prompts import seed_means
from chunkformer.studies.eviction.claims import calibration as eviction_calibration
from chunkformer.studies.needles.claims import calibration as needle_calibration
from chunkformer.studies.paper.claims import mechanism_calibration

REPS = 80  # a coverage of 0.95 has a Monte-Carlo s.e. of 0.024


def _coverage(truth: mc.MatrixTruth, reps: int = REPS) -> dict[str, float]:
  rng = np.random.default_rng(7)
  found = [mc.interval_coverage(mc.simulate(truth, rng), truth, 4, num_resamples=500)
           for _ in range(reps)]
  return {k: float(np.mean([f[k] for f in found])) for k in found[0]}


def test_stacked_seed_rows_undercover_when_seeds_share_haystacks_and_haystack_means_do_not():
  truth, _ = needle_calibration.TRUTHS["period_m4"]
  found = _coverage(truth)
  # Three seeds reading the same haystacks are not three samples of haystacks: resampling
  # their stacked rows gives intervals too narrow for both the mean and the phase gap ...
  assert found["mean_stacked"] < 0.8 and found["gap_stacked"] < 0.8, found
  # ... while the haystack as the unit (each haystack's mean over its seeds) covers.
  assert found["mean_seed_means"] >= 0.85 and found["gap_seed_means"] >= 0.85, found


def test_stacked_seed_rows_cover_when_seeds_are_independent():
  truth, _ = needle_calibration.TRUTHS["period_m4_independent"]
  found = _coverage(truth)
  assert found["mean_stacked"] >= 0.85 and found["gap_stacked"] >= 0.85, found


def test_the_two_poolings_give_one_permutation_test():
  truth, _ = needle_calibration.TRUTHS["period_d2_of_m4"]
  x = mc.simulate(truth, np.random.default_rng(3))
  offsets = np.arange(truth.offsets)
  stacked = period_tests.period_scan(pool_seeds(x), offsets, num_permutations=300)
  means = period_tests.period_scan(seed_means(x), offsets, num_permutations=300)
  np.testing.assert_allclose(stacked.p_values, means.p_values)
  np.testing.assert_allclose(stacked.adjusted_p_values, means.adjusted_p_values)


def test_shared_effects_keep_the_marginal_accuracy_and_make_seeds_agree():
  truth = mc.MatrixTruth("t", "", mc.dip(0.6, 0.4, 4), haystacks=400, tau=1.0, needle_tau=0.5)
  x = mc.simulate(truth, np.random.default_rng(0))
  by_phase = x.mean(axis=(0, 1)).reshape(-1, 4).mean(axis=0)
  np.testing.assert_allclose(by_phase, truth.phases, atol=0.04)
  independent = mc.simulate(dataclasses.replace(truth, tau=0.0, needle_tau=0.0),
                            np.random.default_rng(0))

  def phi(y):  # the two seeds' agreement beyond what each offset's accuracy explains
    centred = y - y.mean(axis=(0, 1), keepdims=True)
    return np.corrcoef(centred[0].ravel(), centred[1].ravel())[0, 1]

  assert phi(x) > 0.2 and abs(phi(independent)) < 0.03


def test_period_m_decision_keeps_its_level_on_flat_and_divisor_truths_and_finds_period_m():
  rows = needle_calibration.run(25, seed=1, names=("flat", "period_d2_of_m4", "period_m4"),
                                num_permutations=500, num_resamples=200)
  by = {(r.truth, r.rule.split(";")[0]): r for r in rows}
  for truth in ("flat", "period_d2_of_m4"):
    assert by[truth, "period = M by the seed rule (2 of 3 seeds and the pooled test)"].rate == 0
  assert by["period_m4", "period = M by the seed rule (2 of 3 seeds and the pooled test)"].rate == 1


def test_paired_gap_difference_covers_and_finds_the_study_effect():
  rows = {(r.truth, r.kind): r for r in needle_calibration.c5_run(
      60, names=("equal_gaps", "study_effect"), num_resamples=400)}
  assert rows["equal_gaps", mc.COVERAGE].rate >= 0.88
  assert rows["study_effect", mc.POWER].passes


def test_sign_flip_keeps_its_level_with_shared_haystacks():
  hits = [eviction_calibration.e3_unit(0.6, 0.6, np.random.default_rng(i),
                                       num_permutations=500)["pooled"] for i in range(100)]
  assert np.mean(hits) <= 0.1


@pytest.mark.parametrize("name", ["full_4kv_uniform", "w8s8_uniform"])
def test_knockout_test_finds_no_specialised_head_when_every_phase_loses_alike(name):
  clean, stride, losses, _ = mechanism_calibration.C14_TRUTHS[name]
  rng = np.random.default_rng(0)
  found = [mechanism_calibration.specialised_heads(
      *mechanism_calibration.knockout(clean, losses, rng), stride) for _ in range(100)]
  assert sum(bool(c) for c in found) <= 2


def test_cycling_thresholds_rarely_pass_when_nothing_moves():
  rows = {r.truth: r for r in mechanism_calibration.c16_run(200) if r.kind == mc.TYPE_I}
  assert all(r.passes for r in rows.values()), {k: r.rate for k, r in rows.items()}
