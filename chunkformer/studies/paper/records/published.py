"""The paper's published numbers: ``paper_published.json`` (its source is named in
``paper_published.md`` beside it: arXiv 2609.36322).

``RUN_IDS`` maps each run of ``configs/paper/runs.py`` to its entry in the published data
(the full-attention controls have no published residue curve there).
"""

from __future__ import annotations

import functools
import json
import os
from typing import Any

PATH = os.path.join(os.path.dirname(os.path.abspath(__file__)), "paper_published.json")
SCALE_NOTE = "paper (Qwen3-0.6B backbone, 100B tokens: a different scale)"
ROW_LABEL = "paper"  # a published row's label in tables whose caption gives SCALE_NOTE

RUN_IDS = {
    "w8s8_1kv": "kvc_w8s8_1kv_baseline",
    "w4s4_1kv": "kvc_w4s4_1kv",
    "w8s4_1kv": "kvc_w8s4",
    "w8s6_1kv": "kvc_w8s6",
    "w12s12_1kv": "kvc_w12s12_1kv",
    "w8s8_2kv": "kvc_w8s8_2kv",
    "w8s8_4kv": "kvc_w8s8_4kv",
    "w8s8_8kv": "kvc_w8s8_8kv",
    "w8s8_1kv_tied_kv": "kvc_w8s8_1kv_kvshare",
    "w8s8_1kv_uniform": "kvc_w8s8_1kv_meanpool",
    "w8s8_1kv_uniform_tied_kv_post_norm": "kvc_w8s8_1kv_mean_kvshare_postnorm",
    "w8s8_1kv_vector": "kvc_w8s8_1kv_vector",
    "w8s8_1kv_no_qk_norm": "kvc_w8s8_1kv_noQKnorm",
    "w8s8_1kv_no_gate_bias": "kvc_w8s8_1kv_nobias",
    "w8s8_1kv_nope": "kvc_w8s8_1kv_nope",
    "w8s8_1kv_rope16": "kvc_w8s8_1kv_rope16",
    "w8s8_1kv_tail": "kvc_w8s8_1kv_tail_concat",
    "w8s8_8kv_tail": "kvc_w8s8_8kv_tail_concat",
    "w8s4_dsv4_kernel": "kvc_w8s4_dsv4kernel_1kv_rope16",
    "w8s4_dsv4_kernel_scalar": "kvc_w8s4_dsv4kernel_1kv_scalar_rope16",
}
PADDING_KEYS = {"prefix": "pp", "in_sequence": "ip"}


@functools.cache
def published() -> dict[str, Any]:
  with open(PATH) as f:
    return json.load(f)


def run_for(name: str) -> dict[str, Any] | None:
  """The published entry of the paper run a unit is named after (its name, or a name ending
  in ``_<run>`` or starting with ``<run>_``), or None."""
  for run, paper_id in sorted(RUN_IDS.items(), key=lambda kv: -len(kv[0])):
    if name == run or name.endswith("_" + run) or name.startswith(run + "_"):
      return next(r for r in published()["runs"] if r["id"] == paper_id)
  return None


def lookup_row(entry: dict[str, Any], padding: str) -> dict[str, Any] | None:
  """{"acc" (percent per residue mod 24), "mean", "worst", "gap", "loss"} of one padding mode
  (a field published as [value, low, high] gives its value)."""
  block = entry.get(PADDING_KEYS.get(padding, ""))
  if block is None:
    return None
  def first(v):
    return v[0] if isinstance(v, list) else v
  return {"acc": list(block["acc"]), "mean": first(block["mean"]), "worst": block["worst"],
          "gap": first(block["gap"]), "loss": entry.get("loss")}
