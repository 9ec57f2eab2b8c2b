"""One sweep variant's record (what results.json stores per variant) and the results file.

``VariantRecord`` = the variant's setup (read from its resolved config), its primary analysis
(``stats.analysis.Analysis``: the needle sweep at the far depth, or the prefix probe for code
models),
the nested analyses (per depth, all depths pooled, phase inside the actual dynamic chunk,
prefix probe), slot gains, held-out metrics and figure paths. JSON form: the flat results.json
variant entry (setup and primary analysis at the top level), written by
``to_json`` and read by ``from_json``; files written before these types read back equal.
Shape letters as in ``records``.
"""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Mapping
from typing import Any

import numpy as np

from chunkformer.evaluation.records import correctness
from chunkformer.evaluation.stats.analysis_types import (
  Analysis,
  DepthAnalysis,
  FloatMatrix,
  Json,
  PhaseTable,
  PrefixAnalysis,
  analysis_keys,
  as_float,
  as_floats,
  float_lists,
)


def json_ready(value: Any) -> Any:
  """Python types with non-finite floats as None (strict JSON), tuples as lists."""
  if isinstance(value, dict):
    return {str(k): json_ready(v) for k, v in value.items()}
  if isinstance(value, (list, tuple, np.ndarray)):
    return [json_ready(v) for v in value]
  if isinstance(value, (bool, np.bool_)):
    return bool(value)
  if isinstance(value, (int, np.integer)):
    return int(value)
  if isinstance(value, (float, np.floating)):
    return float(value) if math.isfinite(value) else None
  return value


# A variant record always carries these setup fields (a study's seeds are told apart by
# them), read from its config.
# The lookup probe's prefix-padding matrix (stored as "<probe>_<padding>"), a lookup model's
# primary one.
LOOKUP_PRIMARY_MATRIX = "lookup_prefix"
IDENTITY_FIELDS = ("variant", "seed", "key_len", "value_len", "task")


# Rows a plan names apart from the paper's table (plan version 5): the study's cures on the
# paper's compressor and the size trend, judged by their own claims (C17-C21) and described,
# never counted by the claims on the table's rows (C10-C16, and E4-E6 on its full rows).
SIDE_ROW_PREFIXES = ("cure_", "size_")

# Setup fields newer than some committed results.json files: absent there, they take the
# dataclass default (what those runs had), and at their default they are not written.
_ADDED_LATER = ("key_shift_frozen_steps", "query_shift", "compress_window", "window_align",
                "gate", "offset_maps", "num_kv_heads")


