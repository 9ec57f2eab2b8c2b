"""Code language models (configs/sweeps/code_lm.py): the corpus prefix probe, needle phases,
held-out loss by position mod M, and a tiny end-to-end sweep writing those record fields."""

from __future__ import annotations

import dataclasses
import json
import math
import os

import numpy as np
import pytest

from chunkformer.config import ConfigError, DataConfig
from chunkformer.data import code, code_needles, ingest
from chunkformer.evaluation.probes import prefix_probe
from chunkformer.evaluation.records import loss_rows
from chunkformer.evaluation.sweep import run as sweep
from chunkformer.studies.lm.probes import lm_phase_loss
from configs.sweeps import code_lm, seeded_units, sweep_config
from tests.test_corpus import write_corpus

NEEDLES = 2
MAX_PREFIX = 6


@pytest.fixture(scope="module")
def tiny_corpus(tmp_path_factory):
  root = tmp_path_factory.mktemp("code_lm")
  out = str(root / "shards")
  ingest.ingest(write_corpus(str(root / "text")), "bytes", out, heldout_fraction=0.25,
                command="test", progress=False)
  return out


def _corpus_config(path: str, **changes) -> DataConfig:
  return dataclasses.replace(
      DataConfig(task="corpus", path=path, tokenizer="bytes", seq_len=96, batch_size=4,
                 code_needles=NEEDLES, near_distance=40, read_threads=1), **changes)


@pytest.fixture(scope="module")
def corpus_probe(tiny_corpus):
  spec = prefix_probe.PrefixSpec(max_prefix=MAX_PREFIX, num_prompts=3, seed=2)
  return prefix_probe.build(_corpus_config(tiny_corpus), spec)


def test_corpus_prefix_probe_shifts_needles_and_answers_by_n(corpus_probe):
  probe = corpus_probe
  k = probe.prefixes_J.size
  tokens = np.concatenate([probe.rows["inputs"], probe.rows["targets"][:, -1:]], axis=1)
  assert probe.value_position_A is not None
  assert probe.answer_row_A.size == 3 * k * NEEDLES
  for a in range(probe.answer_row_A.size):
    row = probe.answer_row_A[a]
    prompt, n = divmod(row, k)
    assert (tokens[row, 1:1 + n] == ord("=")).all() and tokens[row, 0] == code.BOS
    answer = tokens[row, probe.answer_position_A[a]:][:code_needles.VALUE_SYMBOLS]
    planted = tokens[row, probe.value_position_A[a]:][:code_needles.VALUE_SYMBOLS]
    # The planted value is the answer; the line holding it is the query's line.
    np.testing.assert_array_equal(planted, answer)
    np.testing.assert_array_equal(
        tokens[row, probe.value_position_A[a] - code_needles.PROMPT_LEN:][:code_needles.NEEDLE_LEN],
        tokens[row, probe.answer_position_A[a] - code_needles.PROMPT_LEN:][
            :code_needles.NEEDLE_LEN])
    assert tokens[row, probe.answer_position_A[a] - code_needles.PROMPT_LEN - 1] == code.QUERY
    assert probe.value_position_A[a] < probe.answer_position_A[a]
    # Every needle moves by exactly N against its own position at N = 0.
    ref = (prompt * k) * NEEDLES + a % NEEDLES
    assert probe.value_position_A[a] == probe.value_position_A[ref] + n
    assert probe.answer_position_A[a] == probe.answer_position_A[ref] + n
  assert probe.code_mask_NxT is not None and probe.code_mask_NxT.any(axis=1).all()


def test_needle_phases_separate_the_needles_phase_from_the_prefix(corpus_probe):
  probe, m = corpus_probe, 4
  value_phase_a = probe.value_position_A % m
  exact_a = (value_phase_a != 3).astype(np.float64)  # a blind spot at the needle's phase 3
  num_prompts, k = probe.shape
  result = prefix_probe.PrefixResult(
      probe.prefixes_J, np.zeros((num_prompts, k)), np.zeros((num_prompts, k)),
      np.ones((num_prompts, k)), None, exact_a)
  tables = prefix_probe.needle_phases(probe, result, m)
  present = np.bincount(value_phase_a, minlength=m) > 0
  expected = [None if not present[p] else float(p != 3) for p in range(m)]
  assert tables["accuracy_by_value_phase"] == expected
  assert sum(tables["count_by_value_phase"]) == probe.answer_row_A.size
  # By prefix phase the same outcomes are a hand-computed average over the needles.
  n_a = probe.answer_row_A % k
  for p in range(m):
    assert tables["accuracy_by_prefix_phase"][p] == pytest.approx(exact_a[n_a % m == p].mean())
  # [N mod M][base phase]: the blind cell is the one whose value phase is 3.
  grid = tables["accuracy_by_prefix_phase_and_base_value_phase"]
  for q in range(m):
    for b in range(m):
      if tables["count_by_prefix_phase_and_base_value_phase"][q][b]:
        assert grid[q][b] == float((q + b) % m != 3)
  correct = np.array(tables["correct_YxNxJ"])
  assert correct.shape == (num_prompts, k, NEEDLES)
  np.testing.assert_array_equal(np.array(tables["value_phase_YxNxJ"]).ravel(), value_phase_a)
  assert tables["code_accuracy_by_prefix_phase"] == [1.0] * m


def test_corpus_probe_refuses_a_non_byte_tokenizer():
  config = DataConfig(task="corpus", path="builtin:stdlib", tokenizer="bpe:512", seq_len=96,
                      code_needles=NEEDLES)
  with pytest.raises(ConfigError, match="data.tokenizer.*'bpe:512'"):
    prefix_probe.base_config(config, prefix_probe.PrefixSpec(max_prefix=4, num_prompts=2))


