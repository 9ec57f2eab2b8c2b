"""One command that measures chunkformer on whatever accelerator JAX finds, in a time budget.

  python -m bench.accelerator               # GPU/TPU: T = 4096 and 32768, <= 8 minutes
  python -m bench.accelerator --small       # CPU check: tiny shapes, Pallas in interpret mode

Measures (bench/accelerator_rows.py):
- kernels: the compressed-attention kernel (fixed M = 4 and dynamic ends of mean 4, window 128,
  Qwen3-0.6B heads, bf16) forward and forward + backward TFLOP/s at useful FLOPs, against the
  platform's best full causal attention (cuDNN on GPU, splash on TPU, XLA otherwise) and the
  project's kernel run as plain causal attention (what kind full trains with), the measured
  speedup against the FLOP ratio (useful FLOPs, and T / (T/S + W)), and each kernel's executed /
  needed tiles from its loop bounds (``kernels/tiles.py``); ``--trace``: a profiler trace of
  each op under OUT/traces/; ``--isa``: the compiled code dumped to OUT/xla_dump/ and its matrix
  instructions counted (``bench/device_isa.py``);
- train steps: configs/lm/qwen3_0p6b.py per kind (full, fixed, dynamic, v4) at each T, with
  ``--rows_4k`` rows per device at T <= 4096 (one micro-batch): tokens/s, MFU, the compiled
  plan's bytes against the measured peak (``device.memory_stats()``).

Every measurement runs in a worker process (the parent never imports JAX): the kernels in one,
each train row (kind, T) in its own (so the process's peak is that row's), every kind at the
shorter T first. A row that fails (out of memory, a kernel that does not compile) is recorded with
its error; a worker that crashes or overruns leaves its missing rows marked so. The budget is
shared: a worker gets the time that is left, and rows that would start after it are skipped.
Writes ``bench/results/accelerator_<device>.{md,json}`` with date, commit and command.
"""

from __future__ import annotations

import argparse
import datetime
import importlib.util
import json
import os
import re
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if __package__ in (None, ""):  # run as a file: bench/ must not shadow the top-level kernels
  sys.path[0] = ROOT

KINDS = ("fixed", "dynamic", "full", "v4")  # the compressed kinds first: the study's subject
SEQ_LENS = (4096, 32768)
SMALL_SEQ_LENS = (128,)
KERNEL_CHUNKS = ("4", "dynamic")


# What the workers import beyond the standard library: the kernels need JAX alone, a train row
# the whole training stack. Accelerator images often lack the small ones (an H200 image had no
# ml_collections, tensorboardX or array_record), found here before any device time is spent.
KERNEL_PACKAGES = ("jax", "numpy")
TRAIN_PACKAGES = ("flax", "optax", "orbax.checkpoint", "ml_collections", "tensorboardX")


def missing_packages(args) -> list[str]:
  """The packages the requested rows import that this interpreter cannot find."""
  wanted = KERNEL_PACKAGES + (TRAIN_PACKAGES if args.kinds else ())
  missing = []
  for name in wanted:
    try:
      found = importlib.util.find_spec(name) is not None
    except ModuleNotFoundError:  # a dotted name whose parent package is absent
      found = False
    if not found:
      missing.append(name)
  return missing


