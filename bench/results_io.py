"""How benchmark scripts show and keep a result: an aligned table, and JSON in bench/results/."""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from typing import Any


def print_rows(rows: Sequence[tuple[str, str]]) -> None:
  """Prints (label, value) rows with the labels aligned."""
  width = max(len(label) for label, _ in rows)
  for label, value in rows:
    print(f"{label:<{width}}  {value}")


def write_json(out_dir: str, name: str, result: dict[str, Any]) -> str:
  """Writes ``result`` to ``out_dir/name`` (sorted keys, indented); returns and prints the path."""
  os.makedirs(out_dir, exist_ok=True)
  path = os.path.join(out_dir, name)
  with open(path, "w") as f:
    json.dump(result, f, indent=2, sort_keys=True)
  print(f"wrote {path}")
  return path
