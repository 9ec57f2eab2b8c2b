"""Reading the files a sweep stores, refusing what is not one: a truncated or foreign
results.json, record or .npz ends in one ``UnreadableFile`` line naming the file and what is
wrong, before anything is written (so the file that could not be read is never replaced)."""

from __future__ import annotations

import json
import zipfile
from collections.abc import Callable, Collection
from typing import Any, TypeVar

import numpy as np

T = TypeVar("T")


class UnreadableFile(ValueError):
  """A stored file that is truncated, corrupt or of another kind (the message names it)."""


def json_object(path: str, what: str, required: Collection[str] = ()) -> dict[str, Any]:
  """The JSON object in ``path`` (``what`` names the kind of file, e.g. "a sweep's
  results.json"), with every key of ``required``."""
  try:
    with open(path, encoding="utf-8") as f:
      data = json.load(f)
  except json.JSONDecodeError as e:
    raise UnreadableFile(f"{path}: not {what}: its JSON ends or breaks at line {e.lineno} "
                         f"column {e.colno} ({e.msg}); truncated? (left as it is)") from None
  except UnicodeDecodeError:
    raise UnreadableFile(f"{path}: not {what}: not UTF-8 text (left as it is)") from None
  if not isinstance(data, dict):
    raise UnreadableFile(f"{path}: not {what}: a JSON {type(data).__name__}, not an object "
                         "(left as it is)")
  missing = [k for k in required if k not in data]
  if missing:
    raise UnreadableFile(f"{path}: not {what}: no {', '.join(missing)} (left as it is)")
  return data


def parsed(path: str, what: str, parse: Callable[[], T]) -> T:
  """``parse()``, its KeyError/TypeError/ValueError as one line naming ``path``."""
  try:
    return parse()
  except UnreadableFile:
    raise
  except (KeyError, TypeError, ValueError) as e:
    detail = f"no field {e}" if isinstance(e, KeyError) else str(e)
    raise UnreadableFile(f"{path}: not {what}: {detail} (left as it is)") from None


def npz_arrays(path: str, what: str, accept: Callable[[list[str]], str]) -> dict[str, np.ndarray]:
  """Every array of the .npz at ``path``; ``accept(names)`` says what is wrong with its array
  names ("" when nothing)."""
  try:
    with np.load(path) as data:
      arrays = {name: data[name] for name in data.files}
  except (zipfile.BadZipFile, EOFError, OSError, ValueError) as e:
    raise UnreadableFile(f"{path}: not {what}: unreadable as .npz ({e}); truncated? "
                         "(left as it is)") from None
  problem = accept(sorted(arrays))
  if problem:
    raise UnreadableFile(f"{path}: not {what}: {problem} (left as it is)")
  return arrays
