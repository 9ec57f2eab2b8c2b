"""What every probe of the ``PROBES`` registry takes and gives.

A probe is a function ``probe(context, **options) -> ProbeResult``: the context carries the
trained (or loaded) model, its batched predictor, the unit's setup and the sweep's statistics
settings; the options are the probe's entry in the sweep config
(``sweep.probes.<name> = dict(...)``), its keyword defaults the values of an option not given.

Two kinds of result. A probe of its own (``key_overlap``, a new probe) gives a JSON ``record``,
stored under its name in the variant record (results.json ``variants[i].probes.<name>``). The
sweep's built-in probes (``builtin``: needle sweep, prefix probe, slot gains, loss by position)
give typed ``fields`` instead: the ``records.variant.VariantRecord`` fields the claims read
(``depths``, ``prefix_probe``, ``slot_gain``, ...), stored where the claims expect them.
Figures are described (``Figure``), not drawn: the report draws them.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from chunkformer.evaluation.probes import trained as trained_lib
from chunkformer.evaluation.records import correctness
from chunkformer.evaluation.records.loss_rows import Rows
from chunkformer.evaluation.records.variant import VariantSetup
from chunkformer.evaluation.stats.analysis_types import Analysis


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
  # The unit's resolved config (None: the trained model's) and its descriptive fields.
  config: Any = None
  setup: VariantSetup | None = None
  sweep_chunk_sizes: tuple[int, ...] = ()  # every M in play in the sweep (window alignment)
  batch_size: int = 64  # rows per jitted forward pass

  @property
  def unit_config(self) -> Any:
    return self.trained.config if self.config is None else self.config

  @property
  def analyze_kw(self) -> dict[str, int]:
    """The statistics settings ``stats.analyze`` takes."""
    return dict(seed=self.seed, num_resamples=self.num_resamples,
                num_permutations=self.num_permutations)


@dataclasses.dataclass(frozen=True)
class Figure:
  """A figure for the report to draw (``report.figures``): ``kind`` names the drawing function,
  ``args``/``options`` its data; it is saved as ``file`` in the sweep's plots directory."""

  caption: str  # "" for kind "analysis", which draws its own set of captioned figures
  kind: str
  args: tuple = ()
  options: Mapping[str, Any] = dataclasses.field(default_factory=dict)
  file: str = ""
  # Drawn only when this probe's result gives the unit's primary analysis.
  primary_only: bool = False


@dataclasses.dataclass(frozen=True)
class Primary:
  """An analysis a probe offers as the unit's primary one (the first offered is taken)."""

  probe: str  # the record's ``primary_probe``: "needle", "prefix" or "lookup"
  analysis: Analysis


@dataclasses.dataclass(frozen=True)
class ProbeResult:
  # JSON-ready (dicts, lists, numbers, strings, None): the variant record stores it under the
  # probe's name (results.json ``variants[i].probes.<name>``)
  record: Any = None
  # Stored in DIR/correct/<unit>.npz (``correctness``) as "<probe name>_<key>"; a result with
  # ``fields`` names them itself, as the claims read them ("needle_far", "prefix").
  matrices: Mapping[str, correctness.Matrix] = dataclasses.field(default_factory=dict)
  # A built-in's typed ``VariantRecord`` fields (instead of ``record``); {}: not applicable
  # to this unit (e.g. the needle sweep of a code model).
  fields: Mapping[str, Any] | None = None
  figures: Sequence[Figure] = ()
  primary: Primary | None = None
  loss_rows: Rows | None = None  # stored in DIR/lm_loss/<unit>.npz


Probe = Callable[..., ProbeResult]
