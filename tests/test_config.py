"""The run config as the rest of the code sees it: sections re-exported by chunkformer.config,
the data section's checks split between its fields and its task, and records that read back."""

from __future__ import annotations

import glob
import json
import os
import re

import pytest

from chunkformer import config as config_lib
from chunkformer import data as data_lib
from chunkformer import workdir as workdir_lib
from chunkformer.config import AttentionConfig, Config, ConfigError, DataConfig, ModelConfig

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
COMMITTED_RUNS = sorted(os.path.dirname(p) for p in glob.glob(
    os.path.join(ROOT, "results", "**", workdir_lib.CONFIG_FILE), recursive=True))


def _flatten(tree, prefix=""):
  if isinstance(tree, dict):
    return {k: v for key, value in tree.items()
            for k, v in _flatten(value, f"{prefix}{key}.").items()}
  return {prefix[:-1]: tree}


def test_data_section_checks_its_fields_alone_and_the_task_in_check_config():
  short = DataConfig(seq_len=40)  # 16 kv needles and 4 queries need more tokens
  short.validate_fields()  # the fields alone are fine
  with pytest.raises(ConfigError, match=r"'data\.seq_len'.*need >= "):
    data_lib.check_config(short)
  with pytest.raises(ConfigError, match=r"'data\.seq_len'"):
    data_lib.make_batch(short, seed=0, step=0, split="train")
  with pytest.raises(ConfigError, match=r"'data\.seq_len'"):
    Config(data=short).validate()
  with pytest.raises(ConfigError, match=r"'data\.num_filler'"):  # field checks come first
    data_lib.check_config(DataConfig(seq_len=40, num_filler=0))


@pytest.mark.parametrize("config", [
    Config(),
    Config(model=ModelConfig(vocab_size=260, num_layers=4, attention=AttentionConfig(kind="fixed"),
                             layer_pattern="chunk_size=4,overlap=true;chunk_size=8"),
           data=DataConfig(task="code", seq_len=128, code_needles=2), seed=3),
], ids=["default", "pattern_code"])
def test_config_round_trips_through_its_json_record(config):
  record = json.loads(json.dumps(config_lib.to_dict(config)))  # what config.json holds
  assert config_lib.from_dict(record) == config


@pytest.mark.parametrize("run", COMMITTED_RUNS, ids=lambda p: os.path.relpath(p, ROOT))
def test_committed_run_record_reads_back_with_the_values_it_recorded(run):
  with open(os.path.join(run, workdir_lib.CONFIG_FILE)) as f:
    recorded = _flatten(json.load(f))
  read = _flatten(workdir_lib.config_json(workdir_lib.read_config(run)))
  assert {k: read.get(k, "<absent>") for k in recorded} == recorded
  # Fields newer than the run read back as the run behaved: their legacy value, else the default.
  defaults = _flatten(workdir_lib.config_json(Config()))
  legacy = {".".join(path): value for path, value in workdir_lib.LEGACY_VALUES.items()}
  assert {k: read[k] for k in read.keys() - recorded.keys()} == {
      k: legacy.get(k, defaults[k]) for k in read.keys() - recorded.keys()}


def test_committed_runs_are_found():
  assert len(COMMITTED_RUNS) >= 10


@pytest.mark.parametrize("path, value, expected", [
    (("model", "attention", "chunk_size"), "four", "expected int, got 'four' (str)"),
    (("train", "learning_rate"), "fast", "expected float, got 'fast' (str)"),
    (("model", "rope"), 1, "expected bool, got 1 (int)"),
    (("train", "steps"), True, "expected int, got True (bool)"),
])
def test_a_value_of_the_wrong_type_is_refused_naming_the_field(path, value, expected):
  values = config_lib.to_dict(Config())
  node = values
  for key in path[:-1]:
    node = node[key]
  node[path[-1]] = value
  with pytest.raises(ConfigError, match=re.escape(f"config field '{'.'.join(path)}': {expected}")):
    config_lib.from_dict(values)


def test_an_int_where_a_float_is_expected_is_accepted():
  values = config_lib.to_dict(Config())
  values["train"]["learning_rate"] = 1
  assert config_lib.from_dict(values).train.learning_rate == 1
