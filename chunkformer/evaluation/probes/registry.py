"""``PROBES``: every probe a sweep config can enable by name.

``sweep.probes.<name> = dict(option=value, ...)`` runs ``PROBES[name](context, **options)``
(``base``) on every unit after the sweep's own probes (the needle sweep, prefix probe, slot
gains and loss by position, which the claims read as typed record fields); its result is
stored under its name in the variant record (results.json schema 3) and shown in the report.

Adding a probe: one module with its function and one line below (``tests/test_registries.py``
does this with a toy probe).
"""

from __future__ import annotations

import inspect
from collections.abc import Mapping
from typing import Any

from chunkformer.config_sections.errors import ConfigError
from chunkformer.evaluation.probes import (
  eviction_needles,
  gate_concentration,
  gate_cycling,
  head_knockout,
  key_overlap,
  lookup,
)
from chunkformer.evaluation.probes.base import Probe

PROBES: dict[str, Probe] = {
    "key_overlap": key_overlap.probe,  # kv accuracy by the key tokens another needle shares
    "lookup": lookup.probe,  # position-matched lookup: accuracy by residue, Wilson intervals
    "long_needle": lookup.needle_probe,  # multi-token records filling the context, by residue
    "gate_concentration": gate_concentration.probe,  # effective offsets per gate: static, window
    "gate_cycling": gate_cycling.probe,  # gates cycled by delta: do the weak phases follow?
    "head_knockout": head_knockout.probe,  # KV heads mean-replaced at the query: change by residue
    "eviction_needles": eviction_needles.probe,  # needle sweep under KV eviction policies
}


def check(probes: Mapping[str, Any]) -> None:
  """ConfigError naming ``sweep.probes.<name>`` for an unknown probe or option (before any
  training)."""
  for name, options in probes.items():
    field = f"sweep.probes.{name}"
    if name not in PROBES:
      raise ConfigError(f"config field '{field}': no such probe; known: "
                        f"{', '.join(sorted(PROBES)) or 'none'}")
    if not isinstance(options, Mapping):
      raise ConfigError(f"config field '{field}': give the probe's options as a dict, got "
                        f"{options!r}")
    try:
      inspect.signature(PROBES[name]).bind(None, **options)
    except TypeError as e:
      raise ConfigError(f"config field '{field}': {e}") from None