def _parse(argv):
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  p.add_argument("--small", action="store_true", help="tiny shapes and model (CPU check)")
  p.add_argument("--budget_s", type=float, default=480.0, help="total wall time (seconds)")
  p.add_argument("--seq_lens", type=int, nargs="*", help=f"T values (default {SEQ_LENS})")
  p.add_argument("--kinds", nargs="*", default=list(KINDS), choices=KINDS)
  p.add_argument("--chunks", nargs="*", default=list(KERNEL_CHUNKS), choices=KERNEL_CHUNKS,
                 help="kernel chunkings: fixed M = 4 and/or dynamic ends")
  p.add_argument("--steps", type=int, default=3, help="timed train steps after a warm-up")
  p.add_argument("--reps", type=int, default=5, help="timed kernel calls after a warm-up")
  p.add_argument("--full_impl", choices=("cudnn", "splash", "xla"),
                 help="full attention to compare with (default: the platform's best)")
  p.add_argument("--out", default=os.path.join(ROOT, "bench", "results"))
  p.add_argument("--rows_4k", type=int, default=4,
                 help="rows per device (one micro-batch) of the train rows at T <= 4096")
  p.add_argument("--trace", action="store_true",
                 help="a jax.profiler trace of each kernel op under OUT/traces/")
  p.add_argument("--isa", action="store_true",
                 help="dump the kernels' compiled code to OUT/xla_dump/ and count the matrix "
                      "instructions in it (bench/device_isa.py)")
  p.add_argument("--worker", choices=("kernels", "train"), help=argparse.SUPPRESS)
  p.add_argument("--rows_out", help=argparse.SUPPRESS)
  p.add_argument("--deadline", type=float, help=argparse.SUPPRESS)
  args = p.parse_args(argv)
  if args.budget_s <= 0 or args.steps < 1 or args.reps < 1 or args.rows_4k < 1:
    p.error("--budget_s, --steps, --reps and --rows_4k must be positive")
  if args.seq_lens is None:
    args.seq_lens = list(SMALL_SEQ_LENS if args.small else SEQ_LENS)
  if any(t < 16 for t in args.seq_lens):
    p.error(f"--seq_lens: every T must be >= 16, got {args.seq_lens}")
  args.seq_lens = sorted(args.seq_lens)
  if args.small:
    args.steps, args.reps = 1, 1
  return args


# ---- workers (inside a subprocess: JAX imported here only) ----

def _worker(args) -> None:
  import jax
  import jax.numpy as jnp

  from bench import accelerator_rows as rows_lib

  def emit(row):
    with open(args.rows_out, "a") as f:
      f.write(json.dumps(row) + "\n")

  emit(rows_lib.device_row())
  out_of_time = lambda: time.time() > args.deadline
  if args.worker == "kernels":
    dtype = jnp.float32 if args.small else jnp.bfloat16  # bf16 is emulated (slow) on CPU
    for t in args.seq_lens:
      for chunk in args.chunks:
        if out_of_time():
          emit(dict(section="kernels", op="compressed", T=t, M=chunk, status="skipped: budget"))
          continue
        try:
          rows = rows_lib.kernel_rows(
              t, chunk, "small" if args.small else "paper", dtype, args.reps, args.full_impl,
              os.path.join(args.out, "traces") if args.trace else None)
        except Exception as e:  # noqa: BLE001 -- e.g. inputs that do not fit: the next case runs
          rows = [dict(section="kernels", op="compressed", T=t, M=chunk,
                       status=f"failed: {type(e).__name__}: {str(e).splitlines()[0][:300]}")]
        for row in rows:
          emit(row)
    return
  for kind in args.kinds:
    for t in args.seq_lens:
      if out_of_time():
        emit(dict(section="train", op="train_step", kind=kind, T=t, status="skipped: budget"))
        continue
      emit(rows_lib.train_row(kind, t, args.small, args.steps, rows_per_device(args, t)))
  del jax


def rows_per_device(args, t: int) -> int:
  """Micro-batch rows per device of a train row: several at short T (``--rows_4k``)."""
  return args.rows_4k if t <= 4096 else 1


# ---- the parent: plans, runs the workers within the budget, writes the report ----

def _planned(args, worker: str, kind: str | None, seq_lens: list[int]) -> list[dict]:
  if worker == "kernels":
    return [dict(section="kernels", op="compressed", T=t, M=m) for t in seq_lens
            for m in args.chunks]
  return [dict(section="train", op="train_step", kind=kind, T=t) for t in seq_lens]


def _key(row: dict) -> tuple:
  return tuple(row.get(k) for k in ("section", "op", "kind", "T", "M"))


