"""Calibration by simulation of every deciding test: type-I error and power at the committed
sweeps' accuracies and sizes. One command regenerates everything:

  python scripts/calibrate.py [--parts lookup,needles,c5,eviction,e3,mechanism,eviction_lookup,e6,
                                      gate_floor,retrieval_gate]
                              [--seed 0]
                              [--small] [--out results/calibration]

Parts: ``lookup`` (C10-C12's period tests on 24 residues x 576 prompts,
``chunkformer.evaluation.stats.calibration``; its target positions are those of the paper protocol's
lookup probe: 128-token rows with 16 records and 8 demonstrations, t_K in [1, 108] matched in mean
and variance), ``needles`` (C1, C2 and the bootstrap intervals on 32 x 48 matrices,
``studies/needles/claims/calibration``), ``c5`` (the paired gap difference), ``eviction`` (E1, E2 on
32 x 40), ``e3`` (the sign-flip test), ``mechanism`` (C14-C16,
``studies/paper/claims/mechanism_calibration``), ``eviction_lookup`` (E4, E5 on 128 prompts x 8
residues x 3 seeds), ``e6`` (McNemar and the pooled sign-flip test,
``studies/eviction/claims/lookup_calibration``) and ``gate_floor`` (claim rules 4's floored power
gate against rules 1-3's on the lookup truths and at 99.9%). Each part writes ``OUT/<part>.json``
(the lookup part ``OUT/calibration.json``) with its command, commit, date and wall time; every run
rewrites ``OUT/report.md`` (one table per test) and ``OUT/RUN.md`` from every part found, so a part
can be rerun alone. ``--small``: 40 units per truth and 500 permutations (a minute; not for
committing).
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import json
import os
import platform
import subprocess
import sys
import textwrap
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

import numpy as np  # noqa: E402

from chunkformer.data import matched_positions  # noqa: E402
from chunkformer.evaluation.stats import (  # noqa: E402
  calibration,
  matrix_calibration,
  period_effect,
  retrieval_gate,
  shared_prompts,
)
from chunkformer.studies.eviction.claims import calibration as eviction_calibration  # noqa: E402
from chunkformer.studies.eviction.claims import lookup_calibration  # noqa: E402
from chunkformer.studies.needles.claims import calibration as needle_calibration  # noqa: E402
from chunkformer.studies.paper.claims import mechanism_calibration  # noqa: E402

# The paper protocol's lookup rows (configs/sweeps/paper_protocol.py, cpu_study): BOS at 0,
# 16 records, 8 demonstrations, 128 tokens: t_K from 1 to 1 + 77 + 2 * 16 - 2 = 108.
POSITION_RANGE = (1, 108)


def paper_positions() -> np.ndarray:
  """positions_YxR of the paper protocol's lookup matrices (row y of residue r)."""
  return matched_positions.matched_positions(calibration.RESIDUES, calibration.PROMPTS,
                                             *POSITION_RANGE).T


def _commit() -> str:
  try:
    return subprocess.run(["git", "-C", ROOT, "rev-parse", "--short", "HEAD"],
                          capture_output=True, text=True, check=True).stdout.strip()
  except (OSError, subprocess.CalledProcessError):
    return "unknown"


def _pct(x: float) -> str:
  return f"{100 * x:.1f}"


def report(rows, reps: int, phis: dict[str, float]) -> str:
  lines = [
      "# Calibration of the lookup period tests by simulation", "",
      f"{reps} simulated units per truth; 24 residues, 576 prompts per residue; alpha "
      f"{period_effect.ALPHA}. A type-I error passes when it is at most alpha plus two "
      "Monte-Carlo standard errors of a rate of alpha; a power passes at >= 0.8. "
      "\"reported\" rows are today's rules (seed counts summed, lack-of-fit p-value), shown "
      "for comparison and deciding nothing. Rates and their Monte-Carlo standard errors in "
      "percent.", "",
      "| truth | rule | kind | rate (%) | MC s.e. | bound | passes |",
      "|---|---|---|--:|--:|--:|---|"]
  for r in rows:
    bound = "-" if r.bound is None else _pct(r.bound)
    passes = "-" if r.passes is None else ("yes" if r.passes else "**no**")
    lines.append(f"| {r.truth} | {calibration.RULES[r.rule][0]} | {r.kind} | {_pct(r.rate)} | "
                 f"{_pct(r.mc_error)} | {bound} | {passes} |")
  lines += ["", "Truths:", ""]
  for name, t in sorted(calibration.TRUTHS.items()):
    phi = f"; phi between two seeds' answers {phis[name]:.2f}" if name in phis else ""
    lines.append(f"- `{name}`: {t.description}{phi}")
  lines += ["", "Thresholds of the decision (docs/claims.md, \"Period by effect size\"): "
            f"periodic share >= {period_effect.SHARE_MIN}, within-phase residual <= "
            f"{_pct(period_effect.RESIDUAL_MAX)} points rms, flat bound "
            f"{_pct(period_effect.FLAT_RMS)} points rms (a {_pct(period_effect.FLAT_DIP)}-point "
            f"dip at one phase of 8), power gate >= {period_effect.POWER_MIN} for a "
            f"{_pct(period_effect.PERIODIC_DIP)}-point dip (periodic) or the flat dip (flat)."]
  return "\n".join(lines) + "\n"


