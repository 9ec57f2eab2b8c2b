"""``PROBES``: every probe a sweep config can enable by name.

``sweep.probes.<name> = dict(option=value, ...)`` runs ``PROBES[name](context, **options)``
(``base``) on every unit, in the order of this registry; an option not given takes the
function's keyword default. The engine's own instruments (``instruments``: the needle sweep,
prefix probe and slot gains) come first; the studies add theirs when they are installed
(``chunkformer.studies.install``), in the order the studies are listed there. The instruments
give the typed record fields the claims read; any other probe's result is stored under its
name in the variant record (results.json schema 3) and shown in the report.

Adding a probe: one module with its function in a study, and one entry in that study's
``Study.probes`` (``tests/test_registries.py`` does this with a toy study).
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping
from typing import Any

from chunkformer.config_sections.errors import ConfigError
from chunkformer.evaluation.probes import instruments
from chunkformer.evaluation.probes.base import Probe

INSTRUMENTS: dict[str, Probe] = {
    "needle_sweep": instruments.run_needle_sweep,  # accuracy by needle offset, at every depth
    "prefix_probe": instruments.run_prefix_probe,  # accuracy by prefix length N
    "slot_gain": instruments.run_slot_gain,  # realised pooling weight per slot (and at init)
}
PROBES: dict[str, Probe] = dict(INSTRUMENTS)

# Checks of a probe's option values (beyond their names) that can run before any training.
OPTION_CHECKS: dict[str, Callable[..., None]] = {}


def register(probes: Mapping[str, Probe],
             option_checks: Mapping[str, Callable[..., None]] | None = None) -> None:
  """Adds a study's probes (a name taken by another probe is refused)."""
  for name, function in probes.items():
    if PROBES.get(name, function) is not function:
      raise ValueError(f"probe {name!r} is registered already by another module")
    PROBES[name] = function
  OPTION_CHECKS.update(option_checks or {})


def check(probes: Mapping[str, Any]) -> None:
  """ConfigError naming ``sweep.probes.<name>`` for an unknown probe or option (before any
  training)."""
  for name, options in probes.items():
    field = f"sweep.probes.{name}"
    if name not in PROBES:
      hint = ("" if len(PROBES) > len(INSTRUMENTS) else
              " (no study is installed: call chunkformer.studies.install() first)")
      raise ConfigError(f"config field '{field}': no such probe; known: "
                        f"{', '.join(sorted(PROBES)) or 'none'}{hint}")
    if not isinstance(options, Mapping):
      raise ConfigError(f"config field '{field}': give the probe's options as a dict, got "
                        f"{options!r}")
    try:
      inspect.signature(PROBES[name]).bind(None, **options)
    except TypeError as e:
      raise ConfigError(f"config field '{field}': {e}") from None
    if name in OPTION_CHECKS:
      OPTION_CHECKS[name](**options)


def options(name: str, given: Mapping[str, Any]) -> dict[str, Any]:
  """Every option of probe ``name``: ``given`` ones, the function's defaults for the rest."""
  bound = inspect.signature(PROBES[name]).bind(None, **given)
  bound.apply_defaults()
  return dict(list(bound.arguments.items())[1:])  # all but the context


def enabled(probes: Mapping[str, Mapping[str, Any]]) -> list[str]:
  """The names in ``probes``, in the registry's order (the order the sweep runs them in)."""
  return [name for name in PROBES if name in probes]
