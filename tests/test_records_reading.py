"""A truncated or foreign results.json, record or .npz is refused in one line naming the file
and what is wrong, and nothing is written over it."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

import numpy as np
import pytest

from chunkformer.evaluation.records import correctness, loss_rows, results_file
from chunkformer.evaluation.records.reading import UnreadableFile
from chunkformer.evaluation.sweep import run as sweep_run
from configs.sweeps import demo

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
COMMITTED = os.path.join(ROOT, "results", "demo")


@pytest.fixture
def truncated(tmp_path):
  """A copy of the committed demo sweep whose results.json lost its second half."""
  shutil.copytree(os.path.join(COMMITTED, "correct"), tmp_path / "correct")
  text = open(os.path.join(COMMITTED, "results.json"), encoding="utf-8").read()
  (tmp_path / "results.json").write_text(text[:len(text) // 2], encoding="utf-8")
  return tmp_path


def test_a_truncated_results_json_is_named_with_where_it_breaks(truncated):
  path = str(truncated / "results.json")
  with pytest.raises(UnreadableFile, match=r"results\.json: not a sweep's results\.json: its "
                     r"JSON ends or breaks at line \d+ .*truncated\?"):
    results_file.load(path)


@pytest.mark.parametrize("text, problem", [
    ('{"name": "w8s8_1kv", "model": {}}', "no sweep, command, date, settings, verdicts, "
                                           "variants"),
    ("[1, 2]", "a JSON list, not an object"),
    ('{"sweep": "x", "command": "", "date": "", "settings": {}, "verdicts": [], "variants": '
     '[{"name": 1}]}', "not a sweep's results.json: no field"),
])
def test_a_foreign_json_is_refused_naming_what_it_lacks(tmp_path, text, problem):
  path = tmp_path / "results.json"
  path.write_text(text)
  with pytest.raises(UnreadableFile, match=str(path) + ".*" + problem.replace("(", r"\(")):
    results_file.load(str(path))


def test_a_rejudge_of_a_truncated_sweep_writes_nothing_over_it(truncated):
  before = (truncated / "results.json").read_bytes()
  with pytest.raises(UnreadableFile):
    sweep_run.rejudge(demo.get_config(), str(truncated), command="rejudge")
  assert (truncated / "results.json").read_bytes() == before
  assert not (truncated / "report.md").exists()


def test_eval_rejudge_ends_a_truncated_results_json_in_one_line(truncated):
  before = (truncated / "results.json").read_bytes()
  done = subprocess.run(
      [sys.executable, "eval.py", "--config", "configs/sweeps/demo.py", "--workdir",
       str(truncated), "--rejudge"], cwd=ROOT, capture_output=True, text=True, timeout=300,
      env={**os.environ, "PYTHONPATH": ROOT})
  assert done.returncode != 0
  last = done.stderr.strip().splitlines()[-1]
  assert last.startswith(f"error: {truncated / 'results.json'}: not a sweep's results.json")
  assert "Traceback" not in done.stderr
  assert (truncated / "results.json").read_bytes() == before


def test_a_truncated_or_foreign_npz_is_refused(tmp_path):
  good = correctness.path_for(str(tmp_path), "unit")
  correctness.save(good, {"far": correctness.Matrix(np.ones((2, 3)), np.arange(3))})
  assert correctness.load(good)["far"].correct_YxJ.shape == (2, 3)
  data = open(good, "rb").read()
  cut = tmp_path / "cut.npz"
  cut.write_bytes(data[:len(data) // 2])
  with pytest.raises(UnreadableFile, match=f"{cut}: not a correctness file: unreadable as "
                                           r"\.npz"):
    correctness.load(str(cut))
  foreign = str(tmp_path / "foreign.npz")
  np.savez(foreign, weights=np.zeros(3))
  with pytest.raises(UnreadableFile, match="arrays weights are no matrix's"):
    correctness.load(foreign)
  half = str(tmp_path / "half.npz")
  np.savez(half, **{"far.correct_YxJ": np.ones((1, 1))})
  with pytest.raises(UnreadableFile, match="matrices far lack correct_YxJ or offsets_J"):
    correctness.load(half)
  with pytest.raises(UnreadableFile, match=f"{foreign}: not a loss-rows file: arrays weights"):
    loss_rows.load(foreign)