PARTS = ("lookup", "needles", "c5", "eviction", "e3", "mechanism", "eviction_lookup", "e6",
         "gate_floor", "retrieval_gate")
REPS = {"lookup": 2000, "needles": 250, "c5": 2000, "eviction": 250, "e3": 2000,
        "mechanism": 2000, "eviction_lookup": 1000, "e6": 500, "gate_floor": 200,
        "retrieval_gate": 1000}
TITLES = {
    "needles": "C1 and C2 (needle study's period test and the one \"no period\" standard), "
               "and the bootstrap intervals under the two poolings",
    "c5": "C5 (paired bootstrap interval of gap(M=2) - gap(M=4))",
    "eviction": "E1 and E2 (the period test and the \"no period\" standard on eviction "
                "matrices)",
    "e3": "E3 (paired sign-flip test over haystacks)",
    "mechanism": "C14-C16 (knockout concentration, gate alignment, gate cycling)",
    "eviction_lookup": "E4 and E5 (the period decision by effect size on the lookup under "
                       "eviction, plan version 5's sizes)",
    "e6": "E6 (McNemar per seed, the sign-flip test over prompts pooled)",
    "gate_floor": "The power gate of claim rules 4 (floored) against rules 1-3's, on the "
                  "lookup part's truths and at the ceiling",
    "retrieval_gate": "The retrieval gate of claim rules 5 (a unit learned the lookup when "
                      "its one-sided 99% lower bound clears the best shortcut + 10 points)",
}


def _lookup(args, reps: int) -> dict:
  rows = calibration.run(reps, seed=args.seed, positions_YxR=paper_positions())
  rng = np.random.default_rng(args.seed)
  phis = {name: calibration.seed_phi(t, rng) for name, t in calibration.TRUTHS.items()
          if t.seeds > 1}
  return {"reps": reps, "seed": args.seed, "alpha": period_effect.ALPHA,
          "residues": calibration.RESIDUES, "prompts_per_residue": calibration.PROMPTS,
          "truths": {k: dataclasses.asdict(t) for k, t in calibration.TRUTHS.items()},
          "rules": {k: text for k, (text, _) in calibration.RULES.items()},
          "seed_phi": phis, "rows": [r.record() for r in rows]}


def _matrix_part(part: str, args, reps: int) -> dict:
  perms = 500 if args.small else 2000
  run = {"needles": lambda: needle_calibration.run(reps, seed=args.seed, num_permutations=perms,
                                                   num_resamples=perms),
         "c5": lambda: needle_calibration.c5_run(reps, seed=args.seed, num_resamples=perms),
         "eviction": lambda: eviction_calibration.run(reps, seed=args.seed,
                                                      num_permutations=perms),
         "e3": lambda: eviction_calibration.e3_run(reps, seed=args.seed, num_permutations=perms),
         "mechanism": lambda: (mechanism_calibration.c14_run(reps, seed=args.seed)
                               + mechanism_calibration.c15_run(reps, seed=args.seed)
                               + mechanism_calibration.c16_run(reps, seed=args.seed)),
         "eviction_lookup": lambda: lookup_calibration.run(reps, seed=args.seed),
         "e6": lambda: lookup_calibration.e6_run(
             reps, seed=args.seed, num_permutations=perms if args.small else None),
         "gate_floor": lambda: calibration.gate_floor_run(reps, seed=args.seed,
                                                          positions_YxR=paper_positions()),
         "retrieval_gate": lambda: retrieval_gate.calibration_run(reps, seed=args.seed)}[part]
  out = {"reps": reps, "seed": args.seed, "permutations": perms,
         "rows": [r.record() for r in run()]}
  if part == "needles":
    out["truths"] = {k: dict(dataclasses.asdict(t), M=m)
                     for k, (t, m) in needle_calibration.TRUTHS.items()}
    out["design_effect"] = _design_effects(args.seed)
  if part == "eviction":
    out["truths"] = {k: dict(dataclasses.asdict(t), L=m)
                     for k, (t, m) in eviction_calibration.TRUTHS.items()}
  if part == "eviction_lookup":
    out["permutations"] = 0  # closed-form tests: no permutation, no resample
    out["truths"] = {k: dict(dataclasses.asdict(t), L=m)
                     for k, (t, m) in lookup_calibration.TRUTHS.items()}
  if part == "e6":
    out["permutations"] = perms if args.small else lookup_calibration.lookup_claims.E6_FLIPS
  if part in ("gate_floor", "retrieval_gate"):
    out["permutations"] = 0  # closed-form decisions
  return out


