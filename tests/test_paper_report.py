"""The summary of a sweep with lookup records (the paper-style main table beside the paper's
published rows, the main figure, one comparison line per claim C10-C21) and the
pre-registered plan: recorded when a unit trains, named in the report, flagged when judged."""

from __future__ import annotations

import os
import subprocess

import pytest

from chunkformer import provenance
from chunkformer.config import ConfigError
from chunkformer.evaluation.claims import judging, registry
from chunkformer.evaluation.report import sections
from chunkformer.evaluation.sweep import config as sweep_config
from chunkformer.evaluation.sweep import outputs
from chunkformer.evaluation.sweep import run as sweep
from chunkformer.studies.paper.claims import committed, main_table
from chunkformer.studies.paper.report import paper_table
from configs.sweeps import sweep_config as make_sweep
from configs.sweeps import variant
from tests.test_paper_claims import _curve, _seeds

SMOKE = variant("configs/smoke.py", {"train.steps": 2, "train.checkpoint_every": 2,
                                     "data.num_queries": 1})
TINY = dict(name="tiny", num_offsets=12, num_haystacks=3, depths=(0.0, 1.0), prefix_prompts=0,
            slot_gain_rows=0, eval_batch_size=8, num_resamples=20, num_permutations=20)


def _records():
  return [*_seeds("w8s8_1kv", 2, curve=_curve(8, 0.9, 0.1)),
          *_seeds("full_1kv", 2, attention="full")]


def _tables(records):
  return main_table.tables(registry.Evidence(tuple(records), {}, None))


def test_the_main_table_puts_the_papers_row_beside_ours_with_hand_computed_cells():
  lines = paper_table.main_table(_tables(_records()))
  ours = next(line for line in lines if line.startswith("| w8s8_1kv |"))
  # 21 residues at 58/64 and 3 at 6/64 (round(0.9 * 64), round(0.1 * 64)), 2 seeds.
  mean = 100 * (21 * 58 + 3 * 6) / 64 / 24
  assert ours == (f"| w8s8_1kv | 2 | 1.500 | {mean:.1f} | 9.4 (7) | 81.2 | {mean:.1f} | "
                  "9.4 (7) | 81.2 |")
  paper_row = lines[lines.index(ours) + 1]
  assert paper_row.startswith("| paper: W8/S8 · 1 KV · seed 42 | - | 2.478 | 50.6 | 5.7 | 75.3 "
                              "| 27.6 |")
  assert not any("full_1kv" in line and "paper" in line for line in lines)  # none published
  assert paper_table.main_table(_tables([])) == []


def test_each_paper_claim_gets_one_line_against_the_published_numbers(tmp_path):
  records = _records()
  # No answer matrices: the plan's tests (claim rules version 1) decide C10 from the counts.
  judged = judging.judge(records, None, num_resamples=10, num_permutations=10, rules="1")
  lines = paper_table.comparison_lines(judged.claims, judged.tables["paper"])
  assert [line.split("**")[1] for line in lines] == [f"C{i}" for i in range(10, 22)]
  c10 = lines[0]
  # The paper's W8/S8 row: prefix gap 75.3; ours (58 - 6) / 64 = 81.25: 5.95 points larger.
  # The paper's curve: phase means of its published accuracies (no prompt counts, so no
  # interval); phase 7 (6.2, 6.7, 5.7) lies 18.1 points below phase 5 (22.9, 25.0, 25.0).
  assert ("paper stride repeat 1.8 points, lag S / other lags 0.06, lowest phase 7 (18.1 points "
          "below the next, no interval), gap 75.3 (ours +6.0 points)") in c10
  # Ours: the weak residues of _curve(8, ...) sit at phase 7 and repeat exactly every 8; two
  # seeds' counts summed (no matrices): 116 of 128 per residue, variance floored at
  # a~(1 - a~) / 129 with a~ = 116.5 / 129, so noise sqrt(2 / pi) sqrt(2 v) = 2.9 points.
  assert ("(S = 8), stride repeat 0.0 points (noise 2.9, within it), lag S / other lags 0.00, "
          "weakest phase 7, 7 of 8 phases work, prefix gap") in c10
  assert "no full-attention row" in lines[1] and "C14" in lines[4]
  # the cures: no cure row here; C21 names the paper's one stride-2 model beside
  assert lines[7].startswith("- **C17** (INCONCLUSIVE here) against the paper: no cure row")
  assert ("the paper's only stride-2 model (DeepSeek-V4.1-Flash, long needle at 128K tokens, "
          "residues mod 8) has a gap of 6.1 points") in lines[11]
  path = paper_table.plot_residues(str(tmp_path / "plots" / "residues.png"),
                                   judged.tables["paper"])
  assert os.path.getsize(path) > 1000


