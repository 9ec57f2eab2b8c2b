"""A lookup model's primary analysis: the phase tests on the circular residue axis."""

import numpy as np

from chunkformer.evaluation import stats
from chunkformer.evaluation.probes import lookup


def test_candidate_periods_are_the_divisors_of_the_modulus():
  assert lookup.residue_periods(24) == (2, 3, 4, 6, 8, 12)
  assert lookup.residue_periods(8) == (2, 4)
  assert lookup.residue_periods(7) == ()


def _outcomes(accuracy_M, prompts=96, seed=0):
  rng = np.random.default_rng(seed)
  return (rng.random((prompts, len(accuracy_M))) < accuracy_M).astype(np.float64)


def test_a_weak_phase_mod_12_is_detected_with_prompt_level_tests():
  # Two weak residues (11 and 23) among 24: shuffling the 24 columns puts them in one phase
  # group 1 time in 23, so a column test cannot reach p < 0.01; prompts can.
  correct = _outcomes(np.where(np.arange(24) % 12 == 11, 0.2, 0.9))
  columns = stats.analyze(correct, np.arange(24), 12, periods=lookup.residue_periods(24),
                          num_permutations=200, num_resamples=50)
  prompts = lookup.residue_analysis(correct, (12,), num_permutations=200, num_resamples=50)
  assert columns.by_chunk_size[0].p_value > 0.01
  assert prompts.detected_period == 12
  assert prompts.by_chunk_size[0].p_value < 0.01 and prompts.phase.p_value < 0.01
  # Curves and the gap stay those of the 24 residues.
  assert prompts.offsets == tuple(range(24))
  np.testing.assert_allclose(prompts.accuracy_by_offset.values, correct.mean(axis=0))
  assert prompts.offset_gap == columns.offset_gap


def test_a_flat_model_has_no_period_and_a_period_8_model_period_8():
  flat = lookup.residue_analysis(_outcomes(np.full(24, 0.8), seed=1), (8, 4),
                                 num_permutations=200, num_resamples=20)
  assert flat.detected_period is None and flat.by_chunk_size[0].p_value > 0.05
  weak = lookup.residue_analysis(_outcomes(np.where(np.arange(24) % 8 == 7, 0.3, 0.9), seed=2),
                                 (8, 4), num_permutations=200, num_resamples=20)
  assert weak.detected_period == 8
  assert [t.chunk_size for t in weak.by_chunk_size] == [8, 4]


def test_lookup_models_are_judged_by_the_paper_claims_only():
  # The demo's records as stored, then the same records as lookup models: C1-C9 (the needle
  # study's) no longer read them.
  import dataclasses
  import os

  from chunkformer.evaluation.claims import registry
  from chunkformer.evaluation.records import results_file

  root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
  records = results_file.load(os.path.join(root, "results", "demo", "results.json")).variants
  kw = dict(num_resamples=20, num_permutations=20)
  before = {c.id: c for c in registry.decide(records, None, **kw)}
  assert before["C1"].seeds_agreeing != "0/0"
  relabelled = [dataclasses.replace(r, primary_probe="lookup") for r in records]
  after = {c.id: c for c in registry.decide(relabelled, None, **kw)}
  for claim in ("C1", "C2", "C8"):
    assert after[claim].verdict == "INCONCLUSIVE" and after[claim].seeds_agreeing == "0/0"
