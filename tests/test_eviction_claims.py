"""Claims E1-E3 on constructed eviction records: a grid period known by hand, flat content
chunks, a paired comparison in either direction, the gates, and no data."""

from __future__ import annotations

import numpy as np
import pytest

from chunkformer.evaluation.claims import registry
from chunkformer.evaluation.records import correctness
from chunkformer.evaluation.stats.seed_rule import INCONCLUSIVE, NOT_REPRODUCED, REPRODUCED
from chunkformer.studies.eviction.claims import eviction_claims as claims
from chunkformer.studies.eviction.claims import eviction_data
from chunkformer.studies.eviction.stats.sign_flip import paired_rows, sign_flip_test
from tests import policy_sweeps

Y, J = 8, 24  # haystacks, offsets (6 periods of 4)
OFFSETS = np.arange(1, J + 1)  # absolute positions: offset 1 has phase 1 mod 4
GRID = dict(policy="chunkkv", budget=16, chunk=4, window=4)
CUT = dict(policy="chunkkv_cut", budget=16, chunk=4, window=4)
CONTENT = dict(policy="content_chunkkv", budget=16, window=4, delimiters=[3], min_chunk=3,
               max_chunk=8)
SNAP = dict(policy="snapkv", budget=16, window=4)
STREAM = dict(policy="streaming_llm", budget=16, sinks=4)
evidence = policy_sweeps.evidence  # the claims' evidence over constructed units


def blind_phase(phase: int, size: int = 4) -> np.ndarray:
  """Every haystack misses the needle exactly at offset mod ``size`` == ``phase``."""
  return np.broadcast_to((OFFSETS % size != phase).astype(float), (Y, J)).copy()


def scattered() -> np.ndarray:
  """One miss per haystack at offset indices that follow no period (checked: no detected
  period, phase-test p 0.94 / 0.83 / 0.53 at L = 4 / 8 / 10)."""
  m = np.ones((Y, J))
  m[np.arange(Y), [2, 3, 9, 14, 16, 17, 22, 23]] = 0
  return m


def unit(seed: int, matrices: dict[str, np.ndarray], held: float = 0.99, budget: int = 16,
         kept: dict[str, int] | None = None) -> policy_sweeps.Unit:
  """A full-attention unit whose eviction_needles probe gave ``matrices`` (name -> its
  policy's far matrix, name one of the specs above); ``kept``: name -> its budget in tokens
  where it is not ``budget`` (whole chunks round it down)."""
  specs = dict(grid=GRID, cut=CUT, content=CONTENT, snap=SNAP, stream=STREAM)
  probe, stored = {}, {}
  for name, matrix in matrices.items():
    label = f"{name}-b{budget}"
    key = f"{label}_far"
    tokens = (kept or {}).get(name, budget)
    probe[label] = {"policy": dict(specs[name], budget=budget), "budget_tokens": [tokens],
                    "depths": {"far": {"accuracy": float(matrix.mean()), "matrix": key}}}
    stored[f"eviction_needles_{key}"] = correctness.Matrix(matrix, OFFSETS[:matrix.shape[1]])
  return policy_sweeps.unit(seed, "eviction_needles", probe, stored, held=held)


def test_a_blind_phase_on_the_grid_is_a_period_of_l_and_delimiter_chunks_remove_it():
  units = [unit(s, {"grid": blind_phase(s % 4), "content": scattered()}) for s in range(3)]
  found = evidence(units)
  # by hand: phase s % 4 misses in every haystack, the others never: gap 1 at L = 4
  group = policy_sweeps.assert_period_of_four(claims.e1_claim(found), "full/grid-b16/far")
  assert group["pooled"]["holm_family"] == 1
  e2 = claims.e2_claim(found)
  assert (e2.verdict, e2.seeds_agreeing) == (REPRODUCED, "3/3")
  seed0 = e2.numbers["full/content-b16/far"]["seeds"][0]
  assert seed0["periodic_baselines"] == [4] and seed0["baseline_gap"] == {"4": 1.0}
  assert seed0["detected_period"] is None and seed0["p_judged"]["4"] > 0.05