@dataclasses.dataclass(frozen=True)
class VariantSetup:
  """What was trained: the descriptive fields of the variant's resolved config."""

  variant: str  # the variant; its seeds share it (results.json "variant")
  attention: str  # "full", "fixed" or "dynamic" (of the compressed layers)
  chunking: str  # e.g. "fixed/overlap", "dynamic/router", "+shift2" for a key shift
  # ("+shift2@1500": the shift trained only after update 1500, train.shift_frozen_steps;
  # "+qkshift2": queries shifted as well, model.query_shift)
  # Defaults describe a plain 1-token kv model; a sweep fills every field from the config.
  layer_kinds: tuple[str, ...] = ()
  chunk_size: int | None = None  # M (or a dynamic layer's target); None without compression
  chunk_sizes: tuple[int, ...] = ()
  rope: bool = True
  pooling: str = "gated"
  overlap: bool = False
  # The compressor (fixed kind): W (attention.compress_window; 0 = S, or 2S with overlap),
  # where windows sit (end | start), gate kind (vector | scalar), offset maps (shared |
  # per_offset). The stride S is chunk_size.
  compress_window: int = 0
  window_align: str = "end"
  gate: str = "vector"
  offset_maps: str = "shared"
  stagger: bool = False
  stagger_mode: str = "none"
  random_phase: bool = False
  key_shift: bool = False
  key_shift_width: int = 0
  key_shift_frozen_steps: int = 0  # train.shift_frozen_steps: updates before the shift trains
  query_shift: bool = False  # model.query_shift: the queries carry the same shift
  num_kv_heads: int = 0  # model.num_kv_heads (0: not recorded, files written before it)
  window: int = 0
  task: str = "kv"
  key_len: int = 1
  value_len: int = 1
  seq_len: int = 0
  seed: int = 0  # the training seed (config.seed)
  source: str = ""
  overrides: Mapping[str, Any] = dataclasses.field(default_factory=dict)
  workdir: str = ""
  name: str = ""  # the sweep's unit, unique per (variant, seed) (results.json "name"; "" = variant)

  def __post_init__(self):
    if not self.name:
      object.__setattr__(self, "name", self.variant)

  @property
  def overlaps(self) -> bool:
    """Windows longer than the step: CSA's overlap, or a compressor window W > S."""
    return self.overlap or (bool(self.compress_window) and bool(self.chunk_size)
                            and self.compress_window > self.chunk_size)

  @property
  def is_side_row(self) -> bool:
    """A cure or size row of a plan (``SIDE_ROW_PREFIXES``), not a row of the paper's table."""
    return self.variant.startswith(SIDE_ROW_PREFIXES)

  @property
  def is_plain_fixed(self) -> bool:
    """Fixed chunks, RoPE on, gated pooling, no overlap (W = S), stagger, random phase or key
    shift."""
    return (self.attention == "fixed" and self.rope and self.pooling == "gated"
            and not self.overlaps and not self.stagger and not self.random_phase
            and not self.key_shift)

  def to_json(self) -> Json:
    out = {"name": self.name}
    for f in dataclasses.fields(self):
      value = getattr(self, f.name)
      if f.name in _ADDED_LATER and value == f.default:
        continue  # files of runs without it stay as they were
      out[f.name] = list(value) if isinstance(value, tuple) else (
          dict(value) if isinstance(value, Mapping) else value)
    return out

  @classmethod
  def from_json(cls, data: Mapping[str, Any]) -> VariantSetup:
    values = {f.name: data[f.name] for f in dataclasses.fields(cls)
              if f.name not in ("variant", *_ADDED_LATER)}
    values.update({name: data[name] for name in _ADDED_LATER if name in data})
    values["variant"] = data.get("variant", data["name"])
    values["layer_kinds"] = tuple(values["layer_kinds"])
    values["chunk_sizes"] = tuple(int(m) for m in values["chunk_sizes"])
    values["overrides"] = dict(values["overrides"])
    return cls(**values)


@dataclasses.dataclass(frozen=True)
class SlotGainSite:
  """Slot gains of one compressor site (``slot_gain.analyze``; matrices are K heads x S')."""

  site: str
  layer: int
  stream: str
  chunk_size: int | None
  slots: int
  overlap: bool
  pooling: str | None
  num_chunks: float
  bias_weight: FloatMatrix | None
  bias_gain: FloatMatrix | None
  bias_preferred_phase: tuple[float | None, ...] | None
  realised_weight: FloatMatrix | None
  realised_gain: FloatMatrix | None
  preferred_phase: tuple[float | None, ...] | None
  preferred_phase_spread: float | None

  _MATRICES = ("bias_weight", "bias_gain", "realised_weight", "realised_gain")
  _VECTORS = ("bias_preferred_phase", "preferred_phase")

  def to_json(self) -> Json:
    out = {}
    for f in dataclasses.fields(self):
      value = getattr(self, f.name)
      if value is not None and f.name in self._MATRICES:
        value = [list(row) for row in value]
      elif value is not None and f.name in self._VECTORS:
        value = list(value)
      out[f.name] = value
    return out

  @classmethod
  def from_json(cls, data: Mapping[str, Any]) -> SlotGainSite:
    values = {f.name: data[f.name] for f in dataclasses.fields(cls)}
    for key in cls._MATRICES:
      values[key] = float_lists(values[key])
    for key in cls._VECTORS:
      values[key] = None if values[key] is None else as_floats(values[key])
    values["num_chunks"] = as_float(values["num_chunks"])
    values["preferred_phase_spread"] = as_float(values["preferred_phase_spread"])
    return cls(**values)


# Keys of the flat results.json entry that belong to the record itself, not to its analysis
# (the setup and the analysis share "chunk_size" and "seed"; the setup's are stored).
_OWN_KEYS = frozenset({
    "name", "trained_steps", "primary_probe", "primary_depth", "token_accuracy_by_offset",
    "depths", "all_depths", "chunk_phase", "near_accuracy", "prefix_probe", "far_accuracy",
    "slot_gain", "heldout_compression_ratio", "compression_ratio", "heldout", "images",
    "eval_wall_s", "train_wall_s", "analysis_seed", "lm_phase_loss", "split_labels",
    "slot_gain_init", "probes", "plan"}) | {
        f.name for f in dataclasses.fields(VariantSetup)}


