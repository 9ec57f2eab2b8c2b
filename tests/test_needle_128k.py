"""configs/long_context/needle_128k.py: the long needle test at 131,072 tokens with each row
split over mesh.context = 8, and its CPU twin (256 tokens, context 4) through eval.py.

The suite resolves the 128K sweep (every variant's config checked, nothing trained) and checks
its needle task at that length; the twin's run through eval.py (train 20 steps on 4 fake CPU
devices, then the probes; about a minute of CPU, far more on a loaded machine) runs with
CHUNKFORMER_SLOW_TESTS=1."""

import json
import os

import numpy as np
import pytest

from chunkformer.data import long_needle, lookup_task
from chunkformer.evaluation.sweep import config as sweep_config
from configs.long_context import needle_128k
from tests import fake_devices


def test_the_128k_sweep_splits_each_row_over_8_devices(tmp_path):
  sweep = sweep_config.resolve(needle_128k.get_config(), str(tmp_path))
  assert [v.name for v in sweep.variants] == list(needle_128k.RUNS)
  for v in sweep.variants:
    c = v.config
    assert c.data.seq_len == 131_072 and c.mesh.context == 8
    assert {layer.implementation for layer in c.model.layers} == {"xla"}
    assert c.model.num_layers == 28 and c.model.d_model == 1024  # the paper's size
    # 8 rows per update, micro-batches of 2 rows: one batch shard (context 8 on 8 devices)
    assert c.data.batch_size // c.train.grad_accum_steps == 2
  assert sweep.settings.eval_batch_size == 16 and not os.listdir(tmp_path)
  needle = sweep.settings.probes["long_needle"]
  assert (needle["modulus"], needle["key_len"], needle["value_len"],
          needle["prompts_per_residue"]) == (8, 2, 2, 256)


def test_the_needle_task_fits_131072_tokens_with_the_target_near_the_middle():
  c = sweep_config.resolve(needle_128k.get_config("w8s4_1kv"), "/nonexistent").variants[0].config
  spec = long_needle.NeedleSpec(seq_len=c.data.seq_len, prompts_per_residue=256,
                                **lookup_task.default_tokens(c.data))
  spec.validate()
  lo, hi = spec.window()
  assert (lo + hi) / 2 == pytest.approx(131_072 / 2, abs=2) and hi - lo == 32  # +-2 periods
  # records of 4 tokens back to back between BOS and the query block: 32,766 of them
  records = {(spec.query_start - 1 - (spec.start + (t - spec.start) % 4)) // 4
             for t in range(lo, lo + 4)}
  assert records == {32_766}


def test_the_config_names_a_bad_run():
  with pytest.raises(ValueError, match=r"\['w9s9'\] are not paper runs"):
    needle_128k.get_config("tiny,w9s9")


@pytest.mark.skipif(os.environ.get("CHUNKFORMER_SLOW_TESTS") != "1",
                    reason="trains and evaluates through eval.py: about a minute of CPU; "
                           "CHUNKFORMER_SLOW_TESTS=1 runs it")
def test_the_cpu_twin_runs_through_eval_py_on_4_devices_with_context_4(tmp_path):
  fake_devices.run(["eval.py", "--config", "configs/long_context/needle_128k.py:tiny,w8s4_1kv",
                    "--workdir", tmp_path], devices=4, timeout=1800)
  with open(tmp_path / "w8s4_1kv" / "config.json") as f:
    assert json.load(f)["mesh"]["context"] == 4  # the probes' predictor splits rows so too
  record = json.load(open(tmp_path / "results.json"))["variants"][0]["probes"]["long_needle"]
  needle = record["modes"]["needle"]
  assert (record["seq_len"], record["modulus"], record["prompts_per_residue"]) == (256, 8, 64)
  assert needle["total"] == [64] * 8 and 0 <= needle["mean"] <= 1
  with np.load(tmp_path / "correct" / "w8s4_1kv.npz") as matrices:
    assert any(k.startswith("long_needle_needle") for k in matrices.files)
