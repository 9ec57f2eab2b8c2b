"""Claims P1-P2 on constructed sparse-prefill records: a block-sparse period known by hand, a
flat vertical-slash, a periodic one, the gates, no data, and the report's tables."""

from __future__ import annotations

import numpy as np

from chunkformer.evaluation.records import correctness
from chunkformer.evaluation.stats.seed_rule import INCONCLUSIVE, NOT_REPRODUCED, REPRODUCED
from chunkformer.studies.sparse_prefill.claims import sparse_claims as claims
from chunkformer.studies.sparse_prefill.claims import sparse_data
from tests import policy_sweeps

Y, J = 8, 24  # haystacks, offsets (6 periods of 4)
OFFSETS = np.arange(1, J + 1)  # absolute positions: offset 1 has residue 1 mod 4
SPECS = dict(blocks=dict(pattern="block_sparse", block=4, top=2),
             lines=dict(pattern="vertical_slash", block=4, vertical=4, slash=8, last_q=4,
                        forced_vertical=1, forced_slash=4),
             band=dict(pattern="a_shape", block=4, sink=4, local=8),
             dense=dict(pattern="keep_all", block=4))
evidence = policy_sweeps.evidence  # the claims' evidence over constructed units


def blind_residue(residue: int, size: int = 4) -> np.ndarray:
  """Every haystack misses the needle exactly at offset mod ``size`` == ``residue``."""
  return np.broadcast_to((OFFSETS % size != residue).astype(float), (Y, J)).copy()


def scattered() -> np.ndarray:
  """One miss per haystack at offset indices that follow no period (the eviction claims'
  test checked it: no detected period, phase-test p 0.94 at 4)."""
  m = np.ones((Y, J))
  m[np.arange(Y), [2, 3, 9, 14, 16, 17, 22, 23]] = 0
  return m


def unit(seed: int, matrices: dict[str, np.ndarray], held: float = 0.99,
         plain: np.ndarray | None = None) -> policy_sweeps.Unit:
  """A full-attention unit whose sparse_needles probe gave ``matrices`` (a name of SPECS ->
  its pattern's far matrix) and whose plain needle sweep gave ``plain``."""
  probe, stored = {}, {}
  for name, matrix in matrices.items():
    label, key = name, f"{name}_far"
    probe[label] = {"pattern": SPECS[name], "block": 4, "kept_fraction": 0.5,
                    "depths": {"far": {"accuracy": float(matrix.mean()), "matrix": key}}}
    stored[f"sparse_needles_{key}"] = correctness.Matrix(matrix, OFFSETS[:matrix.shape[1]])
  if plain is not None:
    stored["needle_far"] = correctness.Matrix(plain, OFFSETS)
  return policy_sweeps.unit(seed, "sparse_needles", probe, stored, held=held)


def test_a_blind_residue_on_the_block_grid_is_a_period_of_b_and_flat_lines_have_none():
  units = [unit(s, {"blocks": blind_residue(s % 4), "lines": scattered()}) for s in range(3)]
  found = evidence(units)
  # by hand: residue s % 4 misses in every haystack, the others never: gap 1 at B = 4
  group = policy_sweeps.assert_period_of_four(claims.p1_claim(found), "full/blocks/far")
  assert group["pooled"]["holm_family"] == 1 and group["pooled"]["kept_fraction"] == 0.5
  p2 = claims.p2_claim(found)
  assert (p2.verdict, p2.seeds_agreeing) == (REPRODUCED, "3/3")
  seed0 = p2.numbers["full/lines/far"]["seeds"][0]
  assert seed0["detected_period"] is None and seed0["p_judged"]["4"] > 0.05


def test_a_flat_block_grid_fails_p1_where_sparsity_bites_and_periodic_lines_fail_p2():
  rng = np.random.default_rng(0)
  flat = [(rng.random((Y, J)) < 0.7).astype(float) for _ in range(3)]
  units = [unit(s, {"blocks": flat[s], "lines": blind_residue(1)}) for s in range(3)]
  found = evidence(units)
  p1 = claims.p1_claim(found)
  assert (p1.verdict, p1.seeds_agreeing) == (NOT_REPRODUCED, "3/3")
  p2 = claims.p2_claim(found)
  assert (p2.verdict, p2.seeds_agreeing) == (NOT_REPRODUCED, "3/3")
  assert p2.numbers["full/lines/far"]["seeds"][0]["reason"] == "periodic"


def test_the_gates_leave_seeds_undecided():
  ceiling = claims.p1_claim(evidence([unit(s, {"blocks": np.ones((Y, J))}) for s in range(3)]))
  assert ceiling.verdict == INCONCLUSIVE and "outside [0.02, 0.98]" in ceiling.reason
  unlearned = claims.p1_claim(evidence([unit(s, {"blocks": blind_residue(0)}, held=0.5)
                                        for s in range(3)]))
  assert unlearned.verdict == INCONCLUSIVE and "dense prefill 0.500 < 0.9" in unlearned.reason
  lost = claims.p2_claim(evidence([unit(s, {"blocks": blind_residue(0),
                                            "lines": np.zeros((Y, J))}) for s in range(3)]))
  assert lost.verdict == INCONCLUSIVE and "< 0.5" in lost.reason
  alone = claims.p2_claim(evidence([unit(s, {"lines": scattered()}) for s in range(3)]))
  assert alone.verdict == INCONCLUSIVE and "no block size" in alone.reason
  none = claims.p1_claim(evidence([unit(0, {"band": scattered()})]))
  assert (none.verdict, none.seeds_agreeing) == (INCONCLUSIVE, "0/0")


def test_tables_pool_seeds_by_residue_and_compare_keep_all_with_the_dense_sweep():
  plain = blind_residue(2)
  units = [unit(s, {"dense": plain if s else scattered(), "blocks": blind_residue(0)},
                plain=plain) for s in range(2)]
  found = sparse_data.tables(*(lambda e: (e.records, e.matrices))(evidence(units)))
  rows = {r.label: r for r in found.rows}
  assert list(rows) == ["dense", "blocks"] and rows["dense"].seeds == 2
  assert rows["blocks"].residues[4].accuracy == (0.0, 1.0, 1.0, 1.0)
  assert rows["blocks"].matches_dense is None
  # seed 1's keep-all equals its dense sweep; seed 0's differs where its misses do
  differ = (scattered() != plain).sum()
  assert rows["dense"].matches_dense == (2 * Y * J - differ) / (2 * Y * J)
  assert found.dense == {("full", "far"): 0.75}