def test_loss_by_position_mod_m_equals_a_hand_computation():
  loss = np.array([[1.0, 2.0, 3.0, 4.0, 5.0, 6.0],
                   [0.5, 0.5, 0.5, 0.5, 9.0, 7.0]])
  mask = np.array([[1, 1, 0, 1, 1, 1],
                   [1, 0, 1, 1, 0, 1]], np.float64)
  sums, counts = lm_phase_loss.group_by_phase(loss, mask, 4)
  # Columns 0..5 have phases 0 1 2 3 0 1.
  np.testing.assert_allclose(sums, [1 + 5 + 0.5, 2 + 6 + 7, 0.5, 4 + 0.5])
  np.testing.assert_allclose(counts, [3, 3, 1, 2])
  # Two held-out batches, each these two rows; every target predicts one byte.
  rows = loss_rows.Rows(np.concatenate([loss, loss]) * np.concatenate([mask, mask]),
                            np.concatenate([mask, mask]), np.ones((4, 6)))
  result = lm_phase_loss.PhaseLoss(4, rows, rows_per_batch=2)
  assert result.seq_len == 6
  np.testing.assert_allclose(result.loss_sum_BxP, [sums, sums])
  np.testing.assert_allclose(result.bytes_B, [9.0, 9.0])
  record = result.as_record()
  np.testing.assert_allclose(record["mean_loss_by_phase"], [6.5 / 3, 15 / 3, 0.5, 4.5 / 2])
  assert record["loss"] == pytest.approx(26.5 / 9)
  assert record["bits_per_byte"] == pytest.approx(26.5 / 9 / math.log(2))
  assert record["count_by_batch_and_phase"] == [[3, 3, 1, 2]] * 2
  with pytest.raises(ValueError, match="rows_per_batch=3"):
    lm_phase_loss.PhaseLoss(4, rows, rows_per_batch=3)


def test_code_mask_drops_the_needle_answers():
  batch = {"loss_mask": np.array([[1.0, 1.0, 1.0, 0.0]]), "near_mask": np.array([[0, 1.0, 0, 0]]),
           "far_mask": np.array([[0, 0, 1.0, 0]]), "targets": np.array([[65, 66, 67, 258]])}
  mask = lm_phase_loss.code_mask(batch)
  np.testing.assert_array_equal(mask, [[1, 0, 0, 0]])
  assert (lm_phase_loss.token_bytes(batch) * mask).sum() == 1.0


TINY_MODEL = {"model.d_model": 16, "model.num_heads": 2, "model.num_kv_heads": 2,
              "model.head_dim": 8, "model.mlp_dim": 32, "data.seq_len": 96,
              "data.batch_size": 4, "data.code_needles": NEEDLES, "data.near_distance": 40,
              "data.read_threads": 1, "train.steps": 2, "train.warmup_steps": 1,
              "train.checkpoint_every": 2, "train.eval_batches": 1}


def test_tiny_code_lm_sweep_writes_the_probe_and_phase_loss_fields(tiny_corpus, tmp_path):
  units = seeded_units({name: (code_lm.VARIANTS[name][0], 1) for name in
                        ("fixed_m4", "dynamic_m4")})
  config = sweep_config(
      units, overrides={**code_lm.SHARED, **TINY_MODEL, "data.path": tiny_corpus,
                        "data.tokenizer": "bytes"},
      name="tiny_code_lm", num_offsets=12, reference_chunk_size=4, prefix_max=MAX_PREFIX,
      prefix_prompts=2, slot_gain_rows=4, phase_loss_batches=2, eval_batch_size=4,
      num_resamples=20, num_permutations=20)
  workdir = str(tmp_path / "sweep")
  sweep.run(config, workdir, command="test")
  with open(os.path.join(workdir, "results.json")) as f:
    records = {r["name"]: r for r in json.load(f)["variants"]}
  assert set(records) == {"fixed_m4_seed0", "dynamic_m4_seed0"}
  for record in records.values():
    assert record["task"] == "corpus" and record["primary_probe"] == "prefix"
    phases = record["prefix_probe"]["needle_phases"]
    assert phases["period"] == 4
    assert np.array(phases["correct_YxNxJ"]).shape == (2, MAX_PREFIX + 1, NEEDLES)
    assert sum(phases["count_by_answer_phase"]) == 2 * (MAX_PREFIX + 1) * NEEDLES
    loss = record["lm_phase_loss"]
    assert np.array(loss["loss_sum_by_batch_and_phase"]).shape == (2, 4)
    assert all(c > 0 for c in loss["count_by_phase"])
    assert np.isfinite(loss["bits_per_byte"]) and loss["bits_per_byte"] > 0
    # Every code target of the held-out rows counted once (tokens minus answers, by phase).
    assert sum(loss["count_by_phase"]) <= 2 * 4 * 96
    # The detrended signature, recomputable from the stored per-token rows.
    rows = loss_rows.loader(workdir)(record["name"])
    assert rows.loss_NxT.shape == (2 * 4, 96)
    np.testing.assert_allclose(rows.mask_NxT.sum(axis=0).reshape(-1, 4).sum(axis=0),
                               loss["count_by_phase"])
    signature = loss["signature"]
    assert signature == rows.signature(4, seed=0, num_resamples=20, num_permutations=20)
    assert signature["bits_per_byte"] == pytest.approx(loss["bits_per_byte"], rel=1e-6)
  assert records["dynamic_m4_seed0"]["attention"] == "dynamic"
  with open(os.path.join(workdir, "report.md")) as f:
    report = f.read()
  assert "## Loss by position mod 4 (language models, seeds pooled)" in report
  assert os.path.exists(os.path.join(workdir, "plots", "lm_loss_by_phase.png"))
