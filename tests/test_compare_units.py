"""scripts/compare_units.py: two trainings of a unit compared by their stored answers."""

import numpy as np
import pytest

from chunkformer.evaluation.records import correctness
from scripts import compare_units


def _save(directory, unit, **matrices):
  correctness.save(str(directory / f"{unit}.npz"),
                   {k: correctness.Matrix(v, np.arange(v.shape[1])) for k, v in matrices.items()})


def test_identical_and_diverged_units_read_as_such(tmp_path):
  a = np.zeros((4, 3), np.uint8)
  a[:, 1] = 1  # residue 1 always right, 0 and 2 never
  b = a.copy()
  b[0, 2] = 1  # one prompt of residue 2 answered differently
  _save(tmp_path / "A", "u_seed0", lookup_prefix=a, other=a)
  _save(tmp_path / "B", "u_seed0", lookup_prefix=b)
  _save(tmp_path / "B", "only_here_seed0", lookup_prefix=b)
  lines = compare_units.table(str(tmp_path / "A"), str(tmp_path / "B"), None, None)
  (row,) = [line for line in lines if line.startswith("| u_seed0")]  # the common unit/probe
  # A: 0, 100, 0 -> mean 33.3, gap 100; B: 0, 100, 25 -> mean 41.7; 11 of 12 answers agree.
  assert row == ("| u_seed0 | lookup_prefix | 33.3 | 41.7 | 100.0 | 100.0 | 0 / 0 | 25.0 | "
                 "91.7% |")
  same = compare_units.compare(*[correctness.Matrix(a, np.arange(3))] * 2)
  assert same["same_answers"] == 100.0 and same["max_residue_diff"] == 0.0


def test_bad_input_is_named(tmp_path):
  _save(tmp_path / "A", "u_seed0", lookup_prefix=np.zeros((4, 3), np.uint8))
  _save(tmp_path / "B", "u_seed0", lookup_prefix=np.zeros((4, 2), np.uint8))
  with pytest.raises(ValueError, match="differ in shape"):
    compare_units.table(str(tmp_path / "A"), str(tmp_path / "B"), None, None)
  shifted = correctness.Matrix(np.zeros((4, 3)), np.arange(1, 4))
  with pytest.raises(ValueError, match="differ in residues"):
    compare_units.compare(correctness.Matrix(np.zeros((4, 3)), np.arange(3)), shifted)
  with pytest.raises(SystemExit, match="missing_seed0 not in both"):
    compare_units.table(str(tmp_path / "A"), str(tmp_path / "B"), ["missing_seed0"], None)
  with pytest.raises(SystemExit, match="not a directory"):
    compare_units.main([str(tmp_path / "nope"), str(tmp_path / "B")])
