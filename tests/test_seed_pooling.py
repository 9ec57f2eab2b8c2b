"""Seed-pooled records: a variant's seeds stacked as haystacks and analysed as one model."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from chunkformer.evaluation.claims import rules as claim_rules
from chunkformer.evaluation.claims import seed_pooling
from chunkformer.evaluation.records import correctness
from chunkformer.evaluation.records.variant import VariantRecord, VariantSetup
from chunkformer.evaluation.stats import periodicity as stats
from chunkformer.evaluation.stats import seed_rule
from chunkformer.evaluation.stats.analysis_types import DepthAnalysis
from chunkformer.studies.needles.claims import summaries
from chunkformer.studies.needles.report import claim_tables

KW = dict(seed=0, num_resamples=50, num_permutations=50)
OFFSETS = np.arange(100, 112)


def _matrix(rng, blind_phase):
  """4 haystacks x 12 offsets, every answer right except at one phase (mod 4)."""
  correct = (rng.random((4, 12)) < 0.9).astype(float)
  correct[:, OFFSETS % 4 == blind_phase] = 0.0
  return correct


def _run(seed, far, near, *, variant="m4"):
  analysis = stats.analyze(far, OFFSETS, [4], **KW)
  depths = tuple(DepthAnalysis(stats.analyze(m, OFFSETS, [4], **KW).nested(), depth=d,
                               depth_name=n, mean_distance=0.0, token_accuracy=0.0,
                               compression_ratio=None)
                 for m, d, n in ((far, 0.0, "far"), (near, 1.0, "near")))
  setup = VariantSetup(variant, "fixed", "fixed", chunk_size=4, seed=seed,
                       name=f"{variant}_seed{seed}")
  return VariantRecord(setup, analysis, "needle", 10, compression_ratio=4.0,
                       primary_depth="far", depths=depths, near_accuracy=float(near.mean()),
                       heldout={"loss": 1.0})


def _runs_and_loader(num_seeds, *, offsets_of=None, near_step=0):
  """Seeds with a far and a near matrix; the near depth's offsets are the far ones plus
  ``near_step`` (in a sweep each depth has its own offsets, a multiple of M apart)."""
  rng = np.random.default_rng(0)
  runs, stored = [], {}
  for k in range(num_seeds):
    far, near = _matrix(rng, blind_phase=3), _matrix(rng, blind_phase=0)
    own = stats.analyze(np.concatenate([far, near]), OFFSETS, [4], **KW).nested()
    runs.append(dataclasses.replace(_run(k, far, near), all_depths=own))
    offsets = OFFSETS if offsets_of is None else offsets_of(k)
    stored[runs[-1].name] = {"needle_far": correctness.Matrix(far, offsets),
                             "needle_near": correctness.Matrix(near, offsets + near_step)}
  return runs, stored.get


V1 = claim_rules.get("1")  # claim rules version 1: the seeds' rows stacked


def test_pooled_record_under_rules_1_is_the_analysis_of_every_seeds_haystacks_stacked():
  runs, load = _runs_and_loader(3)
  pooled = seed_pooling.pool(runs, load, rules=V1, **KW)
  far = np.concatenate([load(r.name)["needle_far"].correct_YxJ for r in runs])
  near = np.concatenate([load(r.name)["needle_near"].correct_YxJ for r in runs])
  assert pooled.analysis == stats.analyze(far, OFFSETS, [4], **KW)
  assert pooled.analysis.num_haystacks == 12
  assert pooled.analysis.phase.weakest_phase == 3
  assert pooled.all_depths == stats.analyze(np.concatenate([
      np.concatenate([load(r.name)[n].correct_YxJ for n in ("needle_far", "needle_near")])
      for r in runs]), OFFSETS, [4], **KW).nested()
  assert pooled.near_accuracy == pytest.approx(near.mean())
  assert pooled.name == "m4 (3 seeds pooled)" and pooled.setup.variant == "m4"
  # Nothing of one seed alone stays in the pooled record; held-out metrics are the seeds' mean.
  assert pooled.depths is None and pooled.slot_gain is None
  assert pooled.heldout == {"loss": 1.0}
  # The pooled rows are seed_rule.pool_seeds of the seeds' matrices.
  np.testing.assert_array_equal(seed_rule.pool_seeds(
      [load(r.name)["needle_far"].correct_YxJ for r in runs]), far)


def test_pooled_record_has_the_haystack_as_the_unit_under_the_current_rules():
  # Every seed answers the same haystacks: each haystack's outcome averaged over the seeds,
  # so the pooled record has 4 haystacks, not 12, and its intervals are no narrower than the
  # haystacks allow. Phase accuracies (column means) equal the stacked ones.
  runs, load = _runs_and_loader(3)
  pooled = seed_pooling.pool(runs, load, **KW)
  far = [load(r.name)["needle_far"].correct_YxJ for r in runs]
  assert pooled.analysis == stats.analyze(np.mean(far, axis=0), OFFSETS, [4], **KW)
  assert pooled.analysis.num_haystacks == 4
  stacked = seed_pooling.pool(runs, load, rules=V1, **KW).analysis
  np.testing.assert_allclose(pooled.analysis.accuracy_by_offset.values,
                             stacked.accuracy_by_offset.values)
  assert pooled.analysis.phase.weakest_phase == stacked.phase.weakest_phase
  near = np.mean([load(r.name)["needle_near"].correct_YxJ for r in runs], axis=0)
  assert pooled.near_accuracy == pytest.approx(near.mean())


def test_all_depths_pooled_over_seeds_when_each_depth_has_its_own_offsets():
  # The depths of a sweep never share offsets; the seeds share them depth by depth. The pooled
  # all-depths test is then recomputed from every seed's depths, not left at seed 0's value.
  runs, load = _runs_and_loader(3, near_step=400)
  pooled = seed_pooling.pool(runs, load, rules=V1, **KW)
  rows = [np.concatenate([load(r.name)[n].correct_YxJ for n in ("needle_far", "needle_near")])
          for r in runs]
  expected = stats.analyze(np.concatenate(rows), OFFSETS, [4], **KW)
  assert pooled.all_depths == expected.nested()
  assert pooled.all_depths.num_haystacks == 24 != runs[0].all_depths.num_haystacks
  # One seed's depths stacked the same way give that seed's own all-depths analysis.
  assert stats.analyze(rows[0], OFFSETS, [4], **KW).nested() == runs[0].all_depths
  # Seeds asked different offsets at one depth have no pooled all-depths test.
  other = lambda name: {**load(name), "needle_near": correctness.Matrix(  # noqa: E731
      load(name)["needle_near"].correct_YxJ, OFFSETS + (4 if name.endswith("1") else 400))}
  assert seed_pooling.pool(runs, other, rules=V1, **KW).all_depths is None


def test_one_seed_is_its_own_pooled_record_and_missing_data_gives_none():
  runs, load = _runs_and_loader(3)
  single = [dataclasses.replace(runs[0], setup=dataclasses.replace(runs[0].setup,
                                                                    variant="alone"))]
  out = seed_pooling.pooled_records(runs + single, load, **KW)
  assert out["alone"] is single[0]
  assert out["m4"].name == "m4 (3 seeds pooled)"
  assert "m4" not in seed_pooling.pooled_records(runs, None, **KW)  # no matrices at all
  assert seed_pooling.pool(runs, lambda name: None if name.endswith("2") else load(name),
                           **KW) is None  # one seed without matrices
  shifted, load_shifted = _runs_and_loader(2, offsets_of=lambda k: OFFSETS + k)
  assert seed_pooling.pool(shifted, load_shifted, **KW) is None  # not the same offsets


def test_seed_table_shows_each_seed_the_t_interval_and_the_pooled_interval():
  runs, load = _runs_and_loader(3)
  pooled = seed_pooling.pooled_records(runs, load, **KW)
  text = "\n".join(claim_tables.seed_table(summaries.seed_rows(runs, pooled)))
  row = next(line for line in text.splitlines() if line.startswith("| m4 |"))
  cells = [c.strip() for c in row.strip("|").split("|")]
  far = [r.far_accuracy for r in runs]
  assert cells[1] == "3" and cells[2] == " / ".join(f"{x:.3f}" for x in far)
  t = seed_rule.seed_interval(far)
  assert cells[3] == f"{t.mean:.3f} [{t.low:.3f}, {t.high:.3f}]"
  a = pooled["m4"].analysis.mean_accuracy
  assert cells[4] == f"{a.value:.3f} [{a.low:.3f}, {a.high:.3f}]"
  assert claim_tables.seed_table(summaries.seed_rows(runs[:1], None)) == []  # one seed: no table
