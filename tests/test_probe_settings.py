"""``sweep.probes`` settings: the built-in probes are registry entries enabled by the sweep
config; the flat fields of older sweep configs (and of the settings stored in committed
results.json files) read as the same probes, and bad entries are refused naming the field."""

from __future__ import annotations

import importlib
import json
import os

import ml_collections
import pytest

from chunkformer import studies
from chunkformer.config import ConfigError
from chunkformer.evaluation.probes import instruments, registry
from chunkformer.evaluation.sweep import config as sweep_config
from chunkformer.evaluation.sweep import probe_settings

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _settings(sweep: dict) -> sweep_config.SweepSettings:
  return sweep_config.settings_from(ml_collections.ConfigDict({"sweep": sweep}))


def test_the_instruments_come_first_then_each_study_s_probes_in_study_order():
  assert list(registry.PROBES)[:3] == ["needle_sweep", "prefix_probe", "slot_gain"]
  assert list(registry.PROBES)[3:] == [name for study in studies.STUDIES for name in study.probes]
  assert registry.PROBES["needle_sweep"] is instruments.run_needle_sweep
  assert registry.enabled({"key_overlap": {}, "slot_gain": {}, "needle_sweep": {}}) == [
      "needle_sweep", "slot_gain", "key_overlap"]


def test_without_probes_a_sweep_runs_the_built_ins_with_the_old_defaults():
  # What the flat settings' defaults ran: needle sweep (K derived, 32 haystacks, 3 depths),
  # prefix probe (32 prompts, N_max derived, 4 code needles), slot gains on 64 rows.
  assert _settings({}).probes == {
      "needle_sweep": {"num_offsets": 0, "num_haystacks": 32, "depths": (0.0, 0.5, 1.0)},
      "prefix_probe": {"prompts": 32, "max_prefix": 0, "code_needles": 4},
      "slot_gain": {"rows": 64}}


def test_legacy_flat_fields_read_as_the_same_probes():
  old = _settings({"num_offsets": 16, "num_haystacks": 48, "prefix_max": 12,
                   "prefix_prompts": 0, "slot_gain_rows": 8, "phase_loss_batches": 4,
                   "probes": {"key_overlap": {"rows": 5}}})
  assert old.probes == {
      "needle_sweep": {"num_offsets": 16, "num_haystacks": 48, "depths": (0.0, 0.5, 1.0)},
      "slot_gain": {"rows": 8}, "lm_phase_loss": {"batches": 4},
      "key_overlap": {"rows": 5, "seed": 12345}}  # prefix_prompts = 0 switched the probe off
  new = _settings({"probes": {"needle_sweep": {"num_offsets": 16, "num_haystacks": 48},
                              "slot_gain": {"rows": 8}, "lm_phase_loss": {"batches": 4},
                              "key_overlap": {"rows": 5}}})
  assert new == old
  with pytest.raises(ConfigError, match=r"'sweep\.probes\.slot_gain': also set by "
                                        r"sweep\.slot_gain_rows"):
    _settings({"slot_gain_rows": 8, "probes": {"slot_gain": {"rows": 8}}})


@pytest.mark.parametrize("sweep", ["demo", "study", "code_lm"])
def test_each_committed_sweep_config_runs_the_probes_its_results_were_made_with(sweep):
  # The settings stored in results/<sweep>/results.json (sweep.probes, or the older flat
  # fields) and those of configs/sweeps/<sweep>.py (sweep.probes) compare equal, so the
  # committed records stay current for the sweep code (units added to the config train and
  # merge in place).
  config = importlib.import_module(f"configs.sweeps.{sweep}").get_config()
  with open(os.path.join(ROOT, "results", sweep, "results.json")) as f:
    stored = json.load(f)["settings"]
  assert ("probes" in stored) != ("slot_gain_rows" in stored)  # one form, never both
  # The claim rules are judged, not measured: a stored file without them was judged under
  # version 1 (claims.rules), which changes no record.
  def measured(settings):
    return probe_settings.comparable({k: v for k, v in settings.items() if k != "rules"})
  assert measured(sweep_config.settings_from(config).to_json()) == measured(stored)


@pytest.mark.parametrize("sweep, match", [
    ({"probes": {"needle_sweep": {"num_haystakcs": 4}}},
     r"'sweep\.probes\.needle_sweep': .*num_haystakcs"),
    ({"probes": {"prefix_probe": {"prompts": 0}}},
     r"'sweep\.probes\.prefix_probe\.prompts': must be an integer >= 1, got 0"),
    ({"probes": {"needle_sweep": {"depths": ()}}}, r"'sweep\.probes\.needle_sweep\.depths'"),
    ({"slot_gain_rowz": 8}, r"'sweep\.slot_gain_rowz' is unknown; .*slot_gain_rows"),
])
def test_a_bad_probe_setting_names_its_field(sweep, match):
  with pytest.raises(ConfigError, match=match):
    _settings(sweep)


def test_a_probe_set_to_none_is_off():
  probes = _settings({"probes": {**probe_settings.defaults(), "slot_gain": None}}).probes
  assert list(probes) == ["needle_sweep", "prefix_probe"]
