"""The report's summary: the claims a sweep tests in a table, the untested named in one line,
and under newer claim rules only the claims whose verdict or seed count moved."""

from __future__ import annotations

from chunkformer.evaluation.records.claim import Claim
from chunkformer.evaluation.report import markdown

CLAIMS = [Claim("C1", "one", "INCONCLUSIVE", "no data", {}, "0/0"),
          Claim("C2", "two", "REPRODUCED", "r", {}, "2/3"),
          Claim("C3", "three", "INCONCLUSIVE", "undecided seeds", {}, "0/3"),
          Claim("C4", "four", "INCONCLUSIVE", "no data", {}, "0/0")]


def test_the_summary_table_lists_tested_claims_and_names_the_rest():
  text = markdown.claims_table(CLAIMS)
  assert "| C2 | REPRODUCED | 2/3 | two |" in text and "| C3 | INCONCLUSIVE | 0/3 |" in text
  assert "| C1 |" not in text and text.endswith("no unit bears on them; reasons under "
                                                "\"Claims in full\"): C1, C4.")
  assert markdown.claims_table(CLAIMS[:1]).startswith("Not tested by this sweep")


def test_the_rules_table_shows_only_claims_that_moved():
  now = [CLAIMS[0], CLAIMS[1], Claim("C3", "three", "REPRODUCED", "r", {}, "2/3"), CLAIMS[3]]
  change = markdown.RulesChange("3", "2026-12-05", "4", "2026-12-05", (("x", "y"),), now)
  text = "\n".join(markdown.rules_section(change, CLAIMS))
  assert "| C3 | INCONCLUSIVE | REPRODUCED | 2/3 |" in text
  assert "| C2 |" not in text and "| C1 |" not in text
  same = markdown.RulesChange("3", "2026-12-05", "4", "2026-12-05", (("x", "y"),), CLAIMS)
  text = "\n".join(markdown.rules_section(same, CLAIMS))
  assert "| claim |" not in text and "Every claim has the same verdict and seed count" in text
