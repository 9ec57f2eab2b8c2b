"""C17-C21 (the cures under the paper's protocol) on constructed answer matrices whose
verdicts are known by hand: a flat cure with a periodic reference removes the period, a cure
that stays periodic does not, a cure without a periodic reference has nothing to remove, a
cure near chance is undecided; and what remains inside the chunk is described by phase."""

from __future__ import annotations

import numpy as np

from chunkformer.evaluation.records import correctness
from chunkformer.evaluation.records.variant import VariantRecord, VariantSetup
from chunkformer.evaluation.stats import periodicity
from chunkformer.studies.paper.claims import cure_claims, effect_size, main_table
from chunkformer.studies.paper.report import paper_table

BASE = periodicity.analyze(np.ones((2, 12)), np.arange(12), [4], num_resamples=10,
                           num_permutations=10)
PERIODIC = np.tile([0.9] * 7 + [0.2], 3)  # period 8, phase 7 weak
FLAT = np.full(24, 0.6)
CHANCE = np.full(24, 0.04)
# every prompt's best non-reading strategy: a random value of 32 (the retrieval gate's floor)
SHORTCUTS = {p: {"mean": 1 / 32} for p in ("prefix", "in_sequence")}


def _answers(curve, seed, prompts=576):
  rng = np.random.default_rng(seed)
  return (rng.random((prompts, 24)) < curve).astype(np.float64)


def _sweep(rows):
  """rows: name -> (attention, S, curve, seeds) as records and a loader of their matrices;
  a dynamic row's target key sits at phase (residue mod 8) of its chunk."""
  records, stored = [], {}
  for i, (name, (attention, s, curve, seeds)) in enumerate(rows.items()):
    for k in range(seeds):
      unit = f"{name}_seed{k}"
      records.append(VariantRecord(
          VariantSetup(name, attention, attention, chunk_size=s, seed=k, name=unit),
          BASE, "lookup", 100, None, probes={"lookup": {"modes": {}, "shortcuts": SHORTCUTS}}))
      x = _answers(curve, 100 * i + k)
      phases = np.broadcast_to(np.arange(24) % 8, x.shape) if attention == "dynamic" else None
      m = correctness.Matrix(x, np.arange(24), phases_YxJ=phases)
      stored[unit] = {"lookup_prefix": m, "lookup_in_sequence": m}
  return records, stored.get


def _judge(claim_id, rows):
  records, load = _sweep(rows)
  return cure_claims.judge(claim_id, records, effect_size.decisions(records, load), load)


def test_a_flat_cure_beside_a_periodic_reference_removes_the_period():
  claim = _judge("C17", {"w8s8_1kv": ("fixed", 8, PERIODIC, 3),
                         "cure_random_phase": ("fixed", 8, FLAT, 3)})
  assert claim.verdict == "REPRODUCED" and claim.seeds_agreeing == "3/3"
  assert "inside the chunk, by phase of the evaluation grid" in claim.numbers[
      "cure_random_phase"]["inside_chunk"]


def test_a_cure_that_stays_periodic_fails_and_one_near_chance_is_undecided():
  stays = _judge("C19", {"w8s8_1kv": ("fixed", 8, PERIODIC, 2),
                         "cure_key_shift": ("fixed", 8, PERIODIC, 2)})
  assert stays.verdict == "NOT REPRODUCED"
  near_chance = _judge("C19", {"w8s8_1kv": ("fixed", 8, PERIODIC, 2),
                               "cure_key_shift": ("fixed", 8, CHANCE, 2)})
  assert near_chance.verdict == "INCONCLUSIVE"


def test_without_a_periodic_reference_there_is_nothing_to_remove():
  claim = _judge("C18", {"w8s8_8kv": ("fixed", 8, FLAT, 2),
                         "cure_stagger_8kv": ("fixed", 8, FLAT, 2)})
  assert claim.verdict == "INCONCLUSIVE" and "nothing to remove" in claim.reason
  assert _judge("C21", {"w8s8_1kv": ("fixed", 8, PERIODIC, 2)}).reason.startswith("no data")


def test_dynamic_chunking_is_the_common_verdict_of_its_routers_and_shows_chunk_phases():
  rows = {"cure_dynamic_fixed": ("dynamic", 8, PERIODIC, 2),
          "cure_dynamic_router": ("dynamic", 8, FLAT, 2),
          "cure_dynamic_router_end": ("dynamic", 8, PERIODIC, 2)}
  claim = _judge("C20", rows)
  assert claim.verdict == "INCONCLUSIVE" and "disagree" in claim.reason
  inside = claim.numbers["cure_dynamic_router_end"]["inside_chunk"]
  assert "in the chunk the model formed" in inside and "7: 2" in inside  # phase 7 weak, ~20%
  rows["cure_dynamic_router_end"] = ("dynamic", 8, FLAT, 2)
  assert _judge("C20", rows).verdict == "REPRODUCED"


def test_the_reports_line_for_a_cure_names_its_verdict_and_what_remains_inside():
  claim = _judge("C17", {"w8s8_1kv": ("fixed", 8, PERIODIC, 3),
                         "cure_random_phase": ("fixed", 8, FLAT, 3)})
  line = paper_table.cure_line(claim, main_table.Tables())
  # no pooled residue tables in these records: the gaps read "-"
  assert line.startswith("cure_random_phase: REPRODUCED, prefix gap - points against - for "
                         "w8s8_1kv; inside the chunk, by phase of the evaluation grid")
  assert line.endswith("the paper tested no such cure (its cure is DeepSeek-V4.1's stride "
                       "of 2, C21)")
