"""Building blocks of sweep configs (``python eval.py --config configs/sweeps/<name>.py``).

A sweep config is a ConfigDict with ``sweep`` (settings: every field of
``chunkformer.evaluation.sweep.config.SweepSettings``, so each can be overridden from the
command line, and ``sweep.probes``: the probes it runs, each with its options),
``overrides`` (applied to every variant) and ``variants`` (name -> train config file plus
overrides). Overrides are written with dotted keys here and stored nested, because
ConfigDict field names cannot hold dots.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

import ml_collections

from chunkformer import studies
from chunkformer.evaluation.sweep import probe_settings
from chunkformer.evaluation.sweep.config import SEED_SEPARATOR, SweepSettings


def nest(dotted: Mapping[str, Any]) -> dict[str, Any]:
  """{"model.attention.chunk_size": 8} -> {"model": {"attention": {"chunk_size": 8}}}."""
  out: dict[str, Any] = {}
  for key, value in dotted.items():
    node = out
    *parents, leaf = key.split(".")
    for part in parents:
      node = node.setdefault(part, {})
    node[leaf] = value
  return out


def variant(config: str = "", overrides: Mapping[str, Any] | None = None,
            checkpoint: str = "") -> ml_collections.ConfigDict:
  """One variant: a train config file with dotted overrides, or a finished run directory."""
  return ml_collections.ConfigDict(
      {"config": config, "overrides": nest(overrides or {}), "checkpoint": checkpoint})


def sweep_config(variants: Mapping[str, ml_collections.ConfigDict], *,
                 overrides: Mapping[str, Any] | None = None,
                 **settings: Any) -> ml_collections.ConfigDict:
  """The whole sweep config; ``settings`` are SweepSettings fields (the rest keep defaults).

  ``probes`` lists every probe the sweep runs (default: the built-ins of
  ``probe_settings.DEFAULT_PROBES``); the flat fields of older sweep configs
  (``probe_settings.LEGACY_FIELDS``, e.g. ``prefix_prompts=0``) are accepted and written as
  the same probes. ``order`` defaults to the order of ``variants`` (ConfigDict itself sorts
  its keys).
  """
  studies.install()  # a sweep names the studies' probes
  values = dataclasses.asdict(SweepSettings())
  unknown = set(settings) - set(values) - set(probe_settings.LEGACY_FIELDS)
  if unknown:
    raise ValueError(f"unknown sweep settings {sorted(unknown)}; known: {', '.join(values)}")
  if set(settings) & set(probe_settings.LEGACY_FIELDS):
    values.pop("probes")  # the older form: the flat fields name the built-ins
  values = probe_settings.from_legacy({**values, **settings})
  if not values["order"]:
    values["order"] = tuple(variants)
  config = ml_collections.ConfigDict()
  config.sweep = ml_collections.ConfigDict(values)
  config.overrides = ml_collections.ConfigDict(nest(overrides or {}))
  config.variants = ml_collections.ConfigDict({name: v for name, v in variants.items()})
  return config


def seeded_units(variants: Mapping[str, tuple[ml_collections.ConfigDict, int]]
                 ) -> dict[str, ml_collections.ConfigDict]:
  """{name: (variant, n)} -> one unit per seed, ``name_seed<k>`` with ``seed: k`` added.

  Units come seed-major (every repeated variant's seed 0, then seed 1, ...; single-seed
  variants last), so a sweep stopped part way holds the most useful units;
  ``sweep_config.unit_variant`` reads the variant back from a unit's name.
  """
  def unit(name: str, k: int) -> tuple[str, ml_collections.ConfigDict]:
    definition = ml_collections.ConfigDict(variants[name][0].to_dict())
    definition.overrides.seed = k
    return f"{name}{SEED_SEPARATOR}{k}", definition

  repeated = {name: n for name, (_, n) in variants.items() if n > 1}
  units = dict(unit(name, k) for k in range(max(repeated.values(), default=0))
               for name, n in repeated.items() if k < n)
  units.update(unit(name, 0) for name, (_, n) in variants.items() if n == 1)
  return units

