"""The eviction sweep end to end on its tiny variant (configs/sweeps/eviction.py:tiny): units
trained, every policy's matrices and record fields written, claims E1-E3 judged, the report's
eviction section and figure, and a second run that resumes (nothing retrained or
re-evaluated). Whether the claims hold is not asked of a 2-step model."""

from __future__ import annotations

import json
import os

from chunkformer.evaluation.records import correctness
from chunkformer.evaluation.stats.seed_rule import VERDICTS
from chunkformer.evaluation.sweep import run as sweep
from configs.sweeps import eviction as eviction_sweep
from tests import policy_sweeps


def test_the_tiny_eviction_sweep_writes_matrices_claims_and_its_report_section(tmp_path):
  config = eviction_sweep.get_config("tiny")
  workdir = str(tmp_path)
  outcome = sweep.run(config, workdir, command="eval.py --config configs/sweeps/eviction.py:tiny")
  with open(outcome.results_path) as f:
    stored = json.load(f)
  assert [v["name"] for v in stored["variants"]] == ["tiny_seed0"]
  labels = ["streaming_llm-b8-sinks2", "snapkv-b8-window2-kernel7-poolingmax",
            "chunkkv-b8-window2-kernel7-poolingmax-layer_reuse1-chunk4",
            "chunkkv_cut-b8-window2-kernel7-poolingmax-layer_reuse1-chunk4",
            "content_chunkkv-b8-window2-kernel7-poolingmax-layer_reuse1-delim3-len2-4"]
  for entry in stored["variants"]:
    policy_sweeps.assert_far_records(
        entry["probes"]["eviction_needles"],
        correctness.load(correctness.path_for(workdir, entry["name"])), "eviction_needles", labels)
  claims = {c["id"]: c for c in stored["claims"]}
  assert [k for k in claims if k.startswith("E")] == ["E1", "E2", "E3", "E4", "E5", "E6"]
  assert all(claims[k]["verdict"] in VERDICTS and claims[k]["reason"] for k in ("E1", "E2", "E3"))
  # a 2-step model misses the accuracy gate: every seed undecided, never a verdict
  assert "before eviction" in claims["E1"]["reason"]
  with open(outcome.report_path) as f:
    report = f.read()
  assert "## KV eviction: accuracy by needle phase per policy and budget" in report
  assert "| tiny | far | 8 | chunkkv-b8-window2-kernel7-poolingmax-layer_reuse1-chunk4 | 1 |" \
      in report
  assert "- tiny, far, snapkv-b8-window2-kernel7-poolingmax, L=4 (n = 6 per residue): 0: " \
      in report
  assert "| eviction_needles |" not in report  # not dumped as JSON among the other probes
  assert os.path.exists(os.path.join(workdir, "plots", "eviction_phase_tiny_far.png"))
  assert "(plots/eviction_phase_tiny_far.png)" in report
  policy_sweeps.assert_resumes(config, workdir, outcome)  # nothing retrained or re-evaluated
