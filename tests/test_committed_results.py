"""The committed sweep outputs (results/demo, results/study) still load and recompute exactly.

Verdicts and the comparison table are pure functions of the stored per-variant records, so
any change to stats, verdicts or report that alters them shows up here, without retraining.
"""

from __future__ import annotations

import json
import os

import pytest

from chunkformer.evaluation import report, verdicts

RESULTS = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "results")


@pytest.mark.parametrize("sweep", ["demo", "study"])
def test_committed_verdicts_and_table_recompute_from_their_stored_records(sweep):
  with open(os.path.join(RESULTS, sweep, "results.json")) as f:
    results = json.load(f)
  assert results["verdicts"] and results["variants"]
  assert verdicts.decide(results["variants"]) == results["verdicts"]
  with open(os.path.join(RESULTS, sweep, "report.md")) as f:
    assert report.comparison_table(results["variants"]) in f.read()
