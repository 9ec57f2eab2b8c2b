"""Sweep shards: the assignment of variants and bad --shard specs (the shard + merge run is in
test_sweep.py, beside the finished sweep it reuses)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from chunkformer.config import ConfigError
from chunkformer.evaluation.sweep import shards

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_shards_partition_the_variants_in_order_and_balance_them():
  names = [f"v{i}" for i in range(7)]
  for count in (1, 2, 3, 7):
    parts = [shards.parse(f"{i}/{count}").select(names) for i in range(count)]
    assert sorted(sum(parts, [])) == sorted(names)  # every variant in exactly one shard
    assert max(map(len, parts)) - min(map(len, parts)) <= 1
    for part in parts:
      assert part == sorted(part, key=names.index)
  assert shards.parse(" 1/3 ").select(names) == ["v1", "v4"]


@pytest.mark.parametrize("spec", ["2/2", "1/0", "a/b", "1", "-1/2", "", "0/2/3", "1.0/2"])
def test_bad_shard_spec_is_one_line_naming_the_flag(spec):
  with pytest.raises(ConfigError) as raised:
    shards.parse(spec)
  message = str(raised.value)
  assert message.startswith(f"--shard {spec!r}:") and "\n" not in message


def test_more_shards_than_variants_is_refused():
  with pytest.raises(ConfigError, match=r"--shard 0/3: the sweep has 2 variant\(s\)"):
    shards.check_count(shards.parse("0/3"), 2)


def test_eval_with_a_bad_shard_fails_in_one_line_before_any_work(tmp_path):
  workdir = tmp_path / "sweep"
  done = subprocess.run(
      [sys.executable, "eval.py", "--config", "configs/sweeps/demo.py", "--workdir",
       str(workdir), "--shard", "2/2"], cwd=ROOT, capture_output=True, text=True,
      env=dict(os.environ, PYTHONPATH=ROOT), timeout=300, check=False)
  lines = done.stderr.strip().splitlines()
  assert done.returncode == 1 and len(lines) == 1, done.stderr
  assert lines[0].startswith("error: --shard '2/2':"), lines[0]
  assert not workdir.exists()
