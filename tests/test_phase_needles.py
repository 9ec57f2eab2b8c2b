"""scripts/phase_needles.py: each phase-dependent haystack of a stored sweep, by phase."""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np

from chunkformer.evaluation.records import correctness, results_file
from chunkformer.evaluation.records.variant import VariantRecord, VariantSetup
from chunkformer.evaluation.stats import periodicity as stats
from chunkformer.evaluation.stats.analysis_types import DepthAnalysis

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
OFFSETS = np.arange(48)


def _unit(name, seed, key_len, correct_YxJ):
  setup = VariantSetup(name.rsplit("_seed", 1)[0], "fixed", "fixed", chunk_size=4, seed=seed,
                       key_len=key_len, value_len=key_len, name=name)
  analysis = stats.analyze(correct_YxJ, OFFSETS, [4], num_resamples=10, num_permutations=10)
  far = DepthAnalysis(analysis.nested(), depth=0.0, depth_name="far", mean_distance=0.0,
                      token_accuracy=0.0, compression_ratio=None)
  return VariantRecord(setup, analysis, "needle", 10, compression_ratio=4, primary_depth="far",
                       depths=(far,), all_depths=analysis.nested(), near_accuracy=1.0,
                       token_accuracy_by_offset=tuple(correct_YxJ.mean(0)))


def _sweep(directory):
  """Three units: two seeds of 2-token needles that both miss far haystack 1 at phase 2, and
  a 3-token unit (other haystacks) that misses far haystack 1 at phase 0; the 2-token units
  also have a middle depth, where seed 1 misses haystack 1 at phase 2."""
  correct = {}
  for name, miss in (("fixed_k2_seed0", (1, 2)), ("fixed_k2_seed1", (1, 2)),
                     ("fixed_k3_seed0", (1, 0))):
    correct[name] = np.ones((3, OFFSETS.size))
    correct[name][miss[0], OFFSETS % 4 == miss[1]] = 0.0
  correct["fixed_k2_seed1"][2, OFFSETS % 4 == 3] = 0.0  # seed 1 alone misses haystack 2
  units = [_unit(n, int(n[-1]), int(n[7]), c) for n, c in correct.items()]
  middle = {name: np.ones((3, OFFSETS.size)) for name in correct}
  middle["fixed_k2_seed1"][1, OFFSETS % 4 == 2] = 0.0
  for name, c in correct.items():
    matrices = {"needle_far": correctness.Matrix(c, OFFSETS)}
    if name.startswith("fixed_k2"):  # no near depth anywhere; the 3-token unit: far only
      matrices["needle_middle"] = correctness.Matrix(middle[name], OFFSETS)
    correctness.save(correctness.path_for(directory, name), matrices)
  results_file.write(os.path.join(directory, "results.json"), results_file.SweepResults(
      "t", "cmd", "date", 0, 1.0, {}, OFFSETS.size, 4, (4,), (), "", tuple(units)))


def _script(*args):
  return subprocess.run([sys.executable, os.path.join(ROOT, "scripts", "phase_needles.py"),
                         *args], cwd=ROOT, env=dict(os.environ, PYTHONPATH=ROOT),
                        capture_output=True, text=True, timeout=120)


def test_lists_each_phase_dependent_haystack_with_its_split_kinds(tmp_path):
  directory = str(tmp_path / "sweep")
  _sweep(directory)
  out = str(tmp_path / "needles")
  units = ("fixed_k2_seed0", "fixed_k2_seed1", "fixed_k3_seed0")
  done = _script("--out", out, directory, *units)
  assert done.returncode == 0, done.stderr
  rows = [line for line in open(out + ".md").read().splitlines()
          if line.startswith("| fixed") and " | far | " in line]
  # 2-token needles at M = 4: phase 0 no split, 1 value cut, 2 total, 3 key cut; "also in"
  # names only the units of the same needle lengths (the 3-token unit's haystack 1 differs)
  assert rows == [
      "| fixed_k2_seed0 | 2/2 | far | 1 | 1.00 (none) | 1.00 (value_cut) | 0.00 (total) | "
      "1.00 (key_cut) | fixed_k2_seed1 |",
      "| fixed_k2_seed1 | 2/2 | far | 1 | 1.00 (none) | 1.00 (value_cut) | 0.00 (total) | "
      "1.00 (key_cut) | fixed_k2_seed0 |",
      "| fixed_k2_seed1 | 2/2 | far | 2 | 1.00 (none) | 1.00 (value_cut) | 1.00 (total) | "
      "0.00 (key_cut) | none |",
      "| fixed_k3_seed0 | 3/3 | far | 1 | 0.00 (value_cut) | 1.00 (total) | 1.00 (key_cut) | "
      "1.00 (value_cut) | none |"]
  summary = [line for line in open(out + ".md").read().splitlines()
             if line.startswith("| fixed_k2_seed1 | 2/2 | 2 |")]
  assert summary == ["| fixed_k2_seed1 | 2/2 | 2 | 1.00 (none) | 1.00 (value_cut) | "
                     "0.50 (total) | 0.50 (key_cut) |"]
  # another depth has its own haystacks: seed 0's middle depth is perfect, seed 1 misses
  # haystack 1 at phase 2 there too, but the far depth's haystack 1 is another needle
  middle = _script("--out", str(tmp_path / "middle"), "--depths", "middle", directory,
                   "fixed_k2_seed0", "fixed_k2_seed1")
  assert middle.returncode == 0, middle.stderr
  rows = [line for line in open(str(tmp_path / "middle.md")).read().splitlines()
          if line.startswith("| fixed") and " | middle | " in line]
  assert rows == [
      "| fixed_k2_seed0 | 2/2 | middle | none | - (none) | - (value_cut) | - (total) | "
      "- (key_cut) | |",
      "| fixed_k2_seed1 | 2/2 | middle | 1 | 1.00 (none) | 1.00 (value_cut) | 0.00 (total) | "
      "1.00 (key_cut) | none |"]
  again = _script("--out", out, directory, *units)  # written output is never replaced
  assert again.returncode != 0 and "--overwrite" in again.stderr
  unknown = _script("--out", str(tmp_path / "other"), directory, "fixed_k4_seed0")
  assert unknown.returncode != 0 and "no unit fixed_k4_seed0" in unknown.stderr
  no_depth = _script("--out", str(tmp_path / "other"), "--depths", "near", directory,
                     "fixed_k2_seed0")
  assert no_depth.returncode != 0 and "no near-depth" in no_depth.stderr
  assert not os.path.exists(str(tmp_path / "other.md"))
