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
