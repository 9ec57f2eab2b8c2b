"""The study's new statistics against hand-computed cases: split labels, the paired gap
difference, the slot-gain null, seed agreement and loss by position mod M."""

from __future__ import annotations

import numpy as np
import pytest

from chunkformer.config import ConfigError
from chunkformer.evaluation.stats import (
    estimates,
    loss_phase,
    seed_rule,
    slot_null,
    split_labels,
)
from chunkformer.studies.needles.stats import paired_gap

# --- split labels -------------------------------------------------------------------------------

# By hand: needle tokens o .. o+a+b-1, a boundary at gap g iff (o + g) % M == 0; gap a is the
# key/value gap. E.g. M=4, 2/2 at phase 1: tokens 1..4 = k k v | v -> the last value token cut.
HAND_KINDS = [
    (4, 1, 1, ["none", "none", "none", "total"]),
    (4, 2, 2, ["none", "value_cut", "total", "key_cut"]),
    (2, 2, 2, ["total", "value_cut"]),  # phase 1: k | k v | v, cut in key and value -> value_cut
    (8, 2, 2, ["none"] * 5 + ["value_cut", "total", "key_cut"]),
    (4, 3, 3, ["value_cut", "total", "key_cut", "value_cut"]),  # 6 tokens: never uncut at M=4
    (4, 1, 2, ["none", "none", "value_cut", "total"]),
    (3, 2, 1, ["none", "total", "key_cut"]),  # phase 1: tokens 1, 2 | 3 = k k | v
]


@pytest.mark.parametrize("chunk_size,key_len,value_len,expected", HAND_KINDS)
def test_split_kinds_of_every_phase_match_hand_enumeration(chunk_size, key_len, value_len,
                                                           expected):
  assert split_labels.phase_split_kinds(chunk_size, key_len, value_len) == expected
  # A chunk origin shifts the phases; offsets of any shape keep their shape.
  shifted = split_labels.split_kinds_fixed(np.arange(2 * chunk_size).reshape(2, -1) + 1,
                                           chunk_size, key_len, value_len, origin=1)
  assert shifted.shape == (2, chunk_size)
  assert list(shifted[1]) == expected


def test_split_kinds_from_end_flags_of_irregular_chunks():
  # Chunks [0..2], [3..7], [8..]: token 2 and token 7 close a chunk.
  ends = np.zeros((4, 16), np.int32)
  ends[:, [2, 7]] = 1
  kinds = split_labels.split_kinds_from_ends(ends, np.array([1, 2, 4, 5]), 2, 2)
  # offset 1: k k | v v; 2: k | k v v; 4: all in [3..7]; 5: k k v | v.
  assert list(kinds) == ["total", "key_cut", "none", "value_cut"]
  # Every M-th token closing a chunk reproduces the fixed labels.
  regular = (np.arange(40) % 4 == 3).astype(np.int32)
  offsets = np.arange(4, 20)
  np.testing.assert_array_equal(
      split_labels.split_kinds_from_ends(np.tile(regular, (16, 1)), offsets, 2, 2),
      split_labels.split_kinds_fixed(offsets, 4, 2, 2))
  with pytest.raises(ConfigError, match="offsets_N"):
    split_labels.split_kinds_from_ends(ends, np.array([14]), 2, 2)


def test_split_record_per_label_accuracy_by_hand():
  kinds = split_labels.split_kinds_fixed(np.arange(8), 4, 2, 2)  # none vcut total kcut, twice
  correct = np.array([[1, 1, 0, 1, 1, 0, 0, 1],
                      [1, 1, 0, 0, 1, 1, 0, 1]], np.float64)
  record = split_labels.split_record(correct, kinds, np.arange(8) % 4, num_resamples=200)
  by_kind = {k: (v["accuracy"], v["trials"]) for k, v in record["by_kind"].items()}
  assert by_kind == {"none": (1.0, 4), "key_cut": (0.75, 4), "value_cut": (0.75, 4),
                     "total": (0.0, 4)}
  assert record["by_label"]["partial"]["accuracy"] == 0.75
  assert record["by_label"]["partial"]["trials"] == 8
  assert record["mean_accuracy"] == 10 / 16
  assert record["max_gap"] == 1.0
  assert record["kind_by_phase"] == {"0": "none", "1": "value_cut", "2": "total",
                                     "3": "key_cut"}
  for entry in record["by_label"].values():
    assert entry["low"] <= entry["accuracy"] <= entry["high"]
  # A label that never occurs is reported empty, not dropped.
  ones = split_labels.split_kinds_fixed(np.arange(8), 4, 1, 1)
  empty = split_labels.split_record(correct, ones, np.arange(8) % 4, num_resamples=50)
  assert empty["by_label"]["partial"] == {"accuracy": None, "low": None, "high": None,
                                          "trials": 0}


