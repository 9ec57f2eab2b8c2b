"""Typed records of the sweep statistics (``stats.analyze``) and their results.json form.

Frozen dataclasses, nested where the numbers belong together; each has ``to_json`` (python
types only, NaN written as None) and ``from_json`` (the inverse), and ``record ->
to_json -> from_json`` gives an equal record. The JSON form is the flat one results.json has
had since the first sweeps (``accuracy_by_phase``, ``accuracy_by_phase_low``, ``max_gap``, ...), so
committed results read back unchanged; ``records.variant`` builds the per-variant record on
these.

Shape letters of the sweep statistics in evaluation/ (estimates, period_tests, stats,
needle_sweep, prefix_probe): Y sampled haystacks, J needle offsets (or prefix lengths), G phase
groups, P candidate periods, R bootstrap resamples or permutations, F frequencies. They differ
on purpose from kernels/, where S is slots or keys and K kv heads.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

Json = dict[str, Any]


def as_float(value: Any) -> float | None:
  """A finite python float, or None (strict JSON has no NaN or infinity)."""
  if value is None:
    return None
  value = float(value)
  return value if math.isfinite(value) else None


def as_floats(values: Any) -> tuple[float | None, ...]:
  return tuple(as_float(v) for v in np.ravel(np.asarray(values, dtype=object)))


def as_ints(values: Any) -> tuple[int, ...]:
  return tuple(int(v) for v in np.ravel(np.asarray(values)))


def _optional_int(value: Any) -> int | None:
  return None if value is None else int(value)


@dataclasses.dataclass(frozen=True)
class Interval:
  """A point estimate with its bootstrap interval (None where undefined)."""

  value: float | None
  low: float | None
  high: float | None

  @classmethod
  def of(cls, value, low, high) -> Interval:
    return cls(as_float(value), as_float(low), as_float(high))

  def to_json(self, key: str) -> Json:
    return {key: self.value, f"{key}_low": self.low, f"{key}_high": self.high}

  @classmethod
  def from_json(cls, data: Mapping[str, Any], key: str) -> Interval:
    return cls.of(data[key], data.get(f"{key}_low"), data.get(f"{key}_high"))


@dataclasses.dataclass(frozen=True)
class Curve:
  """Values over an axis (offsets, phases) with a pointwise bootstrap band."""

  values: tuple[float | None, ...]
  low: tuple[float | None, ...]
  high: tuple[float | None, ...]

  @classmethod
  def of(cls, values, low, high) -> Curve:
    return cls(as_floats(values), as_floats(low), as_floats(high))

  def to_json(self, key: str) -> Json:
    return {key: list(self.values), f"{key}_low": list(self.low),
            f"{key}_high": list(self.high)}

  @classmethod
  def from_json(cls, data: Mapping[str, Any], key: str) -> Curve:
    return cls.of(data[key], data[f"{key}_low"], data[f"{key}_high"])


@dataclasses.dataclass(frozen=True)
class PhaseTable:
  """Accuracy per phase group, the max-min gap over groups and the permutation test of it."""

  phases: tuple[int, ...]
  accuracy: Curve  # accuracy_by_phase (+ band)
  weakest_phase: int
  gap: Interval  # max_gap: basic bootstrap interval
  p_value: float  # phase_p_value: permutation test of this grouping

  @property
  def weakest_separated(self) -> bool:
    """Whether the weakest phase is separated from every other: its band's upper end lies
    below each other phase's lower end (a lowest phase inside the next one's band is not a
    single weakest phase; docs/claims.md, "Descriptions")."""
    i = self.phases.index(self.weakest_phase)
    high = self.accuracy.high[i]
    lows = [low for j, low in enumerate(self.accuracy.low) if j != i]
    if high is None or not lows or any(low is None for low in lows):
      return False
    return high < min(lows)

  def weakest_text(self) -> str:
    """'weakest phase 3', or 'no single weakest phase (lowest 3)' when not separated."""
    if self.weakest_separated:
      return f"weakest phase {self.weakest_phase}"
    return f"no single weakest phase (lowest {self.weakest_phase})"

  def weakest_label(self) -> str:
    """The weakest phase for a table cell: in parentheses when it is not separated."""
    return str(self.weakest_phase) if self.weakest_separated else f"({self.weakest_phase})"

  def to_json(self) -> Json:
    return {"phases": list(self.phases), **self.accuracy.to_json("accuracy_by_phase"),
            "weakest_phase": self.weakest_phase, **self.gap.to_json("max_gap"),
            "phase_p_value": self.p_value}

  @classmethod
  def from_json(cls, data: Mapping[str, Any]) -> PhaseTable:
    return cls(as_ints(data["phases"]), Curve.from_json(data, "accuracy_by_phase"),
               int(data["weakest_phase"]), Interval.from_json(data, "max_gap"),
               as_float(data["phase_p_value"]))


@dataclasses.dataclass(frozen=True)
class PeriodTest:
  """The absolute grouping ``offset mod M`` at one chunk size M (one ``by_chunk_size`` entry)."""

  chunk_size: int
  table: PhaseTable
  periodic_share: float
  p_value: float  # equals table.p_value; stored under both names in results.json

  def to_json(self) -> Json:
    return {"chunk_size": self.chunk_size, **self.table.to_json(),
            "periodic_share": self.periodic_share, "p_value": self.p_value}

  @classmethod
  def from_json(cls, data: Mapping[str, Any]) -> PeriodTest:
    return cls(int(data["chunk_size"]), PhaseTable.from_json(data),
               as_float(data["periodic_share"]), as_float(data["p_value"]))


@dataclasses.dataclass(frozen=True)
class PeriodScanTable:
  """Every candidate period's share and permutation p-value (raw and family-wise)."""

  periods: tuple[int, ...]
  shares: tuple[float | None, ...]
  adjusted_shares: tuple[float | None, ...]
  p_values: tuple[float | None, ...]
  adjusted_p_values: tuple[float | None, ...]

  def to_json(self) -> Json:
    return {f.name: list(getattr(self, f.name)) for f in dataclasses.fields(self)}

  @classmethod
  def from_json(cls, data: Mapping[str, Any]) -> PeriodScanTable:
    return cls(as_ints(data["periods"]), *(as_floats(data[k]) for k in (
        "shares", "adjusted_shares", "p_values", "adjusted_p_values")))


