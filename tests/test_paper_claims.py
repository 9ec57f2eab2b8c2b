"""Claims C10-C16 (the paper's protocol) on constructed records whose verdicts are known by hand:
periodic at S, flat full attention, a mean that hides the weak phase, a specialised knockout
map, gates aligned with it, cycling with R^2 = 1 and a weak boundary phase; and the plan flags.
"""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest

from chunkformer.evaluation.claims import judging, plan_check
from chunkformer.evaluation.records import results_file
from chunkformer.evaluation.records.variant import VariantRecord, VariantSetup
from chunkformer.evaluation.stats import periodicity
from chunkformer.evaluation.stats.residue_accuracy import from_counts
from chunkformer.studies.paper.claims import mechanism_claims, paper_claims
from chunkformer.studies.paper.claims import paper_rows as pr

BASE = periodicity.analyze(np.ones((2, 12)), np.arange(12), [4], num_resamples=10,
                           num_permutations=10)
N = 64  # prompts per residue
PERMS = dict(seed=0, num_permutations=400)


def _curve(stride: int | None, high: float = 0.9, low: float = 0.1) -> np.ndarray:
  """Accuracy per residue mod 24: ``low`` at phase S - 1, ``high`` elsewhere; flat (with a
  little wobble) without a stride."""
  r = np.arange(24)
  if stride is None:  # sampling-sized wobble without a pattern
    return high + np.random.default_rng(7).normal(0.0, 0.01, 24)
  return np.where(r % stride == stride - 1, low, high)


def _lookup(curves: dict[str, np.ndarray], stride: int | None) -> dict:
  modes = {mode: dataclasses.asdict(from_counts(np.round(c * N).astype(int), [N] * 24, stride))
           for mode, c in curves.items()}
  return json.loads(json.dumps({"test": "lookup", "seq_len": 256, "modulus": 24,
                                "stride": stride, "prompts_per_residue": N,
                                "validation_loss": 1.5, "modes": modes, "settings": {}}))


def _unit(variant: str, seed: int, *, attention: str = "fixed", s: int | None = 8, w: int = 0,
          curve=None, in_sequence=None, probes=None, plan=None, **setup) -> VariantRecord:
  stride = s if attention == "fixed" else None
  curve = _curve(stride) if curve is None else curve
  found = {"lookup": _lookup({"prefix": curve,
                              "in_sequence": curve if in_sequence is None else in_sequence},
                             stride)}
  found.update(probes or {})
  return VariantRecord(
      VariantSetup(variant, attention, attention, chunk_size=stride, compress_window=w,
                   seed=seed, name=f"{variant}_seed{seed}", **setup),
      BASE, "needle", 100, None, probes=found, plan=plan)


def _seeds(variant: str, n: int = 2, **kw) -> list[VariantRecord]:
  return [_unit(variant, k, **kw) for k in range(n)]


def test_period_equals_s_for_every_stride_overlapping_or_not():
  records = [*_seeds("w4s4", s=4), *_seeds("w8s6", s=6, w=8), *_seeds("w8s8", s=8),
             *_seeds("w12s12", s=12)]
  claim = paper_claims.c10(records, **PERMS)
  assert claim.verdict == "REPRODUCED" and claim.seeds_agreeing == "8/8"
  assert claim.numbers["w12s12_seed0"]["detected_period"] == 12
  assert claim.numbers["w8s6 (seeds pooled)"]["holm_family"] == 4
  assert any(line.startswith("REPRODUCED: C10 period = S (w8s6_seed1, W=8, S=6")
             for line in claim.numbers["lines"])
  # A stride missing, or no overlapping row: the rows agree but the claim is not shown.
  fewer = paper_claims.c10(records[:6], **PERMS)
  assert fewer.verdict == "INCONCLUSIVE" and "stride(s) 12" in fewer.reason
  plain = paper_claims.c10([r for r in records if not r.name.startswith("w8s6")], **PERMS)
  assert "stride(s) 6" in plain.reason and "no REPRODUCED overlapping row" in plain.reason
  # One seed never decides: the rule needs two.
  one = paper_claims.c10(records[::2], **PERMS)
  assert one.verdict == "INCONCLUSIVE" and "only 1 seed(s) tested" in one.reason


def test_a_row_with_the_wrong_period_or_a_flat_curve_fails_c10():
  wrong = _seeds("w8s8", s=8, curve=_curve(4))  # its weak phase repeats every 4 residues
  claim = paper_claims.c10(wrong, **PERMS)
  assert claim.verdict == "NOT REPRODUCED"
  assert claim.numbers["w8s8_seed0"]["detected_period"] == 4
  barely = _seeds("w8s8", s=8, curve=np.full(24, 0.05))  # flat below the lookup gate
  assert paper_claims.c10(barely, **PERMS).numbers["w8s8_seed0"]["holds"] is None


