"""Every committed sweep's run record (results/*/RUN.md) opens with the command, commit, machine,
load and wall time (docs/style.md, rule 15), and every commit it names there is one of this
repository's; a sweep's history (results/*/HISTORY.md, the running narrative moved out of its
RUN.md) sits beside a RUN.md that links to it before its first section."""

from __future__ import annotations

import glob
import os
import re
import shutil
import subprocess

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RECORDS = sorted(glob.glob(os.path.join(ROOT, "results", "*", "RUN.md")))
HISTORIES = sorted(glob.glob(os.path.join(ROOT, "results", "*", "HISTORY.md")))
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


def test_the_long_running_sweeps_keep_their_narrative_in_a_history():
  # the sweeps that ran in dated parts, states or pilots (the parametrised test below then
  # cannot pass on an empty glob)
  names = {_name(path) for path in HISTORIES}
  assert {"study", "paper_plan5", "paper_protocol", "demo", "code_lm"} <= names, names


@pytest.mark.parametrize("path", HISTORIES, ids=_name)
def test_a_history_is_linked_from_its_run_record_before_its_first_section(path):
  with open(path, encoding="utf-8") as f:
    assert f.readline().startswith("# "), f"{_name(path)}: HISTORY.md has no title"
  record = os.path.join(os.path.dirname(path), "RUN.md")
  assert os.path.exists(record), f"{_name(path)}: a HISTORY.md without a RUN.md"
  with open(record, encoding="utf-8") as f:
    opening = re.split(r"^## ", f.read(), maxsplit=1, flags=re.MULTILINE)[0]
  links = [line for line in opening.split("\n") if "`HISTORY.md`" in line]
  assert links, f"{_name(path)}: RUN.md does not link `HISTORY.md` before its first section"
