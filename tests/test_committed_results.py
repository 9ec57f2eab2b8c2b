"""The committed sweep outputs (results/demo, study, code_lm, eviction, strides, paper_protocol,
paper_plan5, sparse_prefill) still load and recompute.

Verdicts, claims and the comparison table are pure functions of the stored per-variant records,
so any change to stats, verdicts or report that alters them shows up here, without retraining.
The typed records read the committed (schema version 1) files and write the same JSON back.
"""

from __future__ import annotations

import dataclasses
import functools
import importlib
import json
import os
import re
import shutil

import pytest

from chunkformer.evaluation.claims import registry
from chunkformer.evaluation.claims import rules as claim_rules
from chunkformer.evaluation.records import correctness, loss_rows, results_file
from chunkformer.evaluation.records.variant import VariantRecord
from chunkformer.evaluation.report import markdown as report
from chunkformer.evaluation.report.sections import View
from chunkformer.evaluation.stats import periodicity as stats
from chunkformer.evaluation.stats.seed_rule import VERDICTS
from chunkformer.evaluation.sweep import config as sweep_config
from chunkformer.studies.lm.claims import loss_signatures
from chunkformer.studies.lm.report import loss_tables
from chunkformer.studies.needles.claims import entries, judgments

RESULTS = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "results")
SWEEPS = ["demo", "study", "code_lm", "eviction", "strides", "paper_protocol",
          "paper_plan5", "sparse_prefill"]
CONFIG_ARGS = {"paper_protocol": "cpu_study", "paper_plan5": "plan5"}  # get_config's argument
CONFIG_MODULES = {"paper_plan5": "paper_protocol"}  # where a sweep's config is not its name


def _sweep_config(sweep: str):
  module = CONFIG_MODULES.get(sweep, sweep)
  return importlib.import_module(f"configs.sweeps.{module}").get_config(
      *([CONFIG_ARGS[sweep]] if sweep in CONFIG_ARGS else []))


def _path(sweep: str) -> str:
  return os.path.join(RESULTS, sweep, "results.json")


@functools.cache
def _evidence(sweep: str) -> registry.Evidence:
  """A committed sweep's evidence, gathered once for the tests that read it (the study's
  seed-pooled analyses take most of a minute)."""
  results = results_file.load(_path(sweep))
  s = results.settings
  return registry.evidence(
      results.variants, correctness.loader(os.path.join(RESULTS, sweep)), seed=s["seed"],
      num_resamples=s["num_resamples"], num_permutations=s["num_permutations"],
      rules=claim_rules.of_settings(s))  # the rules the sweep is decided by


def test_rounding_tolerant_comparison_still_sees_every_other_difference():
  _assert_same({"a": [0.1 + 0.2, "x"]}, {"a": [0.3, "x"]}, "tree")
  for got in ({"a": [0.3001, "x"]}, {"a": [0.3, "y"]}, {"a": [0.3]}, {"b": [0.3, "x"]}):
    with pytest.raises(AssertionError):
      _assert_same(got, {"a": [0.3, "x"]}, "tree")


@pytest.mark.parametrize("sweep", SWEEPS)
def test_committed_units_are_exactly_their_sweep_configs(sweep):
  # results/<sweep> is what configs/sweeps/<sweep>.py regenerates: the same units, and each
  # unit directory's recorded config.json is that unit's resolved config (resolve refuses a
  # directory holding a run of another config).
  config = _sweep_config(sweep)
  resolved = sweep_config.resolve(config, os.path.join(RESULTS, sweep))
  committed = [r.name for r in results_file.load(_path(sweep)).variants]
  assert sorted(v.name for v in resolved.variants) == sorted(committed)


@pytest.mark.parametrize("sweep", SWEEPS)
def test_committed_verdicts_and_table_recompute_from_their_stored_records(sweep):
  results = results_file.load(_path(sweep))
  assert results.verdicts and results.variants
  found = _evidence(sweep)
  needles = entries.of(found)
  lines = judgments.verdict_lines(needles.judgments, needles.pooled_judgments)
  # then the lines the paper protocol's claims (C10-C16) carry, where the sweep has their data
  lines += [line for c in registry.decide_on(found) for line in c.numbers.get("lines", ())]
  assert tuple(lines) == results.verdicts
  with open(os.path.join(RESULTS, sweep, "report.md")) as f:
    assert report.comparison_table(results.variants) in f.read()


