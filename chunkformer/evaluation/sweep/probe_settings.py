"""``sweep.probes``: the probes of ``probes.registry.PROBES`` a sweep runs, with their options.

A sweep runs exactly the probes its config lists (``sweep.probes.<name> = dict(...)``; an entry
set to None is off). Without the field it runs ``DEFAULT_PROBES``, what every sweep ran before
the built-ins were registry entries: the needle sweep (32 haystacks at depths 0, 0.5, 1), the
prefix probe (32 prompts) and the slot gains (64 rows); loss by position is off.

Sweep configs written before then (and the settings stored in their results.json) set the
built-ins by flat fields, ``LEGACY_FIELDS``; ``from_legacy`` turns them into the same probes
(a 0 in ``prefix_prompts``, ``slot_gain_rows`` or ``phase_loss_batches`` switched a probe
off), so such a config runs exactly as it did and its stored records stay current.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from chunkformer.config_sections.errors import ConfigError
from chunkformer.evaluation.probes import registry

DEFAULT_PROBES = ("needle_sweep", "prefix_probe", "slot_gain")
# Flat field of older sweep configs -> (probe, option).
LEGACY_FIELDS = {
    "num_offsets": ("needle_sweep", "num_offsets"),
    "num_haystacks": ("needle_sweep", "num_haystacks"),
    "depths": ("needle_sweep", "depths"),
    "prefix_prompts": ("prefix_probe", "prompts"),
    "prefix_max": ("prefix_probe", "max_prefix"),
    "code_needles": ("prefix_probe", "code_needles"),
    "slot_gain_rows": ("slot_gain", "rows"),
    "phase_loss_batches": ("lm_phase_loss", "batches"),
}
_SWITCHES = ("prefix_prompts", "slot_gain_rows", "phase_loss_batches")  # 0 = probe off
# Smallest value of the built-ins' counts (checked before anything trains).
_MINIMUM = {("needle_sweep", "num_offsets"): 0, ("needle_sweep", "num_haystacks"): 1,
            ("prefix_probe", "prompts"): 1, ("prefix_probe", "max_prefix"): 0,
            ("prefix_probe", "code_needles"): 0, ("slot_gain", "rows"): 1,
            ("lm_phase_loss", "batches"): 1}


def defaults() -> dict[str, dict[str, Any]]:
  """``DEFAULT_PROBES`` with every option at its default."""
  return {name: registry.options(name, {}) for name in DEFAULT_PROBES}


def from_legacy(values: Mapping[str, Any]) -> dict[str, Any]:
  """Sweep settings with the flat ``LEGACY_FIELDS`` -> the same settings with ``probes``: the
  built-ins those fields (and their old defaults) gave, then the ``probes`` entries (those were
  the other probes; one a given flat field also sets is a ConfigError). Settings without
  legacy fields come back unchanged."""
  legacy = {k: v for k, v in values.items() if k in LEGACY_FIELDS}
  out = {k: v for k, v in values.items() if k not in LEGACY_FIELDS}
  if not legacy:
    return out
  others = dict(out.get("probes") or {})
  both = sorted(set(others) & {LEGACY_FIELDS[k][0] for k in legacy})
  if both:
    fields = sorted(k for k in legacy if LEGACY_FIELDS[k][0] == both[0])
    raise ConfigError(f"config field 'sweep.probes.{both[0]}': also set by "
                      f"{', '.join(f'sweep.{k}' for k in fields)} (the older form); give only "
                      f"sweep.probes.{both[0]}")
  on = list(DEFAULT_PROBES) + ["lm_phase_loss"] * bool(legacy.get("phase_loss_batches"))
  on = [p for p in on if all(legacy.get(k, 1) for k in _SWITCHES if LEGACY_FIELDS[k][0] == p)]
  probes = {probe: {} for probe in on}
  for field, value in legacy.items():
    probe, option = LEGACY_FIELDS[field]
    if probe in probes:
      probes[probe][option] = value
  out["probes"] = {**{p: registry.options(p, o) for p, o in probes.items()}, **others}
  return out


def resolve(probes: Mapping[str, Any] | None) -> dict[str, dict[str, Any]]:
  """The probes a sweep runs, each with all its options (ConfigError naming
  ``sweep.probes.<name>[.<option>]`` for an unknown probe or option or a bad count); None:
  ``DEFAULT_PROBES``."""
  if probes is None:
    return defaults()
  probes = {name: options for name, options in probes.items() if options is not None}
  registry.check(probes)
  full = {name: registry.options(name, probes[name]) for name in registry.enabled(probes)}
  for (probe, option), least in _MINIMUM.items():
    value = full.get(probe, {}).get(option, least)
    if not isinstance(value, int) or value < least:
      raise ConfigError(f"config field 'sweep.probes.{probe}.{option}': must be an integer >= "
                        f"{least}, got {value!r}")
  if "needle_sweep" in full and not full["needle_sweep"]["depths"]:
    raise ConfigError("config field 'sweep.probes.needle_sweep.depths': give at least one depth "
                      "in [0, 1]")
  return full


def comparable(settings: Mapping[str, Any]) -> dict[str, Any]:
  """Settings (a config's or those stored in results.json, either form) as plain JSON with
  every probe's full options under "probes.<name>": equal exactly when they evaluate alike."""
  values = from_legacy(json.loads(json.dumps(dict(settings))))
  probes = values.pop("probes", None)
  values.update({f"probes.{name}": options for name, options in resolve(probes).items()})
  return json.loads(json.dumps(values))
