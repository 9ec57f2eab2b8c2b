"""Building blocks of sweep configs (``python eval.py --config configs/sweeps/<name>.py``).

A sweep config is a ConfigDict with ``sweep`` (settings: every field of
``chunkformer.evaluation.sweep_config.SweepSettings``, so each can be overridden from the
command line), ``overrides`` (applied to every variant) and ``variants`` (name -> train config
file plus overrides). Overrides are written with dotted keys here and stored nested, because
ConfigDict field names cannot hold dots.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

import ml_collections

from chunkformer.evaluation.sweep_config import SweepSettings


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

  ``order`` defaults to the order of ``variants`` (ConfigDict itself sorts its keys).
  """
  values = dataclasses.asdict(SweepSettings())
  unknown = set(settings) - set(values)
  if unknown:
    raise ValueError(f"unknown sweep settings {sorted(unknown)}; known: {', '.join(values)}")
  values.update(settings)
  if not values["order"]:
    values["order"] = tuple(variants)
  config = ml_collections.ConfigDict()
  config.sweep = ml_collections.ConfigDict(values)
  config.overrides = ml_collections.ConfigDict(nest(overrides or {}))
  config.variants = ml_collections.ConfigDict({name: v for name, v in variants.items()})
  return config
