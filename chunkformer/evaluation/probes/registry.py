"""``PROBES``: every probe a sweep config can enable by name.

``sweep.probes.<name> = dict(option=value, ...)`` runs ``PROBES[name](context, **options)``
(``base``) on every unit, in the order of this registry; an option not given takes the
function's keyword default. The sweep's built-in probes (``builtin``: the needle sweep,
prefix probe, slot gains and loss by position) are entries like any other; they give the typed
record fields the claims read. Any other probe's result is stored under its name in the
variant record (results.json schema 3) and shown in the report.

Adding a probe: one module with its function and one line below (``tests/test_registries.py``
does this with a toy probe).
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Mapping
from typing import Any

from chunkformer.config_sections.errors import ConfigError
from chunkformer.evaluation.probes import (
  builtin,
  eviction_lookup,
  eviction_needles,
  gate_concentration,
  gate_cycling,
  head_knockout,
  key_overlap,
  lookup,
)
from chunkformer.evaluation.probes.base import Probe

PROBES: dict[str, Probe] = {
    "needle_sweep": builtin.run_needle_sweep,  # accuracy by needle offset, at every depth
    "prefix_probe": builtin.run_prefix_probe,  # accuracy by prefix length N
    "slot_gain": builtin.run_slot_gain,  # realised pooling weight per slot (and at init)
    "lm_phase_loss": builtin.run_lm_phase_loss,  # language models: loss by position mod M
    "key_overlap": key_overlap.probe,  # kv accuracy by the key tokens another needle shares
    "lookup": lookup.probe,  # position-matched lookup: accuracy by residue, Wilson intervals
    "long_needle": lookup.needle_probe,  # multi-token records filling the context, by residue
    "gate_concentration": gate_concentration.probe,  # effective offsets per gate: static, window
    "gate_cycling": gate_cycling.probe,  # gates cycled by delta: do the weak phases follow?
    "head_knockout": head_knockout.probe,  # KV heads mean-replaced at the query: change by residue
    "eviction_needles": eviction_needles.probe,  # needle sweep under KV eviction policies
    "eviction_lookup": eviction_lookup.probe,  # lookup / long needle tests under eviction policies
}

# Checks of a probe's option values (beyond their names) that can run before any training.
OPTION_CHECKS: dict[str, Any] = {
    "eviction_needles": eviction_needles.check_options,  # the listed policies and prompt end
    "eviction_lookup": eviction_lookup.check_options,  # the policies, the test and its options
}
# The lookup-task probes' vocabulary options (``lookup.check_vocabulary``).
OPTION_CHECKS.update({name: functools.partial(lookup.check_vocabulary, f"sweep.probes.{name}")
                      for name in ("lookup", "long_needle", "gate_cycling", "head_knockout")})


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
