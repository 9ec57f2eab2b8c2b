"""The prepared device check: one command, <= 8 minutes, everything under one folder.

  python -m bench.device_check --out OUT            # on the accelerator (GPU: an H200)
  python -m bench.device_check --out OUT --small    # CPU rehearsal (its test)

Runs ``bench.accelerator`` with a profiler trace of every kernel op (``--trace``), the compiled
code dumped and its matrix instructions counted (``--isa``) and micro-batches of ``--rows_4k``
rows per device at 4K, then ``bench.kernel_tiles`` (executed / needed tiles per kernel), and
writes ``OUT/goals.md``: each goal of the kernel work beside what was measured. OUT then holds:
accelerator_<device>.{md,json}, traces/<op>/ (TensorBoard profile plugin format),
xla_dump/, kernel_tiles.{md,json}, goals.md.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

if __package__ in (None, ""):  # python bench/device_check.py: make the repo root importable
  sys.path[0] = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

from bench import accelerator, kernel_tiles

# (what, T, M, field of the row, op, target): the goals the kernels are measured against.
GOALS = (
    ("compressed forward >= 400 useful TFLOP/s at 32K", 32768, "4", "fwd_tflops", "compressed",
     400.0),
    ("compressed forward >= 2.7x cuDNN at 32K", 32768, "4", "fwd_speedup", "speedup", 2.7),
    ("compressed forward + backward >= 300 useful TFLOP/s at 32K", 32768, "4", "fwd_bwd_tflops",
     "compressed", 300.0),
    ("compressed forward >= 1.3x cuDNN at 4K", 4096, "4", "fwd_speedup", "speedup", 1.3),
    ("compressed forward + backward >= 1.3x cuDNN at 4K", 4096, "4", "fwd_bwd_speedup",
     "speedup", 1.3),
)
MFU_GOAL = 0.35  # train MFU at 4K with micro-batches, every kind


def goals(rows: list[dict]) -> list[str]:
  """Lines of goals.md: every goal, the measured value, met or not (or not measured)."""
  lines = ["# Device check: goals against measurements", "",
           "| goal | measured | met |", "|---|---|---|"]

  def line(what, value, target):
    if value is None:
      lines.append(f"| {what} | - | not measured |")
    else:
      lines.append(f"| {what} | {value:.3g} | {'yes' if value >= target else 'no'} |")

  for what, t, m, field, op, target in GOALS:
    row = next((r for r in rows if r.get("section") == "kernels" and r.get("op") == op
                and r.get("T") == t and str(r.get("M")) == m), {})
    line(what, row.get(field), target)
  for r in (r for r in rows if r.get("section") == "train" and r.get("T") == 4096):
    line(f"train MFU >= {MFU_GOAL} at 4K, kind {r['kind']} ({r.get('rows_per_device')} rows "
         "per device)", r.get("mfu"), MFU_GOAL)
  return lines


def main(argv=None) -> None:
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  p.add_argument("--out", required=True, help="folder for everything the check writes")
  p.add_argument("--small", action="store_true", help="CPU rehearsal: tiny shapes")
  p.add_argument("--budget_s", type=float, default=420.0,
                 help="the accelerator measurements' budget (the rest takes seconds)")
  p.add_argument("--kinds", nargs="*", default=list(accelerator.KINDS),
                 choices=accelerator.KINDS)
  p.add_argument("--chunks", nargs="*", default=list(accelerator.KERNEL_CHUNKS),
                 choices=accelerator.KERNEL_CHUNKS)
  args = p.parse_args(argv)
  os.makedirs(args.out, exist_ok=True)
  accelerator.main(["--out", args.out, "--budget_s", str(args.budget_s), "--trace", "--isa",
                    "--kinds", *args.kinds, "--chunks", *args.chunks] + ["--small"] * args.small)
  kernel_tiles.main(["--out", args.out] + ["--small"] * args.small)
  (report,) = [n for n in os.listdir(args.out) if n.startswith("accelerator_")
               and n.endswith(".json")]
  rows = json.load(open(os.path.join(args.out, report)))["rows"]
  text = "\n".join(goals(rows)) + "\n"
  with open(os.path.join(args.out, "goals.md"), "w") as f:
    f.write(text)
  print(text)


if __name__ == "__main__":
  main()
