"""The committed study's prose says what its data say: the report's verdict lines agree with
its table, and RUN.md's current verdicts with results.json."""

from __future__ import annotations

import functools
import os
import re

import pytest

from chunkformer.evaluation.records import results_file

STUDY = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "results",
                     "study")


@functools.cache
def _results() -> results_file.SweepResults:
  return results_file.load(os.path.join(STUDY, "results.json"))


def _read(name: str) -> str:
  with open(os.path.join(STUDY, name), encoding="utf-8") as f:
    return f.read()


def _table_periods(report: str) -> dict[str, str]:
  """unit -> the comparison table's period cell."""
  lines = [line for line in report.splitlines() if line.startswith("| variant ")]
  header = [c.strip() for c in lines[0].strip("|").split("|")]
  column = header.index("period")
  out = {}
  for line in report.splitlines():
    cells = [c.strip() for c in line.strip("|").split("|")]
    if line.startswith("| ") and len(cells) == len(header) and cells[0] != "variant":
      out[cells[0]] = cells[column]
  return out


def _line_period(line: str, unit: str) -> str | None:
  """The detected period a verdict line states for ``unit`` (the first after its name)."""
  at = max(line.find(f"({unit},"), line.find(f"CURE: {unit} ("))
  found = re.search(r"detected period (\w+)", line[at:]) if at >= 0 else None
  return found.group(1) if found else None


def test_verdict_lines_state_the_period_the_table_shows():
  report = _read("report.md")
  periods = _table_periods(report)
  records = _results()
  assert set(periods) == {r.name for r in records.variants}
  checked = 0
  for line in records.verdicts:
    assert f"- {line}" in report  # the report prints every verdict line
    for unit, period in periods.items():
      stated = _line_period(line, unit)
      if stated is not None:
        assert stated == period, (unit, line)
        checked += 1
  assert checked >= 100  # nearly every unit has a line that states its period


def test_run_record_states_the_current_claims():
  claims = {c.id: c for c in _results().claims}
  run = _read("RUN.md")
  start = run.index("## Current verdicts")
  section = run[start:run.index("\n## ", start)]
  rows = re.findall(r"^\| (C\d) [^|]*\| [^|]*\| \**([A-Z ]+?)(?: on one seed)? (\d+/\d+)\** \|",
                    section, flags=re.M)
  assert [r[0] for r in rows] == [f"C{i}" for i in range(1, 10)]
  for claim_id, verdict, count in rows:
    assert (verdict, count) == (claims[claim_id].verdict, claims[claim_id].seeds_agreeing)
  # The 3-token router is periodic (not at M, at period 3 or 6): no sentence may call it not.
  assert "none periodic" not in run + _read("HISTORY.md")
  haystack = claims["C9"].numbers["haystack_level"]["seeds_agreeing"]
  assert f"C9 would read {haystack} seeds" in " ".join(section.split())


@pytest.mark.parametrize("claim_id", ["C3", "C4"])
def test_one_seed_claims_say_so_in_their_verdict_lines(claim_id):
  results = _results()
  claim = {c.id: c for c in results.claims}[claim_id]
  assert claim.seeds_agreeing == "1/1"
  what = "RoPE off" if claim_id == "C3" else "pooling mean"
  lines = [line for line in results.verdicts if f"still periodic with {what}" in line]
  assert lines and all(line.startswith("REPRODUCED on one seed:") for line in lines)
