"""What the tests of the sweeps under an inference-time setting share (eviction policies,
sparse-prefill patterns): the untrained smoke model and its needle rows, a constructed unit
record with its stored matrices, the claims' evidence over such units, the period test's
reading of a phase missed by hand, and the tiny sweeps' checks (each setting's far record
against its stored matrix; a finished sweep resumes without retraining or re-evaluating)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import pytest

from chunkformer import config as config_lib
from chunkformer import runtime as runtime_lib
from chunkformer.evaluation.claims import registry
from chunkformer.evaluation.probes import needle_sweep
from chunkformer.evaluation.probes import trained as trained_lib
from chunkformer.evaluation.records import correctness
from chunkformer.evaluation.records.claim import Claim
from chunkformer.evaluation.records.variant import VariantRecord, VariantSetup
from chunkformer.evaluation.stats import periodicity
from chunkformer.evaluation.stats.seed_rule import REPRODUCED
from chunkformer.evaluation.sweep import run as sweep
from configs import smoke

# A record's primary analysis, the same for every constructed unit (the claims read probes).
BASE = periodicity.analyze(np.ones((2, 12)), np.arange(12), [4], num_resamples=10,
                           num_permutations=10)

Unit = tuple[VariantRecord, dict[str, correctness.Matrix]]


def smoke_model() -> trained_lib.TrainedModel:
  """The smoke config's model at initialisation: 2 full-attention layers, T = 32."""
  config = config_lib.from_dict(smoke.get_config().to_dict())
  rt = runtime_lib.build(config)
  return trained_lib.TrainedModel("", config, rt, rt.fresh_state().params, 0)


def far_rows(trained: trained_lib.TrainedModel, num_offsets: int) -> needle_sweep.SweepRows:
  """The needle sweep's far rows: ``num_offsets`` offsets in 2 haystacks."""
  spec = needle_sweep.NeedleSweepSpec(num_offsets=num_offsets, num_haystacks=2, depths=(0.0,))
  return needle_sweep.build(trained.config.data, spec)[0]


def unit(seed: int, probe: str, record: Mapping[str, Any], stored: dict[str, correctness.Matrix],
         *, variant: str = "full", task: str = "kv", held: float | None = None) -> Unit:
  """A full-attention unit ``<variant>_seed<seed>`` whose probe ``probe`` recorded ``record``
  and stored ``stored``; ``held``: its held-out far accuracy (none given: none recorded)."""
  name = f"{variant}_seed{seed}"
  primary = "needle" if task == "kv" else "lookup"
  heldout = {} if held is None else {"heldout": {"far_accuracy": held}}
  return VariantRecord(VariantSetup(variant, "full", "full", seed=seed, name=name, task=task),
                       BASE, primary, 10, compression_ratio=1.0, probes={probe: dict(record)},
                       **heldout), stored


def evidence(units: list[Unit]) -> registry.Evidence:
  """The claims' evidence over constructed units (seed 0, 100 resamples, 1000 permutations)."""
  stored = {r.name: m for r, m in units}
  return registry.Evidence(tuple(r for r, _ in units), {}, stored.get, seed=0,
                           num_resamples=100, num_permutations=1000)


def assert_resumes(config, workdir: str, outcome) -> None:
  """A second run of a finished sweep finds every unit finished and every record current."""
  again = sweep.run(config, workdir, command="again")
  assert [r.eval_wall_s for r in again.records] == [r.eval_wall_s for r in outcome.records]
  assert [c.to_json() for c in again.claims] == [c.to_json() for c in outcome.claims]


def assert_period_of_four(claim: Claim, group: str) -> Mapping[str, Any]:
  """The period test (E1's, P1's) on three seeds whose seed s misses phase s % 4 in every
  haystack and no other: reproduced in 3/3, period 4, gap 1, weakest phase s. The group's
  numbers."""
  assert (claim.verdict, claim.seeds_agreeing) == (REPRODUCED, "3/3")
  found = claim.numbers[group]
  assert [s["detected_period"] for s in found["seeds"]] == [4, 4, 4]
  assert [s["gap"]["4"] for s in found["seeds"]] == [1.0, 1.0, 1.0]
  assert [s["weakest_phase"]["4"] for s in found["seeds"]] == [0, 1, 2]
  return found


def assert_far_records(record: Mapping[str, Any], matrices: Mapping[str, correctness.Matrix],
                       probe: str, labels: list[str]) -> None:
  """The tiny sweeps' probe record (``probe``'s, one unit) holds ``labels`` in order, each
  with a far record that names its stored 2 x 12 matrix and reads its accuracy at L = 4."""
  assert list(record) == labels
  for label in labels:
    far = record[label]["depths"]["far"]
    matrix = matrices[f"{probe}_{far['matrix']}"]
    assert matrix.correct_YxJ.shape == (2, 12)
    assert far["accuracy"] == pytest.approx(matrix.correct_YxJ.mean())
    assert len(far["accuracy_by_phase"]["4"]) == 4
