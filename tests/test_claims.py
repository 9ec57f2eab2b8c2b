"""Claims C1-C9: the seed rule, verdicts from synthetic records, JSON round trip."""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest

from chunkformer.evaluation.claims import registry
from chunkformer.evaluation.claims import rules as claim_rules
from chunkformer.evaluation.records.variant import VariantRecord, VariantSetup
from chunkformer.evaluation.stats import periodicity as stats
from chunkformer.evaluation.stats.analysis_types import Interval, PrefixAnalysis
from chunkformer.studies.needles.claims import combine as claims
from chunkformer.studies.needles.claims import entries, judgments

BASE = stats.analyze(np.ones((2, 12)), np.arange(12), [4], num_resamples=10,
                     num_permutations=10)


def _record(name, seed, *, attention="fixed", m=4, p=0.001, period=4, gap=0.5, far=0.8,
            variant=None, **setup):
  phase = dataclasses.replace(BASE.phase, gap=Interval(gap, gap - 0.1, gap + 0.1), p_value=p)
  analysis = dataclasses.replace(
      BASE, phase=phase, detected_period=period, mean_accuracy=Interval(far, None, None),
      by_chunk_size=(dataclasses.replace(BASE.by_chunk_size[0], table=phase, p_value=p),))
  return VariantRecord(VariantSetup(variant or name, attention, attention, chunk_size=m,
                                    seed=seed, name=name, **setup), analysis, "needle", 10,
                       compression_ratio=None)


def _pooled(variant, seeds, **kw):
  return _record(f"{variant} ({seeds} seeds pooled)", 0, variant=variant, **kw)


def test_claims_apply_the_seed_rule_per_variant_and_never_read_not_tested():
  records = [_record("m4_s0", 0, variant="m4"), _record("m4_s1", 1, variant="m4"),
             _record("m4_s2", 2, variant="m4", p=0.3, period=None),  # seed 2: no period
             _record("m2_s0", 0, m=2, period=2, gap=0.2, variant="m2"),
             _record("m2_s1", 1, m=2, period=2, gap=0.6, variant="m2"),
             _record("full", 0, attention="full", m=None, p=0.6, period=None, gap=0.02,
                     far=0.99)]
  pooled = {"m4": _pooled("m4", 3), "m2": _pooled("m2", 2, m=2, period=2, gap=0.4),
            "full": records[-1]}
  lines = judgments.decide(records, pooled)
  assert not any("NOT TESTED" in line for line in lines)
  assert any(line.startswith("INCONCLUSIVE (no data): still periodic with RoPE off")
             for line in lines)
  assert any("m4 (3 seeds pooled)" in line for line in lines)  # the pooled tests' lines
  by_id = {c.id: c for c in registry.decide(records, pooled=pooled)}
  assert list(by_id) == ([f"C{i}" for i in range(1, 22)]
                                   + ["E1", "E2", "E3", "E4", "E5", "E6", "P1", "P2"])
  # C1: m4 holds in 2/3 seeds and pooled; m2 in 2/2 and pooled: 4 of 5 seeds agree.
  assert (by_id["C1"].verdict, by_id["C1"].seeds_agreeing) == ("REPRODUCED", "4/5")
  assert by_id["C1"].numbers["m4_s2"]["holds"] is False
  assert by_id["C1"].numbers["m4 (3 seeds pooled)"]["holds"] is True
  assert by_id["C1"].numbers["seed_rule"]["m4"]["seeds_agreeing"] == "2/3"
  # C5 per seed pair: seed 0 holds (0.2 < 0.5), seed 1 fails (0.6 > 0.5); pooled 0.4 < 0.5.
  assert (by_id["C5"].verdict, by_id["C5"].seeds_agreeing) == ("INCONCLUSIVE", "1/2")
  assert "the seed-pooled test holds but only 1/2 seeds" in by_id["C5"].reason
  # C2 rests on one seed of full attention: the one seed rule (claim rules version 2) never
  # lets one seed decide; version 1 let it.
  assert by_id["C2"].verdict == "INCONCLUSIVE"
  assert "only 1 seed(s) tested; the rule needs 2" in by_id["C2"].reason
  older = {c.id: c for c in registry.decide(records, pooled=pooled,
                                            rules=claim_rules.get("1"))}
  assert (older["C2"].verdict, older["C2"].seeds_agreeing) == ("REPRODUCED", "1/1")
  assert older["C1"].verdict == by_id["C1"].verdict
  for claim_id in ("C3", "C4", "C6", "C7", "C8", "C9", "E1", "E2", "E3", "E4", "E5", "E6", "P1",
                   "P2"):
    assert by_id[claim_id].verdict == "INCONCLUSIVE" and by_id[claim_id].reason
    assert "NOT TESTED" not in by_id[claim_id].reason
  for claim in by_id.values():
    assert claims.Claim.from_json(json.loads(json.dumps(claim.to_json()))) == claim


