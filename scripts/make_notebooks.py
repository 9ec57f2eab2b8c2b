"""Writes notebooks/*.ipynb from their cells in scripts/notebook_cells/, outputs stripped.

  python scripts/make_notebooks.py           # (re)write the notebooks
  python scripts/make_notebooks.py --check   # exit 1 if a stored notebook differs from here
  python scripts/make_notebooks.py --script DIR   # also write each as a plain .py (debugging)

The notebooks are the product; their cell modules keep them reviewable as text and stored clean
(no outputs, no execution counts, stable cell ids). Logic lives in the library: cells only
call chunkformer/, kernels/ and configs/. CI executes them with CHUNKFORMER_FAST=1
(``pytest --nbmake notebooks``).
"""

from __future__ import annotations

import argparse
import os
import sys

import nbformat

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from scripts.notebook_cells import (  # noqa: E402
    anatomy_of_a_weak_spot,
    kernels_tour,
    quickstart,
    the_papers_table,
)

NOTEBOOK_DIR = os.path.join(ROOT, "notebooks")
NOTEBOOKS = {  # name -> its cells: (kind, source) pairs, kind "markdown" or "code"
    "quickstart": quickstart.CELLS,
    "anatomy_of_a_weak_spot": anatomy_of_a_weak_spot.CELLS,
    "kernels_tour": kernels_tour.CELLS,
    "the_papers_table": the_papers_table.CELLS,
}


def build(name: str) -> nbformat.NotebookNode:
  """The notebook ``name`` with stripped outputs and deterministic cell ids."""
  nb = nbformat.v4.new_notebook()
  nb.metadata = {
      "kernelspec": {"name": "python3", "display_name": "Python 3", "language": "python"},
      "language_info": {"name": "python"},
      "colab": {"provenance": []},
  }
  for i, (kind, source) in enumerate(NOTEBOOKS[name]):
    make = nbformat.v4.new_markdown_cell if kind == "markdown" else nbformat.v4.new_code_cell
    cell = make(source.strip("\n"))
    cell.id = f"{name}-{i:02d}"
    nb.cells.append(cell)
  nbformat.validate(nb)
  return nb


def as_script(name: str) -> str:
  """The code cells as one python file (markdown as comments), for debugging outside Jupyter."""
  parts = []
  for kind, source in NOTEBOOKS[name]:
    if kind == "code":
      parts.append(source.strip("\n"))
    else:
      parts.append("\n".join("# " + line for line in source.strip("\n").splitlines()))
  return "\n\n".join(parts) + "\n"


def main() -> int:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--check", action="store_true", help="compare instead of writing")
  parser.add_argument("--script", help="also write <name>.py files into this directory")
  args = parser.parse_args()
  stale = []
  for name in NOTEBOOKS:
    path = os.path.join(NOTEBOOK_DIR, f"{name}.ipynb")
    text = nbformat.writes(build(name)) + "\n"
    if args.check:
      with open(path, encoding="utf-8") as f:
        if f.read() != text:
          stale.append(path)
      continue
    os.makedirs(NOTEBOOK_DIR, exist_ok=True)
    with open(path, "w", encoding="utf-8") as f:
      f.write(text)
    if args.script:
      os.makedirs(args.script, exist_ok=True)
      with open(os.path.join(args.script, f"{name}.py"), "w", encoding="utf-8") as f:
        f.write(as_script(name))
  if stale:
    print("stale notebooks (run python scripts/make_notebooks.py):", *stale, sep="\n  ")
    return 1
  return 0


if __name__ == "__main__":
  sys.exit(main())
