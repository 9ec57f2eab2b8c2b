"""The paper's sweep at its own size: compiled memory per attention setting, device-hours per run.

  python -m bench.paper_scale_plan [--compile RUN,...|all|none] [--mfu 0.35] [--resume]

Every run of configs/paper/runs.py at size ``paper`` (Qwen3-0.6B's shape; 4096 tokens x 64
rows per update, 20000 updates). For each run, with no compilation: its parameters (abstract
initialisation) and its analytic model FLOPs per token (chunkformer/flops.py), and from them an
ESTIMATE of H200 device-hours for its budget at an assumed model FLOPs utilisation (``--mfu``,
against the H200's dense bf16 peak in ``flops.PEAK_TFLOPS``): an assumption, not a measurement.

Memory: the training step of a run is compiled on one fake CPU device with one row of 4096
tokens (bench/scale_plan.py's ``compile_case``, config "paper"; nothing runs), giving the peak
bytes per device, of which the step's arguments (parameters, AdamW moments, the batch) do not
grow with the rows and the rest is taken as linear in them; so the micro-batch that fits one
H200 (at 90% of its memory) and the ``train.grad_accum_steps`` that makes the paper's 64 rows
follow. Compiling all runs at full size takes hours on two shared cores, so runs that differ
only in fields that change the parameters and no buffer of note share one compiled run
(``shares``; the fields are in ``SHAPE_NEUTRAL``): their state is corrected by the parameter
difference (``STATE_BYTES_PER_PARAM`` for parameters and AdamW moments, plus 4 for the float32
gradient in the peak), exact for the arguments and an estimate for the peak. Runs compiled
themselves say so. The CPU compiler's buffer assignment is a proxy for XLA:GPU's
(bench/scale_plan.py).

Writes bench/results/paper_scale_plan.{md,json} after every compiled run (``--resume`` keeps
the compiled runs of the JSON).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)  # as a file, bench/ comes first: bench/kernels.py would shadow kernels

from bench import scale_plan  # noqa: E402

DEVICE, DEVICE_GB = "H200", 141
STATE_BYTES_PER_PARAM = 12  # float32 parameter + AdamW's two float32 moments
GRAD_BYTES_PER_PARAM = 4  # the float32 gradient, held in the step's temporaries
# Run fields that change the parameters but no buffer beyond one layer's transient gate logits
# (elementwise work, norms, RoPE channels, gate maps and biases; a vector gate's logits are
# T x W x D per kv head: 8 MiB per layer at T = 4096, held one layer at a time under remat):
# runs differing from a compiled run only in these share it.
SHAPE_NEUTRAL = ("model.rope", "rope_of_128", "model.qk_norm", "model.attention.entry_norm",
                 "model.attention.pooling", "model.attention.payload_norm",
                 "model.attention.gate")
# Runs compiled in this order (what bounds the table first); the others share one of them.
COMPILE_ORDER = ("w8s8_1kv", "w8s8_8kv", "w8s8_8kv_tail", "w8s4_1kv", "full_8kv",
                 "w8s4_dsv4_kernel", "w12s12_1kv", "w8s8_1kv_tail", "full_1kv",
                 "w8s8_1kv_tied_kv", "w4s4_1kv", "w8s6_1kv", "w8s8_4kv", "w8s8_2kv",
                 "full_4kv")


def signature(run: str) -> tuple:
  """The run's fields that may change a buffer (``SHAPE_NEUTRAL`` left out)."""
  from configs.paper import runs
  return tuple(sorted((k, v) for k, v in runs.RUNS[run].items() if k not in SHAPE_NEUTRAL))


def shares(run: str, compiled: list[str]) -> str | None:
  """The compiled run standing for ``run``: itself, or one with its signature (None: none)."""
  if run in compiled:
    return run
  return next((c for c in compiled if signature(c) == signature(run)), None)


def static_row(run: str, mfu: float) -> dict:
  """Parameters, analytic FLOPs and the estimated device-hours of one run (no compilation)."""
  from chunkformer import config as config_lib
  from chunkformer import flops
  from chunkformer import runtime as runtime_lib
  from chunkformer import train_state as state_lib
  from configs.paper import runs

  c = runs.get_run_config(run, "paper")
  c.mesh.fsdp = 1  # this process has one CPU device
  config = config_lib.from_dict(c.to_dict())
  m, d, t = config.model, config.data, config.train
  params = state_lib.param_count(runtime_lib.build(config).abstract_state.params)
  per_token = flops.train_flops_per_token(m, d.seq_len)
  peak = dict(flops.PEAK_TFLOPS)[DEVICE] * 1e12
  total = per_token * d.seq_len * d.batch_size * t.steps
  return dict(run=run, params=params, seq_len=d.seq_len, batch_rows=d.batch_size,
              steps=t.steps, analytic_flops_per_token=per_token, train_flops=total,
              assumed_mfu=mfu, device_hours=total / (mfu * peak) / 3600)


