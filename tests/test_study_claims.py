"""C5 and C6 judged by their tests, the split-label record field and the study's report tables,
on synthetic records and correctness matrices whose numbers can be checked by hand."""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest

from chunkformer.evaluation.claims import registry
from chunkformer.evaluation.claims import rules as claim_rules
from chunkformer.evaluation.probes import split_fields
from chunkformer.evaluation.records import correctness
from chunkformer.evaluation.records.variant import SlotGainSite, VariantRecord, VariantSetup
from chunkformer.evaluation.stats import periodicity as stats
from chunkformer.evaluation.stats.analysis_types import Interval
from chunkformer.evaluation.stats.estimates import phase_dependent_needles
from chunkformer.studies.needles.claims import judgments, slot_preference, step_size, summaries
from chunkformer.studies.needles.report import claim_tables

OFFSETS = np.arange(40, 56)  # 16 consecutive offsets: 4 of each phase mod 4, 8 of each mod 2
Y = 8  # haystacks


def _analysis(correct_YxJ, m):
  return stats.analyze(correct_YxJ, OFFSETS, [m], num_resamples=20, num_permutations=20)


def _record(name, seed, m, correct_YxJ, *, key_len=2, value_len=2, attention="fixed",
            variant=None, **setup):
  chunking = setup.pop("chunking", attention)
  setup = VariantSetup(variant or name, attention, chunking, chunk_size=m, seed=seed,
                       key_len=key_len, value_len=value_len, name=name, **setup)
  return VariantRecord(setup, _analysis(correct_YxJ, m), "needle", 10, compression_ratio=m,
                       primary_depth="far")


def _weak_phase(m, phase, rate):
  """All correct except offsets of ``phase`` mod m, right in the first ``rate`` of haystacks."""
  correct = np.ones((Y, OFFSETS.size))
  correct[:, OFFSETS % m == phase] = 0.0
  correct[:int(rate * Y), OFFSETS % m == phase] = 1.0
  return correct


def _sweep(m2_rate, m4_rate, *, seeds=(0, 1), key_len=2):
  """Plain fixed M=2 (weak phase 0) and M=4 (weak phase 2) records and their matrices."""
  records, store = [], {}
  for seed in seeds:
    for m, phase, rate in ((2, 0, m2_rate), (4, 2, m4_rate)):
      correct = _weak_phase(m, phase, rate)
      name = f"fixed_m{m}_k{key_len}_seed{seed}"
      records.append(_record(name, seed, m, correct, key_len=key_len, value_len=key_len,
                             variant=f"fixed_m{m}_k{key_len}"))
      store[name] = {"needle_far": correctness.Matrix(correct, OFFSETS)}
  return records, store


def test_c5_reproduced_when_the_paired_interval_lies_below_zero():
  # gap(M=2) = 1 - 0.5 = 0.5 (half the haystacks fail phase 0); gap(M=4) = 1 - 0 = 1.
  records, store = _sweep(m2_rate=0.5, m4_rate=0.0)
  claim = step_size.c5_claim(records, store.get, num_resamples=200)
  group = claim.numbers["key2_value2_steps10"]
  assert group["difference"] == pytest.approx(-0.5)
  assert (group["gap_a"], group["gap_b"]) == (pytest.approx(0.5), pytest.approx(1.0))
  assert group["difference_high"] < 0 and group["num_seeds"] == 2
  assert group["num_haystacks"] == Y and group["per_seed_difference"] == [-0.5, -0.5]
  assert (claim.verdict, claim.seeds_agreeing) == ("REPRODUCED", "2/2")
  assert group["units_m2"] == ["fixed_m2_k2_seed0", "fixed_m2_k2_seed1"]


def test_c5_reads_the_matrices_a_sweep_stored_in_its_directory(tmp_path):
  records, store = _sweep(m2_rate=0.5, m4_rate=0.0)
  for name, matrices in store.items():
    correctness.save(correctness.path_for(str(tmp_path), name), matrices)
  from_disk = step_size.c5_claim(records, correctness.loader(str(tmp_path)),
                                    num_resamples=100)
  assert from_disk == step_size.c5_claim(records, store.get, num_resamples=100)
  assert correctness.loader(str(tmp_path))("no_such_unit") is None


