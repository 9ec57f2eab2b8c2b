"""Claims C1-C9: the seed rule, verdicts from synthetic records, JSON round trip."""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest

from chunkformer.evaluation import claims, stats, verdicts
from chunkformer.evaluation.records import Interval, PrefixAnalysis
from chunkformer.evaluation.variant_record import VariantRecord, VariantSetup

BASE = stats.analyze(np.ones((2, 12)), np.arange(12), [4], num_resamples=10,
                     num_permutations=10)


def _record(name, seed, *, attention="fixed", m=4, p=0.001, period=4, gap=0.5, far=0.8,
            **setup):
  phase = dataclasses.replace(BASE.phase, gap=Interval(gap, gap - 0.1, gap + 0.1), p_value=p)
  analysis = dataclasses.replace(
      BASE, phase=phase, detected_period=period, mean_accuracy=Interval(far, None, None),
      by_chunk_size=(dataclasses.replace(BASE.by_chunk_size[0], table=phase, p_value=p),))
  return VariantRecord(VariantSetup(name, attention, attention, chunk_size=m, seed=seed,
                                    **setup), analysis, "needle", 10, compression_ratio=None)


@pytest.mark.parametrize("per_seed, verdict, agreeing", [
    ({0: True, 1: True, 2: False}, claims.REPRODUCED, "2/3"),
    ({0: False, 1: False, 2: True}, claims.NOT_REPRODUCED, "2/3"),
    ({0: True, 1: False}, claims.INCONCLUSIVE, "1/2"),
    ({0: True, 1: None}, claims.REPRODUCED, "1/2"),
    ({0: None}, claims.INCONCLUSIVE, "0/1"),
    ({0: True}, claims.REPRODUCED, "1/1"),
])
def test_majority_of_seeds(per_seed, verdict, agreeing):
  assert claims.majority_of_seeds(per_seed)[:2] == (verdict, agreeing)


def test_claims_pool_seeds_and_never_read_not_tested():
  records = [_record("m4_s0", 0), _record("m4_s1", 1),
             _record("m4_s2", 2, p=0.3, period=None),  # seed 2 shows no period
             _record("m2_s0", 0, m=2, period=2, gap=0.2), _record("m2_s1", 1, m=2, period=2,
                                                                   gap=0.6),
             _record("full", 0, attention="full", m=None, p=0.6, period=None, gap=0.02,
                     far=0.99)]
  lines = verdicts.decide(records)
  assert any(line.startswith("NOT TESTED") for line in lines)  # the lines keep their form
  by_id = {c.id: c for c in verdicts.claims(records)}
  assert list(by_id) == [f"C{i}" for i in range(1, 10)]
  assert (by_id["C1"].verdict, by_id["C1"].seeds_agreeing) == ("REPRODUCED", "2/3")
  assert by_id["C1"].numbers["m4_s2"]["holds"] is False
  # C5 per seed: seed 0 holds (0.2 < 0.5, intervals separate), seed 1 fails (0.6 > 0.5).
  assert (by_id["C5"].verdict, by_id["C5"].seeds_agreeing) == ("INCONCLUSIVE", "1/2")
  assert "seeds disagree" in by_id["C5"].reason
  assert by_id["C2"].verdict == "REPRODUCED"
  for claim_id in ("C3", "C4", "C6", "C7", "C8", "C9"):
    assert by_id[claim_id].verdict == "INCONCLUSIVE" and by_id[claim_id].reason
    assert "NOT TESTED" not in by_id[claim_id].reason
  for claim in by_id.values():
    assert claims.Claim.from_json(json.loads(json.dumps(claim.to_json()))) == claim


def test_unlearned_model_leaves_the_claim_undecided_and_extra_claims_replace_it():
  records = [_record("m4", 0, far=0.1, p=0.3, period=None)]
  c1 = verdicts.claims(records)[0]
  assert c1.verdict == "INCONCLUSIVE" and "not learned" in c1.reason
  decided = claims.Claim("C6", claims.STATEMENTS["C6"], "REPRODUCED", "null test", {}, "3/3")
  assert verdicts.claims(records, extra={"C6": decided})[5] is decided
  with pytest.raises(ValueError, match="NOT TESTED"):
    claims.Claim("C1", "s", "NOT TESTED", "r", {}, "0/0")


def test_code_model_record_without_needle_sweep_round_trips_through_json():
  prefix = PrefixAnalysis(BASE.nested(), tuple(0.5 for _ in BASE.offsets),
                          code_accuracy_by_prefix=tuple(0.9 for _ in BASE.offsets))
  record = dataclasses.replace(_record("code_m4", 1, task="code"), primary_probe="prefix",
                               analysis=BASE, prefix_probe=prefix, heldout={"loss": 1.5},
                               images={"a": "plots/a.png"})
  data = json.loads(json.dumps(record.to_json()))
  assert "depths" not in data and data["primary_probe"] == "prefix"
  assert VariantRecord.from_json(data) == record
  assert verdicts.claims([record])[6].numbers["code_m4"]["holds"] is False  # C7: no period


def test_seeded_units_carry_their_variant_and_seed_through_the_record_json():
  from chunkformer.evaluation.sweep_config import unit_variant
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