@pytest.mark.parametrize("sweep", SWEEPS)
def test_committed_results_read_and_write_back_their_own_json(sweep):
  with open(_path(sweep)) as f:
    stored = json.load(f)
  results = results_file.SweepResults.from_json(stored)
  written = json.loads(results_file.dumps(results))
  if stored.get("schema_version") in (2, 3):
    # Version 3 only adds the registry probes' results (none in these sweeps): a version-2 file
    # comes back exactly as stored but for its version number.
    assert written.pop("schema_version") == results_file.SCHEMA_VERSION == 3
    stored = {k: v for k, v in stored.items() if k != "schema_version"}
    assert json.dumps(written, sort_keys=True) == json.dumps(stored, sort_keys=True)
    # Its claims recompute from the stored records and correctness matrices alone: every
    # verdict, reason and count exactly, every number up to float rounding (BLAS picks its
    # kernels by CPU, so a sum may round differently on another machine: up to 1e-14 seen).
    recomputed = registry.decide_on(_evidence(sweep))
    _assert_same([c.to_json() for c in recomputed], [c.to_json() for c in results.claims],
                 "claims")
    return
  assert "schema_version" not in stored and results.claims == ()
  # Version 2 adds fields; every stored one comes back with the same JSON text (types too).
  added = {"schema_version", "claims"}  # and, from version 3, registry probes where any ran
  assert set(written) - set(stored) == added
  for key in stored:
    if key != "variants":
      assert json.dumps(written[key]) == json.dumps(stored[key]), key
  for old, new in zip(stored["variants"], written["variants"], strict=True):
    assert set(new) - set(old) == {"analysis_seed"}
    assert {k: json.dumps(new[k]) for k in old} == {k: json.dumps(v) for k, v in old.items()}


@pytest.mark.parametrize("sweep", SWEEPS)
def test_record_to_json_and_back_is_the_same_record(sweep):
  results = results_file.load(_path(sweep))
  for record in results.variants:
    again = VariantRecord.from_json(json.loads(json.dumps(record.to_json())))
    assert again == record
  claims = tuple(registry.decide(results.variants))
  with_claims = results_file.SweepResults.from_json(
      json.loads(results_file.dumps(dataclasses.replace(results, claims=claims))))
  assert with_claims.claims == claims