@dataclasses.dataclass(frozen=True)
class Spectrum:
  frequencies: tuple[float | None, ...]
  power: tuple[float | None, ...]

  def to_json(self) -> Json:
    return {"frequencies": list(self.frequencies), "power": list(self.power)}

  @classmethod
  def from_json(cls, data: Mapping[str, Any]) -> Spectrum:
    return cls(as_floats(data["frequencies"]), as_floats(data["power"]))


@dataclasses.dataclass(frozen=True)
class Analysis:
  """Every statistic of one correctness matrix (``stats.analyze``; its docstring has the rules).

  ``phase`` is the primary grouping (``offset mod M`` of the first chunk size, or the caller's
  phases, ``phase_source``); ``by_chunk_size`` always groups by ``offset mod M``, first entry
  the primary M, and carries the periodic share and p-value of the period test.
  ``period_scan``/``spectrum`` are None in nested analyses (per depth, prefix probe), which
  results.json stores without them; ``spectrum`` is also None for unevenly spaced offsets.
  """

  offsets: tuple[int, ...]
  num_haystacks: int
  accuracy_by_offset: Curve
  mean_accuracy: Interval
  offset_gap: float
  phase_source: str  # "offset mod M" or "caller"
  phase: PhaseTable
  by_chunk_size: tuple[PeriodTest, ...]
  detected_period: int | None
  detection_p_value: float
  detection_alpha: float
  period_scan: PeriodScanTable | None
  spectrum: Spectrum | None
  num_resamples: int
  num_permutations: int
  confidence: float
  seed: int

  @property
  def chunk_size(self) -> int:
    return self.by_chunk_size[0].chunk_size

  @property
  def periodic_share(self) -> float:
    return self.by_chunk_size[0].periodic_share

  @property
  def p_value(self) -> float:
    """Permutation p-value of ``offset mod M`` at the primary M (a blind spot in position)."""
    return self.by_chunk_size[0].p_value

  @property
  def max_gap(self) -> float | None:
    return self.phase.gap.value

  def nested(self) -> Analysis:
    """This analysis without the bulky scan and spectrum (how nested analyses are stored)."""
    return dataclasses.replace(self, period_scan=None, spectrum=None)

  def to_json(self) -> Json:
    out = {"offsets": list(self.offsets), "num_haystacks": self.num_haystacks,
           **self.accuracy_by_offset.to_json("accuracy_by_offset"),
           **self.mean_accuracy.to_json("mean_accuracy"), "offset_gap": self.offset_gap,
           "chunk_size": self.chunk_size, "phase_source": self.phase_source,
           **self.phase.to_json(), "periodic_share": self.periodic_share,
           "p_value": self.p_value, "detected_period": self.detected_period,
           "detection_p_value": self.detection_p_value, "detection_alpha": self.detection_alpha}
    if self.period_scan is not None:
      out["period_scan"] = self.period_scan.to_json()
      out["spectrum"] = None if self.spectrum is None else self.spectrum.to_json()
    out.update({"by_chunk_size": [t.to_json() for t in self.by_chunk_size],
                "num_resamples": self.num_resamples, "num_permutations": self.num_permutations,
                "confidence": self.confidence, "seed": self.seed})
    return out

  @classmethod
  def from_json(cls, data: Mapping[str, Any], *, seed: int | None = None) -> Analysis:
    """``seed`` replaces ``data["seed"]`` (a variant record stores its own seed there)."""
    scan = data.get("period_scan")
    spectrum = data.get("spectrum") if scan is not None else None
    return cls(
        offsets=as_ints(data["offsets"]), num_haystacks=int(data["num_haystacks"]),
        accuracy_by_offset=Curve.from_json(data, "accuracy_by_offset"),
        mean_accuracy=Interval.from_json(data, "mean_accuracy"),
        offset_gap=as_float(data["offset_gap"]), phase_source=str(data["phase_source"]),
        phase=PhaseTable.from_json(data),
        by_chunk_size=tuple(PeriodTest.from_json(t) for t in data["by_chunk_size"]),
        detected_period=_optional_int(data["detected_period"]),
        detection_p_value=as_float(data["detection_p_value"]),
        detection_alpha=as_float(data["detection_alpha"]),
        period_scan=None if scan is None else PeriodScanTable.from_json(scan),
        spectrum=None if spectrum is None else Spectrum.from_json(spectrum),
        num_resamples=int(data["num_resamples"]), num_permutations=int(data["num_permutations"]),
        confidence=as_float(data["confidence"]),
        seed=int(data["seed"] if seed is None else seed))


