"""The period decision by effect size on the committed paper-protocol answers and on the
paper's published per-residue accuracies: what it must say there (and today's rule did not)."""

import json
import os
import re

import numpy as np
import pytest

from chunkformer.data import matched_positions
from chunkformer.evaluation.records import correctness
from chunkformer.evaluation.stats import (
  period_effect,
  residue_effect,
  residue_period,
  residue_shape,
)

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SWEEP = os.path.join(ROOT, "results", "paper_protocol", "correct")
PUBLISHED = os.path.join(ROOT, "chunkformer", "studies", "paper", "records", "paper_published.json")
FULL = os.path.join(ROOT, "results", "period_effect", "published_full_attention.json")
CHANCE = 1 / 32
PADDINGS = ("prefix", "in_sequence")


def _stride(name):
  m = re.match(r"w(\d+)s(\d+)", name)
  return int(m.group(2)) if m else None


@pytest.fixture(scope="module")
def answers():
  names = sorted(f[:-4] for f in os.listdir(SWEEP) if f.endswith(".npz"))
  return {n: {p: correctness.load(os.path.join(SWEEP, n + ".npz"))["lookup_" + p].correct_YxJ
              for p in PADDINGS} for n in names}


def _decide(x, stride):
  gate = ((period_effect.FLAT_DIP, 8, CHANCE) if stride is None
          else (period_effect.PERIODIC_DIP, stride, CHANCE))
  return period_effect.decide(residue_effect.from_prompts(x), gate=gate)


def test_committed_positions_are_matched_in_two_moments_only():
  positions = matched_positions.matched_positions(24, 576, 1, 108)
  np.testing.assert_allclose(positions.mean(axis=1), 54.5)
  np.testing.assert_allclose(positions.var(axis=1), 887.75)
  z = (positions - 54.5) / np.sqrt(887.75)
  assert np.ptp((z**3).mean(axis=1)) > 0.4  # skewness differs: the position term's reason


def test_every_learned_compressed_unit_with_an_s_periodic_share_is_periodic_with_s(answers):
  checked = 0
  for name, modes in answers.items():
    stride = _stride(name)
    if stride is None:
      continue
    for padding, x in modes.items():
      decision = _decide(x, stride)
      fit = decision.fit(stride)
      learned = x.mean() - CHANCE > period_effect.PERIODIC_DIP
      if learned and fit.share >= 0.9 and all(p <= 0.05 for p in fit.divisor_p_values.values()):
        assert period_effect.period_is(decision, stride), (name, padding, decision.reason)
        checked += 1
  assert checked == 38  # 19 learned compressed units, both paddings


def test_no_full_attention_unit_or_row_is_periodic_and_each_is_flat(answers):
  full = {n: m for n, m in answers.items() if n.startswith("full_")}
  rows = {}
  for name, modes in full.items():
    rows.setdefault(name.rsplit("_seed", 1)[0], []).append(modes)
    for x in modes.values():
      assert _decide(x, None).verdict == period_effect.FLAT
  for seeds in rows.values():
    for padding in PADDINGS:
      x = np.stack([m[padding] for m in seeds])
      assert _decide(x, None).verdict == period_effect.FLAT


def test_full_1kv_in_sequence_period_12_comes_from_summing_seeds_over_shared_prompts(answers):
  x = np.stack([answers[f"full_1kv_seed{s}"]["in_sequence"] for s in range(3)])
  k, n = x.sum(axis=(0, 1)), np.full(24, 3 * 576)
  assert residue_period.detect_period(k, n, [2, 3, 4, 6, 8, 12])[0] == 12  # today's rule
  prompt = residue_effect.from_prompts(x)
  assert prompt.design_effect > 1.5  # seeds' answers to one prompt go together
  decision = _decide(x, None)
  # The phase effect at 12, Bonferroni over the six candidates as both rules read it.
  assert 6 * residue_period.phase_p_value(k, n, 12) <= 0.05
  assert decision.fit(12).phase_p_value > 0.05 and not decision.fit(12).passes
  assert decision.verdict == period_effect.FLAT


def test_summaries_stay_true_of_the_data(answers):
  x = np.stack([answers[f"w8s8_1kv_seed{s}"]["prefix"] for s in range(3)])
  table = residue_effect.from_prompts(x)
  assert residue_shape.working_phases(table, 8) == (2, 3)  # works at 2 of 8 phases
  repeat = residue_shape.stride_repeat(table, 8)
  assert repeat.relative < 0.1 and repeat.repeat < 3 * repeat.noise
  flat = residue_shape.stride_repeat(residue_effect.from_prompts(answers["full_1kv_seed0"][
      "prefix"]), 8)
  assert flat.relative > 0.7  # the flat rows' lag 8 is like any other lag


def _published(prompts):
  with open(PUBLISHED) as f:
    runs = [(r["id"], mode, r["S"], r[key]["acc"]) for r in json.load(f)["runs"]
            for mode, key in (("prefix", "pp"), ("in_sequence", "ip"))]
  with open(FULL) as f:
    runs += [(r["id"], "prefix", None, r["acc"]) for r in json.load(f)["runs"]]
  out = {}
  for name, mode, stride, acc in runs:
    k = np.round(np.asarray(acc) / 100 * prompts)
    table = residue_effect.from_counts(k, np.full(24, prompts))
    gate = ((period_effect.FLAT_DIP, 8, 1 / 64) if stride is None
            else (period_effect.PERIODIC_DIP, stride, 1 / 64))
    out[name, mode] = (stride, period_effect.decide(table, gate=gate))
  return out


FULL_RUNS = ("full_attn_1kv", "full_attn_4kv", "full_attn_8kv")


def test_published_runs_at_576_prompts_per_residue_are_periodic_with_s_and_flat():
  decisions = _published(576)
  compressed = {k: v for k, v in decisions.items() if v[0] is not None}
  assert len(compressed) == 46  # 23 runs x 2 paddings
  for key, (stride, d) in compressed.items():
    assert period_effect.period_is(d, stride), (key, d.verdict, d.period, d.reason)
  for name in FULL_RUNS:
    assert decisions[name, "prefix"][1].verdict == period_effect.FLAT


def test_at_100_prompts_per_residue_the_published_runs_say_why_not():
  decisions = _published(100)
  not_s = {k: d for k, (s, d) in decisions.items()
           if s is not None and not period_effect.period_is(d, s)}
  # W8/S4 prefix (phases 48, 85, 54, 81%) and W8/S6 in-sequence: what the finer period adds
  # is within binomial noise at 100 prompts, so the divisor is the period found.
  assert {k: d.period for k, d in not_s.items()} == {("kvc_w8s4", "prefix"): 2,
                                                    ("kvc_w8s6", "in_sequence"): 3}
  for name in FULL_RUNS:
    d = decisions[name, "prefix"][1]
    assert d.verdict == period_effect.UNDECIDED and "power" in d.reason
