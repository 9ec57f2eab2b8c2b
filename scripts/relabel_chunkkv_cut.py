"""Renames the cut-chunk ChunkKV in a stored eviction sweep: ``chunkkv`` -> ``chunkkv_cut``.

  python scripts/relabel_chunkkv_cut.py results/eviction

Until 2026-12-05 the policy named ``chunkkv`` filled its budget exactly by cutting one chunk;
that name now means ChunkKV as published (whole chunks only) and the cut variant is
``chunkkv_cut`` (docs/eviction.md). A sweep stored before then ran the cut variant as
``chunkkv``: this renames it there, and only renames. In ``DIR/results.json`` (its settings
and every unit's ``eviction_needles`` record), ``DIR/records/<unit>.json`` (the same, as a
shard stores them) and ``DIR/correct/<unit>.npz`` (the matrices' names) every policy dict
``{"policy": "chunkkv", ...}`` becomes ``"chunkkv_cut"``, every label ``chunkkv-b..`` and
matrix name ``chunkkv-b.._<depth>`` gets the new prefix; every number and array stays as
stored (checked before writing). A file that already names ``chunkkv_cut`` anywhere was
written under the new names (or relabelled before) and is left as it is, so the script can
run again and never renames a whole-chunk ``chunkkv`` added later. Claims, report and plots
are not touched: judge the sweep again after it (``eval.py ... --rejudge``).
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

import numpy as np  # noqa: E402

from chunkformer.evaluation.records import correctness  # noqa: E402

OLD, NEW = "chunkkv", "chunkkv_cut"
PROBE = "eviction_needles"
MATRIX_PREFIX = f"{PROBE}_"


def _label(label: str) -> str:
  """``chunkkv-b16-..`` -> ``chunkkv_cut-b16-..`` (``content_chunkkv-..`` is another policy)."""
  return NEW + label[len(OLD):] if label.startswith(OLD + "-") else label


def _policy(spec: dict) -> dict:
  return dict(spec, policy=NEW) if spec.get("policy") == OLD else spec


def _settings(settings: dict) -> dict:
  probe = (settings.get("probes") or {}).get(PROBE)
  if not probe:
    return settings
  probe = dict(probe, policies=[_policy(p) for p in probe["policies"]])
  return dict(settings, probes=dict(settings["probes"], **{PROBE: probe}))


def _record(record: dict) -> dict:
  probe = (record.get("probes") or {}).get(PROBE)
  if not probe:
    return record
  renamed = {}
  for label, entry in probe.items():
    depths = {name: dict(d, matrix=_label(d["matrix"])) if "matrix" in d else d
              for name, d in entry["depths"].items()}
    renamed[_label(label)] = dict(entry, policy=_policy(entry["policy"]), depths=depths)
  return dict(record, probes=dict(record["probes"], **{PROBE: renamed}))


def _mentions_new(value) -> bool:
  return NEW in json.dumps(value)


def _write_json(path: str, value: dict, indent: int | None) -> None:
  text = json.dumps(value, indent=indent) + "\n"
  with open(path + ".tmp", "w", encoding="utf-8") as f:
    f.write(text)
  os.replace(path + ".tmp", path)


def _numbers(value):
  """Every number of a JSON tree in order (the relabel must leave them all as they were)."""
  if isinstance(value, dict):
    return [x for k in sorted(value, key=_label) for x in _numbers(value[k])]
  if isinstance(value, list):
    return [x for v in value for x in _numbers(v)]
  return [value] if isinstance(value, (int, float)) and not isinstance(value, bool) else []


def relabel_results(path: str) -> bool:
  """``DIR/results.json``: settings and every unit's record; claims stay for the rejudge."""
  with open(path, encoding="utf-8") as f:
    stored = json.load(f)
  if _mentions_new(stored.get("settings")) or _mentions_new(stored.get("variants")):
    return False
  new = dict(stored, settings=_settings(stored["settings"]),
             variants=[_record(v) for v in stored["variants"]])
  assert _numbers(new["variants"]) == _numbers(stored["variants"])
  _write_json(path, new, indent=1)
  return True


def relabel_unit_record(path: str) -> bool:
  """``DIR/records/<unit>.json``: ``{"sweep_settings": .., "record": ..}``."""
  with open(path, encoding="utf-8") as f:
    stored = json.load(f)
  if _mentions_new(stored):
    return False
  new = {"sweep_settings": _settings(stored["sweep_settings"]),
         "record": _record(stored["record"])}
  assert _numbers(new) == _numbers(stored)
  _write_json(path, new, indent=1)
  return True


def relabel_matrices(path: str) -> bool:
  """``DIR/correct/<unit>.npz``: the matrix names ``eviction_needles_chunkkv-..``."""
  with np.load(path) as z:
    arrays = {k: z[k] for k in z.files}
  if any(k.startswith(MATRIX_PREFIX + NEW + "-") for k in arrays):
    return False
  renamed = {(MATRIX_PREFIX + _label(k[len(MATRIX_PREFIX):]) if k.startswith(MATRIX_PREFIX)
              else k): v for k, v in arrays.items()}
  assert len(renamed) == len(arrays)
  if list(renamed) == list(arrays):
    return False
  correctness.save_arrays(path, renamed)
  with np.load(path) as z:  # the same arrays, bit for bit, under the new names
    assert all(np.array_equal(z[new], arrays[old]) and z[new].dtype == arrays[old].dtype
               for new, old in zip(renamed, arrays, strict=True))
  return True


def main(argv: list[str] | None = None) -> None:
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("sweep_dir", help="a stored eviction sweep (results/eviction)")
  args = parser.parse_args(argv)
  done = []
  results = os.path.join(args.sweep_dir, "results.json")
  if os.path.exists(results) and relabel_results(results):
    done.append(results)
  for path in sorted(glob.glob(os.path.join(args.sweep_dir, "records", "*.json"))):
    if relabel_unit_record(path):
      done.append(path)
  for path in sorted(glob.glob(os.path.join(args.sweep_dir, correctness.DIRECTORY, "*.npz"))):
    if relabel_matrices(path):
      done.append(path)
  print("relabelled " + (", ".join(done) if done else "nothing (already under the new names)"))


if __name__ == "__main__":
  main()
