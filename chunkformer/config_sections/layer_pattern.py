"""``model.layer_pattern``: per-layer overrides of ``model.attention``, cycled over the layers.

``"chunk_size=4,overlap=true;chunk_size=128"`` gives DeepSeek-V4's alternating CSA/HCA layout
(layers 0, 2, ... get M=4 with overlap; layers 1, 3, ... get M=128). An empty spec between
semicolons keeps the defaults for that layer.
"""

from __future__ import annotations

import dataclasses

from chunkformer.config_sections.attention import AttentionConfig
from chunkformer.config_sections.errors import ConfigError, require


def _parse_bool(text: str) -> bool:
  lowered = text.strip().lower()
  if lowered in ("true", "1", "yes"):
    return True
  if lowered in ("false", "0", "no"):
    return False
  raise ValueError(f"not a boolean: {text!r}")


def resolve(base: AttentionConfig, pattern: str, num_layers: int) -> tuple[AttentionConfig, ...]:
  """One AttentionConfig per layer: ``base`` with the overrides of spec ``layer % len(specs)``."""
  if not pattern.strip():
    return (base,) * num_layers
  fields = {f.name: f for f in dataclasses.fields(AttentionConfig)}
  specs = []
  for spec in pattern.split(";"):
    overrides = {}
    for item in filter(None, (s.strip() for s in spec.split(","))):
      key, sep, value = item.partition("=")
      key = key.strip()
      require(bool(sep), "model.layer_pattern", f"expected field=value, got {item!r}")
      require(key in fields, "model.layer_pattern",
              f"unknown attention field {key!r}; known: {', '.join(fields)}")
      default = getattr(base, key)
      try:
        if isinstance(default, bool):
          overrides[key] = _parse_bool(value)
        else:
          overrides[key] = type(default)(value.strip())
      except ValueError as e:
        raise ConfigError(f"config field 'model.layer_pattern': {key}={value!r}: {e}") from e
    specs.append(dataclasses.replace(base, **overrides))
  return tuple(specs[i % len(specs)] for i in range(num_layers))
