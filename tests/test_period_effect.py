"""The period decision by effect size, the prompt-as-unit table and the shape descriptions,
against constructed truths (hand-computed numbers, noise-free curves, small simulations)."""

import numpy as np
import pytest
from scipy import stats as scipy_stats

from chunkformer.config_sections.errors import ConfigError
from chunkformer.evaluation.stats import period_effect, residue_effect, residue_shape

R, N = 24, 576


def _table(accuracy_R, variance=1e-4):
  a = np.asarray(accuracy_R, np.float64)
  return residue_effect.ResidueMeans(a, np.full(a.size, variance), np.full(a.size, N), 1,
                                     "test")


def _expected_counts(accuracy_R, n=N):
  a = np.asarray(accuracy_R, np.float64)
  return residue_effect.from_counts(np.round(a * n), np.full(a.size, n))


def _periodic(phases_P, residues=R):
  return np.asarray(phases_P, np.float64)[np.arange(residues) % len(phases_P)]


W8S8 = [0.122, 0.124, 0.999, 1.0, 0.097, 0.136, 0.140, 0.079]  # the w8s8_1kv phases


def test_counts_variance_is_binomial_over_n_minus_one_and_floored_at_the_edges():
  t = residue_effect.from_counts([25, 0, 50], [50, 50, 50])
  assert t.variance[0] == pytest.approx(0.25 / 49)
  a = 0.5 / 51
  assert t.variance[1] == pytest.approx(a * (1 - a) / 51)
  assert t.variance[2] == pytest.approx(a * (1 - a) / 51)


def test_one_seed_of_prompts_equals_its_counts():
  rng = np.random.default_rng(0)
  x = (rng.random((40, 6)) < 0.3).astype(float)
  a, b = residue_effect.from_prompts(x), residue_effect.from_counts(x.sum(0), np.full(6, 40))
  np.testing.assert_allclose(a.accuracy, b.accuracy)
  np.testing.assert_allclose(a.variance, b.variance)


def test_a_duplicated_seed_adds_no_information_but_summed_counts_halve_the_variance():
  rng = np.random.default_rng(1)
  x = (rng.random((100, 8)) < 0.4).astype(float)
  one = residue_effect.from_prompts(x)
  twice = residue_effect.from_prompts(np.stack([x, x]))
  summed = residue_effect.from_counts(2 * x.sum(0), np.full(8, 200))
  np.testing.assert_allclose(twice.variance, one.variance)
  np.testing.assert_allclose(summed.variance, one.variance * 99 / 199, rtol=1e-12)
  assert twice.design_effect == pytest.approx(2 * one.design_effect)


def test_position_term_removes_a_cubic_drift_that_skewed_positions_turn_into_residue_gaps():
  rng = np.random.default_rng(2)
  y, r = 60, 8
  positions = np.stack([rng.choice(np.arange(100), y) ** (1 + 0.1 * j) % 100
                        for j in range(r)], axis=1).astype(float)
  z = (positions - positions.mean()) / positions.std()
  effect = np.array([0.0, 0.1, 0.0, 0.1, 0.0, 0.1, 0.0, 0.1])
  x = 0.4 + 0.02 * z + 0.01 * z**2 + 0.005 * z**3 + effect[None]
  plain = residue_effect.from_prompts(x)
  adjusted = residue_effect.from_prompts(x, positions_YxR=positions)
  np.testing.assert_allclose(np.diff(adjusted.accuracy), np.diff(effect), atol=1e-9)
  assert np.max(np.abs(np.diff(plain.accuracy) - np.diff(effect))) > 1e-3


def test_noise_corrected_sums_of_squares_by_hand():
  t = _table([0.2, 0.4, 0.3, 0.5], variance=0.01)
  # phases (0.25, 0.45): within SS 0.01, noise (1 - 2/4) * 0.04; total SS 0.05, noise 3/4 * 0.04
  assert residue_effect.signal_ss(t, 2) == pytest.approx(0.01 - 0.02)
  assert residue_effect.signal_ss(t) == pytest.approx(0.05 - 0.03)
  assert residue_effect.periodic_share(t, 2) == 1.0
  assert residue_effect.effect_rms(t) == pytest.approx(np.sqrt(0.02 / 4))


