"""Claims E4-E6 (eviction on the lookup test) on constructed eviction_lookup records: a grid
period known by hand at L = 4 and 8, content chunks that remove it or keep it, the chance
gate, McNemar by hand, the pooled paired test in either direction, and no data."""

from __future__ import annotations

import numpy as np

from chunkformer.evaluation.records import correctness
from chunkformer.evaluation.stats.seed_rule import INCONCLUSIVE, NOT_REPRODUCED, REPRODUCED
from chunkformer.studies.eviction.claims import lookup_claims as claims
from tests import policy_sweeps

Y, R = 100, 8  # prompts per residue, residues of the target position mod 8
RESIDUES = np.arange(R)
POSITIONS = 8 * np.arange(Y)[:, None] + RESIDUES[None, :] + 1  # the shifted design
SPECS = dict(grid4=dict(policy="chunkkv", budget=16, chunk=4, window=8),
             grid8=dict(policy="chunkkv", budget=16, chunk=8, window=8),
             content=dict(policy="content_chunkkv", budget=16, window=8, delimiters=[40, 41],
                          min_chunk=2, max_chunk=8),
             snap=dict(policy="snapkv", budget=16, window=8),
             stream=dict(policy="streaming_llm", budget=16, sinks=4),
             h2o=dict(policy="h2o", budget=16, recent=8))
evidence = policy_sweeps.evidence  # the claims' evidence over constructed units


def by_residue(accuracy_R, seed: int = 0) -> np.ndarray:
  """A [Y, R] matrix whose residue r has exactly round(Y * accuracy_R[r]) correct prompts,
  placed at prompts drawn by ``seed`` (no link to position)."""
  rng = np.random.default_rng(seed)
  m = np.zeros((Y, R))
  for r, a in enumerate(np.broadcast_to(accuracy_R, (R,))):
    m[rng.permutation(Y)[:round(Y * a)], r] = 1
  return m


def dip(low_residues, seed: int, high: float = 0.9, low: float = 0.3) -> np.ndarray:
  return by_residue(np.where(np.isin(RESIDUES, low_residues), low, high), seed)


def unit(seed: int, matrices: dict[str, np.ndarray], variant: str = "full_1kv"
         ) -> policy_sweeps.Unit:
  """A full-attention unit whose eviction_lookup probe gave ``matrices`` (name of a SPECS
  policy -> its prefix-padding matrix)."""
  probe, stored = {}, {}
  for name, matrix in matrices.items():
    key = f"{name}-b16_prefix"
    probe[f"{name}-b16"] = {"policy": SPECS[name], "prompt_tokens": 33,
                            "budget_tokens": 16, "matrices": {"prefix": key},
                            "result": {}}
    stored[f"eviction_lookup_{key}"] = correctness.Matrix(matrix, RESIDUES,
                                                          positions_YxJ=POSITIONS)
  return policy_sweeps.unit(seed, "eviction_lookup", probe, stored, variant=variant,
                            task="lookup")


def test_a_dip_at_one_phase_of_the_grid_is_its_period_and_content_chunks_remove_it():
  units = [unit(s, {"grid4": dip([1, 5], s), "grid8": dip([3], s),
                    "content": by_residue(0.85, 10 + s)}) for s in range(3)]
  found = evidence(units)
  e4 = claims.e4_claim(found)
  assert (e4.verdict, e4.seeds_agreeing) == (REPRODUCED, "6/6")
  grid4 = e4.numbers["full_1kv/grid4-b16/prefix"]
  assert [s["decision"] for s in grid4["seeds"]] == ["periodic 4"] * 3
  # by hand: residues 1 and 5 at 30%, the others at 90%: a 60-point gap at L = 4
  assert grid4["pooled"]["gap"] == np.float64(0.9 - 0.3)
  assert e4.numbers["full_1kv/grid8-b16/prefix"]["pooled"]["decision"] == "periodic 8"
  e5 = claims.e5_claim(found)
  assert (e5.verdict, e5.seeds_agreeing) == (REPRODUCED, "3/3")
  pooled = e5.numbers["full_1kv/content-b16/prefix"]["pooled"]
  assert pooled["periodic_baselines"] == [4, 8]
  assert pooled["4"]["decision"] == "flat" and pooled["4"]["gap"] < 0.05


def test_flat_grids_fail_e4_and_leave_e5_nothing_to_remove():
  units = [unit(s, {"grid4": by_residue(0.7, s), "content": dip([2], 20 + s)})
           for s in range(3)]
  e4 = claims.e4_claim(evidence(units))
  assert (e4.verdict, e4.seeds_agreeing) == (NOT_REPRODUCED, "3/3")
  e5 = claims.e5_claim(evidence(units))
  assert e5.verdict == INCONCLUSIVE and "no periodic fixed-block baseline" in e5.reason


