"""C10-C12 under the period decision by effect size, beside the plan's verdicts: on constructed
matrices (a periodic, a flat and a near-chance row decide as they should) and on the committed
paper-protocol answers (every learned compressed unit periodic with its S, every full-attention
unit and row flat, the claims' sentences true of the data)."""

from __future__ import annotations

import functools
import os

import numpy as np
import pytest

from chunkformer.evaluation.claims import judging
from chunkformer.evaluation.claims import rules as claim_rules
from chunkformer.evaluation.records import correctness, results_file
from chunkformer.evaluation.stats import period_effect
from chunkformer.studies.paper.claims import effect_size

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
COMMITTED = os.path.join(ROOT, "results", "paper_protocol")
SHORTCUT = 1 / 32  # constructed rows: the best non-reading strategy is a random value


def _answers(curve_R, prompts=576, seed=0):
  """prompts x residues of 0/1 answers drawn at the per-residue accuracies ``curve_R``."""
  rng = np.random.default_rng(seed)
  return (rng.random((prompts, len(curve_R))) < np.asarray(curve_R)).astype(np.float64)


def _matrix(x, positions=None):
  return correctness.Matrix(x, np.arange(x.shape[1]), positions_YxJ=positions)


def _decisions(rows):
  """Decisions over constructed rows: name -> (stride or None, [per-seed matrices])."""
  units = {f"{n}_seed{i}": {p: effect_size._decide([_matrix(x)], s, shortcut=SHORTCUT)
                            for p in effect_size.PADDINGS}
           for n, (s, xs) in rows.items() for i, x in enumerate(xs)}
  pooled = {n: {p: effect_size._decide([_matrix(x) for x in xs], s, shortcut=SHORTCUT)
                for p in effect_size.PADDINGS}
            for n, (s, xs) in rows.items()}
  members = {n: tuple(f"{n}_seed{i}" for i in range(len(xs))) for n, (_, xs) in rows.items()}
  return effect_size.Decisions(units, pooled, members, {n: s for n, (s, _) in rows.items()})


def test_a_periodic_a_flat_and_a_near_chance_row_decide_as_constructed():
  weak = np.tile([0.9] * 6 + [0.2, 0.2], 3)  # period 8: two weak phases of 8
  d = _decisions({"w8s8": (8, [_answers(weak, seed=i) for i in range(3)]),
                  "full": (None, [_answers(np.full(24, 0.5), seed=10 + i) for i in range(3)]),
                  "chance": (8, [_answers(np.full(24, 0.04), seed=20 + i) for i in range(2)])})
  assert [effect_size.periodic_with_s(d.units[f"w8s8_seed{i}"]["prefix"], 8)
          for i in range(3)] == [True] * 3
  assert effect_size.flat_in_both(d.rows["full"], None) is True
  assert d.rows["chance"]["prefix"].verdict == period_effect.UNDECIDED  # the power gate
  rule, _ = effect_size._rule(d, "w8s8", effect_size.periodic_with_s, padded=True)
  assert rule.verdict == "REPRODUCED" and rule.count == "3/3"
  rule, _ = effect_size._rule(d, "chance", effect_size.periodic_with_s, padded=True)
  assert rule.verdict == "INCONCLUSIVE"
  # A flat curve is not "periodic with S": C10 fails on it, it does not pass.
  assert effect_size.periodic_with_s(d.rows["full"]["prefix"], 8) is False


def test_a_position_effect_on_shifted_positions_is_read_as_position_not_residue():
  # one multiset of positions shifted by the residue (lookup_task positions="shift"): a flat
  # model whose accuracy falls with position shows a residue ramp; the position term of claim
  # rules 3 removes it, rules 2 (no term) do not
  from chunkformer.data import matched_positions
  positions_RxY = matched_positions.shifted_positions(24, 576, 1, 96)
  rng = np.random.default_rng(3)
  accuracy = 0.6 - 0.5 * (positions_RxY.T - 1) / 95  # about 12 points from residue 0 to 23
  x = (rng.random(accuracy.shape) < accuracy).astype(np.float64)
  with_term = effect_size._decide([_matrix(x, positions_RxY.T)], None, claim_rules.get("3"))
  without = effect_size._decide([_matrix(x, positions_RxY.T)], None, claim_rules.get("2"))
  assert with_term.verdict == period_effect.FLAT
  assert without.verdict != period_effect.FLAT