def test_pooled_test_that_fails_or_is_missing_keeps_the_claim_inconclusive():
  records = [_record(f"m4_s{k}", k, variant="m4") for k in range(3)]
  failing = {"m4": _pooled("m4", 3, p=0.3, period=None)}
  c1 = registry.decide(records, pooled=failing)[0]
  assert c1.verdict == "INCONCLUSIVE"
  assert "3/3 seeds hold but the seed-pooled test does not" in c1.reason
  c1 = registry.decide(records)[0]  # several seeds, no pooled record: no pooled test
  assert c1.verdict == "INCONCLUSIVE" and "no seed-pooled test" in c1.reason
  # Failing in every seed and pooled: NOT REPRODUCED, the failing seeds counted as agreeing.
  fails = [_record(f"m4_s{k}", k, variant="m4", p=0.3, period=None) for k in range(3)]
  c1 = registry.decide(fails, pooled=failing)[0]
  assert (c1.verdict, c1.seeds_agreeing) == ("NOT REPRODUCED", "3/3")


def _one_seed_decides(records, **kwargs):
  """The claims under claim rules version 1, where a variant's one seed decides it: the
  single-seed records below test what a judgment reads, not how many seeds must agree."""
  return registry.decide(records, rules=claim_rules.get("1"), **kwargs)


def test_variants_that_disagree_leave_the_claim_inconclusive_and_name_them():
  records = [_record("m4", 0), _record("m8", 0, m=8, p=0.3, period=None)]
  c1 = _one_seed_decides(records)[0]  # one seed each: each variant is its own pooled test
  assert c1.verdict == "INCONCLUSIVE"
  assert "the variants disagree (m4: REPRODUCED, m8: NOT REPRODUCED)" in c1.reason
  # No verdict to agree with: the count is the seeds in which the claim holds (m8's failing
  # seed agrees with m8's own verdict but not with the claim).
  assert c1.seeds_agreeing == "1/2"
  # An undecided variant (task not learned) does not block the others' common verdict.
  records = [_record("m4", 0), _record("m8", 0, m=8, p=0.3, period=None, far=0.1)]
  c1 = _one_seed_decides(records)[0]
  assert c1.verdict == "REPRODUCED" and "m8: INCONCLUSIVE" in c1.reason


def test_unlearned_model_leaves_the_claim_undecided_and_c6_without_slot_gains_is_open():
  records = [_record("m4", 0, far=0.1, p=0.3, period=None)]
  c1, c6 = _one_seed_decides(records)[0], _one_seed_decides(records)[5]
  assert c1.verdict == "INCONCLUSIVE" and "not learned" in c1.reason
  assert c6.verdict == "INCONCLUSIVE" and "no realised slot gains" in c6.reason
  with pytest.raises(ValueError, match="NOT TESTED"):
    claims.Claim("C1", "s", "NOT TESTED", "r", {}, "0/0")


@pytest.mark.parametrize("task", ["code", "corpus"])  # synthetic code, or a code corpus LM
def test_code_model_record_without_needle_sweep_round_trips_through_json(task):
  prefix = PrefixAnalysis(BASE.nested(), tuple(0.5 for _ in BASE.offsets),
                          code_accuracy_by_prefix=tuple(0.9 for _ in BASE.offsets))
  record = dataclasses.replace(_record("code_m4", 1, task=task), primary_probe="prefix",
                               analysis=BASE, prefix_probe=prefix, heldout={"loss": 1.5},
                               images={"a": "plots/a.png"})
  data = json.loads(json.dumps(record.to_json()))
  assert "depths" not in data and data["primary_probe"] == "prefix"
  assert VariantRecord.from_json(data) == record
  by_id = {c.id: c for c in _one_seed_decides([record])}
  assert by_id["C7"].numbers["code_m4"]["holds"] is False  # C7: no period
  assert by_id["C1"].verdict == "INCONCLUSIVE" and not by_id["C1"].numbers  # not a C1 model
  unlearned = dataclasses.replace(record, analysis=dataclasses.replace(
      BASE, detected_period=None, mean_accuracy=Interval(0.0, None, None)))
  c7 = {c.id: c for c in _one_seed_decides([unlearned])}["C7"]
  assert c7.verdict == "INCONCLUSIVE" and "not learned" in c7.reason


def test_seeded_units_carry_their_variant_and_seed_through_the_record_json():
  from chunkformer.evaluation.sweep.config import unit_variant
  from configs.sweeps import seeded_units, variant
  units = seeded_units({"fixed_m4": (variant("configs/kv_chunk.py"), 3),
                        "full": (variant("configs/kv_full.py"), 2),
                        "fixed_m6": (variant("configs/kv_chunk.py"), 1)})
  assert list(units) == ["fixed_m4_seed0", "full_seed0", "fixed_m4_seed1", "full_seed1",
                         "fixed_m4_seed2", "fixed_m6_seed0"]
  assert [units[u].overrides.seed for u in units] == [0, 0, 1, 1, 2, 0]
  assert unit_variant("fixed_m4_shift_seed1") == "fixed_m4_shift"
  assert unit_variant("full") == "full"
  record = dataclasses.replace(_record("fixed_m4", 2), setup=dataclasses.replace(
      _record("fixed_m4", 2).setup, name="fixed_m4_seed2"))
  data = json.loads(json.dumps(record.to_json()))
  assert (data["name"], data["variant"], data["seed"]) == ("fixed_m4_seed2", "fixed_m4", 2)
  assert VariantRecord.from_json(data) == record
  assert record.name == "fixed_m4_seed2"


