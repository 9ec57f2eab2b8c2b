"""A language model's held-out per-token rows (loss, code mask, bytes), stored beside
results.json as ``DIR/lm_loss/<unit>.npz`` (``probes.lm_phase_loss`` measures them), so the loss
signature, seed pooling and paired comparisons recompute from DIR alone."""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable
from typing import Any

import numpy as np

from chunkformer.evaluation.records import correctness, reading
from chunkformer.evaluation.stats import loss_phase

DIRECTORY = "lm_loss"  # DIR/lm_loss/<unit>.npz: the per-token rows of each unit


@dataclasses.dataclass(frozen=True)
class Rows:
  """Held-out per-token rows of one model (all batches stacked), [N, T] each."""

  loss_NxT: np.ndarray  # nats (0 where the mask is 0), float32 as measured
  mask_NxT: np.ndarray  # 1 on code targets (``code_mask``)
  bytes_NxT: np.ndarray  # UTF-8 bytes each target predicts

  def signature(self, period: int, **kwargs) -> dict[str, Any]:
    """``loss_phase.loss_by_phase`` of these rows (kwargs: seed, num_resamples, ...)."""
    return loss_phase.loss_by_phase(self.loss_NxT, self.mask_NxT, period,
                                    target_bytes_NxT=self.bytes_NxT, **kwargs)


def stack(rows: list[Rows]) -> Rows:
  """Several models' or seeds' rows as one set of more rows (pooling)."""
  return Rows(*(np.concatenate([getattr(r, f.name) for r in rows])
                for f in dataclasses.fields(Rows)))


def path_for(workdir: str, unit: str) -> str:
  return os.path.join(workdir, DIRECTORY, f"{unit}.npz")


def save(path: str, rows: Rows) -> str:
  """Writes ``rows`` to ``path`` atomically (mask and bytes as uint8: exact); returns path."""
  mask = np.asarray(rows.mask_NxT)
  if not np.all((mask == 0) | (mask == 1)):
    raise ValueError(f"{path}: the code mask must be 0/1 to be stored")
  return correctness.save_arrays(path, {"loss_NxT": np.asarray(rows.loss_NxT, np.float32),
                                        "mask_NxT": mask.astype(np.uint8),
                                        "bytes_NxT": np.asarray(rows.bytes_NxT).astype(np.uint8)})


_ARRAYS = ["bytes_NxT", "loss_NxT", "mask_NxT"]


def load(path: str) -> Rows:
  """One unit's stored rows; ``reading.UnreadableFile`` names a truncated or foreign file."""
  data = reading.npz_arrays(path, "a loss-rows file", lambda names: (
      "" if names == _ARRAYS else f"arrays {', '.join(names)}, not {', '.join(_ARRAYS)}"))
  return Rows(data["loss_NxT"], data["mask_NxT"].astype(np.float64),
              data["bytes_NxT"].astype(np.float64))


def loader(workdir: str):
  """unit name -> its stored ``Rows`` (None where a unit has none)."""
  def read(name: str) -> Rows | None:
    path = path_for(workdir, name)
    return load(path) if os.path.exists(path) else None
  return read


RowsLoader = Callable[[str], "Rows | None"]  # unit name -> its stored rows, None where absent