def test_split_labels_bad_input_names_the_argument():
  with pytest.raises(ConfigError, match="key_len"):
    split_labels.split_kinds_fixed([0], 4, 0, 1)
  with pytest.raises(ConfigError, match="kinds"):
    split_labels.coarse_labels(["none", "half"])


# --- paired gap difference -----------------------------------------------------------------------


def _two_variants(seed: int = 1, num_haystacks: int = 64, num_offsets: int = 32):
  """A at M=2 (weak phase 0.6), B at M=4 (weak phase 0.35), strong phases 0.95: gap(A) -
  gap(B) = -0.25. A haystack effect u_s shifts both variants' weak phase alike."""
  rng = np.random.default_rng(seed)
  offsets = np.arange(num_offsets)
  u = rng.uniform(-0.3, 0.3, size=(num_haystacks, 1))
  p_a = np.where(offsets % 2 == 1, 0.6 + u, 0.95)
  p_b = np.where(offsets % 4 == 3, 0.35 + u, 0.95)
  a = (rng.random(p_a.shape) < p_a).astype(np.float64)
  b = (rng.random(p_b.shape) < p_b).astype(np.float64)
  return a, offsets % 2, b, offsets % 4


def test_paired_gap_difference_covers_the_planted_difference_and_pairing_narrows_it():
  a, phases_a, b, phases_b = _two_variants()
  paired = paired_gap.gap_difference(a, phases_a, b, phases_b, seed=3)
  unpaired = paired_gap.gap_difference(a, phases_a, b, phases_b, seed=3, paired=False)
  # The gaps are exactly estimates.phase_accuracy's.
  assert paired.gap_a.mean == estimates.phase_accuracy(a, phases_a).gap.mean
  assert paired.gap_b.mean == estimates.phase_accuracy(b, phases_b).gap.mean
  assert paired.difference.mean == pytest.approx(paired.gap_a.mean - paired.gap_b.mean)
  assert paired.difference.low < -0.25 < paired.difference.high
  assert paired.separated
  width = paired.difference.high - paired.difference.low
  unpaired_width = unpaired.difference.high - unpaired.difference.low
  assert width < 0.8 * unpaired_width
  again = paired_gap.gap_difference(a, phases_a, b, phases_b, seed=3)
  assert again == paired
  record = paired_gap.gap_difference_record(paired)
  assert record["separated"] and record["num_haystacks"] == 64


def test_paired_gap_difference_pools_seeds_and_refuses_unpaired_shapes():
  a, phases_a, b, phases_b = _two_variants()
  a2, _, b2, _ = _two_variants(seed=2)
  pooled = paired_gap.gap_difference(np.stack([a, a2]), phases_a, np.stack([b, b2]), phases_b)
  rows_a = seed_rule.pool_seeds(np.stack([a, a2]))
  rows_b = seed_rule.pool_seeds(np.stack([b, b2]))
  assert pooled.num_seeds == 2
  assert pooled.difference.mean == pytest.approx(
      estimates.phase_accuracy(rows_a, phases_a).gap.mean
      - estimates.phase_accuracy(rows_b, phases_b).gap.mean)
  with pytest.raises(ConfigError, match="correct_b"):
    paired_gap.gap_difference(a, phases_a, b[:10], phases_b)


# --- slot-gain null -----------------------------------------------------------------------------


