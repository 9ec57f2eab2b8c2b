"""bench.accelerator: --small writes its report with every field finite; the budget is kept."""

import json
import math

import pytest

from bench import accelerator


def _finite(x):
  return isinstance(x, (int, float)) and math.isfinite(x)


def test_small_device_check_writes_finite_rows_traces_tiles_and_goals(tmp_path):
  # The prepared device script in its CPU rehearsal, one kernel case (M = 4, which also times
  # the fused backward) and one train worker (the dynamic kind): the same worker code runs every
  # case and kind; CI time allows one of each (about 60 s of CPU, mostly compiling).
  from bench import device_check

  device_check.main(["--small", "--chunks", "4", "--kinds", "dynamic", "--out",
                     str(tmp_path)])
  md, js = tmp_path / "accelerator_cpu.md", tmp_path / "accelerator_cpu.json"
  record = json.loads(js.read_text())
  assert record["commit"] and record["date"] and record["command"].startswith(
      "python -m bench.accelerator --out")
  assert record["device"]["backend"] == "cpu"
  assert record["device"]["packages"]["flax"] and record["device"]["python"]
  rows = record["rows"]
  kernel = [r for r in rows if r["section"] == "kernels"]
  assert sorted(r["op"] for r in kernel) == ["compressed", "compressed_fused_bwd", "full",
                                              "full_kernel", "speedup"]
  assert {r["M"] for r in kernel} == {"4"} and {r["T"] for r in kernel} == {128}
  for r in kernel:
    assert r["status"] == "ok", r
    keys = (("fwd_speedup", "fwd_bwd_speedup", "useful_flop_ratio", "formula_ratio",
             "kernel_full_fwd_vs_best", "kernel_full_fwd_bwd_vs_best")
            if r["op"] == "speedup" else ("fwd_ms", "fwd_bwd_ms", "fwd_tflops", "fwd_bwd_tflops"))
    assert all(_finite(r[k]) and r[k] > 0 for k in keys), r
  compressed, full, full_kernel, speedup = (
      next(r for r in kernel if r["op"] == op)
      for op in ("compressed", "full", "full_kernel", "speedup"))
  assert compressed["impl"] == "pallas_gpu" and compressed["interpret"] and full["impl"] == "xla"
  assert full_kernel["impl"] == "pallas_gpu" and full_kernel["interpret"]
  assert full_kernel["useful_fwd_flops"] == full["useful_fwd_flops"]
  # T / (T/S + W) at T = 128, S = M = 4, W = 16; useful FLOPs: the causal triangle over the
  # visible scores.
  assert math.isclose(speedup["formula_ratio"], 128 / (128 / 4 + 16))
  assert math.isclose(speedup["useful_flop_ratio"],
                      full["useful_fwd_flops"] / compressed["useful_fwd_flops"])
  assert full["useful_fwd_flops"] == 4 * 32 * 4 * (128 * 129 // 2)  # 4 D H x causal pairs
  # Tile counts per GPU kernel; the kernel as full attention has no entries to visit.
  assert set(compressed["tiles"]) == {"gpu_fwd", "gpu_dq", "gpu_dkv_raw", "gpu_dkv_entries"}
  assert all(n["tile_ratio"] == 1.0 for n in compressed["tiles"].values())
  assert full_kernel["tiles"]["gpu_dkv_entries"]["executed"] == 0
  # One profiler trace per op, under the one output folder.
  for op in ("compressed", "full", "full_kernel", "compressed_fused_bwd"):
    assert list((tmp_path / "traces" / f"T128_M4_{op}").rglob("*.xplane.pb")), op
  assert record["isa"]["files"] > 0  # the dump was written and read (CPU: HLO, no PTX)
  (train,) = [r for r in rows if r["section"] == "train"]
  assert train["status"] == "ok" and train["kind"] == "dynamic" and train["T"] == 128, train
  assert train["rows_per_device"] == 4 and train["rows"] == 4  # micro-batch at T <= 4096
  for k in ("tokens_per_s", "mfu", "step_s", "plan_bytes", "model_flops_per_token", "loss"):
    assert _finite(train[k]) and train[k] > 0, (k, train)
  assert train["measured_peak_bytes"] is None  # CPU reports no memory stats
  text = md.read_text()
  assert "| dynamic | 128 | 4 | xla |" in text and record["commit"] in text
  assert f"flax {record['device']['packages']['flax']}" in text  # the software line
  assert "## Matrix instructions of the compiled kernels" in text
  assert (tmp_path / "kernel_tiles_small.md").exists()
  goals = (tmp_path / "goals.md").read_text()
  assert "| compressed forward >= 400 useful TFLOP/s at 32K | - | not measured |" in goals
  assert "train MFU >= 0.35 at 4K" not in goals  # no 4K row in the rehearsal


def test_isa_scan_counts_matrix_instructions_per_kernel(tmp_path):
  from bench import device_isa

  (tmp_path / "module_1.ptx").write_text(
      ".visible .entry chunk_attention_fwd(\n  wgmma.mma_async.sync.aligned.m64n64k16 ...;\n"
      "  wgmma.mma_async.sync.aligned.m64n64k16 ...;\n}\n"
      ".visible .entry chunk_attention_dq(\n  mma.sync.aligned.m16n8k16.row.col ...;\n}\n")
  (tmp_path / "module_1.txt").write_text("HloModule jit_fn\n")
  result = device_isa.scan(str(tmp_path))
  assert result["files"] == 2 and result["code_files"] == 1
  by = {k["kernel"]: k for k in result["kernels"]}
  assert (by["chunk_attention_fwd"]["wgmma"], by["chunk_attention_fwd"]["mma.sync"]) == (2, 0)
  assert (by["chunk_attention_dq"]["wgmma"], by["chunk_attention_dq"]["mma.sync"]) == (0, 1)
  assert "| chunk_attention_fwd | module_1.ptx | 2 | 0 | 0 |" in device_isa.markdown(result)


def test_spent_budget_skips_every_row_and_still_writes(tmp_path):
  accelerator.main(["--small", "--budget_s", "1e-6", "--out", str(tmp_path)])
  record = json.loads((tmp_path / "accelerator_unknown.json").read_text())
  assert record["device"] is None  # no worker ran
  rows = record["rows"]
  assert len(rows) == 2 + 4 and all(r["status"] == "skipped: budget" for r in rows)
  assert {r["kind"] for r in rows if r["section"] == "train"} == set(accelerator.KINDS)


def test_a_crashed_worker_leaves_its_rows_marked(tmp_path, monkeypatch):
  # A worker that dies before writing anything (here: an interpreter that exits 1 at once).
  monkeypatch.setattr(accelerator.sys, "executable", "false")
  accelerator.main(["--small", "--kinds", "fixed", "--out", str(tmp_path)])
  rows = json.loads((tmp_path / "accelerator_unknown.json").read_text())["rows"]
  assert [(r["section"], r.get("M", r.get("kind"))) for r in rows] == [
      ("kernels", "4"), ("kernels", "dynamic"), ("train", "fixed")]
  assert all(r["status"] == "failed: worker exited 1: " for r in rows), rows
  assert "| fixed | 128 | - | - |" in (tmp_path / "accelerator_unknown.md").read_text()


def test_each_kind_steps_with_the_platforms_own_attention():
  # Kind full must not run the config's T x T default (it failed at 32K on an H200); the
  # compressed kinds take the platform's Pallas kernel where their config allows it.
  from bench import accelerator_rows
  from configs.lm import qwen3_0p6b

  for backend, full, fixed in (("gpu", "pallas_gpu", "pallas_gpu"), ("tpu", "splash", "pallas_tpu"),
                               ("cpu", "blockwise", "xla")):
    configs = {kind: qwen3_0p6b.get_config(kind) for kind in ("full", "fixed")}
    assert accelerator_rows._step_impl(configs["full"], backend) == full
    assert accelerator_rows._step_impl(configs["fixed"], backend) == fixed
    assert [c.model.attention.implementation for c in configs.values()] == [full, fixed]


def test_a_named_commit_overrides_a_stale_checkout(monkeypatch):
  from chunkformer import provenance

  monkeypatch.delenv("CHUNKFORMER_COMMIT", raising=False)
  head = provenance.commit()
  monkeypatch.setenv("CHUNKFORMER_COMMIT", "0123abc")
  assert provenance.commit() == "0123abc" != head


def test_missing_packages_are_named_before_any_worker_starts(tmp_path, monkeypatch):
  # An accelerator image without tensorboardX: the run stops at once, naming it, and writes
  # nothing (before, every train row failed one by one after the kernels had run).
  real = accelerator.importlib.util.find_spec
  monkeypatch.setattr(accelerator.importlib.util, "find_spec",
                      lambda name: None if name == "tensorboardX" else real(name))
  monkeypatch.setattr(accelerator, "_run_worker", lambda *a: pytest.fail("a worker ran"))
  with pytest.raises(SystemExit, match="lacks tensorboardX: install"):
    accelerator.main(["--small", "--out", str(tmp_path)])
  assert not list(tmp_path.iterdir())
  # Kernels alone need JAX only.
  args = accelerator._parse(["--small", "--kinds"])
  assert accelerator.missing_packages(args) == []


def test_a_timed_sample_runs_fast_calls_back_to_back():
  # A call of >= 2 ms and 10 ms samples: after the compile and the sizing call, each of the 3
  # samples runs n = ceil(10 / t) <= 5 calls; the time reported is per call, never below one.
  import time

  import jax.numpy as jnp

  from bench import kernels as kernel_bench

  calls = []

  def fn():
    calls.append(1)
    time.sleep(0.002)
    return jnp.zeros(())

  ms = kernel_bench._timed(fn, reps=3, min_sample_s=0.01)
  n = (len(calls) - 2) / 3
  assert n == int(n) and 1 < n <= 5, len(calls)
  assert ms >= 2.0
  calls.clear()
  kernel_bench._timed(fn, reps=3, min_sample_s=0.0)  # slow calls: one per sample
  assert len(calls) == 2 + 3