def test_content_chunks_with_the_grid_period_fail_e5():
  units = [unit(s, {"grid4": dip([1, 5], s), "content": dip([1, 5], 30 + s)})
           for s in range(3)]
  e5 = claims.e5_claim(evidence(units))
  assert e5.verdict == NOT_REPRODUCED and "still periodic" in e5.reason


def test_near_chance_only_a_period_seen_decides():
  # a 15-point dip at 20% accuracy passes every condition of a period: a period seen at the
  # stated sizes needs no power argument (period_effect)
  seen = [unit(s, {"grid4": dip([1, 5], s, high=0.2, low=0.05)}) for s in range(3)]
  assert claims.e4_claim(evidence(seen)).verdict == REPRODUCED
  # a flat 15% is within 20 points of chance: its "not periodic" says nothing
  flat_low = [unit(s, {"grid4": by_residue(0.15, s)}) for s in range(3)]
  low = claims.e4_claim(evidence(flat_low))
  assert low.verdict == INCONCLUSIVE and "within 20 points of chance" in low.reason
  content_low = [unit(s, {"grid4": dip([1, 5], s), "content": by_residue(0.15, 60 + s)})
                 for s in range(3)]
  e5 = claims.e5_claim(evidence(content_low))
  assert e5.verdict == INCONCLUSIVE and "within 20 points of chance" in e5.reason


def test_mcnemar_by_hand():
  a = np.array([1, 1, 1, 1, 0, 0, 1])
  b = np.array([0, 0, 0, 1, 0, 1, 1])
  # discordant: A alone 3, B alone 1; exact two-sided p = P(|X - 2| >= 1) for X ~ Bin(4, 1/2)
  assert claims.mcnemar(a, b) == (3, 1, 0.625)
  assert claims.mcnemar(a, a) == (0, 0, 1.0)


def test_snapkv_against_streaming_llm_in_either_direction_with_h2o_beside():
  ahead = [unit(s, {"snap": by_residue(0.8, s), "stream": by_residue(0.4, 40 + s),
                    "h2o": by_residue(0.6, 50 + s)}) for s in range(3)]
  e6 = claims.e6_claim(evidence(ahead))
  assert (e6.verdict, e6.seeds_agreeing) == (REPRODUCED, "3/3")
  group = e6.numbers["full_1kv/snap-b16/prefix vs stream-b16"]
  assert group["pooled"]["prompts"] == Y * R and group["pooled"]["holm_family"] == 1
  assert group["pooled"]["h2o_accuracy_beside"] == {"0": 0.6, "1": 0.6, "2": 0.6}
  behind = [unit(s, {"snap": by_residue(0.4, s), "stream": by_residue(0.8, 40 + s)})
            for s in range(3)]
  assert claims.e6_claim(evidence(behind)).verdict == NOT_REPRODUCED
  same = [unit(s, {"snap": by_residue(0.6, s), "stream": by_residue(0.6, s)})
          for s in range(3)]
  assert claims.e6_claim(evidence(same)).verdict == INCONCLUSIVE


def test_no_eviction_lookup_records_leave_e4_to_e6_inconclusive():
  bare = evidence([unit(0, {})])
  for claim in (claims.e4_claim, claims.e5_claim, claims.e6_claim):
    found = claim(bare)
    assert found.verdict == INCONCLUSIVE and "eviction_lookup" in found.reason
  # A plan's size rows are described by the size trend, never judged by E4-E6
  # (results/paper_plan5/PLAN.md, section 4), though their units record the probe.
  sizes = evidence([unit(s, {"grid4": dip([1, 5], s)}, "size_large_full_1kv") for s in range(3)])
  assert claims.collect(sizes.records, sizes.matrices) == []
  assert claims.e4_claim(sizes).verdict == INCONCLUSIVE


def test_phase_rows_pool_seeds_by_residue_mod_l():
  units = [unit(s, {"grid4": dip([1, 5], s)}) for s in range(2)]
  stored = {r.name: m for r, m in units}
  (row,) = claims.phase_rows([r for r, _ in units], stored.get)
  assert (row.depth, row.seeds, row.budget, row.short) == ("lookup, prefix", 2, (16,),
                                                          "chunkkv L=4")
  np.testing.assert_allclose(row.residues[4].accuracy, [0.9, 0.3, 0.9, 0.9], atol=1e-12)
  np.testing.assert_allclose(row.residues[8].accuracy, [0.9, 0.3, 0.9, 0.9] * 2, atol=1e-12)