@pytest.mark.parametrize("sweep, expected", [
    ("demo", {"C1": "REPRODUCED", "C2": "REPRODUCED", "C3": "INCONCLUSIVE",
              "C5": "INCONCLUSIVE", "C6": "INCONCLUSIVE", "C8": "REPRODUCED",
              "C9": "INCONCLUSIVE"}),
    ("study", {"C1": "INCONCLUSIVE", "C2": "REPRODUCED", "C3": "REPRODUCED", "C4": "REPRODUCED",
               "C5": "REPRODUCED", "C7": "INCONCLUSIVE", "C8": "INCONCLUSIVE",
               "C9": "INCONCLUSIVE"}),
    ("code_lm", {"C7": "INCONCLUSIVE", "E1": "INCONCLUSIVE", "E2": "INCONCLUSIVE",
                 "E3": "INCONCLUSIVE"}),
    ("eviction", {"C2": "REPRODUCED", "E1": "INCONCLUSIVE", "E2": "REPRODUCED",
                  "E3": "REPRODUCED"}),
    ("sparse_prefill", {"C2": "REPRODUCED", "P1": "INCONCLUSIVE", "P2": "REPRODUCED"}),
    ("paper_protocol", {"C10": "NOT REPRODUCED", "C11": "INCONCLUSIVE", "C12": "INCONCLUSIVE",
                        "C13": "INCONCLUSIVE", "C14": "REPRODUCED", "C15": "INCONCLUSIVE",
                        "C16": "INCONCLUSIVE"}),
])
def test_every_claim_has_a_verdict_from_the_committed_records(sweep, expected):
  # The stored claims (the read-back test above recomputes them from records and matrices).
  claims = results_file.load(_path(sweep)).claims
  assert [c.id for c in claims] == ([f"C{i}" for i in range(1, 22)]
                                   + ["E1", "E2", "E3", "E4", "E5", "E6", "P1", "P2"])
  for claim in claims:
    assert claim.verdict in VERDICTS and "NOT TESTED" not in claim.reason
    assert claim.reason, claim.id
  by_id = {c.id: c for c in claims}
  assert {k: by_id[k].verdict for k in expected} == expected
  if sweep == "study":
    # Seeds: every record names its variant and seed; the seeded variants have 2 or 3 seeds.
    variants = results_file.load(_path(sweep)).variants
    seeds = {}
    for r in variants:
      seeds.setdefault(r.setup.variant, set()).add(r.setup.seed)
    assert seeds["full"] == seeds["fixed_m4"] == seeds["dynamic_m4"] == {0, 1, 2}
    assert seeds["fixed_m2"] == seeds["fixed_m8"] == seeds["fixed_m4_shift"] == {0, 1}
    assert seeds["fixed_m8_kv2"] == {0, 1}
    assert seeds["full_kv2"] == seeds["fixed_m2_kv2"] == seeds["fixed_m4_kv2"] == {0, 1, 2}
    # The C9 map's 2-token cells: key shift 2, 3, 4 and the router, 2 seeds each.
    assert all(seeds[f"fixed_m4_kv2_{cell}"] == {0, 1} for cell in ("shift2", "shift3", "shift4"))
    assert seeds["fixed_m4_shift3"] == seeds["fixed_m4_shift4"] == {0, 1}
    assert seeds["dynamic_m4_kv2"] == {0, 1}
    # 3-token needles: the seed rule (3 for full, fixed M = 4, router; 2 for the rest).
    assert seeds["full_kv3"] == seeds["fixed_m4_kv3"] == seeds["dynamic_m4_kv3"] == {0, 1, 2}
    assert all(seeds[v] == {0, 1} for v in (
        "fixed_m2_kv3", "fixed_m8_kv3", "delimiter_m4_kv3", "fixed_m4_kv3_shift2",
        "fixed_m4_kv3_shift3", "fixed_m4_kv3_shift4"))
    # Sixth part: the delimiter on 2-token needles, full attention with the shift (2, 3 tokens).
    assert all(seeds[v] == {0, 1} for v in (
        "delimiter_m4_kv2", "full_kv2_shift2", "full_kv3_shift2"))
    # Seventh part: C5's pair (3 seeds) and full control (2) on 2-token needles at 4000 steps;
    # that block decides C5 (the longest budget of its needle length), the 3000-step one not.
    assert seeds["fixed_m2_kv2_long"] == seeds["fixed_m4_kv2_long"] == {0, 1, 2}
    assert seeds["full_kv2_long"] == {0, 1}
    c5 = by_id["C5"].numbers
    assert c5["key2_value2_steps4000"]["verdict"] == "REPRODUCED"
    assert c5["key2_value2_steps4000"]["difference_high"] < 0
    assert "3000 steps" in by_id["C5"].reason and "longer budget" in by_id["C5"].reason
    # C9 is mapped beyond 1-token needles: there the shift reduces the gap but stays periodic.
    assert "fixed_m4_kv2_shift2: NOT REPRODUCED" in by_id["C9"].reason
    # Eighth part: the shift trained only in the second half (2 seeds each); still periodic.
    assert all(seeds[v] == {0, 1} for v in (
        "fixed_m4_kv2_shift3_late", "fixed_m4_kv3_shift4_late"))
    assert seeds["full_kv2_shift3_late"] == {0, 1, 2}  # a third seed in the ninth part
    assert {r.setup.key_shift_frozen_steps for r in variants
            if r.setup.variant.endswith("_late")} == {1500, 1250}
    assert "fixed_m4_kv2_shift3_late: NOT REPRODUCED" in by_id["C9"].reason
    # Ninth and tenth parts: keys and queries shifted (2 seeds each); much higher accuracy, a
    # small period left in both needle lengths.
    assert all(seeds[v] == {0, 1} for v in (
        "fixed_m4_kv2_qkshift3", "full_kv2_qkshift3", "fixed_m4_kv3_qkshift4",
        "full_kv3_qkshift4"))
    assert all(r.setup.query_shift == ("qkshift" in r.setup.variant) for r in variants)
    assert "fixed_m4_kv2_qkshift3: NOT REPRODUCED" in by_id["C9"].reason
    # Eleventh part: the ninth part's pair at twice its budget (6000 steps, 2 seeds each); the
    # fixed model stays periodic over all depths in both seeds.
    assert seeds["fixed_m4_kv2_qkshift3_6k"] == seeds["full_kv2_qkshift3_6k"] == {0, 1}
    assert {r.trained_steps for r in variants if r.setup.variant.endswith("_6k")} == {6000}
    assert "fixed_m4_kv2_qkshift3_6k: NOT REPRODUCED" in by_id["C9"].reason
    # Twelfth part: the same for 3-token needles (5000 steps, twice the tenth part's budget).
    assert seeds["fixed_m4_kv3_qkshift4_5k"] == seeds["full_kv3_qkshift4_5k"] == {0, 1}
    assert {r.trained_steps for r in variants if r.setup.variant.endswith("_5k")} == {5000}
    assert "fixed_m4_kv3_qkshift4_5k: NOT REPRODUCED" in by_id["C9"].reason
    # Thirteenth part: the ninth part's pair twice as wide (3000 steps, 2 seeds each); the
    # widths themselves are pinned by the units-equal-their-configs test above.
    assert seeds["fixed_m4_kv2_qkshift3_wide"] == seeds["full_kv2_qkshift3_wide"] == {0, 1}
    assert {r.trained_steps for r in variants if r.setup.variant.endswith("_wide")} == {3000}
    assert "fixed_m4_kv2_qkshift3_wide: NOT REPRODUCED" in by_id["C9"].reason
    # C7 was decided from data: the code LM did not learn the needles.
    assert "not learned" in by_id["C7"].reason
    # C8 says what was shown: absolute position, and the weak spot inside the actual chunk.
    assert "in absolute position" in by_id["C8"].statement
    assert "inside its own chunk" in by_id["C8"].reason
  if sweep == "demo":
    # Two seeds of each variant: C1, C2 and C8 rest on both seeds and the seed-pooled test,
    # which reads the correctness matrices; the records alone (no matrices) decide none of them.
    stored = results_file.load(_path(sweep))
    seeds: dict[str, set[int]] = {}
    for r in stored.variants:
      seeds.setdefault(r.setup.variant, set()).add(r.setup.seed)
    assert seeds == {"full": {0, 1}, "fixed_m4": {0, 1}, "dynamic_m4": {0, 1}}
    for claim in ("C1", "C2", "C8"):
      assert by_id[claim].seeds_agreeing == "2/2"
      assert "seed-pooled test holds" in by_id[claim].reason
    plain = {c.id: c for c in registry.decide(
        stored.variants, rules=claim_rules.of_settings(stored.settings))}
    for claim in ("C1", "C2", "C8"):
      assert plain[claim].verdict == "INCONCLUSIVE"
      assert "correctness matrices not stored" in plain[claim].reason