_ANALYSIS_KEYS = frozenset(Analysis.__dataclass_fields__) | {
    "chunk_size", "periodic_share", "p_value", "phases", "weakest_phase", "phase_p_value",
    *(f"{k}{s}" for k in ("accuracy_by_offset", "mean_accuracy", "accuracy_by_phase",
                          "max_gap") for s in ("", "_low", "_high"))}


def analysis_keys() -> frozenset[str]:
  """The results.json keys an ``Analysis`` writes (a variant record stores them flat)."""
  return _ANALYSIS_KEYS


@dataclasses.dataclass(frozen=True)
class DepthAnalysis:
  """The needle shift sweep at one depth (0 = far, 1 = near)."""

  analysis: Analysis  # nested: no scan, no spectrum
  depth: float
  depth_name: str
  mean_distance: float
  token_accuracy: float
  compression_ratio: float | None  # measured from the model's end flags (dynamic), else None

  def to_json(self) -> Json:
    return {**self.analysis.to_json(), "depth": self.depth, "depth_name": self.depth_name,
            "mean_distance": self.mean_distance, "token_accuracy": self.token_accuracy,
            "compression_ratio": self.compression_ratio}

  @classmethod
  def from_json(cls, data: Mapping[str, Any]) -> DepthAnalysis:
    return cls(Analysis.from_json(data), as_float(data["depth"]), str(data["depth_name"]),
               as_float(data["mean_distance"]), as_float(data["token_accuracy"]),
               as_float(data.get("compression_ratio")))


@dataclasses.dataclass(frozen=True)
class PrefixAnalysis:
  """The prefix probe: accuracy against the number N of prepended filler tokens."""

  analysis: Analysis  # nested; its offsets are the prefix lengths N
  token_accuracy_by_prefix: tuple[float | None, ...]
  code_accuracy_by_prefix: tuple[float | None, ...] | None = None  # code models only
  boundary_agreement_by_prefix: tuple[float | None, ...] | None = None  # dynamic models only
  # Code prompts: accuracy by N mod M and by each needle's own phase (prefix_probe.needle_phases;
  # its JSON form, kept as written).
  needle_phases: Mapping[str, Any] | None = None

  @property
  def worst_boundary_agreement(self) -> float | None:
    """The lowest boundary agreement over the prefix lengths (None for fixed models)."""
    agreement = self.boundary_agreement_by_prefix
    return None if agreement is None else min(agreement)

  def to_json(self) -> Json:
    out = {**self.analysis.to_json(), "token_accuracy_by_prefix":
           list(self.token_accuracy_by_prefix)}
    for key in ("code_accuracy_by_prefix", "boundary_agreement_by_prefix"):
      if getattr(self, key) is not None:
        out[key] = list(getattr(self, key))
    if self.needle_phases is not None:
      out["needle_phases"] = dict(self.needle_phases)
    return out

  @classmethod
  def from_json(cls, data: Mapping[str, Any]) -> PrefixAnalysis:
    optional = {k: as_floats(data[k]) for k in ("code_accuracy_by_prefix",
                                                 "boundary_agreement_by_prefix") if k in data}
    if data.get("needle_phases") is not None:
      optional["needle_phases"] = dict(data["needle_phases"])
    return cls(Analysis.from_json(data), as_floats(data["token_accuracy_by_prefix"]), **optional)


FloatMatrix = tuple[tuple[float | None, ...], ...]


def float_lists(rows: Sequence[Sequence[Any]] | None) -> FloatMatrix | None:
  """A matrix (list of rows) as nested tuples of JSON floats."""
  return None if rows is None else tuple(as_floats(r) for r in rows)