def test_c5_not_reproduced_above_zero_and_inconclusive_with_the_interval_in_the_reason():
  records, store = _sweep(m2_rate=0.0, m4_rate=0.5)  # M=2 gap 1, M=4 gap 0.5
  claim = step_size.c5_claim(records, store.get, num_resamples=200)
  assert claim.verdict == "NOT REPRODUCED" and claim.seeds_agreeing == "2/2"
  records, store = _sweep(m2_rate=0.5, m4_rate=0.5)  # equal gaps on the same haystacks
  claim = step_size.c5_claim(records, store.get, num_resamples=200)
  group = claim.numbers["key2_value2_steps10"]
  # The paired resamples move both gaps together: the difference is exactly 0 in every one.
  assert (group["difference"], group["difference_low"], group["difference_high"]) == (0, 0, 0)
  assert claim.verdict == "INCONCLUSIVE"
  assert "[0.000, 0.000]" in claim.reason and "contains 0" in claim.reason


def test_c5_with_a_model_below_the_learned_gate_is_inconclusive_and_says_why():
  records, store = _sweep(m2_rate=0.5, m4_rate=0.0)  # the gaps alone would reproduce C5
  records = [dataclasses.replace(r, heldout={"far_accuracy": 0.3 if r.chunk_size == 4 else 0.9})
             for r in records]
  claim = step_size.c5_claim(records, store.get, num_resamples=50)
  assert claim.verdict == "INCONCLUSIVE"
  assert "fixed_m4_k2_seed0 held-out far accuracy 0.300" in claim.reason
  assert "learned gate" in claim.reason
  assert claim.numbers["key2_value2_steps10"]["not_learned"][0].startswith("fixed_m4_k2_seed0")


def test_c5_multi_token_needles_decide_and_one_token_needles_say_why_they_cannot():
  one, store = _sweep(m2_rate=0.0, m4_rate=0.0, key_len=1)  # equal gaps of 1
  claim = step_size.c5_claim(one, store.get, num_resamples=50)
  assert claim.verdict == "INCONCLUSIVE" and "total at every M" in claim.reason
  multi, more = _sweep(m2_rate=0.5, m4_rate=0.0)
  claim = step_size.c5_claim(one + multi, {**store, **more}.get, num_resamples=50)
  assert claim.verdict == "REPRODUCED" and set(claim.numbers) == {"key1_value1_steps10",
                                                             "key2_value2_steps10"}
  assert "not deciding" in claim.reason


def _trained(records, store, steps):
  """The records and matrices as a second block of the same needles trained ``steps``."""
  renamed = {r.name: f"{r.name}_long" for r in records}
  records = [dataclasses.replace(r, trained_steps=steps,
                                 setup=dataclasses.replace(r.setup, name=renamed[r.name]))
             for r in records]
  return records, {renamed[k]: v for k, v in store.items()}


def test_c5_pairs_models_of_one_budget_and_the_longest_budget_decides():
  short, store = _sweep(m2_rate=0.0, m4_rate=0.5)  # 10 steps: NOT REPRODUCED alone
  long, more = _trained(*_sweep(m2_rate=0.5, m4_rate=0.0), steps=40)  # 40 steps: REPRODUCED
  claim = step_size.c5_claim(short + long, {**store, **more}.get, num_resamples=50)
  assert set(claim.numbers) == {"key2_value2_steps10", "key2_value2_steps40"}
  # Paired within a block only: mixing would pair the two blocks' M = 2 and M = 4 models.
  assert claim.numbers["key2_value2_steps10"]["difference"] == pytest.approx(0.5)
  assert claim.numbers["key2_value2_steps40"]["difference"] == pytest.approx(-0.5)
  assert claim.numbers["key2_value2_steps40"]["units_m4"] == ["fixed_m4_k2_seed0_long",
                                                              "fixed_m4_k2_seed1_long"]
  assert (claim.verdict, claim.seeds_agreeing) == ("REPRODUCED", "2/2")
  assert "10 steps" in claim.reason and "longer budget of these needles does" in claim.reason
  # A cure's baseline is the plain model of its own budget (and seed), not the first found.
  cure = dataclasses.replace(long[1], setup=dataclasses.replace(
      long[1].setup, name="fixed_m4_shift_k2_seed0", variant="fixed_m4_shift_k2", key_shift=True,
      key_shift_width=2))
  judged = judgments.judge(short + long + [cure])
  # The per-seed judgments of verdicts pair within a block too (one line per block and seed).
  c5_lines = [j for j in judged if j.claim == "C5"]
  assert sorted((j.records[0].trained_steps, j.holds) for j in c5_lines) == [
      (10, False), (10, False), (40, True), (40, True)]
  (cure_line,) = [j for j in judged if j.records and j.records[0] is cure]
  assert cure_line.numbers["baseline"]["variant"] == "fixed_m4_k2_seed0_long"