def test_full_attention_flat_in_both_paddings_and_not_when_periodic():
  flat = _seeds("full_1kv", 3, attention="full")
  claim = paper_claims.c11(flat, **PERMS)
  assert (claim.verdict, claim.seeds_agreeing) == ("REPRODUCED", "3/3")
  assert claim.numbers["full_1kv (seeds pooled)"]["holm_family"] == 2
  # Periodic in the in-sequence padding only: not flat.
  bumpy = _seeds("full_1kv", 2, attention="full", in_sequence=_curve(8, 0.9, 0.5))
  assert paper_claims.c11(bumpy, **PERMS).verdict == "NOT REPRODUCED"
  # A gap beyond the 6-point bound without any period (one low residue): not flat either.
  dip = _curve(None)
  dip[5] = 0.6
  assert paper_claims.c11(_seeds("full_1kv", 2, attention="full", curve=dip),
                          **PERMS).verdict == "NOT REPRODUCED"
  assert paper_claims.c11([], **PERMS).reason.startswith(pr.NO_DATA)


def test_no_rope_and_uniform_averaging_stay_periodic_each_kind_needed():
  nope = _seeds("w8s8_nope", rope=False)
  uniform = _seeds("w8s8_uniform", pooling="mean")
  claim = paper_claims.c12(nope + uniform, **PERMS)
  assert claim.verdict == "REPRODUCED" and claim.numbers["units"] == [
      "w8s8_nope_seed0", "w8s8_nope_seed1", "w8s8_uniform_seed0", "w8s8_uniform_seed1"]
  half = paper_claims.c12(nope, **PERMS)
  assert half.verdict == "INCONCLUSIVE" and "uniform averaging" in half.reason


def test_mean_hides_the_weak_phase_of_a_row_near_full_in_mean():
  full = _seeds("full_1kv", 3, attention="full")  # mean 0.90, worst 0.88
  near = _curve(8, 0.98, 0.34)  # mean 0.9, worst 0.34
  rows = _seeds("w8s8", curve=near) + _seeds("w4s4", s=4, curve=_curve(4, 0.9, 0.1))
  claim = paper_claims.c13(full + rows)
  assert claim.verdict == "REPRODUCED" and "reproduced by w8s8 (1 of 2 rows)" in claim.reason
  assert claim.numbers["w8s8 (seeds pooled)"]["mean_difference"] == pytest.approx(
      0.0, abs=0.02)
  assert claim.numbers["w4s4_seed0"]["holds"] is False  # mean 0.7: 20 points below full
  assert paper_claims.c13(full + rows[2:]).verdict == "NOT REPRODUCED"
  assert paper_claims.c13(rows).verdict == "INCONCLUSIVE"  # no full reference


def test_mean_hides_pairs_each_row_with_the_full_row_of_its_kv_heads_under_rules_3():
  # full 1 KV at 0.5 in mean, full 8 KV at 0.9: the 8-KV row is near the 8-KV control only
  full1 = _seeds("full_1kv", 2, attention="full", curve=_curve(None, 0.5))
  full8 = _seeds("full_8kv", 2, attention="full", curve=_curve(None, 0.9), num_kv_heads=8)
  w8s8_8kv = _seeds("w8s8_8kv", curve=_curve(8, 0.98, 0.34), num_kv_heads=8)
  w8s8_2kv = _seeds("w8s8_2kv", curve=_curve(8, 0.98, 0.34))  # no full 2 KV row
  records = full1 + full8 + w8s8_8kv + w8s8_2kv
  paired = paper_claims.c13(records, same_kv_heads=True)
  assert paired.verdict == "REPRODUCED" and "reproduced by w8s8_8kv" in paired.reason
  assert paired.numbers["w8s8_8kv_seed0"]["reference"] == "full_8kv"
  assert "w8s8_2kv: no full-attention row with 2 KV heads" in paired.reason
  # one reference for all (rules 1-2): the first full row with the most seeds, full_1kv
  single = paper_claims.c13(records)
  assert single.verdict == "NOT REPRODUCED" and "reference full_1kv" in single.reason
  # the KV heads of a record written before the field: read from the name
  assert paper_claims.kv_heads_of(full1[0]) == 1 and paper_claims.kv_heads_of(
      _unit("w8s4_dsv4_kernel", 0)) is None


