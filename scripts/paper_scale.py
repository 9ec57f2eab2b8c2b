"""Train and evaluate the paper's sweep at its own size on accelerators, as one command.

  python scripts/paper_scale.py --workdir runs/paper [--devices N] [--seeds 3]
      [--runs all|RUN,...] [--dry_run] [-- extra train.py flags, e.g. --config.data.path=DIR]

For every run of configs/paper/runs.py at size ``paper`` (Qwen3-0.6B's shape, 4096 tokens x
64 rows, 20000 updates), one ``train.py`` per seed into WORKDIR/<run>_seed<k>, then one
``eval.py`` of configs/sweeps/paper_protocol.py over the finished run directories into
WORKDIR/protocol (the units are "<run>_seed<k>": seeds of one run pool as one variant).

- Seeds: ``--seeds`` for the replicated runs (``REPLICATED``: W8/S8 with one KV head and full
  attention with one KV head), two for every other compressed run (the claims compare them),
  one for the other full-attention runs.
- Gradient accumulation: the fewest micro-batches whose rows fit one device, from the memory
  plan bench/results/paper_scale_plan.json (``python -m bench.paper_scale_plan``; its
  ``max_rows`` per H200), with the update's 64 rows split over ``--devices`` devices (FSDP).
- Unscanned layers (``--config.model.scan_layers=false``): the gate-concentration and
  knockout probes read unscanned models.
Every step resumes: rerunning the same command continues each training run from its latest
checkpoint and the sweep from its finished units. ``--dry_run`` prints the commands only.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from configs.paper import runs  # noqa: E402

PLAN = os.path.join(ROOT, "bench", "results", "paper_scale_plan.json")
REPLICATED = ("w8s8_1kv", "full_1kv")


def seeds_of(run: str, replicated_seeds: int) -> int:
  if run in REPLICATED:
    return replicated_seeds
  return 1 if runs.RUNS[run]["model.attention.kind"] == "full" else 2


def accumulation(plan_row: dict, batch_rows: int, devices: int) -> int:
  """Fewest micro-batches k (k x devices divides the rows) whose rows per device fit."""
  fit = plan_row.get("max_rows")
  if not fit:
    raise SystemExit(f"error: {PLAN}: run {plan_row['run']!r} has no compiled memory plan "
                     "(max_rows); run python -m bench.paper_scale_plan --compile "
                     f"{plan_row['run']} first")
  for k in range(1, batch_rows + 1):
    if batch_rows % (k * devices) == 0 and batch_rows // (k * devices) <= fit:
      return k
  raise SystemExit(f"error: --devices {devices}: no micro-batch of the {batch_rows} rows "
                   f"splits evenly over {devices} devices")


def commands(workdir: str, names: list[str], plan: dict[str, dict], devices: int,
             replicated_seeds: int, extra: list[str]) -> list[list[str]]:
  """The train.py commands of every run and seed, then the one eval.py command."""
  out, dirs = [], []
  for run in names:
    row = plan.get(run)
    if row is None:
      raise SystemExit(f"error: {PLAN}: no row for run {run!r}")
    accum = accumulation(row, row["batch_rows"], devices)
    for seed in range(seeds_of(run, replicated_seeds)):
      run_dir = os.path.join(workdir, f"{run}_seed{seed}")
      dirs.append(run_dir)
      out.append([sys.executable, "train.py", "--config", runs.source(run, "paper"),
                  "--workdir", run_dir, f"--config.seed={seed}",
                  "--config.model.scan_layers=false",
                  f"--config.train.grad_accum_steps={accum}", *extra])
  out.append([sys.executable, "eval.py", "--config",
              "configs/sweeps/paper_protocol.py:" + ",".join(dirs),
              "--workdir", os.path.join(workdir, "protocol")])
  return out


def main() -> None:
  p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  p.add_argument("--workdir", required=True)
  p.add_argument("--runs", default="all", help="'all' or comma-separated runs of RUNS")
  p.add_argument("--devices", type=int, default=1, help="devices of the FSDP mesh")
  p.add_argument("--seeds", type=int, default=3, help="seeds of the replicated runs")
  p.add_argument("--plan", default=PLAN, help="the memory plan's JSON")
  p.add_argument("--dry_run", action="store_true", help="print the commands, run nothing")
  args, extra = p.parse_known_args()
  extra = [x for x in extra if x != "--"]
  names = list(runs.RUNS) if args.runs == "all" else args.runs.split(",")
  unknown = [n for n in names if n not in runs.RUNS]
  if unknown:
    raise SystemExit(f"error: --runs: unknown paper runs {unknown}")
  if args.devices < 1 or args.seeds < 1:
    raise SystemExit("error: --devices and --seeds must be >= 1")
  if not os.path.exists(args.plan):
    raise SystemExit(f"error: --plan {args.plan}: not found; run python -m bench.paper_scale_plan")
  plan = {r["run"]: r for r in json.load(open(args.plan))["rows"]}
  todo = commands(args.workdir, names, plan, args.devices, args.seeds, extra)
  for cmd in todo:
    print(shlex.join(cmd), flush=True)
    if not args.dry_run:
      subprocess.run(cmd, cwd=ROOT, check=True)


if __name__ == "__main__":
  main()
