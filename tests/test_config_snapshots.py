"""The run configs resolve to exactly the values they had when the snapshot was written.

`tests/data/config_snapshots.json` holds, per config (and per argument of `lm/qwen3_tiny`), every
field whose value differs from `configs/base.py`, written from the configs as they stood before
the kv-task and schedule block moved into `configs/common.py` (commit 2bf800f). Comparing
base + snapshot to the whole resolved config catches a changed, added or dropped field, while a
default added later to the dataclasses (same in base and config) leaves the test as it is.
"""

from __future__ import annotations

import importlib
import json
import os

import pytest

from chunkformer import config as config_lib
from chunkformer.evaluation.sweep.config import flatten
from configs import base

SNAPSHOT = os.path.join(os.path.dirname(__file__), "data", "config_snapshots.json")


def _as_json(config):
  """The config as JSON reads it back (tuples become lists), flattened to dotted fields."""
  return flatten(json.loads(json.dumps(config.to_dict())))


def _load(name):
  module, _, arg = name.partition(":")
  get_config = importlib.import_module("configs." + module.replace("/", ".")).get_config
  return get_config(arg) if arg else get_config()


with open(SNAPSHOT) as f:
  _SNAPSHOTS = json.load(f)


def test_the_snapshot_covers_the_six_configs_that_share_the_task_and_schedule_block():
  names = {name.partition(":")[0] for name in _SNAPSHOTS}
  six = {"kv_full", "kv_chunk", "deepseek_v4_small", "smoke", "code_full", "lm/qwen3_tiny"}
  assert six <= names


@pytest.mark.parametrize("name", sorted(_SNAPSHOTS))
def test_config_resolves_to_its_snapshot(name):
  config = _load(name)
  expected = flatten(json.loads(json.dumps(base.get_config().to_dict())))
  unknown = set(_SNAPSHOTS[name]) - set(expected)
  assert not unknown, f"{name}: snapshot fields unknown to configs/base.py: {sorted(unknown)}"
  expected.update(_SNAPSHOTS[name])
  actual = _as_json(config)
  differing = {k: (actual.get(k), expected.get(k)) for k in set(actual) | set(expected)
               if actual.get(k) != expected.get(k)}
  assert not differing, f"{name}: fields (now, snapshot) differ: {differing}"
  config_lib.from_dict(config.to_dict())  # and it still passes validation


def test_a_block_helper_refuses_a_name_that_is_not_a_field_naming_it():
  from configs import common  # noqa: PLC0415

  c = base.get_config()
  with pytest.raises(KeyError, match="num_pair"):
    common.kv_task(c, num_pair=3)
  assert c.data.num_pairs == base.get_config().data.num_pairs  # nothing was set