def test_slot_statistics_by_hand():
  weights = np.array([[1.0, 0, 0, 0], [0, 0, 0, 1.0]])  # centres of mass 0 and 3
  record = slot_null.slot_gain_null(weights, num_permutations=50, min_agree=1)
  assert record["preferred_phase"] == [[0.0, 3.0]]
  assert record["shift"]["per_seed"] == [0.0]
  assert record["spread"]["per_seed"] == [3.0]
  assert record["deviation"]["per_seed"] == [0.75]  # TV distance of a one-hot from uniform


def test_slot_gain_null_p_values_are_uniform_under_exchangeable_slots():
  rng = np.random.default_rng(0)
  p_values = [slot_null.slot_gain_null(rng.dirichlet(np.ones(4), size=4), num_permutations=199,
                                       seed=i)["shift"]["p_values"][0] for i in range(300)]
  p_values = np.array(p_values)
  assert 0.04 <= np.mean(p_values <= 0.1) <= 0.17
  assert 0.4 <= np.mean(p_values <= 0.5) <= 0.6


def test_slot_gain_null_detects_a_planted_late_preference_against_init_and_permutation():
  rng = np.random.default_rng(1)
  late = np.array([1.0, 1.2, 1.4, 1.6])
  trained = late * np.exp(rng.normal(0, 0.05, size=(3, 4, 4)))  # 3 seeds, 4 heads
  init = np.full((3, 4, 4), 0.25)
  record = slot_null.slot_gain_null(trained, init, num_permutations=500)
  shift = record["shift"]
  assert max(shift["p_values"]) <= 0.01 and shift["pooled_p_value"] <= 0.01
  assert shift["agreement"]["verdict"] == seed_rule.REPRODUCED
  assert shift["agreement"]["seeds_agreeing"] == "3/3"
  assert shift["excess"]["low"] > 0
  assert record["deviation"]["excess"]["low"] > 0
  # The same weights at "initialisation": nothing learned, whatever the permutation test says.
  same = slot_null.slot_gain_null(trained, trained, num_permutations=100)
  assert same["shift"]["holds"] == [False] * 3
  assert same["shift"]["agreement"]["verdict"] == seed_rule.NOT_REPRODUCED
  with pytest.raises(ConfigError, match="init"):
    slot_null.slot_gain_null(trained, init[:, :, :2])


# --- seed agreement -----------------------------------------------------------------------------


@pytest.mark.parametrize("holds,pooled,min_agree,verdict,count", [
    ([True, True, False], True, 2, "REPRODUCED", "2/3"),
    ([True, True, True], True, 2, "REPRODUCED", "3/3"),
    ([True, False, False], False, 2, "NOT REPRODUCED", "1/3"),
    ([True, True, False], False, 2, "INCONCLUSIVE", "2/3"),
    ([False, False, True], True, 2, "INCONCLUSIVE", "1/3"),
    ([True, True], True, 2, "REPRODUCED", "2/2"),
    ([True, False], True, 2, "INCONCLUSIVE", "1/2"),
    ([True], True, 2, "INCONCLUSIVE", "1/1"),
    ([True, True, False], True, 3, "INCONCLUSIVE", "2/3"),
    # Undecided seeds (None) count neither way; an undecided pooled test decides nothing.
    ([True, True, None], True, 2, "REPRODUCED", "2/3"),
    ([False, False, None], False, 2, "NOT REPRODUCED", "0/3"),
    ([False, None, None], False, 2, "INCONCLUSIVE", "0/3"),
    ([True, True, True], None, 2, "INCONCLUSIVE", "3/3"),
])
def test_seed_agreement_truth_table(holds, pooled, min_agree, verdict, count):
  result = seed_rule.seed_agreement(holds, pooled, min_agree=min_agree)
  assert result.verdict == verdict
  assert result.count == count
  assert bool(result.reason) == (verdict == "INCONCLUSIVE")
  fails = sum(h is False for h in holds)
  assert result.agreeing == (f"{fails}/{len(holds)}" if verdict == "NOT REPRODUCED" else count)


