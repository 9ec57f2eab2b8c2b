"""Sweep statistics, figures and report: invariants on synthetic accuracy matrices."""

import dataclasses
import json
import os
import tempfile

import numpy as np
from absl.testing import absltest, parameterized

from chunkformer.config import ConfigError
from chunkformer.evaluation.records.variant import VariantRecord, VariantSetup
from chunkformer.evaluation.report import markdown as report
from chunkformer.evaluation.report import plots
from chunkformer.evaluation.stats import periodicity as stats
from chunkformer.evaluation.stats.analysis_types import DepthAnalysis, Interval

Y, J = 32, 48
OFFSETS_J = np.arange(200, 200 + J)


def planted_YxJ(period: int, weak_phase: int, seed: int, weak: float = 0.5,
                strong: float = 0.9) -> np.ndarray:
  """Binomial outcomes with one weak phase of ``period`` (phase of the absolute offset)."""
  p_J = np.where(OFFSETS_J % period == weak_phase, weak, strong)
  rng = np.random.default_rng(seed)
  return rng.binomial(1, np.broadcast_to(p_J, (Y, J))).astype(np.float64)


def iid_YxJ(seed: int, p: float = 0.8) -> np.ndarray:
  return np.random.default_rng(seed).binomial(1, p, (Y, J)).astype(np.float64)


class PeriodicityTest(parameterized.TestCase):

  @parameterized.parameters((4, 1), (6, 2), (8, 5))
  def test_planted_weak_phase_is_detected_with_small_p(self, period, weak_phase):
    result = stats.analyze(planted_YxJ(period, weak_phase, seed=period), OFFSETS_J, [period])
    self.assertEqual(result.detected_period, period)
    self.assertLess(result.p_value, 0.01)
    self.assertLess(result.detection_p_value, 0.01)
    self.assertEqual(result.phase.weakest_phase, weak_phase)

  def test_multiples_of_the_period_are_significant_but_the_fundamental_is_chosen(self):
    scan = stats.period_scan(planted_YxJ(4, 1, seed=3), OFFSETS_J)
    p_by_period = dict(zip(scan.periods.tolist(), scan.p_values.tolist(), strict=True))
    for multiple in (8, 12, 16):
      self.assertLess(p_by_period[multiple], 0.01)
    self.assertEqual(stats.detect_period(scan), 4)

  def test_iid_noise_phase_effect_is_not_significant(self):
    self.assertGreater(stats.phase_permutation_test(iid_YxJ(0), OFFSETS_J % 4), 0.05)
    self.assertIsNone(stats.detect_period(stats.period_scan(iid_YxJ(0), OFFSETS_J)))
    p_values = [stats.phase_permutation_test(iid_YxJ(seed), OFFSETS_J % 4, seed=seed)
                for seed in range(50)]
    self.assertLessEqual(np.mean(np.array(p_values) <= 0.05), 0.1)

  def test_iid_noise_rarely_yields_a_detected_period(self):
    scans = [stats.period_scan(iid_YxJ(seed), OFFSETS_J, num_permutations=1000, seed=seed)
             for seed in range(50)]
    detected = [stats.detect_period(scan) for scan in scans]
    self.assertLessEqual(sum(d is not None for d in detected), 5)

  def test_constant_accuracy_has_no_share_no_gap_and_p_one(self):
    result = stats.analyze(np.ones((Y, J)), OFFSETS_J, [4])
    self.assertEqual(result.periodic_share, 0.0)
    self.assertEqual(result.max_gap, 0.0)
    self.assertEqual(result.p_value, 1.0)
    self.assertIsNone(result.detected_period)