def _run_worker(args, worker: str, kind: str | None, seq_lens: list[int],
                deadline: float) -> list[dict]:
  """Runs one worker until it ends or the deadline; its rows plus any it left unwritten."""
  planned = _planned(args, worker, kind, seq_lens)
  left = deadline - time.time()
  if left < 1:
    return [dict(p, status="skipped: budget") for p in planned]
  with tempfile.TemporaryDirectory() as tmp:
    rows_out = os.path.join(tmp, "rows.jsonl")
    cmd = [sys.executable, "-m", "bench.accelerator", "--worker", worker, "--rows_out",
           rows_out, "--deadline", str(deadline), "--steps", str(args.steps), "--reps",
           str(args.reps), "--seq_lens", *map(str, seq_lens), "--chunks", *args.chunks]
    cmd += ["--small"] * args.small + (["--kinds", kind] if kind else [])
    cmd += ["--out", os.path.abspath(args.out), "--rows_4k", str(args.rows_4k)]
    cmd += ["--trace"] * args.trace
    cmd += ["--full_impl", args.full_impl] if args.full_impl else []
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    # One worker at a time owns the device: let it use all of a GPU (JAX's default is 75%).
    env.setdefault("XLA_PYTHON_CLIENT_MEM_FRACTION", "0.95")
    if args.isa and worker == "kernels":  # the compiled kernels, for bench/device_isa.py
      env["XLA_FLAGS"] = (env.get("XLA_FLAGS", "") + " --xla_dump_to="
                          + os.path.join(os.path.abspath(args.out), "xla_dump")).strip()
    try:
      done = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True,
                            timeout=left)
      why = None if done.returncode == 0 else (
          f"worker exited {done.returncode}: " + (done.stderr.strip().splitlines() or [""])[-1])
    except subprocess.TimeoutExpired:
      why = f"worker stopped at the budget after {left:.0f} s"
    rows = [json.loads(line) for line in open(rows_out)] if os.path.exists(rows_out) else []
  written = {_key(r) for r in rows}
  # The kernels worker writes "compressed" rows under each (T, M): a missing one was not reached.
  rows += [dict(p, status=f"failed: {why}" if why else "failed: no row written")
           for p in planned if _key(p) not in written]
  return rows


def device_name(rows: list[dict]) -> str:
  """File-name form of the device (e.g. ``nvidia-h200``, ``cpu``), from the workers' rows."""
  kinds = [r["device_kind"] for r in rows if r.get("op") == "device"]
  kind = kinds[0] if kinds else "unknown"
  return re.sub(r"[^a-z0-9]+", "-", kind.lower()).strip("-") or "unknown"


def _fmt(x, spec: str) -> str:
  return format(x, spec) if isinstance(x, (int, float)) and x is not None else "-"


def _gib(x) -> str:
  return f"{x / 2**30:.2f}" if isinstance(x, (int, float)) else "-"


