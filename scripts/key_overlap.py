"""Which part of the key trained kv models read: accuracy by the key tokens another needle shares.

  python scripts/key_overlap.py --out results/study/key_overlap \
      results/study/full_kv2_seed0 results/study/full_kv2_shift2_seed0 ...

For each finished kv run (a sweep unit directory or a train.py workdir), scores ``--rows``
fresh training-distribution rows and reports needle and token accuracy by the longest suffix
and prefix the asked key shares with another key of its row
(``chunkformer.evaluation.key_overlap``). Every model is scored on the same rows when the runs
share their data settings. Writes OUT.md (a table) and OUT.json; refuses to replace them unless
--overwrite.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import json
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from chunkformer import provenance  # noqa: E402
from chunkformer.config import ConfigError  # noqa: E402
from chunkformer.data import kv  # noqa: E402
from chunkformer.evaluation.probes import trained  # noqa: E402
from chunkformer.studies.needles.probes import key_overlap  # noqa: E402


def _cell(row: key_overlap.Row) -> str:
  if row.needle_accuracy is None:
    return "-"
  tokens = ", ".join(f"{a:.2f}" for a in row.token_accuracy)
  return f"{row.needle_accuracy:.3f} [{tokens}] ({row.queries})"


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("workdirs", nargs="+", help="finished kv runs")
  parser.add_argument("--out", required=True, help="output path without extension")
  parser.add_argument("--rows", type=int, default=512)
  parser.add_argument("--seed", type=int, default=12345, help="seed of the scored rows")
  parser.add_argument("--batch_size", type=int, default=64)
  parser.add_argument("--overwrite", action="store_true")
  args = parser.parse_args()

  if args.rows < 1 or args.batch_size < 1:
    raise SystemExit("error: --rows and --batch_size must be >= 1")
  paths = [args.out + ".md", args.out + ".json"]
  existing = [p for p in paths if os.path.exists(p)]
  if existing and not args.overwrite:
    raise SystemExit(f"error: {', '.join(existing)} exist; pass --overwrite to replace them")
  configs = {}
  for workdir in args.workdirs:  # every run checked before any model is built
    try:
      config = trained.finished_config(workdir)
    except ConfigError as e:
      raise SystemExit(f"error: {e}") from None
    if config.data.task != "kv":
      raise SystemExit(f"error: {workdir}: config field 'data.task' is {config.data.task!r}; "
                       "the key overlap probe needs 'kv'")
    configs[workdir] = config

  results, lines = [], []
  key_lens = sorted({c.data.key_len for c in configs.values()})
  for workdir, config in configs.items():
    model = trained.load(workdir)
    layouts = key_overlap.sample(config.data, args.rows, args.seed)
    rows = kv.render_many(layouts, config.data)
    predictions = trained.Predictor(model, args.batch_size)(rows)["predictions"]
    outcomes = key_overlap.score(layouts, rows["targets"], predictions)
    k = config.data.key_len
    suffix = key_overlap.by_overlap(outcomes, k, "suffix")
    prefix = key_overlap.by_overlap(outcomes, k, "prefix")
    name = os.path.basename(os.path.normpath(workdir))
    results.append({"run": name, "workdir": workdir, "step": model.step, "key_len": k,
                    "key_shift": config.model.key_shift,
                    "suffix": [dataclasses.asdict(r) for r in suffix],
                    "prefix": [dataclasses.asdict(r) for r in prefix]})
    cells = ([_cell(r) for r in suffix] + ["-"] * (max(key_lens) - k)
             + [_cell(r) for r in prefix] + ["-"] * (max(key_lens) - k))
    lines.append(f"| {name} | {k} | {config.model.key_shift} | " + " | ".join(cells) + " |")
    print(lines[-1], flush=True)

  commit = provenance.commit()
  command = " ".join(["python", "scripts/key_overlap.py"] + sys.argv[1:])
  date = datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")
  width = max(key_lens)
  head = ([f"suffix {s}" for s in range(width)] + [f"prefix {s}" for s in range(width)])
  table = [
      "# Key overlap probe: which part of the key the models read", "",
      f"`{command}` at commit {commit}, {date}. {args.rows} fresh training-distribution rows "
      f"per model (row seed {args.seed}); each cell: needle accuracy [accuracy of the 1st, 2nd, "
      "... value token] (queries), by the longest run of trailing (suffix) or leading "
      "(prefix) key tokens that another key of the row shares with the asked one. A whole-key "
      "reader is flat along a row; a model that matches only the key's last tokens fails "
      "where the suffix is shared.",
      "", "| run | key tokens | key shift | " + " | ".join(head) + " |",
      "|:--|--:|--:|" + "--:|" * len(head), *lines]
  with open(paths[0], "w") as f:
    f.write("\n".join(table) + "\n")
  with open(paths[1], "w") as f:
    json.dump({"command": command, "commit": commit, "date": date, "rows": args.rows,
               "row_seed": args.seed, "runs": results}, f, indent=2)
  print(f"wrote {paths[0]} and {paths[1]}")


if __name__ == "__main__":
  main()
