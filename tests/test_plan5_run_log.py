"""results/paper_plan5/RUN.md says only what the committed unit files hold: every unit of its
latest state table with its held-out accuracy (final_metrics.json) and training minutes
(sweep_train_time.json), every unit trained so far in the table, and the ranges its text
quotes; its history (HISTORY.md) quotes the retrained unit's committed loss."""

from __future__ import annotations

import json
import os
import re

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SWEEP = os.path.join(ROOT, "results", "paper_plan5")


def _latest_state() -> str:
  with open(os.path.join(SWEEP, "RUN.md"), encoding="utf-8") as f:
    text = f.read()
  sections = re.split(r"\n(?=## )", text)
  states = [s for s in sections if s.startswith("## State")]
  assert states, "RUN.md has no state section"
  return states[-1]


def _table(section: str) -> dict[str, tuple[float, float]]:
  """unit -> (held-out, minutes) from the section's table (two units per line)."""
  found = {}
  for line in section.splitlines():
    cells = [c.strip() for c in line.strip().strip("|").split("|")]
    if len(cells) % 3 or not line.startswith("|") or cells[0] in ("unit", "") or \
        cells[0].startswith("-"):
      continue
    for i in range(0, len(cells), 3):
      if cells[i]:
        found[cells[i]] = (float(cells[i + 1]), float(cells[i + 2]))
  return found


def _committed(unit: str) -> tuple[float, float] | None:
  directory = os.path.join(SWEEP, unit)
  metrics = os.path.join(directory, "final_metrics.json")
  timing = os.path.join(directory, "sweep_train_time.json")
  if not (os.path.exists(metrics) and os.path.exists(timing)):
    return None
  with open(metrics) as f, open(timing) as g:
    return json.load(f)["heldout"]["accuracy"], json.load(g)["wall_s"] / 60


TABLE = _table(_latest_state())


def test_the_state_table_lists_every_trained_unit_and_nothing_else():
  trained = sorted(u for u in os.listdir(SWEEP) if _committed(u) is not None)
  assert sorted(TABLE) == trained


@pytest.mark.parametrize("unit", sorted(TABLE))
def test_each_units_numbers_are_its_committed_files(unit):
  accuracy, minutes = _committed(unit)
  assert TABLE[unit] == (round(accuracy, 3), round(minutes, 1))


def test_the_ranges_the_text_quotes():
  text = " ".join(_latest_state().split())

  def span(prefix: str) -> str:
    values = [TABLE[u][0] for u in TABLE if u.startswith(prefix)]
    return f"{min(values):.2f}-{max(values):.2f}"

  assert (f"the S = 12 row learns on this recipe ({span('w12s12_1kv_')} in every trained "
          "seed") in text
  assert f"controls reach {span('full_')} at 1, 4 and 8 KV heads" in text


def test_the_quoted_retrain_is_the_committed_units_loss():
  # the retrain on a fresh machine (the 2026-12-05 23:50 state section, now in the sweep's
  # history) matched w8s8_1kv_seed0's committed held-out loss exactly
  with open(os.path.join(SWEEP, "HISTORY.md"), encoding="utf-8") as f:
    text = " ".join(f.read().split())
  with open(os.path.join(SWEEP, "w8s8_1kv_seed0", "final_metrics.json")) as f:
    heldout = json.load(f)["heldout"]
  assert (f"reached the committed held-out loss to the last digit ({heldout['loss']!r}; "
          f"accuracy {heldout['accuracy']:.3f})") in text


# The claims plan 5 decides (PLAN.md section 4): the paper's C10-C16, the cures' C17-C21 and
# the eviction claims restated for the lookup.
PLAN_CLAIMS = {f"C{i}" for i in range(10, 22)} | {"E4", "E5", "E6"}


def _verdicts(rules: str = "claims") -> dict[str, tuple[str, str]]:
  """claim -> (verdict, seeds agreeing) in results.json, under the plan's rules ("claims") or
  the current ones ("current_rules"), for the claims plan 5 decides."""
  with open(os.path.join(SWEEP, "results.json")) as f:
    results = json.load(f)
  claims = results["claims"] if rules == "claims" else results[rules]["claims"]
  return {c["id"]: (c["verdict"], c["seeds_agreeing"]) for c in claims
          if c["id"] in PLAN_CLAIMS}


def test_the_quoted_verdicts_are_the_committed_claims():
  # the latest state's verdict table: each claim's verdict and seeds agreeing under the plan's
  # rules (results.json "claims") and under the current rules ("current_rules")
  decided, current = _verdicts(), _verdicts("current_rules")
  # (the state's last column is version 4's, the current rules when it was written; the
  # section judged again under version 5 quotes the current rules')
  quoted = re.findall(r"^\| ([CE]\d+) \| ([A-Z ]+) \| (\d+/\d+) \| (.+) \|$", _latest_state(),
                      flags=re.MULTILINE)
  assert [q[0] for q in quoted] == list(decided)
  for claim, verdict, seeds, _ in quoted:
    assert (verdict, seeds) == decided[claim], claim
  quoted = re.findall(r"^\| ([CE]\d+) \| ([A-Z ]+) \| (\d+/\d+) \| ([A-Z ]+) \| (\d+/\d+) \|$",
                      _rejudged(), flags=re.MULTILINE)
  assert [q[0] for q in quoted] == list(decided)
  for claim, verdict, seeds, now, now_seeds in quoted:
    assert (verdict, seeds) == decided[claim], claim
    assert (now, now_seeds) == current[claim], claim


