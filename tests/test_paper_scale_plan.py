"""bench/paper_scale_plan.py: which compiled run stands for each paper run, and the memory and
device-hour arithmetic (hand-computed numbers; nothing compiles here)."""

import pytest

from bench import paper_scale_plan as plan
from configs.paper import runs


def test_every_paper_run_has_a_compiled_run_that_stands_for_it():
  for run in runs.RUNS:
    source = plan.shares(run, list(plan.COMPILE_ORDER))
    assert source is not None, run
    assert plan.signature(source) == plan.signature(run)


@pytest.mark.parametrize("run,source", [
    ("w8s8_1kv_nope", "w8s8_1kv"), ("w8s8_1kv_vector", "w8s8_1kv"),
    ("w8s8_1kv_uniform_tied_kv_post_norm", "w8s8_1kv_tied_kv"),
    ("w8s4_dsv4_kernel_scalar", "w8s4_dsv4_kernel"), ("w8s8_1kv_tail", "w8s8_1kv_tail")])
def test_runs_share_only_across_shape_neutral_fields(run, source):
  assert plan.shares(run, list(plan.COMPILE_ORDER)) == source
  # The tail, the kv heads, the grid and the tied K/V change buffers: never shared.
  for other in ("w8s8_1kv", "w8s8_2kv", "w8s6_1kv", "w8s8_1kv_tied_kv", "w8s8_1kv_tail"):
    if other != source:
      assert plan.shares(run, [other]) is None, (run, other)


def test_memory_row_corrects_the_state_by_the_parameter_difference():
  gib = 2**30
  compiled = {"w8s8_1kv": dict(params=600_000_000, argument_bytes=8 * gib,
                               peak_bytes=12 * gib, compile_s=100.0)}
  row = dict(run="w8s8_1kv_vector", params=600_000_000 + 1_000_000, batch_rows=64)
  out = plan.memory_row(row, compiled)
  assert out["memory_from"] == "w8s8_1kv" and out["compile_s"] is None
  assert out["state_bytes"] == 8 * gib + 12_000_000
  assert out["peak_bytes_one_row"] == 12 * gib + 16_000_000
  per_row = 4 * gib + 4_000_000
  rows = int((0.9 * 141e9 - (8 * gib + 12_000_000)) // per_row)  # 27
  assert out["max_rows"] == rows == 27
  # grad_accum_steps splits the 64 rows evenly: 4 micro-batches of 16 (3 would not divide 64)
  assert (out["micro_batch"], out["grad_accum_steps"]) == (16, 4)
  assert out["peak_bytes_at_micro_batch"] == 8 * gib + 12_000_000 + 16 * per_row


def test_a_run_whose_one_row_does_not_fit_has_no_plan():
  compiled = {"full_8kv": dict(params=1, argument_bytes=100 * 2**30, peak_bytes=200 * 2**30,
                               compile_s=1.0)}
  out = plan.memory_row(dict(run="full_8kv", params=1, batch_rows=64), compiled)
  assert out["max_rows"] == 0 and out["grad_accum_steps"] is None and out["micro_batch"] == 0
  assert plan.memory_row(dict(run="full_1kv", params=1, batch_rows=64),
                         compiled)["memory_from"] is None


def _script():
  import importlib.util
  import os

  path = os.path.join(os.path.dirname(os.path.dirname(__file__)), "scripts", "paper_scale.py")
  spec = importlib.util.spec_from_file_location("paper_scale_script", path)
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module


def test_the_paper_scale_command_trains_every_run_and_seed_then_evaluates_them():
  script = _script()
  plan = {run: dict(run=run, batch_rows=64, max_rows=20) for run in runs.RUNS}
  plan["full_8kv"]["max_rows"] = 5
  cmds = script.commands("W", list(runs.RUNS), plan, devices=1, replicated_seeds=3,
                         extra=["--config.data.path=D"])
  train, evaluate = cmds[:-1], cmds[-1]
  dirs = [c[c.index("--workdir") + 1] for c in train]
  # 3 seeds of the replicated runs, 1 of the other full runs, 2 of every other compressed run
  assert len(train) == 2 * 3 + 2 * 1 + 2 * (len(runs.RUNS) - 4)
  assert {"W/w8s8_1kv_seed2", "W/full_1kv_seed2", "W/full_8kv_seed0", "W/w4s4_1kv_seed1"} \
      <= set(dirs) and "W/full_8kv_seed1" not in dirs
  by_dir = dict(zip(dirs, train, strict=True))
  # 64 rows: 4 micro-batches of 16 fit 20 rows; 13 of 5 would not divide 64, so 16 of 4
  assert "--config.train.grad_accum_steps=4" in by_dir["W/w8s8_1kv_seed0"]
  assert "--config.train.grad_accum_steps=16" in by_dir["W/full_8kv_seed0"]
  assert all("--config.model.scan_layers=false" in c and c[-1] == "--config.data.path=D"
             for c in train)
  assert "configs/paper/run.py:w8s8_1kv,paper" in by_dir["W/w8s8_1kv_seed1"]
  assert "--config.seed=1" in by_dir["W/w8s8_1kv_seed1"]
  assert evaluate[-2:] == ["--workdir", "W/protocol"]
  assert evaluate[3] == "configs/sweeps/paper_protocol.py:" + ",".join(dirs)
  # Over 8 devices each holds 64 / (8 k) rows: one micro-batch of 8 per device fits 20.
  assert script.accumulation(plan["w8s8_1kv"], 64, 8) == 1
  assert script.accumulation(plan["full_8kv"], 64, 8) == 2
  with pytest.raises(SystemExit, match="no compiled memory plan"):
    script.accumulation(dict(run="w8s8_2kv", max_rows=None), 64, 1)
