"""Which needles carry the period: each phase-dependent haystack's accuracy by phase.

  python scripts/phase_needles.py --out results/study/phase_needles_qk results/study \
      fixed_m4_kv2_qkshift3_seed0 fixed_m4_kv2_qkshift3_seed1 ...

For each named unit of a finished sweep DIR (its results.json and correct/ matrices) and each
needle depth of --depths (default far), lists the haystacks whose needle accuracy by offset
mod --period spans >= 0.5 (at the far depth: the haystacks the report's table "Where the
period lives" counts), with the accuracy at each phase under the split kind of that phase at
M = --period for the unit's needle lengths: do the needles a model still misses fail where
the split geometry predicts (total split worst), or elsewhere? The last column names the
other listed units in which that haystack (same depth and needle lengths, so the same needle;
each depth samples its own haystacks) is phase-dependent too: a needle every seed misses is
hard by its content, one that a single seed misses is that model's own.
Writes OUT.md; refuses to replace it unless --overwrite.
"""

from __future__ import annotations

import argparse
import datetime
import os
import sys

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from chunkformer import provenance  # noqa: E402
from chunkformer.evaluation.records import correctness, results_file  # noqa: E402
from chunkformer.evaluation.stats import split_labels  # noqa: E402
from chunkformer.evaluation.stats.estimates import PHASE_DEPENDENT, phase_dependent_needles  # noqa: E402,E501
from chunkformer.studies.needles.claims import summaries  # noqa: E402


def _lengths(record) -> tuple[int, int]:
  """Units with the same needle lengths were scored on the same haystacks (one sweep seed)."""
  return record.setup.key_len, record.setup.value_len


def _cells(accuracy_P, kinds) -> str:
  return " | ".join(("-" if np.isnan(a) else f"{a:.2f}") + f" ({k})"
                    for a, k in zip(accuracy_P, kinds, strict=True))


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("sweep_dir", help="a finished sweep's directory")
  parser.add_argument("units", nargs="+", help="unit names of that sweep")
  parser.add_argument("--out", required=True, help="output path without extension")
  parser.add_argument("--period", type=int, default=summaries.MAP_PERIOD)
  parser.add_argument("--depths", default="far", help="comma-separated needle depths: far, "
                      "middle, near")
  parser.add_argument("--overwrite", action="store_true")
  args = parser.parse_args()

  if args.period < 2:
    raise SystemExit(f"error: --period must be >= 2, got {args.period}")
  out = args.out + ".md"
  if os.path.exists(out) and not args.overwrite:
    raise SystemExit(f"error: {out} exists; pass --overwrite to replace it")
  path = os.path.join(args.sweep_dir, "results.json")
  if not os.path.exists(path):
    raise SystemExit(f"error: {path} does not exist (not a finished sweep)")
  records = {r.name: r for r in results_file.load(path).variants}
  unknown = [u for u in args.units if u not in records]
  if unknown:
    raise SystemExit(f"error: {path} has no unit {', '.join(unknown)}")
  load = correctness.loader(args.sweep_dir)
  depths = args.depths.split(",")
  needles = {}  # (unit, depth) -> phase-dependent haystacks; all checked before any output
  for unit in args.units:
    matrices = load(unit) or {}
    for depth in depths:
      matrix = matrices.get(correctness.needle_name(depth))
      if matrix is None:
        raise SystemExit(f"error: {unit} has no {depth}-depth needle correctness matrix in "
                         f"{os.path.join(args.sweep_dir, 'correct')} (--depths)")
      needles[unit, depth] = phase_dependent_needles(matrix.correct_YxJ, matrix.offsets_J,
                                                      args.period)

  # the split kind of each phase for each unit's needle lengths
  kinds = {u: split_labels.phase_split_kinds(args.period, *_lengths(records[u]))
           for u in args.units}
  lines = []
  for unit, depth in needles:
    haystacks_H, accuracy_HxP = needles[unit, depth]
    head = f"| {unit} | {'/'.join(map(str, _lengths(records[unit])))} | {depth} |"
    if not haystacks_H.size:
      lines.append(f"{head} none | {_cells([np.nan] * args.period, kinds[unit])} | |")
    for haystack, accuracy_P in zip(haystacks_H, accuracy_HxP, strict=True):
      also = [u for u in args.units if u != unit and haystack in needles[u, depth][0]
              and _lengths(records[u]) == _lengths(records[unit])]
      lines.append(f"{head} {haystack} | {_cells(accuracy_P, kinds[unit])} | "
                   f"{', '.join(also) or 'none'} |")

  summary = []  # per unit: where its phase-dependent needles fail, over the listed depths
  for unit in args.units:
    rows = np.concatenate([needles[unit, depth][1] for depth in depths])
    mean_P = np.nanmean(rows, axis=0) if rows.size else np.full(args.period, np.nan)
    summary.append(f"| {unit} | {'/'.join(map(str, _lengths(records[unit])))} | {len(rows)} | "
                   f"{_cells(mean_P, kinds[unit])} |")

  commit = provenance.commit()
  command = " ".join(["python", "scripts/phase_needles.py"] + sys.argv[1:])
  date = datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")
  head = [f"phase {p}" for p in range(args.period)]
  table = [
      "# Phase-dependent needles: where each unit's remaining blind spot lies", "",
      f"`{command}` at commit {commit}, {date}. Haystacks whose needle accuracy by "
      f"offset mod {args.period} spans >= {PHASE_DEPENDENT}; each cell: accuracy "
      f"at that phase (the split kind of the phase under fixed chunks of {args.period}: none, "
      "key_cut, value_cut or total). The last column: the other listed units in which the same "
      "haystack (same depth and needle lengths: the same needle) depends on the phase too.",
      "", "| unit | key/value tokens | depth | haystack | " + " | ".join(head) + " | also in |",
      "|:--|--:|:--|--:|" + "--:|" * args.period + ":--|", *lines, "",
      f"Per unit, over the depths {', '.join(depths)}: how many phase-dependent haystacks, and "
      "their mean accuracy at each phase (a blind spot that follows the split geometry is "
      "lowest at the total split).", "",
      "| unit | key/value tokens | haystacks | " + " | ".join(head) + " |",
      "|:--|--:|--:|" + "--:|" * args.period, *summary]
  with open(out, "w") as f:
    f.write("\n".join(table) + "\n")
  print("\n".join(table))
  print(f"wrote {out}")


if __name__ == "__main__":
  main()
