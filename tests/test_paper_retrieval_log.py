"""results/paper_retrieval/RUN.md says only what its committed pilot record (pilots.json) and
the shortcut baselines of its designs hold."""

from __future__ import annotations

import json
import os
import re

import pytest

from chunkformer.data import lookup_shortcuts, lookup_task

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SWEEP = os.path.join(ROOT, "results", "paper_retrieval")


def _run() -> str:
  with open(os.path.join(SWEEP, "RUN.md"), encoding="utf-8") as f:
    return f.read()


def _pilots() -> dict:
  with open(os.path.join(SWEEP, "pilots.json")) as f:
    return json.load(f)["pilots"]


def test_the_pilot_table_is_the_committed_held_out_accuracy():
  rows = re.findall(r"^\| `(\w+)`[^|]*\| ([0-9., ]+?)(?: at [^|]*)? \|", _run(), flags=re.MULTILINE)
  assert rows, "no pilot rows"
  pilots = _pilots()
  for name, cells in rows:
    key = name  # each row opens with its pilot's name in pilots.json
    quoted = [c.strip() for c in cells.split(",")]
    held = pilots[key]["heldout_accuracy"]
    assert quoted == [f"{held[s]:.3f}" for s in sorted(held, key=int)][:len(quoted)], name


def test_the_probe_cell_quotes_the_probe_and_its_shortcut():
  text = " ".join(_run().split())
  for name in ("full_8kv", "w8s8_1kv"):
    probe = _pilots()[name]["probe"]
    assert (f"| `{name}` |" in text and
            f"{100 * probe['prefix']['mean']:.1f}% / {100 * probe['in_sequence']['mean']:.1f}% "
            f"against the shortcut's {100 * probe['prefix']['shortcut']:.1f}% / "
            f"{100 * probe['in_sequence']['shortcut']:.1f}%: did not learn") in text


@pytest.mark.parametrize("padding, quoted", [("prefix", "4.45%"), ("in_sequence", "4.90%")])
def test_the_retrieval_designs_shortcut_is_what_run_md_says(padding, quoted):
  spec = lookup_task.LookupSpec(seq_len=128, keys=tuple(range(8, 40)),
                                values=tuple(range(40, 72)), filler=4, bos=1, modulus=24,
                                prompts_per_residue=576, positions="shift", padding=padding,
                                num_records=32, num_demos=8, distinct_values=True)
  found = lookup_shortcuts.baselines(spec, lookup_task.generate(spec, 2609))
  assert f"{100 * found.mean(found.best):.2f}%" == quoted
  assert "| **32 records with distinct values, 8 demonstrations (the retrieval design)** |" in \
      _run()
  assert f"**{quoted}**" in _run()