def test_the_main_figure_shows_the_strides_full_attention_and_the_cures_first():
  records = [*_records(), *_seeds("w8s8_4kv", 2, curve=_curve(8, 0.9, 0.1)),
             *_seeds("cure_key_shift", 2, curve=_curve(None))]
  shown = [r.variant for r in paper_table.main_rows(_tables(records))]
  assert shown == ["w8s8_1kv", "full_1kv", "cure_key_shift"]


def _git(directory, *args):
  subprocess.run(["git", "-C", str(directory), *args], check=True, capture_output=True,
                 env={**os.environ, "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t",
                      "GIT_COMMITTER_NAME": "t", "GIT_COMMITTER_EMAIL": "t@t"})


@pytest.fixture
def plan_repo(tmp_path):
  repo = tmp_path / "repo"
  repo.mkdir()
  _git(repo, "init", "-q")
  (repo / "PLAN.md").write_text("budgets: 2 steps; seeds 0, 1\n")
  _git(repo, "add", "PLAN.md")
  _git(repo, "commit", "-qm", "plan")
  return repo


def test_a_units_plan_is_recorded_with_its_hash_and_commit_and_a_changed_plan_appended(
    plan_repo, tmp_path):
  plan = str(plan_repo / "PLAN.md")
  state = provenance.file_state(plan)
  assert state["committed"] and len(state["commit"]) == 40 and len(state["sha256"]) == 64
  run_dir = str(tmp_path / "unit")
  assert sweep.read_plans(run_dir) is None
  first = sweep.record_plan(run_dir, plan)
  assert [s["sha256"] for s in first] == [state["sha256"]]
  assert sweep.record_plan(run_dir, plan) == first  # resumed under the same plan: no entry
  (plan_repo / "PLAN.md").write_text("budgets: 3 steps\n")  # changed, not committed
  again = sweep.read_plans(run_dir) and sweep.record_plan(run_dir, plan)
  assert len(again) == 2 and again[1]["committed"] is False
  assert again[1]["sha256"] != state["sha256"] and again[1]["commit"] == state["commit"]


def test_a_missing_plan_file_is_refused_by_name_and_no_plan_is_not_written(tmp_path):
  config = make_sweep({"smoke": SMOKE}, plan=str(tmp_path / "nope.md"), **TINY)
  with pytest.raises(ConfigError, match="'sweep.plan': no plan file"):
    sweep_config.resolve(config, str(tmp_path / "run"))
  assert "plan" not in sweep_config.SweepSettings().to_json()


