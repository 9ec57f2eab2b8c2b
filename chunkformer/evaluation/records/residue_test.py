"""The record of a position-matched test (the ``lookup`` and ``long_needle`` probes), typed:
accuracy by residue per padding mode, as results.json stores it under the probe's name."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping
from typing import Any

from chunkformer.evaluation.stats import residue_accuracy


@dataclasses.dataclass(frozen=True)
class ResidueTest:
  """One probe's result: accuracy by residue per padding mode (``modes``)."""

  test: str  # "lookup" | "long_needle"
  seq_len: int
  modulus: int
  stride: int | None
  prompts_per_residue: int
  validation_loss: float | None  # the run's held-out loss at its last step, if recorded
  modes: dict[str, residue_accuracy.ResidueAccuracy]
  settings: dict[str, Any]  # the task fields used (records, demonstrations, key length, ...)
  # padding -> the best strategy that never reads the target's record, its mean and
  # per-residue accuracy, every strategy's mean (``data/lookup_shortcuts.Shortcuts.record``);
  # None where the probe has no shortcut (the long needle) or the record predates it
  shortcuts: dict[str, Any] | None = None
  # padding -> what a model forming its own chunks formed on the prompts (tokens per chunk,
  # the target's chunk length and phase; ``probes.lookup.formed_chunks``); None otherwise
  chunks: dict[str, Any] | None = None

  def to_record(self) -> dict[str, Any]:
    """JSON-ready (tuples as lists), equal to what results.json reads back."""
    return json.loads(json.dumps(dataclasses.asdict(self)))

  @classmethod
  def from_record(cls, record: Mapping[str, Any]) -> ResidueTest:
    return cls(**dict(record, modes={k: residue_accuracy.ResidueAccuracy.from_record(v)
                                     for k, v in record["modes"].items()}))