def _design_effects(seed: int) -> dict[str, float]:
  """How much the shared effects make three seeds agree (``shared_prompts.seed_agreement``,
  1 = independent, 3 = identical), averaged over 50 draws per truth."""
  rng = np.random.default_rng(seed)
  return {name: float(np.mean([shared_prompts.seed_agreement(matrix_calibration.simulate(t, rng))
                               for _ in range(50)]))
          for name, (t, _) in needle_calibration.TRUTHS.items()
          if name in ("flat", "period_m4", "period_m4_independent")}


def _file(out: str, part: str) -> str:
  return os.path.join(out, "calibration.json" if part == "lookup" else f"{part}.json")


def _matrix_table(part: str, record: dict) -> list[str]:
  lines = ["", f"## {TITLES[part]}", "",
           f"{record['reps']} simulated units per truth, {record['permutations']} permutations "
           "and bootstrap resamples per test; rates and Monte-Carlo standard errors in percent.",
           "", "| test | truth | sizes | accuracy | decision counted | kind | rate (%) | MC s.e. "
           "| bound | passes |", "|---|---|---|--:|---|---|--:|--:|--:|---|"]
  for r in record["rows"]:
    bound = "-" if r["bound"] is None else _pct(r["bound"])
    passes = "-" if r["passes"] is None else ("yes" if r["passes"] else "**no**")
    lines.append(f"| {r['test']} | {r['truth']} | {r['sizes']} | {_pct(r['accuracy'])} | "
                 f"{r['rule']} | {r['kind']} | {_pct(r['rate'])} | {_pct(r['mc_error'])} | "
                 f"{bound} | {passes} |")
  truths = record.get("truths") or {}
  if truths:
    lines += ["", "Truths (probit sd of the haystack effect / the needle effect shared by the "
              "seeds):", ""]
    lines += [f"- `{k}`: {t['description']} (tested at {t.get('M', t.get('L'))}; "
              f"{t['tau']} / {t['needle_tau']})" for k, t in truths.items()]
  if "design_effect" in record:
    lines += ["", "Design effect of counting each seed's answer as a new haystack "
              "(`shared_prompts.seed_agreement`, 1 = independent seeds, 3 = identical): "
              + ", ".join(f"{k} {v:.2f}" for k, v in record["design_effect"].items()) + "."]
  return lines


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--parts", default=",".join(PARTS))
  parser.add_argument("--reps", type=int, default=0, help="units per truth (0: each part's "
                      "default)")
  parser.add_argument("--seed", type=int, default=0)
  parser.add_argument("--small", action="store_true")
  parser.add_argument("--out", default=os.path.join(ROOT, "results", "calibration"))
  args = parser.parse_args()
  parts = [p for p in args.parts.split(",") if p]
  unknown = sorted(set(parts) - set(PARTS))
  if unknown:
    parser.error(f"unknown parts {unknown}; known: {', '.join(PARTS)}")
  os.makedirs(args.out, exist_ok=True)
  for part in parts:
    reps = args.reps or (40 if args.small else REPS[part])
    start, began = time.time(), datetime.datetime.now(datetime.UTC)
    record = _lookup(args, reps) if part == "lookup" else _matrix_part(part, args, reps)
    flags = (f" --parts {part}" + (f" --reps {args.reps}" if args.reps else "")
             + (" --small" if args.small else "") + (f" --seed {args.seed}" if args.seed else ""))
    record["run"] = {"command": "python scripts/calibrate.py" + flags, "commit": _commit(),
                     "date": f"{began:%Y-%m-%d %H:%M} UTC", "seconds": round(time.time() - start),
                     "load": os.getloadavg()[0]}
    with open(_file(args.out, part), "w") as f:
      json.dump(record, f, indent=1)
    print(f"{part}: {record['run']['seconds']} s", flush=True)
  _write_report(args.out)


