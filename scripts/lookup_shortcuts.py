"""Adds the lookup's shortcut baselines to sweeps whose records predate them:

  python scripts/lookup_shortcuts.py results/paper_plan5 [results/paper_protocol ...]

The ``lookup`` probe now stores, per padding, the best accuracy of a strategy that never reads
the target key's record (``chunkformer/data/lookup_shortcuts.py``) beside the model's. For a
sweep evaluated before that, this regenerates each unit's lookup prompts exactly (the sweep's
stored probe options, ``settings.probes.lookup``, and the unit's own data config,
``DIR/<unit>/config.json``) and writes the baselines into the unit's lookup record, in
``results.json`` and in ``records/<unit>.json``. Nothing else changes: no accuracy, matrix or
verdict is touched (``eval.py --rejudge`` then judges with them). A record that already holds
baselines is left as it is; a unit whose config is missing is refused by name before anything
is written.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from chunkformer import config as config_lib  # noqa: E402
from chunkformer.data import lookup_shortcuts, lookup_task  # noqa: E402
from chunkformer.evaluation.probes import lookup as lookup_probe  # noqa: E402

RECORDS = "records"


def _specs(options: dict, record: dict, data) -> list[lookup_task.LookupSpec]:
  """The unit's lookup spec per padding, as the probe built them."""
  tokens = lookup_task.default_tokens(data)
  for k in ("keys", "values", "filler"):
    if options.get(k) is not None:
      tokens[k] = tuple(options[k]) if k != "filler" else int(options[k])
  if options.get("bos") != lookup_probe.DEFAULT:
    tokens["bos"] = options.get("bos")
  if options.get("vocabulary", lookup_probe.TASK) != lookup_probe.TASK:
    raise ValueError("a words-vocabulary lookup needs the model's tokenizer; rerun its probe")
  settings = record["settings"]
  return [lookup_task.LookupSpec(
      seq_len=record["seq_len"], modulus=record["modulus"],
      prompts_per_residue=record["prompts_per_residue"], num_records=settings["num_records"],
      num_demos=settings["num_demos"], padding=padding,
      positions=options.get("positions", "moments"),
      distinct_values=bool(options.get("distinct_values", False)), **tokens)
      for padding in record["modes"]]


def backfill(workdir: str) -> int:
  """Adds the baselines to every lookup record of ``workdir`` lacking them; returns how many."""
  path = os.path.join(workdir, "results.json")
  with open(path) as f:
    results = json.load(f)
  options = results["settings"]["probes"].get("lookup")
  if options is None:
    raise ValueError(f"{path}: the sweep has no lookup probe")
  todo = [v for v in results["variants"]
          if (v.get("probes") or {}).get("lookup") and "shortcuts" not in v["probes"]["lookup"]]
  configs = {}
  for v in todo:
    config_path = os.path.join(workdir, v["name"], "config.json")
    if not os.path.exists(config_path):
      raise FileNotFoundError(f"{config_path}: unit {v['name']!r} has no config; its prompts "
                              "cannot be regenerated")
    with open(config_path) as f:
      configs[v["name"]] = config_lib.from_dict(json.load(f)).data
  cache = {}
  for v in todo:
    record = v["probes"]["lookup"]
    found = {}
    for spec in _specs(options, record, configs[v["name"]]):
      if spec not in cache:
        prompts = lookup_task.generate(spec, int(record["settings"]["seed"]))
        cache[spec] = lookup_shortcuts.baselines(spec, prompts).record()
      found[spec.padding] = cache[spec]
    record["shortcuts"] = found
  _write(path, results)
  for v in todo:
    unit_path = os.path.join(workdir, RECORDS, f"{v['name']}.json")
    if os.path.exists(unit_path):
      with open(unit_path) as f:
        unit = json.load(f)
      probes = unit.get("probes") or unit.get("record", {}).get("probes") or {}
      if "lookup" in probes and "shortcuts" not in probes["lookup"]:
        probes["lookup"]["shortcuts"] = v["probes"]["lookup"]["shortcuts"]
        _write(unit_path, unit)
  return len(todo)


def _write(path: str, value: dict) -> None:
  tmp = path + ".tmp"
  with open(tmp, "w") as f:
    json.dump(value, f, indent=1)
    f.write("\n")
  os.replace(tmp, path)


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("workdirs", nargs="+")
  for workdir in parser.parse_args().workdirs:
    print(f"{workdir}: baselines added to {backfill(workdir)} lookup records", flush=True)


if __name__ == "__main__":
  main()