class PeriodicShareTest(parameterized.TestCase):

  def test_share_of_a_pure_periodic_curve_is_one(self):
    pattern = np.array([0.9, 0.2, 0.7, 1.0])
    curve_J = np.tile(pattern, J // 4)
    self.assertAlmostEqual(stats.periodic_share(curve_J, OFFSETS_J % 4), 1.0, places=12)
    # A period of 4 is also a period of 8 and 12, not of 3.
    self.assertAlmostEqual(stats.periodic_share(curve_J, OFFSETS_J % 8), 1.0, places=12)
    self.assertLess(stats.periodic_share(curve_J, OFFSETS_J % 3), 0.2)

  @parameterized.parameters(2, 3, 4, 6, 8, 12, 16)
  def test_share_equals_fft_power_at_all_harmonics_of_one_over_p(self, period):
    rng = np.random.default_rng(period)
    curve_J = 0.1 * rng.normal(size=J) + np.tile(rng.uniform(size=period), J // period)
    power_J = np.abs(np.fft.fft(curve_J - curve_J.mean())) ** 2
    harmonic_bins = np.arange(1, period) * (J // period)
    expected = power_J[harmonic_bins].sum() / power_J[1:].sum()
    phases_J = stats.phases_of_offsets(OFFSETS_J, period)
    self.assertAlmostEqual(stats.periodic_share(curve_J, phases_J), expected, places=10)
    # The one-sided spectrum gives the same fraction at frequencies j / P.
    frequencies_F, power_F = stats.spectrum(curve_J)
    on_harmonic_F = np.isclose(np.mod(frequencies_F * period, 1.0), 0.0) | np.isclose(
        np.mod(frequencies_F * period, 1.0), 1.0)
    self.assertAlmostEqual(power_F[on_harmonic_F].sum() / power_F.sum(), expected, places=10)
    self.assertAlmostEqual(power_F.sum(), np.sum((curve_J - curve_J.mean()) ** 2), places=10)

  def test_share_does_not_depend_on_the_phase_origin(self):
    curve_J = planted_YxJ(6, 4, seed=1).mean(axis=0)
    self.assertAlmostEqual(
        stats.periodic_share(curve_J, stats.phases_of_offsets(OFFSETS_J, 6)),
        stats.periodic_share(curve_J, stats.phases_of_offsets(OFFSETS_J, 6, origin=5)),
        places=12)

  def test_spectrum_peaks_at_the_planted_frequency(self):
    curve_J = 0.5 + 0.3 * np.cos(2 * np.pi * OFFSETS_J / 8)
    frequencies_F, power_F = stats.spectrum(curve_J)
    self.assertAlmostEqual(frequencies_F[np.argmax(power_F)], 1 / 8)
    self.assertAlmostEqual(power_F.max() / power_F.sum(), 1.0, places=10)


class IntervalTest(parameterized.TestCase):

  def test_bootstrap_intervals_cover_the_true_mean_about_95_percent(self):
    p_J = np.linspace(0.3, 0.9, 8)
    covered = []
    for sim in range(200):
      rng = np.random.default_rng(1000 + sim)
      correct_YxJ = rng.binomial(1, np.broadcast_to(p_J, (Y, p_J.size))).astype(np.float64)
      estimate = stats.bootstrap_offset_accuracy(correct_YxJ, num_resamples=1000, seed=sim)
      covered.append((estimate.low <= p_J) & (p_J <= estimate.high))
    coverage = np.mean(covered)
    self.assertBetween(coverage, 0.88, 0.99)

  def test_phase_gap_interval_covers_the_true_gap_about_90_percent(self):
    covered = []
    for sim in range(200):
      correct_YxJ = planted_YxJ(4, 1, seed=2000 + sim)
      gap = stats.phase_accuracy(correct_YxJ, OFFSETS_J % 4, num_resamples=1000, seed=sim).gap
      covered.append(gap.low <= 0.4 <= gap.high)
    self.assertBetween(np.mean(covered), 0.85, 0.99)

  def test_phase_accuracy_is_the_mean_of_its_trials_and_gap_is_max_minus_min(self):
    correct_YxJ = np.array([[1, 0, 1, 1, 0, 0], [1, 1, 1, 0, 0, 1]], dtype=np.float64)
    result = stats.phase_accuracy(correct_YxJ, np.arange(6) % 3)
    np.testing.assert_allclose(result.accuracy.mean, [0.75, 0.25, 0.75])
    self.assertAlmostEqual(result.gap.mean, 0.5)
    self.assertTrue(np.all(result.accuracy.low <= result.accuracy.mean))
    self.assertTrue(np.all(result.accuracy.mean <= result.accuracy.high))

  def test_per_trial_phases_pool_trials_by_their_own_phase(self):
    correct_YxJ = np.array([[1, 0, 0], [0, 1, 1]], dtype=np.float64)
    phases_YxJ = np.array([[0, 1, 0], [1, 0, 2]])
    result = stats.phase_accuracy(correct_YxJ, phases_YxJ)
    np.testing.assert_array_equal(result.phases_G, [0, 1, 2])
    np.testing.assert_allclose(result.accuracy.mean, [2 / 3, 0.0, 1.0])

  def test_per_trial_phases_equal_to_offset_phases_give_identical_statistics(self):
    correct_YxJ = planted_YxJ(4, 2, seed=5)
    phases_J = OFFSETS_J % 4
    phases_YxJ = np.broadcast_to(phases_J, (Y, J))
    by_offset = stats.phase_accuracy(correct_YxJ, phases_J)
    by_trial = stats.phase_accuracy(correct_YxJ, phases_YxJ)
    for a, b in zip(by_offset.accuracy, by_trial.accuracy, strict=True):
      np.testing.assert_allclose(a, b)
    noise_YxJ = iid_YxJ(7)
    self.assertEqual(stats.phase_permutation_test(noise_YxJ, phases_J, num_permutations=300),
                     stats.phase_permutation_test(noise_YxJ, phases_YxJ, num_permutations=300))


class AnalyzeTest(parameterized.TestCase):

  def test_analyze_is_json_ready_deterministic_and_primary_is_first_chunk_size(self):
    correct_YxJ = planted_YxJ(4, 1, seed=2)
    result = stats.analyze(correct_YxJ, OFFSETS_J, [4, 8], seed=3)
    text = json.dumps(result.to_json(), allow_nan=False)
    self.assertEqual(text, json.dumps(
        stats.analyze(correct_YxJ, OFFSETS_J, [4, 8], seed=3).to_json()))
    for key in ("offsets", "accuracy_by_offset", "accuracy_by_phase", "max_gap",
                "periodic_share", "detected_period", "p_value"):
      self.assertIn(key, result.to_json())
    self.assertEqual(result.to_json()["offsets"], OFFSETS_J.tolist())
    self.assertLen(result.accuracy_by_offset.values, J)
    primary = result.by_chunk_size[0]
    self.assertEqual(primary.chunk_size, 4)
    self.assertEqual(result.phase, primary.table)
    self.assertEqual(result.p_value, primary.p_value)
    self.assertEqual([r.chunk_size for r in result.by_chunk_size], [4, 8])
    self.assertEqual(result.phase_source, "offset mod M")

  def test_caller_phases_replace_offset_phases_but_not_the_periodicity_fields(self):
    correct_YxJ = planted_YxJ(4, 1, seed=2)
    phases_YxJ = np.random.default_rng(0).integers(0, 5, (Y, J))
    plain = stats.analyze(correct_YxJ, OFFSETS_J, 4, num_permutations=300)
    caller = stats.analyze(correct_YxJ, OFFSETS_J, 4, phases=phases_YxJ, num_permutations=300)
    self.assertEqual(caller.phase_source, "caller")
    self.assertEqual(caller.phase.phases, (0, 1, 2, 3, 4))
    self.assertEqual(caller.periodic_share, plain.periodic_share)
    self.assertEqual(caller.p_value, plain.p_value)
    self.assertGreater(caller.phase.p_value, 0.05)

  @parameterized.named_parameters(
      ("values_above_one", lambda c: (c * 2, OFFSETS_J, 4, None), "correct_YxJ"),
      ("one_dimensional", lambda c: (c[0], OFFSETS_J, 4, None), "correct_YxJ"),
      ("offsets_wrong_length", lambda c: (c, OFFSETS_J[:-1], 4, None), "offsets_J"),
      ("offsets_not_increasing", lambda c: (c, OFFSETS_J[::-1], 4, None), "offsets_J"),
      ("chunk_size_zero", lambda c: (c, OFFSETS_J, [0], None), "chunk_sizes"),
      ("phases_wrong_shape", lambda c: (c, OFFSETS_J, 4, np.zeros(3, int)), "phases"),
  )
  def test_bad_input_raises_config_error_naming_the_argument(self, make_args, argument):
    correct_YxJ, offsets_J, sizes, phases = make_args(iid_YxJ(0))
    with self.assertRaisesRegex(ConfigError, argument):
      stats.analyze(correct_YxJ, offsets_J, sizes, phases=phases, num_permutations=10,
                    num_resamples=10)


def is_nonempty_png(path: str) -> bool:
  with open(path, "rb") as f:
    return f.read(8) == b"\x89PNG\r\n\x1a\n" and os.path.getsize(path) > 1000


class OutputTest(parameterized.TestCase):

  def make_directory(self) -> str:
    directory = tempfile.TemporaryDirectory()
    self.addCleanup(directory.cleanup)
    return directory.name

  def test_plots_write_nonempty_png_files(self):
    directory = self.make_directory()
    fixed = stats.analyze(planted_YxJ(4, 1, seed=0), OFFSETS_J, [4, 8], num_permutations=200)
    flat = stats.analyze(iid_YxJ(1), OFFSETS_J, [4], num_permutations=200)
    paths = list(plots.write_analysis_plots(fixed, directory, "fixed").values())
    gains_LxHxM = np.random.default_rng(0).uniform(size=(2, 3, 4))
    paths += [
        plots.plot_slot_gains(os.path.join(directory, "gains3.png"), gains_LxHxM),
        plots.plot_slot_gains(os.path.join(directory, "gains2.png"), gains_LxHxM[0].T),
        plots.plot_variant_comparison(os.path.join(directory, "cmp.png"),
                                      {"fixed M=4": fixed, "dynamic": flat}, chunk_size=4),
    ]
    self.assertLen(paths, 6)
    for path in paths:
      self.assertTrue(is_nonempty_png(path), path)

  def test_report_has_one_table_row_per_variant_and_the_given_verdicts(self):
    directory = self.make_directory()
    fixed = stats.analyze(planted_YxJ(4, 1, seed=0), OFFSETS_J, [4, 8], num_permutations=200)
    fixed = VariantRecord(
        VariantSetup("fixed-M4", "fixed", "fixed", chunk_size=4),
        dataclasses.replace(fixed, mean_accuracy=Interval(0.812, 0.8, 0.83)), "needle", 10,
        compression_ratio=4.0, images={"offsets": os.path.join(directory, "img", "a.png")},
        primary_depth="far", depths=tuple(
            DepthAnalysis(fixed.nested(), depth=d, depth_name=n, mean_distance=0.0,
                          token_accuracy=t, compression_ratio=None)
            for d, n, t in ((0.0, "far", 0.75), (1.0, "near", 0.25))),
        heldout={"far_accuracy": 0.9})
    dynamic = stats.analyze(iid_YxJ(1), OFFSETS_J, [4], num_permutations=200)
    dynamic = VariantRecord(VariantSetup("dynamic-router", "dynamic", "dynamic/router",
                                         chunk_size=4), dynamic, "needle", 10,
                            compression_ratio=3.87)
    verdicts = ["fixed-M4 has period 4 (p < 0.01)", "dynamic-router shows no period"]
    path = report.write_report(os.path.join(directory, "report.md"), [fixed, dynamic],
                               title="sweep", verdicts=verdicts)
    with open(path, encoding="utf-8") as f:
      text = f.read()
    table = report.comparison_table([fixed, dynamic]).splitlines()
    self.assertLen(table, 4)
    self.assertLen({len(line) for line in table}, 1)  # columns aligned for the console
    self.assertIn(table[2], text)
    self.assertIn(table[3], text)
    cells = [c.strip() for c in table[2].strip("|").split("|")]
    self.assertEqual(cells[:5], ["fixed-M4", "fixed", "4", "4.00x", "0.812"])
    self.assertEqual(cells[7], "4")
    self.assertEqual(f"{fixed.analysis.max_gap:.3f}", cells[5])
    # Token accuracies: the primary (far) depth's, not the near one's; the held-out one.
    self.assertEqual(cells[9:], ["0.750", "0.900"])
    dynamic_cells = [c.strip() for c in table[3].strip("|").split("|")]
    self.assertEqual(dynamic_cells[4], f"{dynamic.analysis.mean_accuracy.value:.3f}")
    self.assertEqual(dynamic_cells[9:], ["-", "-"])  # neither recorded
    for verdict in verdicts:
      self.assertIn(f"- {verdict}", text)
    self.assertIn("![offsets](img/a.png)", text)
    self.assertIn("### dynamic-router", text)


if __name__ == "__main__":
  absltest.main()