def _write_report(out: str) -> None:
  found = {p: json.load(open(_file(out, p))) for p in PARTS if os.path.exists(_file(out, p))}
  text = ["# Calibration by simulation of the deciding tests", "",
          "A type-I error passes when it is at most its bound (alpha) plus two Monte-Carlo "
          "standard errors of a rate equal to the bound; a power at >= 80%; a coverage or a "
          "\"holds under its truth\" rate at >= its bound minus two such errors. \"reported\" "
          "rows decide nothing. How each part ran: `RUN.md`.", ""]
  if "lookup" in found:
    lookup = found["lookup"]
    rows = [calibration.Row(**r) for r in lookup["rows"]]
    text += ["## C10-C12 (the lookup period tests)", "",
             report(rows, lookup["reps"], lookup["seed_phi"]).split("\n", 2)[2]]
  for part in PARTS[1:]:
    if part in found:
      text += _matrix_table(part, found[part])
  failing = [f"{r.get('test', 'lookup')} {r['truth']} / {r['rule']}"
             for rec in found.values() for r in rec["rows"] if r["passes"] is False]
  with open(os.path.join(out, "report.md"), "w") as f:
    f.write("\n".join(text) + "\n")
  # The lookup part predates the run record; its row is the one its first run printed.
  runs = {part: rec.get("run") or {"command": "python scripts/calibrate.py", "commit": "627ae95",
                                   "date": "2026-12-04 22:05 UTC", "seconds": 912, "load": None}
          for part, rec in found.items()}
  machine = f"{platform.machine()}, numpy {np.__version__}, {os.cpu_count()} CPUs seen"
  run = ["# Calibration runs", "", *_run_header(runs, machine), "",
         "One command regenerates every part: "
         "`python scripts/calibrate.py` (deterministic for a given seed and reps). Each part "
         "as it last ran:", "", "| part | command | commit | date | wall time (s) | load |",
         "|---|---|---|---|--:|--:|"]
  for part, r in runs.items():
    load = "-" if r["load"] is None else f"{r['load']:.1f}"
    run.append(f"| {part} | `{r['command']}` | {r['commit']} | {r['date']} | {r['seconds']} | "
               f"{load} |")
  run += ["", f"Machine: {machine}, shared with other work (load: the 1-minute load average at "
          "the start).", "",
          "Checks that fail their bound: " + ("; ".join(failing) if failing else "none") + "."]
  with open(os.path.join(out, "RUN.md"), "w") as f:
    f.write("\n".join(run) + "\n")


def _run_header(runs: dict, machine: str) -> list[str]:
  """The five lines every RUN.md opens with (docs/style.md, rule 15), from the parts' runs."""
  by_commit: dict[str, list[str]] = {}
  for part, r in runs.items():
    by_commit.setdefault(r["commit"], []).append(part)
  loads = [r["load"] for r in runs.values() if r["load"] is not None]
  unrecorded = [part for part, r in runs.items() if r["load"] is None]
  load = "shared with other work"
  if loads:
    load += f"; 1-minute load average at the start {min(loads):.1f}-{max(loads):.1f}"
  if unrecorded:
    load += f" (not recorded for the {', '.join(unrecorded)} part{'s' * (len(unrecorded) > 1)})"
  fields = [
      ("Command", "`python scripts/calibrate.py` (every part; one part: `python "
                  "scripts/calibrate.py --parts NAME`, as in the table below)"),
      ("Commit", "per part (table below): " + ", ".join(
          f"{commit} ({', '.join(parts)})" for commit, parts in by_commit.items())),
      ("Machine", machine),
      ("Load", load),
      ("Wall time", "per part, " + ", ".join(f"{part} {r['seconds']} s"
                                             for part, r in runs.items())),
  ]
  return [textwrap.fill(f"- **{name}**: {value}", width=100, subsequent_indent="  ",
                        break_on_hyphens=False, break_long_words=False)
          for name, value in fields]


if __name__ == "__main__":
  main()