def test_committed_demo_statistics_recompute_from_its_correctness_matrices():
  results = results_file.load(_path("demo"))
  s = results.settings
  for record in results.variants:
    matrices = correctness.load(correctness.path_for(os.path.join(RESULTS, "demo"),
                                                     record.name))
    far = matrices["needle_far"]
    sizes = [t.chunk_size for t in record.analysis.by_chunk_size]
    again = stats.analyze(far.correct_YxJ, far.offsets_J, sizes, seed=s["seed"],
                          num_resamples=s["num_resamples"],
                          num_permutations=s["num_permutations"])
    # Every interval, p-value and the period; bootstrap percentiles may differ in the last bits
    # on another CPU (numpy's vectorised sums), so floats compare to 1e-9.
    _assert_same(dataclasses.asdict(again), dataclasses.asdict(record.analysis), record.name)


def _assert_same(a, b, where: str) -> None:
  """Equal trees, floats to a relative 1e-9."""
  if isinstance(a, dict):
    assert isinstance(b, dict) and a.keys() == b.keys(), where
    for key in a:
      _assert_same(a[key], b[key], f"{where}.{key}")
  elif isinstance(a, (list, tuple)):
    assert isinstance(b, (list, tuple)) and len(a) == len(b), where
    for i, (x, y) in enumerate(zip(a, b, strict=True)):
      _assert_same(x, y, f"{where}[{i}]")
  elif isinstance(a, float) and isinstance(b, float):
    assert a == pytest.approx(b, rel=1e-9, abs=1e-12, nan_ok=True), where
  else:
    assert a == b, where