def test_seed_interval_is_student_t():
  est = seed_rule.seed_interval([1.0, 2.0, 3.0])
  half = 4.302652729911275 / np.sqrt(3)  # t_{0.975, 2} * sd 1 / sqrt(3)
  assert est.mean == 2.0
  assert est.low == pytest.approx(2.0 - half) and est.high == pytest.approx(2.0 + half)
  assert seed_rule.seed_interval([0.5]) == (0.5, None, None)


# --- loss by position mod M ---------------------------------------------------------------------


def test_detrend_removes_a_linear_trend_and_keeps_a_periodic_pattern():
  np.testing.assert_allclose(loss_phase.trend_kernel(4), [0.125, 0.25, 0.25, 0.25, 0.125])
  t = np.arange(40, dtype=np.float64)
  pattern = np.array([0.0, 0.0, 0.0, 0.4])[t.astype(int) % 4]
  residual = loss_phase.detrend(5.0 - 0.1 * t + pattern, 4)[0]
  assert np.isnan(residual[:2]).all() and np.isnan(residual[-2:]).all()
  np.testing.assert_allclose(residual[2:-2], (pattern - 0.1)[2:-2], atol=1e-12)


def _losses(rng, planted: float, num_rows: int = 32, length: int = 128):
  t = np.arange(length)
  trend = 3.0 / np.sqrt(1.0 + t)  # steep at the start, like a language model's loss
  loss = trend + planted * (t % 4 == 3) + rng.normal(0, 0.3, size=(num_rows, length))
  return np.abs(loss), np.ones((num_rows, length))


def test_loss_by_phase_finds_a_planted_period_and_its_size():
  loss, mask = _losses(np.random.default_rng(0), planted=0.1)
  record = loss_phase.loss_by_phase(loss, mask, 4, num_resamples=300, num_permutations=500)
  assert record["p_value"] <= 0.01
  assert int(np.argmax(record["excess_by_phase"])) == 3
  assert record["amplitude_low"] < 0.1 < record["amplitude_high"]
  assert record["num_blocks"] == 30  # 32 blocks; the first and last lose 2 positions each
  flat, _ = _losses(np.random.default_rng(0), planted=0.0)
  diff = loss_phase.amplitude_difference(loss, flat, mask, 4, num_resamples=300)
  assert diff["difference_low"] > 0


def test_loss_by_phase_p_values_are_not_small_under_a_trend_without_period():
  rng = np.random.default_rng(1)
  p_values = np.array([
      loss_phase.loss_by_phase(*_losses(rng, planted=0.0), 4, num_resamples=10,
                               num_permutations=199, seed=i)["p_value"] for i in range(40)])
  assert np.mean(p_values <= 0.1) <= 0.25
  assert 0.3 <= p_values.mean() <= 0.7


def test_bits_per_byte_by_hand():
  loss = np.full((4, 8), np.log(2.0))  # one bit per token
  mask = np.ones((4, 8))
  assert loss_phase.bits_per_byte(loss, mask)[0] == pytest.approx(1.0)
  assert loss_phase.bits_per_byte(loss, mask, np.full((4, 8), 2.0))[0] == pytest.approx(0.5)
  mask[:, :4] = 0  # unscored tokens count neither bits nor bytes
  assert loss_phase.bits_per_byte(loss * 7 * (1 - mask) + loss, mask)[0] == pytest.approx(1.0)
  with pytest.raises(ConfigError, match="chunk_size"):
    loss_phase.loss_by_phase(loss, mask, 1)


def test_site_weights_stack_seeds_and_drop_incomplete_sites():
  def analysis(value, with_second):
    sites = [{"site": "block_0/attn/compressor", "realised_weight": [[value, 1 - value]]}]
    if with_second:
      sites.append({"site": "block_1/attn/compressor", "realised_weight": [[0.5, 0.5]]})
    return {"sites": sites}

  stacked = slot_null.site_weights([analysis(0.2, True), analysis(0.4, False)])
  assert list(stacked) == ["block_0/attn/compressor"]
  np.testing.assert_allclose(stacked["block_0/attn/compressor"], [[[0.2, 0.8]], [[0.4, 0.6]]])