def _knockout(clean, heads) -> dict:
  return {"head_knockout": {"modulus": 24, "padding": "prefix", "prompts_per_residue": 576,
                            "clean": list(clean), "heads": [
                                {"layer": layer, "kv_head": 0, "accuracy": list(acc),
                                 "change": list(np.asarray(acc) - clean)}
                                for layer, acc in enumerate(heads)]}}


def _specialised_map(phase: int, stride: int = 8) -> dict:
  clean = np.full(24, 0.8)
  hit = np.where(np.arange(24) % stride == phase, 0.2, 0.8)  # loses 60 points at one phase
  needed = clean * 0.5  # a head every phase needs: no phase stands out
  return _knockout(clean, [hit, needed])


def test_knockout_specialisation_in_w_equals_s_rows_not_in_full_attention():
  compressed = _seeds("w8s8", probes=_specialised_map(2))
  full = _seeds("full_1kv", attention="full", probes=_knockout(np.full(24, 0.9),
                                                              [np.full(24, 0.5)]))
  claim = mechanism_claims.c14(compressed + full)
  assert claim.verdict == "REPRODUCED", claim.reason
  heads = claim.numbers["W = S rows"]["w8s8_seed0"]["heads"]
  assert heads["L0H0"]["effect"] == pytest.approx(0.6)
  assert heads["L1H0"]["effect"] == pytest.approx(0.0)  # needed everywhere: not specialised
  # Full attention with a specialised head fails the claim's second half.
  odd = _seeds("full_1kv", attention="full", probes=_specialised_map(5))
  assert mechanism_claims.c14(compressed + odd).verdict == "NOT REPRODUCED"
  only = mechanism_claims.c14(compressed)
  assert only.verdict == "INCONCLUSIVE" and "full-attention rows: no data" in only.reason


def _gates(peaks: dict[tuple[int, str], int], static: float = 1.5, window: int = 8) -> dict:
  gates = []
  for (layer, stream), peak in peaks.items():
    alpha = np.full(window, 0.02)
    alpha[peak] = 1 - 0.02 * (window - 1)
    gates.append({"layer": layer, "stream": stream, "head": 0, "window": window,
                  "windows": 10, "static": static, "per_window": static,
                  "mean_alpha": alpha.tolist()})
  return {"gate_concentration": {"rows": 4, "step": 10, "gates": gates}}


def test_concentrated_gates_line_up_with_their_heads_knockout_phase():
  # Layer 0's head loses at phase 2: its key gate peaks at offset 2, its value gate at 3.
  aligned = {**_specialised_map(2), **_gates({(0, "k"): 2, (0, "v"): 3})}
  claim = mechanism_claims.c15(_seeds("w8s8", probes=aligned))
  assert claim.verdict == "REPRODUCED", claim.reason
  assert claim.numbers["w8s8_seed0"]["aligned"] == 2  # p = (1/8)^2
  off = {**_specialised_map(2), **_gates({(0, "k"): 5, (0, "v"): 6})}
  assert mechanism_claims.c15(_seeds("w8s8", probes=off)).verdict == "NOT REPRODUCED"
  spread = {**_specialised_map(2), **_gates({(0, "k"): 2}, static=6.0)}  # not concentrated
  assert mechanism_claims.c15(_seeds("w8s8", probes=spread)).verdict == "INCONCLUSIVE"
  # One aligned gate per seed: p = 1/8 could never pass, so each seed is undecided; pooled
  # over 3 seeds (p = 1/512) it holds, but the rule needs two seeds.
  one = mechanism_claims.c15(_seeds("w8s8", 3, probes={**_specialised_map(2),
                                                       **_gates({(0, "k"): 2})}))
  assert one.numbers["w8s8_seed0"]["holds"] is None and one.verdict == "INCONCLUSIVE"
  assert one.numbers["w8s8 (seeds pooled)"]["holds"] is True


def _cycling(base: np.ndarray, deltas=(1, -1, 2, -2), boundary_moves: bool = False) -> dict:
  """Accuracy by phase under each cycle: the within-window phases move by delta (R^2 = 1);
  the boundary phase stays (or moves too)."""
  s = base.size
  accuracy = {"0": base.tolist()}
  for d in deltas:
    moved = base.copy()
    for r in range(s - 1):
      source = (r - d) % s
      moved[r] = base[source] if source != s - 1 else base[r]
    if boundary_moves:
      moved[s - 1], moved[(s - 1 + d) % s] = moved[(s - 1 + d) % s], moved[s - 1]
    accuracy[str(d)] = moved.tolist()
  return {"gate_cycling": {"stride": s, "deltas": list(deltas), "accuracy": accuracy,
                           "r_squared": None, "boundary": {}}}


