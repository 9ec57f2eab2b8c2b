"""What every probe of the ``PROBES`` registry takes and gives.

A probe is a function ``probe(context, **options) -> ProbeResult``: the context carries the
trained (or loaded) model, its batched predictor and the sweep's statistics settings; the
options are the probe's entry in the sweep config (``sweep.probes.<name> = dict(...)``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from typing import Any

from chunkformer.evaluation.probes import trained as trained_lib
from chunkformer.evaluation.records import correctness


@dataclasses.dataclass(frozen=True)
class ProbeContext:
  trained: trained_lib.TrainedModel
  # rows -> {"predictions", ...}: batched, jitted; kv rows in a loaded model's own tokens
  predict: trained_lib.Predictor
  unit: str  # the sweep unit's name
  chunk_sizes: tuple[int, ...]  # the M its phases are read at (the model's own first)
  seed: int = 0
  num_resamples: int = 2000
  num_permutations: int = 2000


@dataclasses.dataclass(frozen=True)
class ProbeResult:
  # JSON-ready (dicts, lists, numbers, strings, None): the variant record stores it under the
  # probe's name (results.json ``variants[i].probes.<name>``)
  record: Any
  # stored in DIR/correct/<unit>.npz as "<probe name>_<key>" (``correctness``)
  matrices: Mapping[str, correctness.Matrix] = dataclasses.field(default_factory=dict)


Probe = Callable[..., ProbeResult]
