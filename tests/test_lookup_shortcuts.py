"""The lookup's shortcut baselines (data/lookup_shortcuts.py), the retrieval gate
(stats/retrieval_gate.py) and how claim rules 5 read them (studies/paper/claims/effect_size)."""

from __future__ import annotations

import numpy as np
import pytest

from chunkformer.data import lookup_shortcuts, lookup_task
from chunkformer.evaluation.claims import rules as claim_rules
from chunkformer.evaluation.records import correctness
from chunkformer.evaluation.stats import period_effect, retrieval_gate
from chunkformer.studies.paper.claims import effect_size

KEYS, VALUES = tuple(range(8, 40)), tuple(range(40, 72))  # the CPU size's kv symbols


def _spec(padding="prefix", **changes) -> lookup_task.LookupSpec:
  base = dict(seq_len=128, keys=KEYS, values=VALUES, filler=4, bos=1, modulus=24,
              prompts_per_residue=64, positions="shift", padding=padding)
  return lookup_task.LookupSpec(**dict(base, **changes))


def _baselines(spec):
  return lookup_shortcuts.baselines(spec, lookup_task.generate(spec, 2609))


def test_plan5_design_leaves_the_target_one_of_two_records_worth_half_the_prompts():
  found = _baselines(_spec(num_records=16, num_demos=14))
  # 1/2 + (1/2)(1/32): the other undemonstrated record shares the value 1 time in 32
  assert found.mean("undemonstrated") == pytest.approx(0.517, abs=0.01)
  assert found.mean(found.best) >= found.mean("undemonstrated")
  assert found.record()["mean"] == found.mean(found.best)


@pytest.mark.parametrize("padding", lookup_task.PADDINGS)
def test_retrieval_design_leaves_every_shortcut_at_most_five_percent(padding):
  found = _baselines(_spec(padding, num_records=32, num_demos=8, distinct_values=True))
  assert found.mean(found.best) <= 0.05
  assert found.mean("demonstrated") == 0.0  # distinct values: no demonstration shares it
  assert found.mean("undemonstrated") == pytest.approx(1 / 24)


def test_expected_accuracies_match_a_sampled_strategy():
  spec = _spec(num_records=16, num_demos=14)
  prompts = lookup_task.generate(spec, 7)
  found = lookup_shortcuts.baselines(spec, prompts)
  rng = np.random.default_rng(0)
  start = spec.region_end + 1
  hits = []
  for row, at, answer in zip(prompts.tokens, prompts.record_positions, prompts.answers[:, 0],
                             strict=True):
    undemo = at[~np.isin(row[at], row[start:start + 2 * spec.num_demos:2])]
    hits.append(row[rng.choice(undemo) + 1] == answer)
  n = len(hits)
  assert np.mean(hits) == pytest.approx(found.mean("undemonstrated"), abs=4 / np.sqrt(n))
  assert found.by_residue("undemonstrated").shape == (24,)


def test_distinct_values_need_a_value_per_record():
  with pytest.raises(ValueError, match="values"):
    _spec(num_records=33, num_demos=8, keys=tuple(range(100, 140)),
          distinct_values=True).validate()


def test_gate_passes_retrieval_and_refuses_the_shortcut():
  rng = np.random.default_rng(0)
  at_shortcut = (rng.random(4000) < 0.52).astype(float)
  assert not retrieval_gate.gate(at_shortcut, 0.517).learned
  assert "did not learn" in retrieval_gate.gate(at_shortcut, 0.517).reason
  retrieving = (rng.random(4000) < 0.8).astype(float)
  assert retrieval_gate.gate(retrieving, 0.05).learned
  assert retrieval_gate.gate(np.ones(4000), 0.05).learned  # 100%: a finite bound, learned
  assert retrieval_gate.at_floor_or_ceiling(0.995, 0.05).startswith("at ceiling")
  assert retrieval_gate.at_floor_or_ceiling(0.04, 0.05).startswith("at the floor")
  assert retrieval_gate.at_floor_or_ceiling(0.5, 0.05) == ""


def test_gate_holds_its_level_at_the_boundary_and_has_power_past_it():
  rng = np.random.default_rng(1)
  b, n = 0.05, 24 * 576
  boundary = retrieval_gate.simulate(b, b + retrieval_gate.MARGIN, prompts=n, reps=300, rng=rng)
  past = retrieval_gate.simulate(b, b + retrieval_gate.MARGIN + 0.03, prompts=n, reps=100,
                                 rng=rng)
  assert boundary <= retrieval_gate.ALPHA + 3 * np.sqrt(retrieval_gate.ALPHA / 300)
  assert past == 1.0


def _matrix(accuracy: float, rng, prompts: int = 96) -> correctness.Matrix:
  return correctness.Matrix((rng.random((prompts, 24)) < accuracy).astype(float), np.arange(24))


def test_rules_5_call_a_full_unit_at_the_shortcut_did_not_learn():
  rng = np.random.default_rng(2)
  rules = claim_rules.get("5")
  found = effect_size._decide([_matrix(0.52, rng)], None, rules, shortcut=0.616)
  assert found.verdict == period_effect.UNDECIDED
  assert effect_size.describe(found) == "did not learn"
  learned = effect_size._decide([_matrix(0.8, rng, 576)], None, rules, shortcut=0.05)
  assert learned.verdict == period_effect.FLAT


def test_rules_5_leave_ceiling_floor_and_unknown_shortcuts_undecided():
  rng = np.random.default_rng(3)
  rules = claim_rules.get("5")
  ceiling = effect_size._decide([correctness.Matrix(np.ones((96, 24)), np.arange(24))], 8,
                                rules, shortcut=0.05)
  assert effect_size.describe(ceiling) == "at ceiling"
  floor = effect_size._decide([_matrix(0.5, rng)], 8, rules, shortcut=0.6)
  assert effect_size.describe(floor) == "at the floor"
  unknown = effect_size._decide([_matrix(0.5, rng)], 8, rules, shortcut=None)
  assert unknown.verdict == period_effect.UNDECIDED and "no shortcut" in unknown.reason