def test_committed_lm_loss_tables_recompute_from_the_stored_rows(tmp_path):
  """results/code_lm: each record's signature and the report's loss-by-position tables follow
  from the per-token rows in lm_loss/ (every unit seeded 0..2, C7 undecided: not learned)."""
  directory = os.path.join(RESULTS, "code_lm")
  results = results_file.load(_path("code_lm"))
  s = results.settings
  resampling = dict(seed=s["seed"], num_resamples=s["num_resamples"],
                    num_permutations=s["num_permutations"])
  load = loss_rows.loader(directory)
  seeds = {}
  for r in results.variants:
    seeds.setdefault(r.setup.variant, set()).add(r.setup.seed)
    assert r.lm_phase_loss["signature"] == load(r.name).signature(4, **resampling), r.name
  assert seeds == {v: {0, 1, 2} for v in ("full", "fixed_m4", "dynamic_m4", "fixed_m4_shift",
                                          "full_shift")}
  judged = loss_signatures.Tables(
      loss_signatures.code_accuracies(results.variants),
      loss_signatures.pooled_signatures(results.variants, load, **resampling))
  tables = loss_tables.sections(View(results.variants, (), judged, str(tmp_path), directory))
  with open(os.path.join(directory, "report.md")) as f:
    text = f.read()
  assert "seeds pooled)" in tables
  for line in tables.splitlines():
    if not line.startswith("!["):  # the figure went to tmp_path
      assert line in text
  assert "not learned" in {c.id: c for c in results.claims}["C7"].reason


def _without_rejudge_note(text: str) -> str:
  """The report without its "Judged again on <date> by <command>" paragraph (the one line a
  rejudge adds or rewrites) and the machine a run used."""
  text = re.sub(r"\n\nJudged again on [^\n]*", "", text)
  return "\n".join(line.split("; machine: ")[0] for line in text.splitlines()) + "\n"


@pytest.mark.parametrize("sweep", SWEEPS)
def test_committed_sweeps_rejudge_to_their_own_report_and_claims(sweep, tmp_path):
  """A rejudge of each committed sweep (records, correctness matrices and loss rows only)
  writes its committed report.md again, byte for byte but for the rejudge note, and the same
  verdicts, variants and claims (numbers up to float rounding)."""
  from chunkformer.evaluation.sweep import run as sweep_run

  source = os.path.join(RESULTS, sweep)
  for item in ("results.json", "correct", "lm_loss"):
    path = os.path.join(source, item)
    if os.path.isdir(path):
      shutil.copytree(path, tmp_path / item)
    elif os.path.exists(path):
      shutil.copy(path, tmp_path / item)
  config = _sweep_config(sweep)
  outcome = sweep_run.rejudge(config, str(tmp_path), command="rejudge")
  with open(os.path.join(source, "report.md"), encoding="utf-8") as f:
    committed = f.read()
  with open(outcome.report_path, encoding="utf-8") as f:
    again = f.read()
  assert _without_rejudge_note(again) == _without_rejudge_note(committed)
  with open(_path(sweep)) as f:
    stored = json.load(f)
  with open(outcome.results_path) as f:
    written = json.load(f)
  for key in stored:
    if key not in ("schema_version", "claims", "current_rules"):
      assert written[key] == stored[key], key
  _assert_same(written["claims"], stored["claims"], "claims")
  # A sweep judged under older claim rules also stores its claims under the current ones.
  assert ("current_rules" in written) == ("current_rules" in stored)
  if "current_rules" in stored:
    _assert_same(written["current_rules"], stored["current_rules"], "current_rules")
