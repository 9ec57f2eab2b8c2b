"""Evaluates the policies an eviction sweep config lists but its stored records lack, and
merges them into those records (nothing else is evaluated again).

  python scripts/eviction_add_policies.py --config eviction --sweep_dir results/eviction \
      --runs DIR [--check LABEL ...]

A sweep's record counts as current only when it was evaluated under the sweep's settings, so
adding a policy to ``sweep.probes.eviction_needles.policies`` would make ``eval.py`` evaluate
every probe and policy of every unit again. This evaluates only the missing policies, on the
finished runs in ``DIR/<unit>/`` (checkpoints of the units, or of units trained identically:
the committed sweeps keep no checkpoints), with the sweep's own settings (seed, haystacks,
offsets, batch size), and writes each new policy's record and matrices into
``--sweep_dir``'s ``results.json``, ``records/<unit>.json`` and ``correct/<unit>.npz``, in
the config's order; the stored settings become the config's. Stored policies stay exactly as
they were. Then judge the sweep again (``eval.py ... --rejudge``).

The needle sweep is evaluated too (a unit's record needs its primary analysis) and compared
with the stored one, and so is every ``--check`` label (a policy already stored): a run that
does not give the stored answers on every needle is not the unit that was evaluated, and
nothing is written.
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib
import json
import os
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

import numpy as np  # noqa: E402

from chunkformer import eviction, studies  # noqa: E402
from chunkformer.evaluation.probes import trained as trained_lib  # noqa: E402
from chunkformer.evaluation.records import correctness  # noqa: E402
from chunkformer.evaluation.sweep import config as sweep_config  # noqa: E402
from chunkformer.evaluation.sweep import run as sweep_run  # noqa: E402
from chunkformer.evaluation.sweep import unit  # noqa: E402

PROBE = "eviction_needles"


def _label(spec: dict) -> str:
  return eviction.label(eviction.from_dict(dict(spec)))


def _write_json(path: str, value: dict) -> None:
  with open(path + ".tmp", "w", encoding="utf-8") as f:
    f.write(json.dumps(value, indent=1) + "\n")
  os.replace(path + ".tmp", path)


def _same(a: np.ndarray, b: np.ndarray) -> float:
  return float((a == b).mean()) if a.shape == b.shape else 0.0


def evaluate(config, sweep_dir: str, runs: str, checks: list[str], scratch: str) -> dict:
  """unit -> (its new eviction_needles entries by label, their arrays), after the checks."""
  sweep = sweep_config.resolve(config, runs)
  wanted = list(sweep.settings.probes[PROBE]["policies"])
  with open(os.path.join(sweep_dir, "results.json"), encoding="utf-8") as f:
    stored = {v["name"]: v for v in json.load(f)["variants"]}
  have = {name: set(v["probes"][PROBE]) for name, v in stored.items()}
  missing = [p for p in wanted if any(_label(p) not in have[v.name] for v in sweep.variants)]
  checked = [p for p in wanted if _label(p) in checks]
  absent = sorted(set(checks) - {_label(p) for p in checked})
  if absent:
    raise SystemExit(f"--check: {', '.join(absent)} not among the config's policies")
  if not missing:
    print("every policy of the config is stored: nothing to evaluate")
    return {}
  print("to evaluate:", ", ".join(_label(p) for p in missing))
  probes = dict(sweep.settings.probes)
  probes = {"needle_sweep": probes["needle_sweep"],
            PROBE: dict(probes[PROBE], policies=missing + checked)}
  part = dataclasses.replace(sweep, settings=dataclasses.replace(sweep.settings, probes=probes))
  out = {}
  for variant in part.variants:
    if not sweep_run.is_finished(variant):
      raise SystemExit(f"{variant.workdir}: no finished run of {variant.name} under this config")
    start = time.time()
    path = os.path.join(scratch, "correct", f"{variant.name}.npz")
    record = unit.evaluate(trained_lib.load(variant.workdir), variant, part,
                           os.path.join(scratch, "plots"), path)
    with np.load(path) as z:
      arrays = {k: z[k] for k in z.files}
    with np.load(correctness.path_for(sweep_dir, variant.name)) as z:
      before = {k: z[k] for k in z.files}
    entries = json.loads(json.dumps(record.to_json()))["probes"][PROBE]
    compared = ["needle_far"] + [f"{PROBE}_{entries[_label(p)]['depths'][d]['matrix']}"
                                 for p in checked for d in entries[_label(p)]["depths"]]
    for name in compared:
      key = f"{name}.correct_YxJ"
      share = _same(arrays[key], before[key])
      print(f"{variant.name}: {name}: {100 * share:.2f}% of the stored answers")
      if share < 1.0:
        raise SystemExit(f"{variant.workdir} does not give {variant.name}'s stored answers "
                         f"({name}); nothing written")
    new = {_label(p): entries[_label(p)] for p in missing}
    keys = {f"{PROBE}_{d['matrix']}" for e in new.values() for d in e["depths"].values()}
    out[variant.name] = (new, {k: v for k, v in arrays.items() if k.split(".")[0] in keys})
    print(f"{variant.name}: evaluated in {time.time() - start:.0f} s")
  return out


def merge(config, sweep_dir: str, found: dict) -> None:
  """Writes the new entries and matrices into the stored sweep, in the config's order."""
  settings = json.loads(json.dumps(sweep_config.settings_from(config).to_json()))
  order = [_label(p) for p in settings["probes"][PROBE]["policies"]]

  def merged(record: dict) -> dict:
    new, _ = found[record["name"]]
    both = {**record["probes"][PROBE], **new}
    entries = {label: both[label] for label in order if label in both}
    return dict(record, probes=dict(record["probes"], **{PROBE: entries}))

  path = os.path.join(sweep_dir, "results.json")
  with open(path, encoding="utf-8") as f:
    results = json.load(f)
  _write_json(path, dict(results, settings=settings,
                         variants=[merged(v) for v in results["variants"]]))
  for name, (_, arrays) in found.items():
    record_path = sweep_run.record_path(sweep_dir, name)
    if os.path.exists(record_path):
      with open(record_path, encoding="utf-8") as f:
        stored = json.load(f)
      _write_json(record_path, {"sweep_settings": settings, "record": merged(stored["record"])})
    npz = correctness.path_for(sweep_dir, name)
    with np.load(npz) as z:
      before = {k: z[k] for k in z.files}
    clash = sorted(set(before) & set(arrays))
    if clash:
      raise SystemExit(f"{npz} already holds {clash[0]}")
    correctness.save_arrays(npz, {**before, **arrays})
  print(f"merged into {sweep_dir}: {', '.join(found)}")


def main(argv: list[str] | None = None) -> None:
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--config", required=True, help="a module of configs/sweeps (eviction)")
  parser.add_argument("--sweep_dir", required=True, help="the stored sweep (results/eviction)")
  parser.add_argument("--runs", required=True, help="finished runs: DIR/<unit>/checkpoints")
  parser.add_argument("--check", action="append", default=[],
                      help="a stored policy's label to evaluate again and compare")
  parser.add_argument("--scratch", default=None, help="where the new matrices go first")
  args = parser.parse_args(argv)
  studies.install()
  config = importlib.import_module(f"configs.sweeps.{args.config}").get_config()
  scratch = args.scratch or os.path.join(args.runs, "added_policies")
  found = evaluate(config, args.sweep_dir, args.runs, args.check, scratch)
  if found:
    merge(config, args.sweep_dir, found)


if __name__ == "__main__":
  main()
