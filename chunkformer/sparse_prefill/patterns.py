"""The sparse-prefill patterns as frozen, validated settings: data, not code paths.

``BlockSparse(top=100)`` etc. A pattern is what one attention head does in a prefill; its
``index(q, k, block)`` estimates the head's index set online from the prompt's own queries and
keys (``estimate.py``). Budgets are in MInference's units: tokens for vertical columns, slash
lines and A-shape's sink and window; key blocks for block-sparse. Bad settings raise ConfigError
naming the field (``sparse.<pattern>.<field>``) when the pattern is made. Patterns are hashable,
so a prefill compiles once per plan.

MInference's published defaults, and where ours differ: docs/sparse_prefill.md.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax

from chunkformer.config_sections.errors import ConfigError, require
from chunkformer.sparse_prefill import estimate
from chunkformer.sparse_prefill.index import Index

Array = jax.Array


@dataclasses.dataclass(frozen=True)
class Pattern:
  """What every pattern shares: validation of its int settings and a stable label."""

  name = "pattern"

  def __post_init__(self):
    for f in dataclasses.fields(self):
      value = getattr(self, f.name)
      low = f.metadata.get("minimum", 1)
      require(isinstance(value, int) and not isinstance(value, bool) and value >= low,
              f"sparse.{self.name}.{f.name}", f"must be an int >= {low}, got {value!r}")

  def index(self, q_BxTxHxD: Array, k_BxTxKxD: Array, block: int) -> Index:
    raise NotImplementedError

  def label(self) -> str:
    """A short stable name, e.g. ``vertical_slash-v1000-s6096-q64``."""
    return "-".join([self.name] + [f"{f.metadata.get('tag', f.name)}{getattr(self, f.name)}"
                                   for f in dataclasses.fields(self)])


def _setting(default: int, tag: str, minimum: int = 1):
  return dataclasses.field(default=default, metadata=dict(tag=tag, minimum=minimum))


@dataclasses.dataclass(frozen=True)
class KeepAll(Pattern):
  """Every causal key: dense attention through the sparse path (its equality test)."""

  name = "keep_all"

  def index(self, q_BxTxHxD, k_BxTxKxD, block):
    return estimate.keep_all(q_BxTxHxD, block)


@dataclasses.dataclass(frozen=True)
class AShape(Pattern):
  """Sink + local window ("A-shape", StreamingLLM): the first ``sink`` and the last ``local``
  tokens before each query block, rounded up to whole blocks; static (no estimation)."""

  name = "a_shape"
  sink: int = _setting(64, "i", minimum=0)
  local: int = _setting(4096, "l")

  def index(self, q_BxTxHxD, k_BxTxKxD, block):
    return estimate.a_shape(q_BxTxHxD, block, -(-self.sink // block), -(-self.local // block))


@dataclasses.dataclass(frozen=True)
class VerticalSlash(Pattern):
  """Top ``vertical`` key columns and top ``slash`` diagonals from the attention of the last
  ``last_q`` queries; the first ``forced_vertical`` columns and the ``forced_slash`` nearest
  diagonals always (MInference forces 30 and 100)."""

  name = "vertical_slash"
  vertical: int = _setting(1000, "v")
  slash: int = _setting(6096, "s")
  last_q: int = _setting(64, "q")
  forced_vertical: int = _setting(30, "fv", minimum=0)
  forced_slash: int = _setting(100, "fs")

  def __post_init__(self):
    super().__post_init__()
    require(self.forced_vertical <= self.vertical, f"sparse.{self.name}.forced_vertical",
            f"{self.forced_vertical} exceeds vertical={self.vertical}")
    require(self.forced_slash <= self.slash, f"sparse.{self.name}.forced_slash",
            f"{self.forced_slash} exceeds slash={self.slash}")

  def index(self, q_BxTxHxD, k_BxTxKxD, block):
    return estimate.vertical_slash(q_BxTxHxD, k_BxTxKxD, block, self.vertical, self.slash,
                                   self.last_q, self.forced_vertical, self.forced_slash)


@dataclasses.dataclass(frozen=True)
class BlockSparse(Pattern):
  """The ``top`` key blocks of each query block by pooled (block-mean) query-key score; the
  diagonal block always."""

  name = "block_sparse"
  top: int = _setting(100, "k")

  def index(self, q_BxTxHxD, k_BxTxKxD, block):
    return estimate.block_sparse(q_BxTxHxD, k_BxTxKxD, block, self.top)


PATTERNS: dict[str, type[Pattern]] = {cls.name: cls for cls in (
    KeepAll, AShape, VerticalSlash, BlockSparse)}


def from_dict(spec: dict[str, Any], field: str = "sparse") -> Pattern:
  """A pattern from a config entry: ``{"pattern": "vertical_slash", "vertical": 1000}``."""
  spec = dict(spec)
  name = spec.pop("pattern", None)
  require(name in PATTERNS, f"{field}.pattern", f"got {name!r}, allowed: {', '.join(PATTERNS)}")
  cls = PATTERNS[name]
  known = {f.name for f in dataclasses.fields(cls)}
  unknown = sorted(set(spec) - known)
  require(not unknown, f"{field}.{unknown[0] if unknown else ''}",
          f"not a setting of {name}; known: {', '.join(sorted(known)) or 'none'}")
  try:
    return cls(**spec)
  except TypeError as e:
    raise ConfigError(f"config field '{field}': {e}") from None