def _rejudged() -> str:
  with open(os.path.join(SWEEP, "RUN.md"), encoding="utf-8") as f:
    sections = re.split(r"\n(?=## )", f.read())
  found = [s for s in sections if s.startswith("## Judged again under claim rules 5")]
  assert found, "RUN.md has no section judged again under claim rules 5"
  return found[-1]


def _elimination_numbers() -> dict[str, str]:
  """What every sentence about plan 5's shortcut quotes, from results.json: the full-attention
  units' prefix mean range and the stored shortcuts (prefix padding)."""
  with open(os.path.join(SWEEP, "results.json")) as f:
    variants = json.load(f)["variants"]
  full = [v for v in variants if v["attention"] == "full" and not v["variant"].startswith("size_")]
  means = [v["probes"]["lookup"]["modes"]["prefix"]["correct"] for v in full]
  means = [sum(c) / sum(v["probes"]["lookup"]["modes"]["prefix"]["total"]) for c, v in
           zip(means, full, strict=True)]
  shortcuts = full[0]["probes"]["lookup"]["shortcuts"]["prefix"]
  assert all(v["probes"]["lookup"]["shortcuts"]["prefix"] == shortcuts for v in full)
  return {"range": f"{100 * min(means):.1f}-{100 * max(means):.1f}%",
          "undemonstrated": f"{100 * shortcuts['means']['undemonstrated']:.1f}%",
          "best": f"{100 * shortcuts['mean']:.1f}%", "units": str(len(full))}


def test_the_elimination_sentences_quote_the_committed_records():
  n = _elimination_numbers()
  with open(os.path.join(ROOT, "WORKSPACE.md"), encoding="utf-8") as f:
    row = next(line for line in f if "plan version 5 (`results/paper_plan5/PLAN.md`)" in line)
  assert (f"prefix mean {n['range']} at 1, 4 and 8 KV heads; answering a random undemonstrated "
          f"record's value scores {n['undemonstrated']}, the last undemonstrated record's "
          f"{n['best']}") in row
  with open(os.path.join(SWEEP, "report.md"), encoding="utf-8") as f:
    regime = f.read().split("## Summary")[0]
  assert (f"**The full-attention controls did not learn the lookup**: prefix mean {n['range']} "
          f"over {n['units']} units") in regime
  assert f"last undemonstrated, scores {n['best']}" in regime
  text = " ".join(_rejudged().split())
  assert (f"prefix mean {n['range']} over the {n['units']} full-attention units of the paper's "
          f"rows") in text
  assert f"a random undemonstrated record's value scores {n['undemonstrated']}" in text
  assert f"the last undemonstrated record's value {n['best']}" in text
  with open(os.path.join(SWEEP, "results.json")) as f:
    current = {c["id"]: c for c in json.load(f)["current_rules"]["claims"]}
  assert "full_1kv: INCONCLUSIVE (prefix: did not learn" in current["C11"]["reason"]
  assert "its reference full_1kv does not qualify (did not learn: mean" in current["C13"]["reason"]
  from chunkformer.evaluation.claims import rules
  why = " ".join(why for _, why in rules.CHANGES["5"])
  assert (f"answering a random one's value scores {n['undemonstrated']}, the last one's "
          f"{n['best']} (prefix padding), and every full-attention unit sat at "
          f"{n['range'].rstrip('%')}%") in why
  with open(os.path.join(ROOT, "docs", "claims.md"), encoding="utf-8") as f:
    docs = " ".join(f.read().split())
  assert (f"answering a random one's value scores {n['undemonstrated']} and the last one's "
          f"{n['best']} (prefix padding;") in docs
  assert f"every full-attention unit sat at {n['range']}" in docs


def test_workspace_quotes_the_committed_verdicts():
  with open(os.path.join(ROOT, "WORKSPACE.md"), encoding="utf-8") as f:
    row = next(line for line in f if "plan version 5 (`results/paper_plan5/PLAN.md`)" in line)
  quoted = {}
  for verdict, claims in re.findall(r"(NOT REPRODUCED|REPRODUCED|INCONCLUSIVE) ((?:[CE]\d+"
                                    r"(?: \([^)]*\))?(?:, )?)+)", row.split("version 3):")[1]):
    for claim in re.findall(r"[CE]\d+", re.sub(r"\([^)]*\)", "", claims)):
      quoted[claim] = verdict
  assert quoted == {c: verdict for c, (verdict, _) in _verdicts().items()}
