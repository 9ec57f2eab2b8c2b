"""Per-haystack x offset correctness matrices of a sweep variant, stored beside results.json.

results.json keeps only statistics; these matrices are the data behind them, so every interval
and test can be recomputed (``stats.analyze(m.correct_YxJ, m.offsets_J, ...)`` with the
sweep's seed, resamples and permutations gives the stored analysis exactly). One file per
variant, ``DIR/correct/<variant>.npz``, one matrix per probe:
  ``needle_<depth name>``: the needle shift sweep at one depth (far, middle, near, ...);
    outcomes 0/1 (the whole answer predicted), stored as uint8;
  ``prefix``: the prefix probe (offsets = prefix lengths N; outcomes are the fraction of a
    prompt's queries answered, stored as float64).
Arrays per matrix: ``<name>.correct_YxJ``, ``<name>.offsets_J`` and, for dynamic models,
``<name>.phases_YxJ`` (phase inside the actual chunk). Letters as in ``records``: Y haystacks,
J offsets.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable, Mapping, Sequence

import numpy as np

from chunkformer.evaluation.records import reading

DIRECTORY = "correct"
PREFIX = "prefix"  # the prefix probe's matrix
NEEDLE = "needle_"  # + depth name: the needle shift sweep's matrix at that depth


def needle_name(depth_name: str) -> str:
  """The matrix of the needle shift sweep at one depth ("far", "middle", "near", ...)."""
  return NEEDLE + depth_name


@dataclasses.dataclass(frozen=True)
class Matrix:
  correct_YxJ: np.ndarray  # outcomes in [0, 1]
  offsets_J: np.ndarray
  phases_YxJ: np.ndarray | None = None
  # the target's position in its row, where the design varies it within an offset (the
  # lookup test's residue groups): what a position term in the analysis adjusts for
  positions_YxJ: np.ndarray | None = None


def shared_positions(matrices: Sequence[Matrix]) -> np.ndarray | None:
  """The target positions every matrix's prompts share (seeds asked the same prompts), None
  unless all store the same."""
  found = [m.positions_YxJ for m in matrices]
  if any(p is None for p in found) or any(not np.array_equal(p, found[0]) for p in found):
    return None
  return found[0]


# unit name -> its matrices, or None when not stored (``loader`` reads DIR)
Loader = Callable[[str], Mapping[str, Matrix] | None]


def path_for(workdir: str, variant: str) -> str:
  return os.path.join(workdir, DIRECTORY, f"{variant}.npz")


def _stored(correct_YxJ: np.ndarray) -> np.ndarray:
  """uint8 when every outcome is 0 or 1 (exact), else float64 (fractions)."""
  correct_YxJ = np.asarray(correct_YxJ)
  if np.all((correct_YxJ == 0) | (correct_YxJ == 1)):
    return correct_YxJ.astype(np.uint8)
  return correct_YxJ.astype(np.float64)


def save(path: str, matrices: Mapping[str, Matrix]) -> str:
  """Writes ``matrices`` (name -> Matrix) to ``path`` atomically; returns the path."""
  arrays = {}
  for name, m in matrices.items():
    if "." in name or not name:
      raise ValueError(f"matrix name {name!r}: must be non-empty without '.'")
    if m.correct_YxJ.ndim != 2 or m.correct_YxJ.shape[1] != m.offsets_J.shape[0]:
      raise ValueError(f"matrix {name!r}: correct_YxJ {m.correct_YxJ.shape} does not match "
                       f"offsets_J {m.offsets_J.shape}")
    arrays[f"{name}.correct_YxJ"] = _stored(m.correct_YxJ)
    arrays[f"{name}.offsets_J"] = np.asarray(m.offsets_J, np.int64)
    for part in ("phases_YxJ", "positions_YxJ"):
      if getattr(m, part) is not None:
        arrays[f"{name}.{part}"] = np.asarray(getattr(m, part), np.int64)
  return save_arrays(path, arrays)


def save_arrays(path: str, arrays: Mapping[str, np.ndarray]) -> str:
  """Writes ``arrays`` as a compressed .npz at ``path`` atomically (folders created): the
  form of every per-unit data file stored beside results.json. Returns the path."""
  os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
  tmp = path + ".tmp.npz"
  np.savez_compressed(tmp, **arrays)
  os.replace(tmp, path)
  return path


_PARTS = ("correct_YxJ", "offsets_J", "phases_YxJ", "positions_YxJ")


def _matrix_names(names: list[str]) -> str:
  """What is wrong with a correctness file's array names ("" when nothing)."""
  foreign = [n for n in names if "." not in n or n.rsplit(".", 1)[1] not in _PARTS]
  if foreign:
    return f"arrays {', '.join(foreign[:3])} are no matrix's (<name>.correct_YxJ, ...)"
  lacking = sorted(base for base in {n.rsplit(".", 1)[0] for n in names}
                   if f"{base}.correct_YxJ" not in names or f"{base}.offsets_J" not in names)
  return f"matrices {', '.join(lacking)} lack correct_YxJ or offsets_J" if lacking else ""


def load(path: str) -> dict[str, Matrix]:
  """The matrices of one variant file (name -> Matrix; outcomes as float64);
  ``reading.UnreadableFile`` names the file for a truncated or foreign one."""
  data = reading.npz_arrays(path, "a correctness file", _matrix_names)
  names = sorted({key.rsplit(".", 1)[0] for key in data})
  return {name: Matrix(data[f"{name}.correct_YxJ"].astype(np.float64), data[f"{name}.offsets_J"],
                       data.get(f"{name}.phases_YxJ"), data.get(f"{name}.positions_YxJ"))
          for name in names}


def loader(workdir: str) -> Loader:
  """Reads ``DIR/correct/<unit>.npz`` (None where a unit has none)."""
  def read(name: str) -> dict[str, Matrix] | None:
    path = path_for(workdir, name)
    return load(path) if os.path.exists(path) else None
  return read


def far_matrix(record, load: Loader) -> Matrix | None:
  """The far-depth needle matrix of a ``VariantRecord`` (None where it has none stored)."""
  matrices = load(record.name)
  name = record.needle_matrix_name
  return None if not matrices or name is None else matrices.get(name)