@dataclasses.dataclass(frozen=True)
class VariantRecord:
  """One evaluated variant (module docstring); the unit the verdicts, report and plots read."""

  setup: VariantSetup
  analysis: Analysis  # the primary probe's analysis
  primary_probe: str  # "needle" (far depth), "prefix" or "lookup" (prefix padding)
  trained_steps: int
  compression_ratio: float | None  # tokens per entry: 1 full, M fixed, measured for dynamic
  primary_depth: str | None = None  # needle models only, as the four below
  token_accuracy_by_offset: tuple[float | None, ...] | None = None
  depths: tuple[DepthAnalysis, ...] | None = None
  all_depths: Analysis | None = None  # all depths pooled (nested)
  near_accuracy: float | None = None
  chunk_phase: PhaseTable | None = None  # dynamic models: phase inside the actual chunk
  prefix_probe: PrefixAnalysis | None = None
  slot_gain: tuple[SlotGainSite, ...] | None = None
  heldout_compression_ratio: float | None = None
  heldout: Mapping[str, float] | None = None  # the training run's final held-out metrics
  # Language models: held-out loss by position mod M per batch, bits per byte
  # (lm_phase_loss.PhaseLoss.as_record(); its JSON form, kept as written).
  lm_phase_loss: Mapping[str, Any] | None = None
  images: Mapping[str, str] = dataclasses.field(default_factory=dict)  # caption -> PNG path
  eval_wall_s: float | None = None
  train_wall_s: float | None = None
  # Plain fixed models with multi-token needles: ``split_labels.split_record`` of the far depth
  # with the labels fixed in advance (``split_kinds_fixed``), plus chunk_size/key_len/value_len.
  split_labels: Mapping[str, Any] | None = None
  # Slot gains of the same config's initialised model (same seed) on the same rows: C6's null.
  slot_gain_init: tuple[SlotGainSite, ...] | None = None
  # The registry probes the sweep enabled (``sweep.probes``): probe name -> its JSON record.
  probes: Mapping[str, Any] | None = None
  # The pre-registered plan states the unit trained under (``provenance.file_state`` each,
  # appended when its training started or resumed); None: the sweep recorded no plan.
  plan: tuple[Mapping[str, Any], ...] | None = None

  @property
  def name(self) -> str:
    return self.setup.name

  @property
  def far_accuracy(self) -> float | None:
    """Mean accuracy of the primary probe (the far depth for needle models)."""
    return self.analysis.mean_accuracy.value

  @property
  def far_token_accuracy(self) -> float | None:
    """Per-token accuracy of the primary depth's needles (a needle counts in ``far_accuracy``
    only when every value token is right); None without a stored needle sweep."""
    far = next((d for d in self.depths or () if d.depth_name == self.primary_depth), None)
    return None if far is None else far.token_accuracy

  @property
  def needle_matrix_name(self) -> str | None:
    """The stored correctness matrix of the far depth's needle sweep (``correctness``)."""
    return None if self.primary_depth is None else correctness.needle_name(self.primary_depth)

  @property
  def primary_matrix_name(self) -> str | None:
    """The stored correctness matrix behind ``analysis``: the prefix probe's, the lookup test's
    in prefix padding, or the far needles'."""
    if self.primary_probe == "lookup":
      return LOOKUP_PRIMARY_MATRIX
    return correctness.PREFIX if self.primary_probe == "prefix" else self.needle_matrix_name

  @property
  def heldout_far_accuracy(self) -> float | None:
    """The training run's held-out far accuracy (rows as in training), where recorded."""
    held = (self.heldout or {}).get("far_accuracy")
    return None if held is None else float(held)

  @property
  def chunk_size(self) -> int | None:
    return self.setup.chunk_size

  def identity(self) -> dict[str, Any]:
    """The fields that name one trained model of a study (variant, seed, needle lengths, task)."""
    return {k: getattr(self.setup, k) for k in IDENTITY_FIELDS}

  def to_json(self) -> Json:
    out = self.setup.to_json()
    out["trained_steps"] = self.trained_steps
    out["primary_probe"] = self.primary_probe
    if self.depths is not None:
      out.update(primary_depth=self.primary_depth,
                 token_accuracy_by_offset=list(self.token_accuracy_by_offset),
                 depths=[d.to_json() for d in self.depths],
                 all_depths=self.all_depths.to_json())
      if self.chunk_phase is not None:
        out["chunk_phase"] = self.chunk_phase.to_json()
      out["near_accuracy"] = self.near_accuracy
    if self.prefix_probe is not None:
      out["prefix_probe"] = self.prefix_probe.to_json()
    out.update({k: v for k, v in self.analysis.to_json().items() if k not in out})
    out["analysis_seed"] = self.analysis.seed
    out["far_accuracy"] = self.far_accuracy
    out["slot_gain"] = None if self.slot_gain is None else {
        "sites": [s.to_json() for s in self.slot_gain]}
    if self.heldout_compression_ratio is not None:
      out["heldout_compression_ratio"] = self.heldout_compression_ratio
    out["compression_ratio"] = self.compression_ratio
    out["heldout"] = None if self.heldout is None else dict(self.heldout)
    if self.lm_phase_loss is not None:
      out["lm_phase_loss"] = dict(self.lm_phase_loss)
    out["images"] = dict(self.images)
    out["eval_wall_s"] = self.eval_wall_s
    out["train_wall_s"] = self.train_wall_s
    # Optional fields are written only when present: older results.json files lack them.
    if self.split_labels is not None:
      out["split_labels"] = json.loads(json.dumps(self.split_labels))
    if self.slot_gain_init is not None:
      out["slot_gain_init"] = {"sites": [s.to_json() for s in self.slot_gain_init]}
    if self.probes:
      out["probes"] = json.loads(json.dumps(self.probes))
    if self.plan is not None:
      out["plan"] = [dict(s) for s in self.plan]
    return out

  @classmethod
  def from_json(cls, data: Mapping[str, Any]) -> VariantRecord:
    """Reads a results.json variant entry (files before ``analysis_seed``: the record's seed)."""
    unknown = set(data) - _OWN_KEYS - analysis_keys()
    if unknown:
      raise ValueError(f"variant record {data.get('name')!r}: unknown fields {sorted(unknown)}")
    setup = VariantSetup.from_json(data)
    primary = Analysis.from_json(data, seed=data.get("analysis_seed", setup.seed))
    depths = data.get("depths")
    slot = data.get("slot_gain")
    return cls(
        setup=setup, analysis=primary, primary_probe=str(data["primary_probe"]),
        trained_steps=int(data["trained_steps"]),
        compression_ratio=as_float(data.get("compression_ratio")),
        primary_depth=data.get("primary_depth"),
        token_accuracy_by_offset=(None if depths is None
                                  else as_floats(data["token_accuracy_by_offset"])),
        depths=None if depths is None else tuple(DepthAnalysis.from_json(d) for d in depths),
        all_depths=None if depths is None else Analysis.from_json(data["all_depths"]),
        near_accuracy=as_float(data.get("near_accuracy")),
        chunk_phase=(PhaseTable.from_json(data["chunk_phase"]) if data.get("chunk_phase")
                     else None),
        prefix_probe=(PrefixAnalysis.from_json(data["prefix_probe"]) if data.get("prefix_probe")
                      else None),
        slot_gain=None if not slot else tuple(SlotGainSite.from_json(s) for s in slot["sites"]),
        heldout_compression_ratio=as_float(data.get("heldout_compression_ratio")),
        heldout=None if data.get("heldout") is None else dict(data["heldout"]),
        lm_phase_loss=(None if data.get("lm_phase_loss") is None
                       else dict(data["lm_phase_loss"])),
        images=dict(data.get("images") or {}),
        eval_wall_s=as_float(data.get("eval_wall_s")),
        train_wall_s=as_float(data.get("train_wall_s")),
        split_labels=(None if data.get("split_labels") is None
                      else json.loads(json.dumps(data["split_labels"]))),
        slot_gain_init=(None if not data.get("slot_gain_init") else tuple(
            SlotGainSite.from_json(s) for s in data["slot_gain_init"]["sites"])),
        probes=dict(data["probes"]) if data.get("probes") else None,
        plan=None if data.get("plan") is None else tuple(dict(s) for s in data["plan"]))