def compile_run(run: str) -> dict:
  """scale_plan's record of ``run`` at size paper on one device (a subprocess, as scale_plan)."""
  case = dict(devices=1, seq_len=4096, variant=run, remat="full", config="paper",
              compiler_flops=False)
  with tempfile.TemporaryDirectory() as tmp:
    cases, out = os.path.join(tmp, "cases"), os.path.join(tmp, "out")
    with open(cases, "w") as f:
      f.write(json.dumps(case) + "\n")
    env = dict(os.environ, JAX_PLATFORMS="cpu", PYTHONPATH=ROOT,
               XLA_FLAGS="--xla_force_host_platform_device_count=1")
    subprocess.run([sys.executable, "-m", "bench.scale_plan", "--worker", "--cases", cases,
                    "--output", out], env=env, cwd=ROOT, check=True)
    return json.loads(open(out).read().splitlines()[-1])


def memory_row(row: dict, compiled: dict[str, dict]) -> dict:
  """The run's memory on one device from its own or its shared compiled record."""
  source = shares(row["run"], list(compiled))
  if source is None:
    return dict(row, memory_from=None)
  rec = compiled[source]
  if "error" in rec:
    return dict(row, memory_from=source, error=rec["error"])
  delta = row["params"] - rec["params"]
  state = rec["argument_bytes"] + STATE_BYTES_PER_PARAM * delta
  peak = rec["peak_bytes"] + (STATE_BYTES_PER_PARAM + GRAD_BYTES_PER_PARAM) * delta
  per_row = max(peak - state, 1)
  budget = scale_plan.FIT_FRACTION * DEVICE_GB * 1e9
  rows = max(int((budget - state) // per_row), 0)
  # train.grad_accum_steps splits the update's rows evenly: the fewest micro-batches (a
  # divisor of the rows) whose micro-batch fits.
  batch = row["batch_rows"]
  accum = next((k for k in range(1, batch + 1) if batch % k == 0 and batch // k <= rows), None)
  micro = batch // accum if accum else 0
  return dict(row, memory_from=source, state_bytes=state, peak_bytes_one_row=peak,
              bytes_per_row=per_row, max_rows=rows, micro_batch=micro, grad_accum_steps=accum,
              peak_bytes_at_micro_batch=state + micro * per_row if micro else None,
              compile_s=rec["compile_s"] if source == row["run"] else None)


def gib(x) -> str:
  return "-" if x is None else f"{x / 2**30:.2f}"


def write(rows: list[dict], compiled: dict[str, dict], meta: dict, out_base: str) -> None:
  table = [memory_row(r, compiled) for r in rows]
  with open(out_base + ".json", "w") as f:
    json.dump(dict(meta, rows=table, compiled=compiled), f, indent=2)
  mfu = meta["assumed_mfu"]
  lines = [
      "# The paper's sweep at its own size: memory plan and device-hours per run", "",
      f"Command: `{meta['command']}`  ",
      f"Date: {meta['date']}{' - ' + meta['date_end'] if meta.get('date_end') else ''}, "
      f"commit {meta['commit']}, load average at start / end: "
      f"{meta['load_start']} / {meta.get('load_end', '?')} (2 shared CPU cores).", "",
      "Every run of `configs/paper/runs.py` at size `paper`: Qwen3-0.6B's shape (28 layers, "
      "width 1024, 16 query heads of 128, vocabulary 151936), bf16 compute, float32 parameters "
      "and AdamW, remat `full`, scanned layers, 4096 tokens x 64 rows per update, 20000 "
      "updates (5.24e9 tokens). How to run them: `docs/paper_scale.md`.", "",
      f"**Device-hours are an ESTIMATE, not a measurement**: analytic model FLOPs of the "
      f"budget (`chunkformer/flops.py`: 3 x forward, remat not counted) / ({mfu:.0%} assumed "
      f"MFU x 989 TFLOP/s, the H200's dense bf16 peak) / 3600. No run of this table has "
      f"trained on an H200; at another MFU m multiply by {mfu} / m (the 0.6B step's measured "
      f"MFU: `bench/results/accelerator_<device>.md`).", "",
      "**Memory is CPU-compiled (a proxy)**: XLA:CPU's buffer assignment for the step on one "
      "device with one row, not XLA:GPU's. `state` = parameters + AdamW moments + batch "
      "(the step's arguments); the bytes above it are taken as linear in the rows, so the "
      "largest micro-batch that fits one H200 at 90% of 141 GB, and the gradient accumulation "
      "that makes 64 rows, are extrapolations from one row. `memory from`: the run compiled "
      "for this row (itself, or one that differs from it only in fields that change the "
      "parameters and no buffer beyond one layer's gate logits (`SHAPE_NEUTRAL` in "
      "bench/paper_scale_plan.py): its state corrected by 12 bytes per parameter of "
      "difference, the peak by 16, an estimate).", "",
      f"| run | params | analytic GFLOP/token | est. {DEVICE}-hours at {mfu:.0%} MFU | memory "
      "from | state GiB | peak GiB (1 row) | GiB per extra row | max rows on one H200 | "
      "micro-batch x accumulation = 64 | peak GiB at that micro-batch |",
      "|" + "---|" * 11,
  ]
  for r in table:
    src = r.get("memory_from")
    head = (f"| {r['run']} | {r['params'] / 1e6:.1f}M | "
            f"{r['analytic_flops_per_token'] / 1e9:.3f} | {r['device_hours']:.1f} |")
    if src is None:
      lines.append(head + " not compiled |" + " |" * 6)
    elif "error" in r:
      lines.append(head + f" {src}: compile failed: {r['error']} |" + " |" * 6)
    else:
      own = "itself" if src == r["run"] else f"`{src}`"
      plan = (f"{r['micro_batch']} x {r['grad_accum_steps']}" if r["grad_accum_steps"]
              else "does not fit")
      lines.append(head + f" {own} | {gib(r['state_bytes'])} | {gib(r['peak_bytes_one_row'])} "
                   f"| {gib(r['bytes_per_row'])} | {r['max_rows']} | {plan} | "
                   f"{gib(r['peak_bytes_at_micro_batch'])} |")
  total = sum(r["device_hours"] for r in table)
  lines += ["", f"Sum over the {len(table)} runs (one seed each): {total:,.0f} estimated "
            f"{DEVICE}-hours at {mfu:.0%} MFU; each further seed of a run adds its row."]
  compiled_rows = [c for c in compiled.values() if "error" not in c]
  if compiled_rows:
    lines += ["", "## Compiled runs (one device, one row of 4096 tokens)", "",
              "| run | params | state | activations | logits/loss | rest | peak | compile s |",
              "|---|---|---|---|---|---|---|---|"]
    for c in compiled_rows:
      p = c["parts"]
      lines.append(f"| {c['variant']} | {c['params'] / 1e6:.1f}M | {gib(p['state'])} | "
                   f"{gib(p['activations'])} | {gib(p['logits_loss'])} | {gib(p['rest'])} | "
                   f"{gib(c['peak_bytes'])} | {c['compile_s']:.0f} |")
  if meta.get("notes"):
    lines += ["", *meta["notes"]]
  with open(out_base + ".md", "w") as f:
    f.write("\n".join(lines) + "\n")


def main() -> None:
  p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  p.add_argument("--compile", default="all",
                 help="runs to compile, in order: 'all' (COMPILE_ORDER), 'none' or RUN,...")
  p.add_argument("--mfu", type=float, default=0.35, help="assumed model FLOPs utilisation")
  p.add_argument("--out", default="bench/results/paper_scale_plan")
  p.add_argument("--resume", action="store_true", help="keep the compiled runs of --out")
  args = p.parse_args()
  from configs.paper import runs
  todo = {"all": list(COMPILE_ORDER), "none": []}.get(args.compile)
  if todo is None:
    todo = args.compile.split(",")
  bad = [r for r in todo if r not in runs.RUNS]
  if bad:
    raise SystemExit(f"error: --compile: unknown paper runs {bad}; expected names of "
                     f"configs/paper/runs.py RUNS")
  if not 0 < args.mfu <= 1:
    raise SystemExit(f"error: --mfu must be in (0, 1], got {args.mfu}")
  from chunkformer import provenance

  compiled: dict[str, dict] = {}
  if args.resume and os.path.exists(args.out + ".json"):
    compiled = {k: v for k, v in json.load(open(args.out + ".json"))["compiled"].items()
                if "error" not in v}
  meta = dict(command="python -m bench.paper_scale_plan " + " ".join(sys.argv[1:]),
              date=datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC"),
              commit=provenance.commit(), load_start=scale_plan.load(), assumed_mfu=args.mfu,
              device=DEVICE)
  os.makedirs(os.path.dirname(args.out) or ".", exist_ok=True)
  rows = [static_row(r, args.mfu) for r in runs.RUNS]
  write(rows, compiled, meta, args.out)
  for run in todo:
    if run in compiled:
      continue
    compiled[run] = compile_run(run)
    meta["load_end"] = scale_plan.load()
    meta["date_end"] = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC")
    write(rows, compiled, meta, args.out)  # after each run: partial results survive
  print(open(args.out + ".md").read())


if __name__ == "__main__":
  main()
