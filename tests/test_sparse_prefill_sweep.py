"""The sparse-prefill sweep end to end on its tiny variant (configs/sweeps/sparse_prefill.py:
tiny): a unit trained, every pattern's matrices and record fields written, claims P1-P2
judged, the report's section and figure, and a second run that resumes (nothing retrained or
re-evaluated). Whether the claims hold is not asked of a 2-step model."""

from __future__ import annotations

import json
import os

import pytest

from chunkformer.evaluation.records import correctness
from chunkformer.evaluation.stats.seed_rule import VERDICTS
from chunkformer.evaluation.sweep import run as sweep
from configs.sweeps import sparse_prefill as sparse_sweep
from tests import policy_sweeps


def test_the_tiny_sparse_prefill_sweep_writes_matrices_claims_and_its_report_section(tmp_path):
  config = sparse_sweep.get_config("tiny")
  workdir = str(tmp_path)
  outcome = sweep.run(config, workdir,
                      command="eval.py --config configs/sweeps/sparse_prefill.py:tiny")
  with open(outcome.results_path) as f:
    stored = json.load(f)
  assert [v["name"] for v in stored["variants"]] == ["tiny_seed0"]
  labels = ["keep_all-b4", "block_sparse-k2-b4", "vertical_slash-v2-s4-q4-fv1-fs2-b4",
            "a_shape-i2-l4-b4"]
  probe = stored["variants"][0]["probes"]["sparse_needles"]
  policy_sweeps.assert_far_records(
      probe, correctness.load(correctness.path_for(workdir, "tiny_seed0")), "sparse_needles",
      labels)
  assert probe["keep_all-b4"]["kept_fraction"] == pytest.approx(1.0)
  assert probe["block_sparse-k2-b4"]["kept_fraction"] < 1.0
  claims = {c["id"]: c for c in stored["claims"]}
  assert [k for k in claims if k.startswith("P")] == ["P1", "P2"]
  assert list(claims).index("P1") > list(claims).index("E3")  # after the eviction claims
  assert all(claims[k]["verdict"] in VERDICTS and claims[k]["reason"] for k in ("P1", "P2"))
  # a 2-step model misses the accuracy gate: every seed undecided, never a verdict
  assert "with a dense prefill" in claims["P1"]["reason"]
  with open(outcome.report_path) as f:
    report = f.read()
  assert "## Sparse prefill: accuracy by needle phase per pattern and budget" in report
  assert "| tiny | far | keep_all-b4 | 4 | 100.0 | 1 |" in report
  assert "- tiny, far, block_sparse-k2-b4, B=4 (n = 6 per residue): 0: " in report
  assert "| sparse_needles |" not in report  # not dumped as JSON among the other probes
  assert os.path.exists(os.path.join(workdir, "plots", "sparse_prefill_phase_tiny_far.png"))
  assert "(plots/sparse_prefill_phase_tiny_far.png)" in report
  policy_sweeps.assert_resumes(config, workdir, outcome)  # nothing retrained or re-evaluated