def test_a_flat_grid_fails_e1_where_eviction_bites_and_is_undecided_at_the_ceiling():
  rng = np.random.default_rng(0)
  flat = [(rng.random((Y, J)) < 0.7).astype(float) for _ in range(3)]
  e1 = claims.e1_claim(evidence([unit(s, {"grid": flat[s]}) for s in range(3)]))
  assert (e1.verdict, e1.seeds_agreeing) == (NOT_REPRODUCED, "3/3")
  ceiling = claims.e1_claim(evidence([unit(s, {"grid": np.ones((Y, J))}) for s in range(3)]))
  assert ceiling.verdict == INCONCLUSIVE and "outside [0.02, 0.98]" in ceiling.reason
  short = claims.e1_claim(evidence([unit(s, {"grid": flat[s][:, :11]}) for s in range(2)]))
  assert short.verdict == INCONCLUSIVE and "11 offsets hold fewer than 3 periods of 4" in \
      short.reason
  assert ceiling.verdict == INCONCLUSIVE and "outside [0.02, 0.98]" in ceiling.reason
  # content chunks with the same blind phase as the grid are still periodic: E2 fails
  same = [unit(s, {"grid": blind_phase(1), "content": blind_phase(1)}) for s in range(3)]
  assert claims.e2_claim(evidence(same)).verdict == NOT_REPRODUCED
  # a grid without a period leaves nothing to remove: E2 undecided
  nothing = [unit(s, {"grid": flat[s], "content": scattered()}) for s in range(3)]
  e2 = claims.e2_claim(evidence(nothing))
  assert e2.verdict == INCONCLUSIVE and "no periodic fixed-block baseline" in e2.reason


def test_snapkv_against_streaming_llm_is_a_paired_test_over_haystacks_in_either_direction():
  rng = np.random.default_rng(1)
  half = [(rng.random((Y, J)) < 0.5).astype(float) for _ in range(3)]
  ahead = claims.e3_claim(evidence([unit(s, {"snap": np.ones((Y, J)), "stream": half[s]})
                                    for s in range(3)]))
  assert (ahead.verdict, ahead.seeds_agreeing) == (REPRODUCED, "3/3")
  numbers = ahead.numbers["full/snap-b16/far vs stream-b16"]
  seed0 = numbers["seeds"][0]
  assert seed0["snapkv_accuracy"] == 1.0
  assert seed0["difference"] == pytest.approx(1.0 - half[0].mean())
  # the pooled test averages the seeds per haystack (the same haystacks in every seed)
  assert numbers["pooled"]["difference"] == pytest.approx(1.0 - np.mean(half))
  behind = claims.e3_claim(evidence([unit(s, {"snap": half[s], "stream": np.ones((Y, J))})
                                     for s in range(3)]))
  assert (behind.verdict, behind.seeds_agreeing) == (NOT_REPRODUCED, "3/3")
  same = claims.e3_claim(evidence([unit(s, {"snap": half[s], "stream": half[s]})
                                   for s in range(3)]))
  assert same.verdict == INCONCLUSIVE and "no significant difference" in same.reason
  # policies at different budgets are never paired
  apart = [unit(s, {"snap": np.ones((Y, J))}) for s in range(3)]
  apart = [(r, {**m, **unit(s, {"stream": half[s]}, budget=24)[1]}) for s, (r, m) in
           enumerate(apart)]
  assert claims.e3_claim(evidence(apart)).numbers == {}


