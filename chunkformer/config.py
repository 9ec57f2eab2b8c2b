"""Frozen, validated run configuration.

`ml_collections.ConfigDict` files (``configs/*.py``) are the user-facing format; they are
converted exactly once, here, into frozen dataclasses. Modules never see a ConfigDict.
Every check raises ``ConfigError`` naming the offending field and the allowed values, so bad
input fails before anything is compiled or written.

The sections (``model``, ``data``, ``train``, ``mesh``, ``init``) and their own field checks live
in ``chunkformer/config_sections/`` and are re-exported here, the one import the rest of the
code uses. ``Config`` adds what needs the whole run: checks across sections (entry capacity and
top-k against ``data.seq_len``, micro-batches against ``data.batch_size``) and the data task's
checks (``chunkformer.data.check_config``, ``vocab_size_needed``), owned by the task modules.

Per-layer attention: ``model.attention`` holds the defaults for every layer and
``model.layer_pattern`` optionally overrides fields per layer, cycled over the layers:
``"chunk_size=4,overlap=true;chunk_size=128"`` gives DeepSeek-V4's alternating CSA/HCA layout
(see ``config_sections/layer_pattern.py``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from chunkformer import data as data_lib
from chunkformer.config_sections import capabilities
from chunkformer.config_sections.attention import (
    ATTENTION_KINDS,
    BOUNDARY_PREDICTORS,
    INDEXERS,
    LAYOUTS,
    POOLINGS,
    ROUTER_RULES,
    STAGGER_MODES,
    AttentionConfig,
)
from chunkformer.config_sections.data import TASKS, DataConfig
from chunkformer.config_sections.errors import ConfigError, require
from chunkformer.config_sections.mesh import DEFAULT_AXIS_RULES, MeshConfig
from chunkformer.config_sections.model import DTYPES, REMAT_POLICIES, ModelConfig
from chunkformer.config_sections.training import InitConfig, TrainConfig

__all__ = [
    "ATTENTION_KINDS", "BOUNDARY_PREDICTORS", "DEFAULT_AXIS_RULES", "DTYPES", "INDEXERS",
    "LAYOUTS", "POOLINGS", "REMAT_POLICIES", "ROUTER_RULES", "STAGGER_MODES", "TASKS",
    "AttentionConfig", "Config", "ConfigError", "DataConfig", "InitConfig", "MeshConfig",
    "ModelConfig", "TrainConfig", "from_dict", "to_dict",
]


@dataclasses.dataclass(frozen=True)
class Config:
  """The whole run: one field per section."""

  seed: int = 0
  model: ModelConfig = ModelConfig()
  data: DataConfig = DataConfig()
  train: TrainConfig = TrainConfig()
  mesh: MeshConfig = MeshConfig()
  init: InitConfig = InitConfig()

  def validate(self) -> Config:
    self.model.validate()
    data_lib.check_config(self.data)
    self.train.validate()
    self.init.validate()
    self.mesh.validate()
    require(not self.train.shift_frozen_steps or self.model.key_shift > 0,
            "train.shift_frozen_steps", "holds the token-shift weights, but model.key_shift = 0 "
            "gives the model none")
    accum = self.train.grad_accum_steps
    require(self.data.batch_size % accum == 0, "train.grad_accum_steps",
            f"{accum} micro-batches do not divide data.batch_size={self.data.batch_size}")
    for i, layer in enumerate(self.model.layers):
      if layer.kind == "dynamic" and layer.entry_capacity:
        rows = -(-self.data.seq_len // layer.shortest_chunk)
        require(layer.entry_capacity >= rows, f"model.attention[layer {i}].entry_capacity",
                f"{layer.entry_capacity} entries cannot hold the {rows} chunks of at least "
                f"{layer.shortest_chunk} tokens that a row of data.seq_len={self.data.seq_len} "
                "may close")
    for i, layer in enumerate(self.model.layers):
      if layer.kind == "fixed" and layer.topk:
        capacity = -(-self.data.seq_len // layer.chunk_size)  # fixed entries per row
        require(layer.topk <= capacity, f"model.attention[layer {i}].topk",
                f"top-{layer.topk} exceeds the {capacity} entries of a row "
                f"(data.seq_len={self.data.seq_len}, chunk_size={layer.chunk_size})")
    self._check_context_parallel()
    needed = data_lib.vocab_size_needed(self.data)
    require(self.model.vocab_size >= needed, "model.vocab_size",
            f"data task {self.data.task!r} emits token ids up to {needed - 1}; "
            f"need >= {needed}, got {self.model.vocab_size}")
    return self

  def _check_context_parallel(self) -> None:
    """mesh.context > 1 splits every row's tokens; what cannot be split is refused here.

    GSPMD partitions the XLA attention paths along the tokens (chunks may straddle a shard
    edge: the partitioner moves the rows it needs), but a Pallas kernel is one opaque call
    that it cannot split, and a row must split into equal token blocks. The ring's load
    balancing reorders a row's tokens, which only layers that read tokens by their position
    (full attention, no token shift) allow.
    """
    context = self.mesh.context
    if context <= 1:
      return
    require(self.data.seq_len % context == 0, "data.seq_len",
            f"{self.data.seq_len} tokens do not split over mesh.context={context} devices")
    for i, layer in enumerate(self.model.layers):
      refused = capabilities.context_refusal(layer.implementation, context)
      require(refused is None, f"model.attention[layer {i}].implementation", refused)
    if not self.mesh.context_load_balance:
      return
    require(self.data.seq_len % (2 * context) == 0, "data.seq_len",
            f"{self.data.seq_len} tokens do not split into the 2*mesh.context = {2 * context} "
            "equal chunks of mesh.context_load_balance")
    for i, layer in enumerate(self.model.layers):
      require(layer.kind == "full", f"model.attention[layer {i}].kind",
              f"{layer.kind!r} reads neighbouring tokens (windows, chunks), which "
              "mesh.context_load_balance reorders; it needs every layer 'full'")
    require(self.model.key_shift == 0, "model.key_shift",
            "the token shift reads the previous token, which mesh.context_load_balance "
            "reorders; set it 0 or the load balancing off")


def _deep_tuple(value: Any) -> Any:
  """Lists back to tuples at every depth (JSON and ConfigDict turn tuples into lists)."""
  return tuple(_deep_tuple(v) for v in value) if isinstance(value, (list, tuple)) else value


def _build(cls, values: Mapping[str, Any], prefix: str):
  known = {f.name: f for f in dataclasses.fields(cls)}
  kwargs = {}
  for key, value in values.items():
    field = f"{prefix}{key}"
    if key not in known:
      raise ConfigError(f"config field '{field}' is unknown; known: {', '.join(known)}")
    default = known[key].default
    if dataclasses.is_dataclass(default):
      kwargs[key] = _build(type(default), value, f"{field}.")
    elif isinstance(default, tuple):
      kwargs[key] = _deep_tuple(value)
    else:
      _check_type(field, default, value)
      kwargs[key] = value
  return cls(**kwargs)


def _check_type(field: str, default: Any, value: Any) -> None:
  """A scalar must have its default's type (an int where a float is expected is fine)."""
  if default is None or value is None or isinstance(default, dict | list):
    return
  expected = type(default)
  numeric = expected is float and isinstance(value, int)
  if isinstance(value, bool) != (expected is bool) or not (isinstance(value, expected) or numeric):
    raise ConfigError(f"config field '{field}': expected {expected.__name__}, got {value!r} "
                      f"({type(value).__name__})")


def from_dict(values: Mapping[str, Any]) -> Config:
  """Builds and validates a Config from a nested mapping (e.g. ``ConfigDict.to_dict()``)."""
  return _build(Config, values, "").validate()


def to_dict(config: Config) -> dict[str, Any]:
  return dataclasses.asdict(config)
