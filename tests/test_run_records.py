"""Every committed sweep's run record (results/*/RUN.md) opens with the command, commit, machine,
load and wall time (docs/style.md, rule 15), and every commit it names there is one of this
repository's."""

from __future__ import annotations

import glob
import os
import re
import shutil
import subprocess

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RECORDS = sorted(glob.glob(os.path.join(ROOT, "results", "*", "RUN.md")))
FIELDS = ("Command", "Commit", "Machine", "Load", "Wall time")
HEAD_LINES = 25
HASH = re.compile(r"(?<![0-9A-Za-z])[0-9a-f]{7,40}(?![0-9A-Za-z])")


def _name(path: str) -> str:
  return os.path.basename(os.path.dirname(path))


def _header(path: str) -> dict[str, str]:
  """Each field's text after its colon, continuation lines joined, from the first 25 lines."""
  with open(path, encoding="utf-8") as f:
    head = f.read().split("\n")[:HEAD_LINES]
  fields, order, current = {}, [], None
  for line in head:
    found = re.match(r"- \*\*([A-Za-z ]+)\*\*:(.*)$", line)
    if found and found.group(1) in FIELDS and found.group(1) not in fields:
      current = found.group(1)
      order.append(current)
      fields[current] = found.group(2).strip()
    elif current and line.startswith("  ") and line.strip():
      fields[current] += " " + line.strip()
    else:
      current = None
  assert order == list(FIELDS), f"{_name(path)}: header fields {order}, not {list(FIELDS)}"
  return fields


def test_every_committed_sweep_has_a_run_record():
  assert len(RECORDS) >= 10, RECORDS


@pytest.mark.parametrize("path", RECORDS, ids=_name)
def test_run_record_opens_with_the_five_fields_in_order(path):
  for name, text in _header(path).items():
    assert text, f"{_name(path)}: **{name}** is empty"


@pytest.mark.parametrize("path", RECORDS, ids=_name)
def test_the_header_opens_the_record(path):
  # The title, then at most one short paragraph, then the header.
  with open(path, encoding="utf-8") as f:
    lines = f.read().split("\n")
  assert lines[0].startswith("# "), _name(path)
  first = next(i for i, line in enumerate(lines) if line.startswith("- **Command**:"))
  paragraphs = [block for block in "\n".join(lines[1:first]).split("\n\n") if block.strip()]
  assert len(paragraphs) <= 1, f"{_name(path)}: {len(paragraphs)} paragraphs before the header"


@pytest.mark.parametrize("path", RECORDS, ids=_name)
def test_every_commit_the_header_names_exists(path):
  if shutil.which("git") is None or not os.path.exists(os.path.join(ROOT, ".git")):
    pytest.skip("no git or no .git directory")
  hashes = HASH.findall(_header(path)["Commit"])
  missing = [h for h in hashes
             if subprocess.run(["git", "cat-file", "-e", f"{h}^{{commit}}"], cwd=ROOT,
                               capture_output=True).returncode != 0]
  assert not missing, f"{_name(path)}: not commits of this repository: {missing}"
