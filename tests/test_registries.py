"""The registries, used the documented way: a toy study (a ``Study`` with one probe, one claim,
a judging table and a report section, added to ``chunkformer.studies.STUDIES``) shows up in
results.json and in the report of a real (tiny) sweep, its probe enabled by
``sweep.probes.<name>``."""

from __future__ import annotations

import dataclasses
import functools
import json
import os
import types

import numpy as np
import pytest

from chunkformer import data as data_lib
from chunkformer import studies
from chunkformer.config import ConfigError, DataConfig
from chunkformer.evaluation.claims import registry as claim_registry
from chunkformer.evaluation.probes import registry as probe_registry
from chunkformer.evaluation.probes.base import ProbeContext, ProbeResult
from chunkformer.evaluation.records import correctness, results_file
from chunkformer.evaluation.records.claim import Claim
from chunkformer.evaluation.report import figures, sections
from chunkformer.evaluation.stats.seed_rule import NOT_REPRODUCED, REPRODUCED
from chunkformer.evaluation.sweep import catalog
from chunkformer.evaluation.sweep import run as sweep
from chunkformer.studies.needles.probes import key_overlap
from configs.sweeps import sweep_config as make_sweep
from configs.sweeps import variant

SMOKE = variant("configs/smoke.py", {"train.steps": 2, "train.checkpoint_every": 2,
                                     "data.num_queries": 1})
TINY = dict(name="tiny", num_offsets=12, num_haystacks=3, depths=(0.0, 1.0), prefix_prompts=0,
            slot_gain_rows=0, eval_batch_size=8, num_resamples=20, num_permutations=20)

# The toy probe's module: what "one module" of a new probe holds.
TOY_PROBE = types.ModuleType("toy_probe")


def _first_token_probe(context: ProbeContext, rows: int = 4) -> ProbeResult:
  """Predicts ``rows`` rows of the model's own held-out data and records how often the greedy
  prediction at position 0 equals the target there; the outcome matrix is stored too."""
  config = context.trained.config
  batch = data_lib.make_batch(config.data, seed=config.seed, step=0, split="heldout")
  batch = {k: v[:rows] for k, v in batch.items()}
  predicted = context.predict(batch)["predictions"]
  right_Yx1 = (predicted[:, :1] == batch["targets"][:, :1]).astype(np.float64)
  return ProbeResult({"rows": rows, "first_token_accuracy": float(right_Yx1.mean()),
                      "unit": context.unit},
                     {"first": correctness.Matrix(right_Yx1, np.zeros(1, np.int64))})


TOY_PROBE.probe = _first_token_probe


def _toy_claim(evidence: claim_registry.Evidence) -> Claim:
  """C22 (toy): every unit's toy probe ran on the rows it was asked for."""
  found = {r.name: (r.probes or {}).get("first_token") for r in evidence.records}
  holds = all(v is not None and v["rows"] == 3 for v in found.values())
  return Claim("C22", "the toy probe ran on every unit", REPRODUCED if holds else NOT_REPRODUCED,
               f"{len(found)} unit(s) checked", {"units": sorted(found)}, f"{len(found)}/1")


def _toy_section(view: sections.View) -> str:
  """The toy study's report section: formats the number its judging hook computed."""
  return f"\n## Toy study\n\nFirst-token accuracy over {view.tables['units']} unit(s) judged.\n"


# What the toy study's package exports (docs/extending.md, "How to add a study").
TOY_STUDY = catalog.Study(
    name="toy",
    probes={"first_token": TOY_PROBE.probe},
    claims={"C22": _toy_claim},
    judging=claim_registry.Judging(tables=lambda e: {"units": len(e.records)}),
    report=sections.ReportHooks(sections=_toy_section))

# Every registry the studies fill (restored after each test that installs the toy study).
_REGISTRIES = ((probe_registry, "PROBES"), (probe_registry, "OPTION_CHECKS"),
               (claim_registry, "CLAIMS"), (claim_registry, "JUDGING"), (sections, "HOOKS"),
               (figures, "KINDS"), (catalog, "INSTALLED"))


@pytest.fixture
def registered(monkeypatch):
  # The documented way: the study's entry in ``STUDIES``, then ``install`` (as eval.py does).
  saved = [(getattr(module, name), dict(getattr(module, name))) for module, name in _REGISTRIES]
  monkeypatch.setattr(studies, "STUDIES", (*studies.STUDIES, TOY_STUDY))
  studies.install()
  yield
  # The test's own monkeypatching (spies put into PROBES) undone first, or its undo would put
  # the toy study's probe back after the registries are restored.
  monkeypatch.undo()
  for registry, contents in saved:  # in place: other modules hold these dicts by reference
    registry.clear()
    registry.update(contents)


def _spy(name: str, calls: list):
  """PROBES[name], recording each call's options."""
  real = probe_registry.PROBES[name]

  @functools.wraps(real)  # its signature: the options and their defaults
  def probe(context, **options):
    calls.append((name, options))
    return real(context, **options)
  return probe


