"""The paper's five probes on a model chunkformer trains on CPU, through the sweep that
``eval.py`` runs (``configs/sweeps/paper_protocol.py``'s probe set at a tiny size): each writes
its record, its matrices in ``correct/<unit>.npz`` and its figure, and a rerun evaluates
nothing again. It trains and compiles about a dozen programs (some 30 s of CPU from a cold
compilation cache), so it runs only with CHUNKFORMER_SLOW_TESTS=1; the suite runs every probe
on an initialised W = S model (test_gate_probes.py, test_lookup_probe.py) and on imported
Qwen3 checkpoints (test_loaded_model.py, test_word_tokens.py)."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest

from chunkformer.evaluation.records import correctness
from chunkformer.evaluation.sweep import run as sweep
from configs.sweeps import sweep_config as make_sweep
from configs.sweeps import variant

# configs/smoke.py (T = 32, 2 KV heads) with one layer of W = S = 4 per-offset scalar gates, so
# that gate cycling applies; two training steps.
PAPER_STYLE = variant("configs/smoke.py", {
    "model.attention.kind": "fixed", "model.attention.window": 4,
    "model.attention.chunk_size": 4, "model.attention.offset_maps": "per_offset",
    "model.attention.gate": "scalar", "model.attention.shared_kv": False,
    "model.num_layers": 1, "train.steps": 2, "train.checkpoint_every": 2})
PROBES = {
    "prefix_probe": {"prompts": 2, "max_prefix": 8},  # the unit's primary analysis
    "lookup": {"modulus": 4, "paddings": ("prefix",)},
    "long_needle": {"modulus": 4},
    "gate_concentration": {"rows": 4, "batch_size": 4},
    "gate_cycling": {"deltas": (1,)},
    "head_knockout": {"modulus": 4},
}


@pytest.mark.skipif(os.environ.get("CHUNKFORMER_SLOW_TESTS") != "1",
                    reason="trains and compiles ~30 s of CPU; CHUNKFORMER_SLOW_TESTS=1 runs it")
def test_every_paper_probe_runs_on_a_trained_cpu_model_through_the_sweep(tmp_path):
  config = make_sweep({"w4s4": PAPER_STYLE}, name="paper_tiny", eval_batch_size=32,
                      num_resamples=20, num_permutations=20, probes=PROBES)
  workdir = str(tmp_path / "sweep")
  outcome = sweep.run(config, workdir, command="test")
  with open(outcome.results_path) as f:
    (record,) = json.load(f)["variants"]
  assert record["trained_steps"] == 2
  probes = record["probes"]
  assert set(probes) == set(PROBES) - {"prefix_probe"}
  assert probes["lookup"]["modes"]["prefix"]["total"] == [16] * 4
  assert probes["long_needle"]["modes"]["needle"]["total"] == [16] * 4
  assert [(g["layer"], g["stream"]) for g in probes["gate_concentration"]["gates"]] == [
      (0, s) for s in ("k", "v") for _ in (0, 1)]
  assert probes["gate_cycling"]["stride"] == 4 and set(probes["gate_cycling"]["accuracy"]) == {
      "0", "1"}
  assert len(probes["head_knockout"]["heads"]) == 2  # layers x KV heads
  matrices = correctness.load(os.path.join(workdir, "correct", "w4s4.npz"))
  for name in ("lookup_prefix", "long_needle_needle", "head_knockout_clean",
               "head_knockout_L0H1", "gate_cycling_delta0", "gate_cycling_delta+1"):
    assert matrices[name].correct_YxJ.shape[1] == 4, name
  np.testing.assert_allclose(matrices["lookup_prefix"].correct_YxJ.mean(axis=0),
                             probes["lookup"]["modes"]["prefix"]["accuracy"])
  plots = set(os.listdir(os.path.join(workdir, "plots")))
  assert {"w4s4_gate_concentration.png", "w4s4_gate_cycling.png",
          "w4s4_head_knockout.png"} <= plots
  # resumable: a rerun finds the record current and evaluates nothing again
  before = os.path.getmtime(os.path.join(workdir, "correct", "w4s4.npz"))
  sweep.run(config, workdir, command="test")
  assert os.path.getmtime(os.path.join(workdir, "correct", "w4s4.npz")) == before