def _split_text(records) -> str:
  return "\n".join(claim_tables.split_label_tables(summaries.split_label_blocks(records)))


def _shift_lines(records) -> list[str]:
  return claim_tables.shift_map(summaries.shift_grid(records, None))


def test_split_labels_and_shift_map_keep_budgets_apart():
  short, _ = _sweep(m2_rate=0.5, m4_rate=0.0, seeds=(0,))
  long, _ = _trained(short, {}, steps=40)
  text = _split_text(short + long)
  assert "Key 2 / value 2 token(s), 10 steps:" in text
  assert "Key 2 / value 2 token(s), 40 steps:" in text
  text = "\n".join(_shift_lines(short + long))
  assert "| model | key/value 1/1 | key/value 2/2, 10 steps | key/value 2/2, 40 steps |" in text
  assert "| fixed M=4, shift 0 | - | 1.000 / 0.750 (n=1) | 1.000 / 0.750 (n=1) |" in text


def test_c5_without_matrices_leaves_the_judgment_based_claim():
  records, _ = _sweep(m2_rate=0.5, m4_rate=0.0)
  assert step_size.c5_claim(records, None) is None
  assert step_size.c5_claim(records, lambda name: None) is None
  by_id = {c.id: c for c in registry.decide(records, None)}
  assert "paired" not in by_id["C5"].reason and by_id["C5"].numbers


def _site(weights_KxS):
  weights = [list(map(float, row)) for row in weights_KxS]
  return SlotGainSite.from_json({
      "site": "block_0/attn/compressor", "layer": 0, "stream": "kv", "chunk_size": 4,
      "slots": 4, "overlap": False, "pooling": "gated", "num_chunks": 10.0,
      "bias_weight": None, "bias_gain": None, "bias_preferred_phase": None,
      "realised_weight": weights, "realised_gain": None, "preferred_phase": None,
      "preferred_phase_spread": None})


def _slot_records(with_init=True, seeds=3):
  rng = np.random.default_rng(1)
  late = np.array([1.0, 1.2, 1.4, 1.6])
  out = []
  for seed in range(seeds):
    trained = late * np.exp(rng.normal(0, 0.05, size=(4, 4)))  # 4 heads lean late
    r = _record(f"fixed_m4_seed{seed}", seed, 4, np.ones((Y, OFFSETS.size)),
                variant="fixed_m4")
    out.append(dataclasses.replace(
        r, slot_gain=(_site(trained / trained.sum(1, keepdims=True)),),
        slot_gain_init=(_site(np.full((4, 4), 0.25)),) if with_init else None))
  return out


def test_c6_late_preference_beats_init_and_permutation_in_every_seed():
  claim = slot_preference.c6_claim(_slot_records(), num_permutations=500)
  assert (claim.verdict, claim.seeds_agreeing) == ("REPRODUCED", "3/3")
  site = claim.numbers["fixed_m4"]["sites"]["block_0/attn/compressor"]
  assert site["shift"]["init"] == 0.0 and site["shift"]["mean"] > 0
  assert site["shift"]["pooled_p_value"] < 0.025  # alpha 0.05 / (2 statistics x 1 site)
  assert claim.numbers["fixed_m4"]["alpha_per_test"] == pytest.approx(0.025)
  text = "\n".join(claim_tables.slot_null_table(claim))
  assert "| fixed_m4 | block_0/attn/compressor | shift |" in text and "3/3" in text


def test_c6_without_init_gains_is_inconclusive_and_one_seed_is_its_own_pooled_test():
  claim = slot_preference.c6_claim(_slot_records(with_init=False), num_permutations=100)
  assert claim.verdict == "INCONCLUSIVE" and "initialised model" in claim.reason
  claim = slot_preference.c6_claim(_slot_records(seeds=1), num_permutations=100)
  assert claim.verdict == "INCONCLUSIVE"  # the current rules: one seed never decides
  claim = slot_preference.c6_claim(_slot_records(seeds=1), num_permutations=100,
                                   rules=claim_rules.get("1"))
  assert (claim.verdict, claim.seeds_agreeing) == ("REPRODUCED", "1/1")
  site = claim.numbers["fixed_m4"]["sites"]["block_0/attn/compressor"]
  assert site["shift"]["seeds_agreeing"] == "1/1"
  assert slot_preference.c6_claim([_record("m4", 0, 4, np.ones((Y, 16)))]) is None