def test_nested_test_statistic_by_hand():
  t = _table([0.2, 0.4, 0.3, 0.5], variance=0.01)
  # RSS(1) = 0.05 / 0.01 = 5; RSS(2) = 0.01 / 0.01 = 1: the phase effect is chi2(1) = 4
  assert residue_effect.phase_p_value(t, 2) == pytest.approx(scipy_stats.chi2.sf(4.0, 1))
  assert residue_effect.lack_of_fit_p_value(t, 2) == pytest.approx(scipy_stats.chi2.sf(1.0, 2))
  with pytest.raises(ConfigError, match="divisor"):
    residue_effect.nested_p_value(t, 2, 3)


def test_noise_correction_is_unbiased_under_exact_periodicity():
  rng = np.random.default_rng(3)
  truth = _periodic(W8S8)
  within, total = [], []
  for _ in range(300):
    t = residue_effect.from_counts(rng.binomial(N, truth), np.full(R, N))
    within.append(residue_effect.signal_ss(t, 8))
    total.append(residue_effect.signal_ss(t))
  true_total = np.sum((truth - truth.mean()) ** 2)
  assert abs(np.mean(within)) < 3 * np.std(within) / np.sqrt(300)
  assert np.mean(total) == pytest.approx(true_total, abs=3 * np.std(total) / np.sqrt(300))


def test_exact_period_s_is_periodic_with_s():
  decision = period_effect.decide(_expected_counts(_periodic(W8S8)),
                                  gate=(period_effect.PERIODIC_DIP, 8, 1 / 32))
  assert (decision.verdict, decision.period) == (period_effect.PERIODIC, 8)
  assert decision.fit(8).share == pytest.approx(1.0, abs=1e-3)
  assert decision.fit(4).share < 0.5


def test_a_period_dividing_s_is_named_not_s():
  decision = period_effect.decide(_expected_counts(_periodic([0.2, 0.9, 0.5, 0.3])))
  assert (decision.verdict, decision.period) == (period_effect.PERIODIC, 4)
  assert not decision.fit(8).passes  # 8 against its divisor 4: nothing to add


def test_a_flat_curve_is_flat_and_a_large_unperiodic_effect_is_no_period():
  flat = period_effect.decide(_expected_counts(np.full(R, 0.13)),
                              gate=(period_effect.FLAT_DIP, 8, 1 / 32))
  assert flat.verdict == period_effect.FLAT and flat.effect_upper < period_effect.FLAT_RMS
  bumpy = np.random.default_rng(4).permutation(np.linspace(0.2, 0.8, R))
  decision = period_effect.decide(_expected_counts(bumpy))
  assert decision.verdict == period_effect.NO_PERIOD
  assert "no period passes" in decision.reason


def test_a_within_phase_residual_above_its_size_fails_the_period():
  curve = _periodic(W8S8) + 0.08 * np.where(np.arange(R) < 12, 1, -1) * (_periodic(W8S8) < .9)
  fit = period_effect.decide(_expected_counts(np.clip(curve, 0, 1))).fit(8)
  assert fit.share >= period_effect.SHARE_MIN  # the share alone would pass
  assert fit.residual_rms > period_effect.RESIDUAL_MAX and not fit.passes


def test_gate_leaves_a_unit_near_chance_or_without_power_undecided():
  near_chance = period_effect.decide(_expected_counts(np.full(R, 0.088)),
                                     gate=(period_effect.FLAT_DIP, 8, 1 / 32))
  assert near_chance.verdict == period_effect.UNDECIDED and "chance" in near_chance.reason
  few = period_effect.decide(_expected_counts(np.full(R, 0.5), n=20),
                             gate=(period_effect.FLAT_DIP, 8, 0.0))
  assert few.verdict == period_effect.UNDECIDED and "power" in few.reason


def test_a_unit_that_answers_every_prompt_is_flat_with_full_power():
  # Claim rules >= 4: the gate's binomial variance and design effect are floored like the
  # residue variances, so a unit at (or next to) 100% in every residue decides. Rules 1-3
  # divided floored variances by an unfloored binomial: a design effect near 1e9, power near
  # alpha, "undecided" for a unit that answers everything (plan 5's stagger and stride-2
  # cures, at 100%). Seeds sharing prompts, with and without the position term.
  rng = np.random.default_rng(0)
  positions = rng.permuted(np.tile(np.arange(N, dtype=float), (R, 1)), axis=1).T
  for correct in (np.ones((3, N, R)), (rng.random((3, N, R)) < 0.999).astype(float)):
    for table in (residue_effect.from_prompts(correct),
                  residue_effect.from_prompts(correct, positions_YxR=positions)):
      assert table.design_effect == pytest.approx(1.0, abs=0.1)
      for gate in ((period_effect.PERIODIC_DIP, 8, 1 / 32), (period_effect.FLAT_DIP, 8, 0.0)):
        decision = period_effect.decide(table, gate=gate)
        assert decision.verdict == period_effect.FLAT and decision.power > 0.99, decision
  old = period_effect.decide(residue_effect.from_prompts(np.ones((1, N, R))),
                             gate=(period_effect.PERIODIC_DIP, 8, 1 / 32), floored_gate=False)
  assert old.verdict == period_effect.UNDECIDED and old.power < 0.1 and "power" in old.reason


