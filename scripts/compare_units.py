"""Do two trainings of the same unit give the same model? Compares their stored answers.

  python scripts/compare_units.py results/paper_protocol/correct runs/replica/correct \
      [--units full_1kv_seed0,w8s8_1kv_seed0] [--probe lookup_prefix] [--out FILE.md]

Each argument is a sweep's ``correct/`` directory (``DIR/correct/<unit>.npz``, read by
``records.correctness``: one matrix of prompts x residues per probe). For every unit in both
(or those named), and every probe whose matrices both hold (or the one named), prints the
mean accuracy and gap (best - worst residue, points) of each side, each side's worst residue,
the largest per-residue difference and the share of prompts answered the same way. Identical
trainings agree on 100% of prompts; a rerun on other hardware shows how far float rounding
moves the trained model.
"""

from __future__ import annotations

import argparse
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

import numpy as np  # noqa: E402

from chunkformer.evaluation.records import correctness  # noqa: E402


def _units(directory: str) -> set[str]:
  return {name[:-4] for name in os.listdir(directory) if name.endswith(".npz")}


def compare(a: correctness.Matrix, b: correctness.Matrix) -> dict[str, float]:
  """Two matrices of the same probe (same prompts, same residues): accuracy per residue."""
  if a.correct_YxJ.shape != b.correct_YxJ.shape:
    raise ValueError(f"matrices differ in shape: {a.correct_YxJ.shape} vs "
                     f"{b.correct_YxJ.shape} (not the same probe settings)")
  if not np.array_equal(a.offsets_J, b.offsets_J):
    raise ValueError(f"matrices differ in residues: {a.offsets_J} vs {b.offsets_J}")
  acc_a, acc_b = 100 * a.correct_YxJ.mean(0), 100 * b.correct_YxJ.mean(0)
  return dict(mean_a=acc_a.mean(), mean_b=acc_b.mean(), gap_a=np.ptp(acc_a),
              gap_b=np.ptp(acc_b), worst_a=int(a.offsets_J[acc_a.argmin()]),
              worst_b=int(b.offsets_J[acc_b.argmin()]),
              max_residue_diff=float(np.abs(acc_a - acc_b).max()),
              same_answers=100 * float((a.correct_YxJ == b.correct_YxJ).mean()))


def table(dir_a: str, dir_b: str, units: list[str] | None, probe: str | None) -> list[str]:
  common = sorted(_units(dir_a) & _units(dir_b))
  if units:
    absent = sorted(set(units) - set(common))
    if absent:
      raise SystemExit(f"--units: {', '.join(absent)} not in both {dir_a} and {dir_b}")
    common = units
  if not common:
    raise SystemExit(f"no unit has answers in both {dir_a} and {dir_b}")
  lines = [f"A = `{dir_a}`, B = `{dir_b}`; accuracy %, gap = best - worst residue (points).", "",
           "| unit | probe | mean A | mean B | gap A | gap B | worst residue A / B | "
           "largest residue difference | same answer |", "|---|---|--:|--:|--:|--:|:-:|--:|--:|"]
  for unit in common:
    fa, fb = (correctness.load(os.path.join(d, unit + ".npz")) for d in (dir_a, dir_b))
    probes = sorted(set(fa) & set(fb))
    for name in [probe] if probe else probes:
      if name not in probes:
        raise SystemExit(f"--probe: {unit} has no {name!r} in both (has {', '.join(probes)})")
      c = compare(fa[name], fb[name])
      lines.append(f"| {unit} | {name} | {c['mean_a']:.1f} | {c['mean_b']:.1f} | "
                   f"{c['gap_a']:.1f} | {c['gap_b']:.1f} | {c['worst_a']} / {c['worst_b']} | "
                   f"{c['max_residue_diff']:.1f} | {c['same_answers']:.1f}% |")
  return lines


def main(argv=None) -> None:
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  p.add_argument("dir_a")
  p.add_argument("dir_b")
  p.add_argument("--units", help="comma-separated unit names (default: every unit in both)")
  p.add_argument("--probe", help="one probe, e.g. lookup_prefix (default: every common one)")
  p.add_argument("--out", help="also write the table to this markdown file")
  args = p.parse_args(argv)
  for d in (args.dir_a, args.dir_b):
    if not os.path.isdir(d):
      raise SystemExit(f"not a directory: {d} (give a sweep's correct/ directory)")
  lines = table(args.dir_a, args.dir_b, args.units.split(",") if args.units else None,
                args.probe)
  print("\n".join(lines))
  if args.out:
    with open(args.out, "w", encoding="utf-8") as f:
      f.write("\n".join(lines) + "\n")


if __name__ == "__main__":
  main()
