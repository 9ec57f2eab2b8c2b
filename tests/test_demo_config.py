"""The demo sweep decides what it shows: two seeds of each variant, and the fixed model and its
cure differ in attention alone."""

from __future__ import annotations

import dataclasses

from chunkformer.evaluation.sweep import config as sweep_config
from configs.sweeps import demo


def _configs(tmp_path) -> dict[str, dict]:
  sweep = sweep_config.resolve(demo.get_config(), str(tmp_path / "demo"))
  return {v.name: sweep_config.flatten(dataclasses.asdict(v.config)) for v in sweep.variants}


def test_demo_trains_two_seeds_of_each_variant(tmp_path):
  configs = _configs(tmp_path)
  assert sorted(configs) == sorted(f"{name}_seed{k}" for name in demo.VARIANTS for k in (0, 1))
  assert {c["seed"] for c in configs.values()} == {0, 1}
  # The seeds differ in the seed alone.
  a, b = configs["fixed_m4_seed0"], configs["fixed_m4_seed1"]
  assert {k for k in a.keys() | b.keys() if a.get(k) != b.get(k)} == {"seed"}


def test_demo_cure_differs_from_fixed_only_in_attention(tmp_path):
  configs = _configs(tmp_path)
  fixed, dynamic = configs["fixed_m4_seed0"], configs["dynamic_m4_seed0"]
  differing = {k for k in fixed.keys() | dynamic.keys() if fixed.get(k) != dynamic.get(k)}
  assert differing and all(k.startswith("model.attention.") for k in differing)
  assert dynamic["model.attention.kind"] == "dynamic" and fixed["model.attention.kind"] == "fixed"
  assert fixed["model.key_shift"] == dynamic["model.key_shift"] == 0
  # The control is full attention with its calibrated key shift.
  assert configs["full_seed0"]["model.attention.kind"] == "full"
  assert configs["full_seed0"]["model.key_shift"] == 2