def write_report(rows: list[dict], meta: dict, out_dir: str) -> tuple[str, str]:
  os.makedirs(out_dir, exist_ok=True)
  base = os.path.join(out_dir, f"accelerator_{device_name(rows)}")
  devices = [r for r in rows if r.get("op") == "device"]
  meta = dict(meta, device=devices[0] if devices else None)
  with open(base + ".json", "w") as f:
    json.dump(dict(meta, rows=[r for r in rows if r.get("op") != "device"]), f, indent=1)
  d = meta["device"] or {}
  lines = [f"# Accelerator measurements: {d.get('device_kind', '?')} x{d.get('devices', '?')} "
           f"({d.get('backend', '?')}, jax {d.get('jax_version', '?')})", "",
           f"Command: `{meta['command']}`  ",
           f"Date: {meta['date']}, commit {meta['commit']}, wall {meta['wall_s']:.0f} s of a "
           f"{meta['budget_s']:.0f} s budget.  ",
           "Software: " + (", ".join([f"Python {d['python']}"] + [
               f"{k} {v}" for k, v in d["packages"].items() if v]) if d.get("packages")
                           else "not recorded") + ".", "",
           "## Kernels: compressed attention against full causal attention", "",
           "Useful FLOPs only (window + visible entries; the causal triangle); forward + "
           "backward counts 3.5x the forward. Speedup = full time / compressed time, beside the "
           "useful-FLOP ratio and T / (T/S + W).", "",
           "| T | M | op | impl | fwd ms | fwd TFLOP/s | fwd+bwd ms | fwd+bwd TFLOP/s | status |",
           "|---|---|---|---|---|---|---|---|---|"]
  for r in (r for r in rows if r.get("section") == "kernels" and r["op"] != "speedup"):
    lines.append(f"| {r['T']} | {r['M']} | {r['op']} | {r.get('impl', '-')}"
                 f"{' (interpret)' if r.get('interpret') else ''} | {_fmt(r.get('fwd_ms'), '.3f')}"
                 f" | {_fmt(r.get('fwd_tflops'), '.3g')} | {_fmt(r.get('fwd_bwd_ms'), '.3f')} | "
                 f"{_fmt(r.get('fwd_bwd_tflops'), '.3g')} | {r['status']} |")
  lines += ["", "Speedup = full time / compressed time. Kernel as full = the best full attention's "
            "time / the project's kernel run as causal attention (a whole-row window, what the "
            "model's kind full runs on GPU and TPU).", "",
            "| T | M | fwd speedup | fwd+bwd speedup | useful-FLOP ratio | T / (T/S + W) | "
            "kernel as full fwd | kernel as full fwd+bwd |", "|---|---|---|---|---|---|---|---|"]
  for r in (r for r in rows if r.get("op") == "speedup"):
    lines.append(f"| {r['T']} | {r['M']} | {_fmt(r.get('fwd_speedup'), '.2f')} | "
                 f"{_fmt(r.get('fwd_bwd_speedup'), '.2f')} | {_fmt(r['useful_flop_ratio'], '.2f')}"
                 f" | {_fmt(r['formula_ratio'], '.2f')} | "
                 f"{_fmt(r.get('kernel_full_fwd_vs_best'), '.2f')} | "
                 f"{_fmt(r.get('kernel_full_fwd_bwd_vs_best'), '.2f')} |")
  tiled = [r for r in rows if r.get("tiles")]
  if tiled:
    lines += ["", "Executed / needed tiles (and executed / visible pairs) per kernel, from the "
              "loop bounds (`kernels/tiles.py`):", "", "| T | M | op | kernel | tiles x | "
              "pairs x |", "|---|---|---|---|---|---|"]
    for r in tiled:
      for name, n in r["tiles"].items():
        lines.append(f"| {r['T']} | {r['M']} | {r['op']} | {name} | {n['tile_ratio']:.3f} | "
                     f"{n['pair_ratio']:.2f} |")
  lines += ["", "## Training steps", "",
            "Each device steps one micro-batch of `rows/device` rows (`--rows_4k` at T <= 4096); "
            "MFU = model FLOPs (chunkformer/flops.py) x tokens/s / peak. "
            "Plan = the compiled step's argument + output - aliased + temporary bytes per "
            "device; measured = the process's `peak_bytes_in_use` after the row.", "",
            "| kind | T | rows/device | attention impl | tokens/s | MFU | step s | compile s | "
            "plan GiB | measured peak GiB | status |",
            "|---|---|---|---|---|---|---|---|---|---|---|"]
  for r in (r for r in rows if r.get("section") == "train"):
    lines.append(f"| {r['kind']} | {r['T']} | {r.get('rows_per_device', '-')} | "
                 f"{r.get('implementation', '-')} | "
                 f"{_fmt(r.get('tokens_per_s'), ',.0f')} | {_fmt(r.get('mfu'), '.3f')} | "
                 f"{_fmt(r.get('step_s'), '.3f')} | {_fmt(r.get('compile_s'), '.1f')} | "
                 f"{_gib(r.get('plan_bytes'))} | {_gib(r.get('measured_peak_bytes'))} | "
                 f"{r['status']} |")
  if meta.get("isa") is not None:
    from bench import device_isa

    lines += [""] + device_isa.markdown(meta["isa"])
  with open(base + ".md", "w") as f:
    f.write("\n".join(lines) + "\n")
  return base + ".md", base + ".json"


def main(argv=None) -> None:
  args = _parse(argv)
  if args.worker:
    _worker(args)
    return
  missing = missing_packages(args)
  if missing:
    raise SystemExit(f"bench.accelerator: this Python lacks {', '.join(missing)}: install the "
                     "pinned versions (requirements.lock), or on a machine without a package "
                     "index carry their wheels and put them on PYTHONPATH")
  began = time.time()
  deadline = began + args.budget_s
  from chunkformer import provenance  # light: no JAX in the parent

  meta = dict(command="python -m bench.accelerator " + " ".join(sys.argv[1:] if argv is None
                                                                else argv),
              date=datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC"),
              commit=provenance.commit(), budget_s=args.budget_s,
              seq_lens=args.seq_lens, small=args.small)
  rows = _run_worker(args, "kernels", None, args.seq_lens, deadline) if args.chunks else []
  # One process per train row (its peak memory is its own), every kind at the shorter T first.
  for t in args.seq_lens:
    for kind in args.kinds:
      rows += _run_worker(args, "train", kind, [t], deadline)
  meta["wall_s"] = time.time() - began
  if args.isa:
    from bench import device_isa

    meta["isa"] = device_isa.scan(os.path.join(args.out, "xla_dump"))
  md, js = write_report(rows, meta, args.out)
  print(open(md).read())
  print(f"wrote {md} and {js}")


if __name__ == "__main__":
  main()