def test_a_sweep_records_the_plan_when_a_unit_trains_and_the_report_names_it(
    plan_repo, tmp_path, monkeypatch):
  plan = str(plan_repo / "PLAN.md")
  workdir = str(tmp_path / "run")
  resolved = sweep_config.resolve(make_sweep({"smoke": SMOKE}, plan=plan, **TINY), workdir)
  trained = []
  monkeypatch.setattr(sweep.trainer, "train", lambda config, run_dir, progress: trained.append(
      sweep.read_plans(run_dir)) or {})  # what the unit's directory held when training began
  sweep._train(resolved, resolved.variants)
  state = provenance.file_state(plan)
  assert [[s["sha256"] for s in found] for found in trained] == [[state["sha256"]]]
  # Evaluating the unit puts the plans it trained under into its record.
  monkeypatch.setattr(sweep.trained_lib, "load", lambda run_dir: None)
  monkeypatch.setattr(sweep.unit, "evaluate", lambda *args: _records()[0])
  evaluated = sweep._evaluate(resolved, resolved.variants, workdir)
  assert [s["commit"] for s in evaluated[0].plan] == [state["commit"]]
  # The report's summary names the plan's hash and commit; units flagged in the lines.
  records = [r for r in _records() if r.setup.seed == 0]
  judged = judging.judge(records, None, num_resamples=10, num_permutations=10, plan=state)
  views = sections.views(records, judged.claims, judged.tables, str(tmp_path), str(tmp_path))
  lines = outputs._summary(resolved.settings, state, views)
  assert lines[0].startswith(f"Pre-registered plan: `{plan}`, sha256 {state['sha256'][:16]}, "
                             f"last committed in {state['commit'][:10]};")
  assert "### Main table (the paper's columns)" in lines
  assert all("PLAN: " in line for line in judged.verdicts if "w8s8_1kv_seed0" in line)


def test_the_size_trend_pools_the_seeds_every_size_has():
  records = [*_seeds("w8s8_1kv", 3, curve=_curve(8, 0.9, 0.1)),
             *_seeds("size_small_w8s8_1kv", 2, curve=_curve(8, 0.5, 0.1)),
             *_seeds("full_1kv", 2, attention="full")]
  tables = _tables(records)
  assert [(r.row, r.size, r.seeds) for r in tables.sizes] == [
      ("w8s8_1kv", "small", 2), ("w8s8_1kv", "cpu", 2), ("full_1kv", "cpu", 2)]
  lines = paper_table.size_table(tables)
  # the small size: 21 residues at round(0.5 * 64) = 32 of 64, 3 at 6 of 64: gap 40.6 points;
  # no stored answers, so no period decision
  assert ("| w8s8_1kv | small (size_small_w8s8_1kv) | 2 | "
          f"{100 * (21 * 32 + 3 * 6) / 64 / 24:.1f} | 9.4 (7) | 40.6 | 0 of 8 | no matrix |"
          ) in lines
  assert _tables(_records()).sizes == ()  # no size row: no trend


def test_the_committed_paper_table_opens_from_a_notebooks_directory(tmp_path):
  root = committed.results_root(os.path.join(os.path.dirname(__file__), "..", "notebooks"))
  opened = committed.open_sweep(committed.newest(root))
  assert opened.tables.rows and opened.claims
  table = committed.verdict_table(opened)
  assert "| C10 |" in table and "| C21 |" in table and "| C1 |" not in table
  # the deciding rules' verdicts, and the current rules' beside exactly where they differ
  assert f"decided by claim rules version {opened.rules}" in table
  now = {c.id: c for c in opened.current}
  moved = 0
  for c in (c for c in opened.claims if c.id in committed.PAPER_CLAIMS):
    row = next(line for line in table.splitlines() if line.startswith(f"| {c.id} |"))
    assert row.startswith(f"| {c.id} | {c.verdict} | {c.seeds_agreeing} |"), row
    other = now.get(c.id)
    differs = other is not None and (other.verdict, other.seeds_agreeing) != (
        c.verdict, c.seeds_agreeing)
    assert (other is not None and f"| {other.verdict} ({other.seeds_agreeing}) |" in row) == differs
    moved += differs
  assert moved or not opened.current  # the committed sweeps' rules changed after them
  with pytest.raises(FileNotFoundError, match="no results/ directory"):
    committed.results_root(str(tmp_path))
  with pytest.raises(FileNotFoundError, match="none of paper_plan5, paper_protocol"):
    committed.newest(str(tmp_path))