def test_split_fields_label_phases_in_advance_and_round_trip_in_the_record():
  correct = _weak_phase(4, 2, 0.0)  # 2/2 needles at M=4: phases none, value cut, total, key cut
  r = _record("fixed_m4_kv2", 0, 4, correct)
  assert split_fields.wants_split_labels(r.setup)
  assert not split_fields.wants_split_labels(dataclasses.replace(r.setup, key_len=1,
                                                                 value_len=1))
  fields = split_fields.split_fields(r.setup, correct, OFFSETS, depth_name="far", seed=0,
                                     num_resamples=20)
  assert fields["kind_by_phase"] == {"0": "none", "1": "value_cut", "2": "total",
                                     "3": "key_cut"}
  labels = {k: (v["accuracy"], v["trials"]) for k, v in fields["by_label"].items()}
  assert labels == {"none": (1.0, 4 * Y), "partial": (1.0, 8 * Y), "total": (0.0, 4 * Y)}
  assert fields["mean_accuracy"] == 0.75 and fields["max_gap"] == 1.0
  record = dataclasses.replace(r, split_labels=fields, slot_gain_init=(_site(np.eye(4)),),
                               primary_depth=None)  # written only beside the depths
  data = json.loads(json.dumps(record.to_json()))
  assert VariantRecord.from_json(data) == record
  assert "split_labels" not in r.to_json() and "slot_gain_init" not in r.to_json()
  # The report reads the stored labels (no star) and, without them, the phase table (star).
  row = "| 1 | none, value_cut, total, key_cut | 1.000 | 1.000 | 0.000 | 1.000 | 1.000 | 0.750 |"
  assert f"| 4 {row}" in _split_text([record])
  assert f"| 4* {row}" in _split_text([r])  # same numbers


def test_shift_map_and_chunk_phase_shares():
  r = _record("fixed_m4", 0, 4, _weak_phase(4, 3, 0.0), key_len=1, value_len=1)
  shifted = _record("fixed_m4_shift3", 0, 4, np.ones((Y, 16)), key_len=2, value_len=2,
                    key_shift=True, key_shift_width=3)
  full_shift = [_record("full_shift", seed, 4, _weak_phase(4, 1, rate), attention="full",
                        key_shift=True, key_shift_width=2) for seed, rate in ((0, 0.5), (1, 1.0))]
  full_shift = [dataclasses.replace(f, setup=dataclasses.replace(f.setup, chunk_size=None))
                for f in full_shift]  # as stored: full attention has no chunk size
  text = "\n".join(_shift_lines([r, shifted, *full_shift]))
  assert "key/value 1/1, 10 steps | key/value 2/2, 10 steps | key/value 3/3 |" in text
  assert "| fixed M=4, shift 0 | 1.000 / 0.750 (n=1) | - | - |" in text
  assert "| fixed M=4, shift 3 | - | 0.000 / 1.000 (n=1) | - |" in text
  assert "| fixed M=4, shift 4 | - | - | - |" in text
  # full attention is the control row, after the compressed ones; seeds averaged (gaps 0.5, 0)
  assert text.rstrip().endswith("| full, shift 2 | - | 0.250 / 0.938 (n=2) | - |")
  # a shift trained only after step N is a row of its own, after the plain widths
  late = _record("fixed_m4_shift3_late", 0, 4, _weak_phase(4, 2, 0.0), key_len=2, value_len=2,
                 key_shift=True, key_shift_width=3, key_shift_frozen_steps=5)
  rows = [line for line in _shift_lines([shifted, late]) if line.startswith("| ")]
  assert rows[1:] == ["| fixed M=4, shift 0 | - | - | - |",
                      "| fixed M=4, shift 2 | - | - | - |",
                      "| fixed M=4, shift 3 | - | 0.000 / 1.000 (n=1) | - |",
                      "| fixed M=4, shift 4 | - | - | - |",
                      "| fixed M=4, shift 3 after step 5 | - | 1.000 / 0.750 (n=1) | - |"]
  # keys and queries shifted: a row of its own, after every key-only shift of its model
  both = _record("fixed_m4_qkshift3", 0, 4, _weak_phase(4, 1, 0.0), key_len=2, value_len=2,
                 key_shift=True, key_shift_width=3, query_shift=True)
  rows = [line for line in _shift_lines([late, both]) if line.startswith("| ")]
  assert rows[-2:] == ["| fixed M=4, shift 3 after step 5 | - | 1.000 / 0.750 (n=1) | - |",
                       "| fixed M=4, shift 3 (keys and queries) | - | 1.000 / 0.750 (n=1) | - |"]
  phases = np.tile(np.array([0, 0, 0, 1] * 4), (Y, 1))  # phase 1 in a quarter of the trials
  correct = np.ones((Y, 16))
  correct[:, 3::4] = 0
  dyn = dataclasses.replace(
      _record("dyn", 0, 4, correct, attention="dynamic", chunking="dynamic/router"),
      chunk_phase=stats.analyze(correct, OFFSETS, [4], phases=phases, num_resamples=20,
                                num_permutations=20).phase)
  load = {"dyn": {"needle_far": correctness.Matrix(correct, OFFSETS, phases)}}.get
  text = "\n".join(claim_tables.chunk_phase_table(summaries.chunk_phase_rows([dyn], load)))
  assert "0: 1.00 (75.0%), 1: 0.00 (25.0%)" in text
  assert "| dyn | 0..1 | 1 | 0.000 | 1.000 |" in text
  assert Interval(1.0, None, None).value == dyn.chunk_phase.gap.value