def test_cycling_with_r2_one_and_a_weak_boundary_holds_and_a_moving_boundary_fails():
  base = np.array([0.9, 0.5, 0.8, 0.7, 0.6, 0.85, 0.75, 0.1])
  good = mechanism_claims.c16(_seeds("w8s8", probes=_cycling(base)))
  assert good.verdict == "REPRODUCED", good.reason
  assert good.numbers["w8s8_seed0"]["r_squared"] == pytest.approx(1.0)
  moving = mechanism_claims.c16(_seeds("w8s8", probes=_cycling(base, boundary_moves=True)))
  assert moving.verdict == "NOT REPRODUCED"
  assert moving.numbers["w8s8_seed1"]["boundary_weakest"] is False
  # A plan's cure and size rows are judged by C17-C21 and the size trend, not by C16, even
  # with a gate_cycling record (results/paper_plan5/PLAN.md, section 4).
  others = [*_seeds("cure_random_phase", probes=_cycling(base, boundary_moves=True)),
            *_seeds("size_large_w8s8", probes=_cycling(base, boundary_moves=True))]
  mixed = mechanism_claims.c16([*_seeds("w8s8", probes=_cycling(base)), *others])
  assert mixed.verdict == "REPRODUCED" and mixed.seeds_agreeing == "2/2"
  assert not any(name.startswith(("cure_", "size_")) for name in mixed.numbers)
  assert mechanism_claims.c16(others).verdict == "INCONCLUSIVE"


def test_every_paper_claim_without_rows_is_inconclusive_no_data():
  records = [_unit("w8s8", 0, probes=None)]
  records = [dataclasses.replace(records[0], probes=None)]
  judged = judging.judge(records, None, num_resamples=10, num_permutations=10)
  for claim in judged.claims[9:21]:  # C10-C21 (E1-E3 state their own missing data)
    assert claim.verdict == "INCONCLUSIVE" and claim.reason.startswith(pr.NO_DATA), claim.id


def test_units_trained_under_another_plan_or_none_are_flagged_in_their_lines():
  current = {"sha256": "a" * 64, "commit": "c0ffee", "committed": True}
  other = {"sha256": "b" * 64, "commit": "deadbeef", "committed": True}
  records = [_unit("w8s8", 0, plan=(current,)), _unit("w8s8", 1, plan=(other,)),
             _unit("w8s8", 2), _unit("w8s8", 3, plan=(dict(current, committed=False),))]
  flags = plan_check.flags(records, current)
  assert set(flags) == {"w8s8_seed1", "w8s8_seed2", "w8s8_seed3"}
  assert flags["w8s8_seed2"] == plan_check.NO_PLAN and "bbbbbbbbbbbb" in flags["w8s8_seed1"]
  assert plan_check.flags(records, None) == {}
  judged = judging.judge(records, None, num_resamples=10, num_permutations=10, plan=current,
                         rules="1")  # the plan's own lines: version 1 decides C10 by them
  lines = [line for line in judged.verdicts if "C10 period" in line]
  assert "PLAN" not in next(line for line in lines if "(w8s8_seed0," in line)
  assert "PLAN: w8s8_seed1: trained under another plan" in next(
      line for line in lines if "(w8s8_seed1," in line)
  assert "w8s8_seed2: trained with no plan" in next(line for line in lines
                                                    if "(w8s8_seed2," in line)
  by_id = {c.id: c for c in judged.claims}
  assert "PLAN: w8s8_seed1" in by_id["C10"].reason and "PLAN: w8s8_seed1" in by_id["C1"].reason
  # The plan list travels through results.json.
  again = VariantRecord.from_json(json.loads(json.dumps(records[1].to_json())))
  assert again == records[1]
  assert results_file.SCHEMA_VERSION == 3


def test_the_residue_g_test_is_scipys_log_likelihood_contingency_test():
  from scipy import stats as scipy_stats

  from chunkformer.evaluation.stats import residue_period
  k, n = np.array([10, 40, 12, 38]), np.array([50, 50, 50, 50])
  table = np.array([[10 + 12, 40 + 38], [100 - 22, 100 - 78]])
  expected = scipy_stats.chi2_contingency(table, correction=False, lambda_="log-likelihood")
  assert residue_period.g_statistic(k, n, np.arange(4) % 2) == pytest.approx(expected[0])
  assert residue_period.phase_p_value(k, n, 2) == pytest.approx(expected[1])
  # Period 2 explains these residues (no lack of fit); a flat curve has no period.
  assert residue_period.lack_of_fit_p_value(k, n, 2) > 0.5
  assert residue_period.detect_period(k, n, [2, 4])[0] == 2
  assert residue_period.detect_period([25] * 4, n, [2, 4]) == (None, None)