def test_accuracy_gates_read_the_held_out_far_accuracy_where_recorded():
  full = _record("full", 0, attention="full", m=None, p=0.6, period=None, gap=0.02, far=0.90)
  passes = dataclasses.replace(full, heldout={"far_accuracy": 0.97})
  misses = dataclasses.replace(_record("full", 0, attention="full", m=None, p=0.6, period=None,
                                       gap=0.02, far=0.99), heldout={"far_accuracy": 0.80})
  assert _one_seed_decides([full])[1].verdict == "INCONCLUSIVE"  # no held-out: the sweep's 0.90
  assert _one_seed_decides([passes])[1].verdict == "REPRODUCED"
  c2 = _one_seed_decides([misses])[1]
  assert c2.verdict == "INCONCLUSIVE"
  assert "held-out far accuracy 0.800 is below the 0.95 gate" in c2.reason
  assert c2.numbers["full"]["gate_accuracy"] == 0.80
  # The 50% "task learned" gate of a fixed model too.
  unlearned = dataclasses.replace(_record("m4", 0, far=0.9), heldout={"far_accuracy": 0.2})
  assert _one_seed_decides([unlearned])[0].numbers["m4"]["holds"] is True  # period shown anyway
  flat = dataclasses.replace(_record("m4", 0, far=0.9, p=0.4, period=None),
                             heldout={"far_accuracy": 0.2})
  assert _one_seed_decides([flat])[0].numbers["m4"]["holds"] is None  # no period, not learned


def test_a_cure_has_no_period_only_by_the_controls_standard():
  # One standard for C2 and the cures: p > 0.05 at M AND no detected period. The plain
  # baseline (gap 0.5) is periodic; each cure has a far smaller gap.
  base = _record("m4", 0)
  cures = {"flat": dict(p=0.4, period=None), "weak_p": dict(p=0.03, period=None),
           "other_period": dict(p=0.4, period=3)}
  holds = {}
  for name, kw in cures.items():  # one cure at a time: a family of one test (no Holm effect)
    records = [base, _record(name, 0, gap=0.05, key_shift=True, **kw)]
    holds[name] = _one_seed_decides(records)[8].numbers[name]["holds"]
  assert holds == {"flat": True, "weak_p": False, "other_period": False}
  line = judgments.judge([base, _record("other_period", 0, gap=0.05, key_shift=True,
                                        **cures["other_period"])])[-1].line
  assert "detected period 3" in line and line.endswith("reduces the gap, still periodic")
  # The three as one claim: Holm over its 3 tests lifts 0.03 to 0.09, no longer periodic.
  records = [base] + [_record(n, 0, gap=0.05, key_shift=True, **kw) for n, kw in cures.items()]
  c9 = _one_seed_decides(records)[8]
  assert c9.numbers["weak_p"]["p_value_holm"] == pytest.approx(0.09)
  assert c9.numbers["weak_p"]["holds"] is True


def test_holm_within_a_claim_adjusts_the_tests_its_verdict_reads():
  # Two plain variants, one seed each, p = 0.006 at M: alone each passes p < 0.01; as the two
  # tests of C1, Holm gives both 2 x 0.006 = 0.012 and neither passes.
  m4, m8 = _record("m4", 0, p=0.006), _record("m8", 0, m=8, period=8, p=0.006)
  assert _one_seed_decides([m4])[0].verdict == "REPRODUCED"
  c1 = _one_seed_decides([m4, m8])[0]
  assert c1.verdict == "NOT REPRODUCED"
  assert c1.numbers["m4"]["p_value_holm"] == pytest.approx(0.012)
  assert c1.numbers["m4"]["holm_family"] == 2 and c1.numbers["m4"]["p_value"] == 0.006
  needles = entries.of(registry.evidence([m4, m8], None))
  lines = judgments.verdict_lines(needles.judgments, needles.pooled_judgments)
  assert "p = 0.006 (Holm over 2 tests of the claim: 0.012) at M" in lines[0]


def test_ablation_on_one_seed_says_so_in_its_verdict_line():
  one = [_record("norope", 0, rope=False)]
  two = [_record("norope_s0", 0, rope=False, variant="norope"),
         _record("norope_s1", 1, rope=False, variant="norope")]
  assert judgments.decide(one)[-1 - 3].startswith("REPRODUCED on one seed: still periodic")
  c3 = _one_seed_decides(one)[2]
  assert c3.verdict == "REPRODUCED" and c3.numbers["norope"]["one_seed"] is True
  now = registry.decide(one)[2]  # the current rules: one seed never decides
  assert now.verdict == "INCONCLUSIVE" and "the rule needs 2" in now.reason
  assert not any("one seed" in line for line in judgments.decide(two))