def test_phase_dependent_haystacks_count_where_the_period_lives():
  # haystack 0 is found only at phase 3 (span 1), haystack 1 misses half of phase 2 (span 0.5),
  # haystack 2 misses one offset of phase 1 (span 1/12 with 48 offsets), the rest are perfect
  offsets = np.arange(48)
  correct = np.ones((4, 48))
  correct[0, offsets % 4 != 3] = 0.0
  correct[1, np.flatnonzero(offsets % 4 == 2)[:6]] = 0.0
  correct[2, 1] = 0.0
  assert phase_dependent_needles(correct, offsets, 4)[0].size == 2
  # by offset mod 2: only the first
  assert phase_dependent_needles(correct, offsets, 2)[0].size == 1
  haystacks, accuracy = phase_dependent_needles(correct, offsets, 4)
  np.testing.assert_array_equal(haystacks, [0, 1])
  np.testing.assert_allclose(accuracy, [[0, 0, 0, 1], [1, 1, 0.5, 1]])
  # a phase no offset has is NaN, and does not count towards the span
  haystacks, accuracy = phase_dependent_needles(
      correct[:, offsets % 4 != 1], offsets[offsets % 4 != 1], 4)
  np.testing.assert_array_equal(haystacks, [0, 1])
  np.testing.assert_allclose(accuracy, [[0, np.nan, 0, 1], [1, np.nan, 0.5, 1]])
  # on the shift map's grid, per seed in seed order, '-' for an empty cell, '-' without matrices
  runs = [_record(f"fixed_m4_qk_seed{s}", s, 4, correct[:, :OFFSETS.size], key_len=2,
                  value_len=2, key_shift=True, key_shift_width=3, query_shift=True)
          for s in (1, 0)]
  store = {"fixed_m4_qk_seed0": {"needle_far": correctness.Matrix(correct, offsets)},
           "fixed_m4_qk_seed1": {"needle_far": correctness.Matrix(np.ones((4, 48)), offsets)}}
  rows = [line for line in claim_tables.phase_dependent_map(summaries.shift_grid(runs, store.get))
          if line.startswith("| fixed M=4, shift 3 (keys")]
  assert rows == ["| fixed M=4, shift 3 (keys and queries) | - | 2, 0 of 4 | - |"]
  rows = [line for line in claim_tables.phase_dependent_map(summaries.shift_grid(runs, {}.get))
          if line.startswith("| fixed M=4, shift 3 (keys")]
  assert rows == ["| fixed M=4, shift 3 (keys and queries) | - | - | - |"]
  assert claim_tables.phase_dependent_map(summaries.shift_grid(runs, None)) == []