def test_a_toy_probe_and_claim_reach_results_json_and_the_report(registered, tmp_path,
                                                                 monkeypatch):
  calls = []
  for name in ("needle_sweep", "prefix_probe", "slot_gain", "lm_phase_loss", "first_token"):
    monkeypatch.setitem(probe_registry.PROBES, name, _spy(name, calls))
  config = make_sweep({"smoke": SMOKE}, **TINY)
  config.sweep.probes.first_token = dict(rows=3)  # as a sweep config file enables it
  outcome = sweep.run(config, str(tmp_path), command="test")
  # The built-ins run through the registry too, in its order, with the config's options: TINY
  # switches the prefix probe and the slot gains off (the older flat fields), so they never
  # ran, and their record fields and report sections are absent.
  assert calls == [("needle_sweep", {"num_offsets": 12, "num_haystacks": 3,
                                     "depths": (0.0, 1.0)}),
                   ("first_token", {"rows": 3})]
  with open(outcome.results_path) as f:
    stored = json.load(f)
  assert stored["schema_version"] == 3
  # The built-ins TINY leaves on (the needle sweep), then the toy probe, with all options.
  assert stored["settings"]["probes"] == {
      "needle_sweep": {"num_offsets": 12, "num_haystacks": 3, "depths": [0.0, 1.0]},
      "first_token": {"rows": 3}}
  (entry,) = stored["variants"]
  record = entry["probes"]["first_token"]
  assert record["rows"] == 3 and record["unit"] == "smoke"
  assert 0.0 <= record["first_token_accuracy"] <= 1.0
  matrices = correctness.load(correctness.path_for(str(tmp_path), "smoke"))
  assert matrices["first_token_first"].correct_YxJ.shape == (3, 1)
  assert matrices["first_token_first"].correct_YxJ.mean() == record["first_token_accuracy"]
  claims = {c["id"]: c for c in stored["claims"]}
  assert list(claims)[-1] == "C22" and claims["C22"]["verdict"] == REPRODUCED
  assert claims["C22"]["numbers"] == {"units": ["smoke"]}
  with open(outcome.report_path) as f:
    report = f.read()
  assert "## Probes enabled by the sweep config" in report
  assert "## Needle sweep by depth" in report
  assert "## Prefix probe" not in report and "## Slot gains" not in report
  assert entry["primary_probe"] == "needle" and entry["slot_gain"] is None
  assert "prefix_probe" not in entry and "slot_gain_init" not in entry
  assert f"| smoke | first_token | `{json.dumps(record, sort_keys=True)}` |" in report
  # the summary's table states the claim, "Claims in full" gives its reason
  assert "| C22 | REPRODUCED | 1/1 | the toy probe ran on every unit |" in report
  assert ("- **C22** REPRODUCED (1/1 seeds agreeing): the toy probe ran on every unit; 1 unit(s) "
          "checked") in report
  assert report.rstrip().endswith("First-token accuracy over 1 unit(s) judged.")
  # The typed results read it back (schema 3), and a rejudge keeps it.
  assert results_file.load(outcome.results_path).variants[0].probes["first_token"] == record
  again = sweep.rejudge(config, str(tmp_path), command="rejudge")
  assert [c.id for c in again.claims][-1] == "C22"


@pytest.mark.parametrize("probes, match", [
    ({"no_such_probe": {}}, r"'sweep\.probes\.no_such_probe': no such probe; known: .*"
                            r"first_token"),
    ({"first_token": {"rowz": 3}}, r"'sweep\.probes\.first_token': .*rowz"),
    ({"first_token": 3}, r"'sweep\.probes\.first_token': give the probe's options as a dict"),
    ({"lm_phase_loss": {"batchez": 2}}, r"'sweep\.probes\.lm_phase_loss': .*batchez"),  # built-in
])
def test_a_bad_probe_entry_is_refused_before_anything_trains(registered, tmp_path, probes,
                                                             match):
  config = make_sweep({"smoke": SMOKE}, probes=probes, **TINY)
  with pytest.raises(ConfigError, match=match):
    sweep.run(config, str(tmp_path / "run"))
  assert not os.path.exists(tmp_path / "run" / "smoke")


def test_the_registries_hold_the_projects_own_entries():
  assert list(claim_registry.CLAIMS) == ([f"C{i}" for i in range(1, 22)]
                                         + ["E1", "E2", "E3", "E4", "E5", "E6", "P1", "P2"])
  assert "key_overlap" in probe_registry.PROBES
  assert list(sections.HOOKS) == list(claim_registry.JUDGING) == [s.name for s in studies.STUDIES]


def test_installing_again_changes_nothing_and_a_clash_is_refused():
  before = (list(probe_registry.PROBES), list(claim_registry.CLAIMS))
  studies.install()
  assert (list(probe_registry.PROBES), list(claim_registry.CLAIMS)) == before
  impostor = catalog.Study(name="paper")
  with pytest.raises(ValueError, match="a different study named 'paper'"):
    catalog.install([impostor])
  thief = catalog.Study(name="thief", claims={"C1": _toy_claim})
  with pytest.raises(ValueError, match="claim 'C1' of study 'thief'"):
    claim_registry.register(thief.name, thief.claims, thief.judging)


def test_the_key_overlap_probe_scores_a_perfect_reader_perfectly():
  data = DataConfig(seq_len=96, num_pairs=6, key_len=2, value_len=2, num_queries=2,
                    num_symbols=16, near_distance=30)
  trained = types.SimpleNamespace(config=types.SimpleNamespace(data=data))
  context = ProbeContext(trained, lambda rows: {"predictions": rows["targets"]}, "unit", (4,))
  result = key_overlap.probe(context, rows=64, seed=3)
  assert [r["shared"] for r in result.record["suffix"]] == [0, 1]
  assert sum(r["queries"] for r in result.record["suffix"]) == 64 * data.num_queries
  assert all(r["needle_accuracy"] in (None, 1.0) for side in ("suffix", "prefix")
             for r in result.record[side])
  code = types.SimpleNamespace(config=types.SimpleNamespace(data=DataConfig(task="code")))
  assert key_overlap.probe(dataclasses.replace(context, trained=code)).record is None