def test_sign_flip_test_by_hand():
  # d = (1, 1, 1, 1): only the two all-equal sign vectors of 16 reach |mean| = 1, so the
  # two-sided p-value tends to 2/16 with many permutations
  test = sign_flip_test(np.ones(4), np.zeros(4), num_permutations=20000, seed=3)
  assert test.difference == 1.0 and test.p_value == pytest.approx(2 / 16, abs=0.01)
  assert sign_flip_test(np.ones(4), np.ones(4)).p_value == 1.0
  a, b = paired_rows([np.ones((2, 3)), np.zeros((2, 3))], [np.zeros((2, 3))] * 2)
  np.testing.assert_array_equal(a, [0.5, 0.5])
  np.testing.assert_array_equal(b, [0.0, 0.0])
  with pytest.raises(ValueError, match="a_NxYxJ"):
    paired_rows([np.ones((2, 3))], [np.ones((3, 3))])


def test_gates_and_missing_data_leave_every_claim_inconclusive():
  weak = [unit(s, {"grid": blind_phase(0), "snap": np.ones((Y, J)), "stream": np.zeros((Y, J))},
               held=0.8) for s in range(3)]
  for claim in (claims.e1_claim, claims.e3_claim):
    found = claim(evidence(weak))
    assert found.verdict == INCONCLUSIVE and "before eviction 0.800 < 0.9" in found.reason
  empty = evidence([unit(0, {})])
  reasons = [claim(empty).reason for claim in (claims.e1_claim, claims.e2_claim,
                                               claims.e3_claim)]
  assert all(r.startswith("no ") for r in reasons)
  ids = [c.id for c in registry.decide_on(empty)]
  assert ids[ids.index("E1"):ids.index("E1") + 3] == ["E1", "E2", "E3"]
  # a record without stored matrices: every seed undecided
  record, _ = unit(0, {"grid": blind_phase(0)})
  lost = registry.Evidence((record,), {}, lambda name: None)
  assert "correctness matrix not stored" in claims.e1_claim(lost).reason
  assert eviction_data.collect([record], None)[0].runs[0].matrix is None


def test_the_cut_chunk_variant_is_judged_beside_and_never_decides():
  rng = np.random.default_rng(0)
  flat = [(rng.random((Y, J)) < 0.7).astype(float) for _ in range(3)]
  # the published grid keeps 15 of the 16 tokens it is given (whole chunks), the cut one 16
  units = [unit(s, {"grid": flat[s], "cut": blind_phase(s % 4), "content": scattered()},
                kept={"grid": 15}) for s in range(3)]
  found = evidence(units)
  e1 = claims.e1_claim(found)
  assert (e1.verdict, e1.seeds_agreeing) == (NOT_REPRODUCED, "3/3")
  beside = e1.numbers[claims.BESIDE]
  assert (beside["verdict"], beside["seeds_agreeing"]) == (REPRODUCED, "3/3")
  assert list(beside["groups"]) == ["full/cut-b16/far"]
  assert "beside it, not deciding, the cut-chunk variant chunkkv_cut reads REPRODUCED" in \
      e1.reason
  assert e1.numbers["full/grid-b16/far"]["pooled"]["holm_family"] == 1  # its own family
  # E2: the published grid at the same budget setting is its baseline although it keeps
  # fewer tokens; it has no period, so E2 is undecided, while beside it the cut grid has one
  e2 = claims.e2_claim(found)
  assert e2.verdict == INCONCLUSIVE and "no periodic fixed-block baseline" in e2.reason
  assert e2.numbers[claims.BESIDE]["verdict"] == REPRODUCED
  without = claims.e1_claim(evidence([unit(s, {"grid": flat[s]}) for s in range(3)]))
  assert claims.BESIDE not in without.numbers and "beside" not in without.reason


def test_content_chunks_without_a_grid_at_their_budget_are_undecided():
  units = [unit(s, {"content": scattered()}) for s in range(2)]
  e2 = claims.e2_claim(evidence(units))
  assert e2.verdict == INCONCLUSIVE and "no ChunkKV policy at equal budget" in e2.reason