def test_the_decorrelated_padding_plays_the_in_sequence_role():
  x = _answers(np.full(24, 0.5))
  stored = {"lookup_prefix": _matrix(x), "lookup_in_sequence_decorrelated": _matrix(x)}
  load = {"u": stored}.get
  assert effect_size._matrix(load, "u", "in_sequence") is stored[
      "lookup_in_sequence_decorrelated"]
  assert effect_size._matrix(load, "u", "prefix") is stored["lookup_prefix"]
  assert effect_size._matrix(load, "v", "prefix") is None


@functools.cache
def _judged():
  results = results_file.load(os.path.join(COMMITTED, "results.json"))
  s = results.settings
  return results, judging.judge(results.variants, correctness.loader(COMMITTED), seed=s["seed"],
                                num_resamples=s["num_resamples"],
                                num_permutations=s["num_permutations"],
                                rules=claim_rules.of_settings(s).version)


@pytest.mark.parametrize("claim_id, plan, effect", [
    ("C10", "NOT REPRODUCED", "INCONCLUSIVE"), ("C11", "INCONCLUSIVE", "INCONCLUSIVE"),
    ("C12", "INCONCLUSIVE", "INCONCLUSIVE")])
def test_the_committed_claims_show_both_verdicts(claim_id, plan, effect):
  results, judged = _judged()
  assert judged.rules.version == "1"  # the sweep's own rules (plan version 4's) decide
  claim = {c.id: c for c in judged.claims}[claim_id]
  assert claim.verdict == plan
  now = {c.id: c for c in judged.current}[claim_id]
  assert now.verdict == effect and "period by effect size" in now.reason
  if claim_id == "C11":  # 12.8-14.2%, below the best shortcut (20.9%): claim rules 5
    assert "did not learn" in now.reason
  stored = {c.id: c for c in results.current_claims}[claim_id]
  assert stored.verdict == effect and results.current_rules == claim_rules.CURRENT


def test_committed_units_periodic_with_s_where_learned_and_full_attention_flat():
  results, judged = _judged()
  d = judged.evidence.prepared[effect_size.STUDY]
  for row, members in d.members.items():
    stride = d.strides[row]
    for unit in [*members, row]:
      decision = (d.units[unit] if unit in d.units else d.rows[row])["prefix"]
      if stride is None:  # the sweep's own rules (1): no retrieval gate
        assert decision.verdict == period_effect.FLAT, unit
      elif decision.verdict != period_effect.UNDECIDED:  # learned: past the power gate
        assert (decision.verdict, decision.period) == (period_effect.PERIODIC, stride), unit
  # C10 is undecided for the reason the report gives: no learned S = 12 row.
  c10 = {c.id: c for c in judged.current}["C10"]
  assert "no REPRODUCED row at stride(s) 12" in c10.reason
  assert {d.rows["w12s12_1kv"][p].verdict for p in effect_size.PADDINGS} == {
      period_effect.UNDECIDED}


def test_the_comparison_lines_quote_the_decision_that_judged_each_row():
  # Judged by effect size, a row's line names its seed-pooled decision and the main table's
  # gap (rules 1 stored a detected period and a p-value instead, which these claims lack).
  from chunkformer.evaluation.records.formatting import percent
  from chunkformer.studies.paper.report import paper_table

  _, judged = _judged()
  lines = paper_table.comparison_lines(judged.current, judged.tables["paper"])
  c10, c12 = (next(line for line in lines if line.startswith(f"- **{c}**"))
              for c in ("C10", "C12"))
  claims = {c.id: c for c in judged.current}
  rows = {r.variant: r for r in judged.tables["paper"].rows}
  for claim, line, variant, stride in (("C10", c10, "w8s8_1kv", "S = 8, "),
                                       ("C12", c12, "w8s8_1kv_nope", "")):
    decision = claims[claim].numbers[variant]["pooled"]["prefix"]
    words = (f"periodic {decision['period']}" if decision["verdict"] == "periodic"
             else decision["verdict"])
    assert (f"{variant}: ours {words} ({stride}effect {100 * decision['effect_rms']:.1f} "
            "points rms)" in line), line
    assert f"prefix gap {percent(rows[variant].pooled['prefix'].gap)}" in line
  assert "detected period" not in c10 and "p = " not in c12
