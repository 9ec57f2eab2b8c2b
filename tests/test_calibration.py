"""The calibration by simulation, small: the new tests keep their type-I error and power, and
today's pooling (seeds' counts summed over shared prompts) does not."""

import dataclasses

import numpy as np
import pytest

from chunkformer.evaluation.stats import calibration

REPS = 120  # a rate of 0.05 has a Monte-Carlo s.e. of 0.02; today's pooling sits near 0.28


def _rows(*pairs):
  checks = tuple(c for c in calibration.CHECKS if (c.truth, c.rule) in pairs)
  assert len(checks) == len(pairs)
  return {(r.truth, r.rule): r for r in calibration.run(REPS, seed=1, checks=checks)}


def test_shared_seeds_keep_type_i_error_with_the_prompt_as_unit_and_inflate_when_summed():
  rows = _rows(("flat_seeds", "phase_prompt"), ("flat_seeds", "phase_summed"),
               ("flat_seeds", "flat"), ("flat_seeds", "periodic_any"))
  assert rows["flat_seeds", "phase_prompt"].passes
  assert rows["flat_seeds", "periodic_any"].passes and rows["flat_seeds", "flat"].passes
  summed = rows["flat_seeds", "phase_summed"]
  bound, _ = calibration._verdict(calibration.TYPE_I, 0.0, REPS, 0.05)
  # Today's pooling read as a type-I check fails: well above alpha plus its Monte-Carlo error.
  assert summed.rate > bound + 2 * np.sqrt(0.05 * 0.95 / REPS)
  assert not calibration._verdict(calibration.TYPE_I, summed.rate, REPS, 0.05)[1]


def test_period_rule_has_power_at_s_and_names_a_divisor_period_correctly():
  rows = _rows(("period_s", "periodic_s"), ("period_d", "periodic_s"),
               ("period_d", "periodic_d"), ("period_s_smallest", "periodic_s"))
  assert all(r.passes for r in rows.values()), {k: r.rate for k, r in rows.items()}


def test_flat_decision_rarely_calls_the_flat_bound_flat():
  rows = _rows(("flat", "flat"), ("flat_bound", "flat"))
  assert rows["flat", "flat"].passes and rows["flat_bound", "flat"].passes


def test_simulated_seeds_share_prompts_and_keep_the_marginal_accuracy():
  rng = np.random.default_rng(0)
  truth = calibration.TRUTHS["flat_seeds"]
  x = calibration.simulate(truth, rng)
  assert x.shape == (3, calibration.PROMPTS, calibration.RESIDUES)
  assert x.mean() == pytest.approx(calibration.FULL_MEAN, abs=0.01)
  assert 0.15 < calibration.seed_phi(truth, rng) < 0.45  # the measured phi range
  independent = dataclasses.replace(truth, tau=0.0)
  assert abs(calibration.seed_phi(independent, rng)) < 0.03


def test_a_drifting_truth_needs_positions():
  with pytest.raises(ValueError, match="positions"):
    calibration.simulate(calibration.TRUTHS["period_s_drift"], np.random.default_rng(0))


def test_the_floored_power_gate_changes_no_calibrated_decision_and_decides_the_ceiling():
  rows = {(r.truth, r.rule): r for r in calibration.gate_floor_run(8, seed=1)}
  same = "the same decision under rules 3 and 4 (both gates)"
  assert all(rows[t, same].rate == 1.0 for t in ("flat", "flat_seeds", "period_s", "ceiling"))
  assert rows["all_correct", "flat under rules 4 (20-point gate)"].passes
  assert rows["all_correct", "flat under rules 3 (20-point gate)"].rate == 0.0
  assert ("flat_drift", same) not in rows  # drifting truths need the sweep's positions
