"""``ConfigError`` and the one-line field checks that raise it, naming the field."""

from __future__ import annotations

from typing import Any


class ConfigError(ValueError):
  """A config field holds a value the framework cannot run."""


def require(ok: bool, field: str, message: str) -> None:
  if not ok:
    raise ConfigError(f"config field '{field}': {message}")


def require_positive(obj: Any, names: tuple[str, ...], prefix: str) -> None:
  for name in names:
    value = getattr(obj, name)
    require(value >= 1, f"{prefix}.{name}", f"must be >= 1, got {value}")


def one_of(value: Any, allowed: tuple[str, ...], field: str) -> None:
  require(value in allowed, field, f"got {value!r}, allowed: {', '.join(allowed)}")
