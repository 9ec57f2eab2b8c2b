"""The demo sweep compares like with like: its matched full control is the fixed model's config."""

from __future__ import annotations

import dataclasses

from chunkformer.evaluation.sweep import config as sweep_config
from configs.sweeps import demo


def test_demo_matched_full_control_differs_from_fixed_only_in_attention_kind(tmp_path):
  sweep = sweep_config.resolve(demo.get_config(), str(tmp_path / "demo"))
  configs = {v.name: sweep_config.flatten(dataclasses.asdict(v.config)) for v in sweep.variants}
  fixed, matched = configs["fixed_m4"], configs["full_matched"]
  differing = {k for k in fixed.keys() | matched.keys() if fixed.get(k) != matched.get(k)}
  assert differing == {"model.attention.kind"}
  assert matched["model.attention.kind"] == "full"
  # The calibrated control differs in more than attention (its key shift), hence the second one.
  assert configs["full"]["model.key_shift"] != fixed["model.key_shift"]