def test_dip_power_matches_simulated_rejections():
  rng = np.random.default_rng(5)
  p, dip = 0.13, 0.03
  truth = np.full(R, p + dip / 8)
  truth[np.arange(R) % 8 == 0] -= dip
  variance = p * (1 - p) / N
  hits = [residue_effect.phase_p_value(
      residue_effect.from_counts(rng.binomial(N, truth), np.full(R, N)), 8) <= 0.05
          for _ in range(1000)]
  assert period_effect.dip_power(variance, dip, 8, R) == pytest.approx(np.mean(hits), abs=0.05)
  assert period_effect.dip_power(variance, 0.06, 8, R) > 0.99


def test_stride_repeat_of_an_exact_period_is_zero_and_other_lags_are_not():
  t = _table(_periodic(W8S8), variance=4e-4)
  repeat = residue_shape.stride_repeat(t, 8)
  assert repeat.repeat == 0.0 and repeat.relative == 0.0
  assert repeat.noise == pytest.approx(np.sqrt(2 / np.pi) * np.sqrt(8e-4))
  assert repeat.other_lags > 0.3


def test_weakest_phase_is_named_only_when_separated():
  t = _table(_periodic([0.5, 0.5, 0.30, 0.32]), variance=1e-3)  # phase sd 0.018, diff sd 0.026
  unclear = residue_shape.weakest_phase(t, 4)
  assert unclear.phase is None and unclear.lowest == 2
  clear = residue_shape.weakest_phase(_table(_periodic([0.5, 0.5, 0.30, 0.40]), 1e-3), 4)
  assert clear.phase == 2 and clear.margin == pytest.approx(0.10)


def test_working_phases_need_their_lower_bound_above_one_half():
  t = _table(_periodic(W8S8), variance=1e-4)
  assert residue_shape.working_phases(t, 8) == (2, 3)
  assert residue_shape.working_phases(_table(_periodic([0.52, 0.9]), 1e-2), 2) == (1,)


def test_a_periodic_curve_below_the_gate_stays_periodic_and_period_is_reads_the_detection():
  low = _periodic([0.02, 0.02, 0.40, 0.02, 0.02, 0.02, 0.02, 0.02])  # mean 7%, chance 3%
  decision = period_effect.decide(_expected_counts(low),
                                  gate=(period_effect.PERIODIC_DIP, 8, 1 / 32))
  assert (decision.verdict, decision.period) == (period_effect.PERIODIC, 8)
  assert period_effect.period_is(decision, 8) is True
  assert period_effect.period_is(decision, 4) is False
  flat_low = period_effect.decide(_expected_counts(np.full(R, 0.07)),
                                  gate=(period_effect.PERIODIC_DIP, 8, 1 / 32))
  assert period_effect.period_is(flat_low, 8) is None
  assert "by effect size alone: flat" in flat_low.reason


@pytest.mark.parametrize("split, detected", [(0.075, 8), (0.03, 4)])
def test_a_finer_period_is_detected_only_when_it_adds_more_than_the_flat_bound(split, detected):
  base = np.array([0.2, 0.9, 0.5, 0.3, 0.2, 0.9, 0.5, 0.3])
  base[0] += split
  base[4] -= split  # phases 0 and 4 of 8 apart by 2 x split; period 4 merges them
  decision = period_effect.decide(_table(_periodic(base), variance=1e-5))
  assert decision.fit(4).passes and decision.fit(8).passes  # both hold, 8 significantly finer
  # 4 leaves split / 2 rms within its phases: 3.75 points (not flat) or 1.5 (flat)
  assert decision.fit(4).residual_rms == pytest.approx(split / 2, abs=0.003)
  assert (decision.verdict, decision.period) == (period_effect.PERIODIC, detected)
